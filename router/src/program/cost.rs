//! The spec's calibration models as functions: cold-prefill seconds, the cache-miss impact that
//! Progress-TTL weighs, and aggregate decode throughput.

use crate::config::program::{DecodeThroughputModel, PrefillCostModel};

/// Cold prefill of `uncached_tokens`: `intercept + linear·x + quadratic·x²`, `x = tokens / 1000`.
pub fn prefill_seconds(m: &PrefillCostModel, uncached_tokens: u64) -> f64 {
    let x = uncached_tokens as f64 / 1000.0;
    m.intercept_seconds
        + m.linear_seconds_per_1k_tokens * x
        + m.quadratic_seconds_per_1k_tokens_squared * x * x
}

/// What losing a Program's KV costs: its re-prefill plus the decode throughput it takes from the
/// batch meanwhile, `prefill · (2 − alpha)`.
pub fn cache_miss_impact_seconds(m: &PrefillCostModel, context_tokens: u64) -> f64 {
    prefill_seconds(m, context_tokens) * (2.0 - m.decode_throughput_alpha)
}

/// Aggregate decode tokens/s for `batch` requests whose full contexts sum to `context_tokens`.
pub fn decode_throughput(m: &DecodeThroughputModel, batch: u64, context_tokens: u64) -> f64 {
    let step = m.fixed_step_seconds
        + m.batch_step_seconds_per_request * batch as f64
        + m.context_step_seconds_per_token * context_tokens as f64;
    if step <= 0.0 {
        0.0
    } else {
        batch as f64 / step
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reference_estimates() {
        let p = PrefillCostModel::default();
        assert!((prefill_seconds(&p, 50_000) - 13.93).abs() < 0.01);
        assert!((cache_miss_impact_seconds(&p, 50_000) - 13.93 * 1.85).abs() < 0.02);
        let d = DecodeThroughputModel::default();
        assert!((decode_throughput(&d, 4, 200_000) - 98.23).abs() < 0.01);
    }
}
