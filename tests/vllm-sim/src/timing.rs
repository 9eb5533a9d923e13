//! The step-time model: the spec's cold-prefill and decode-throughput calibration surfaces.
//!
//! Owns the seven coefficients and the formulas, nothing else:
//!
//! * cold prefill of `n` uncached tokens, `x = n / 1000`:
//!   `intercept + linear·x + quadratic·x²`; a prompt prefilled in several chunks pays the
//!   intercept once and the linear/quadratic terms as a telescoping sum, so the total equals the
//!   one-shot formula and a lone request's virtual TTFT is exactly the formula;
//! * one decode step for `B` sequences whose contexts sum to `C` tokens:
//!   `fixed + per_request·B + per_token·C`;
//! * a step that mixes prefill `p` and decode `d` lasts `p + d − alpha·min(p, d)`: `alpha` is the
//!   fraction of the shorter phase hidden under the longer one (0 = fully serial).

use serde::{Deserialize, Serialize};

/// Timing coefficients; defaults are the spec's reference values.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TimingModel {
    pub prefill_intercept_seconds: f64,
    pub prefill_linear_seconds_per_1k_tokens: f64,
    pub prefill_quadratic_seconds_per_1k_tokens_squared: f64,
    pub decode_throughput_alpha: f64,
    pub decode_fixed_step_seconds: f64,
    pub decode_batch_step_seconds_per_request: f64,
    pub decode_context_step_seconds_per_token: f64,
}

impl Default for TimingModel {
    fn default() -> Self {
        TimingModel {
            prefill_intercept_seconds: 0.066_000_619_071_329_26,
            prefill_linear_seconds_per_1k_tokens: 0.057_020_240_121_666_13,
            prefill_quadratic_seconds_per_1k_tokens_squared: 0.004_405_734_793_797_847_5,
            decode_throughput_alpha: 0.15,
            decode_fixed_step_seconds: 0.010_635_218_423_115_973,
            decode_batch_step_seconds_per_request: 0.000_419_280_369_883_478_4,
            decode_context_step_seconds_per_token: 1.420_458_414_996_201e-7,
        }
    }
}

impl TimingModel {
    /// A model in which every step takes no time (for throughput benchmarks of routers).
    pub fn zero() -> Self {
        TimingModel {
            prefill_intercept_seconds: 0.0,
            prefill_linear_seconds_per_1k_tokens: 0.0,
            prefill_quadratic_seconds_per_1k_tokens_squared: 0.0,
            decode_throughput_alpha: 0.0,
            decode_fixed_step_seconds: 0.0,
            decode_batch_step_seconds_per_request: 0.0,
            decode_context_step_seconds_per_token: 0.0,
        }
    }

    /// Cold prefill of `uncached_tokens` in one go (the spec's formula).
    pub fn cold_prefill_seconds(&self, uncached_tokens: u64) -> f64 {
        self.prefill_intercept_seconds + self.prefill_variable(uncached_tokens)
    }

    /// Cost of computing `chunk` more uncached tokens after `done` uncached tokens of the same
    /// request; the first chunk (`done == 0`) pays the intercept.
    pub fn prefill_chunk_seconds(&self, done: u64, chunk: u64) -> f64 {
        let intercept = if done == 0 {
            self.prefill_intercept_seconds
        } else {
            0.0
        };
        intercept + self.prefill_variable(done + chunk) - self.prefill_variable(done)
    }

    fn prefill_variable(&self, tokens: u64) -> f64 {
        let x = tokens as f64 / 1000.0;
        self.prefill_linear_seconds_per_1k_tokens * x
            + self.prefill_quadratic_seconds_per_1k_tokens_squared * x * x
    }

    /// One decode step for `batch` sequences with `context_tokens` in total.
    pub fn decode_step_seconds(&self, batch: u64, context_tokens: u64) -> f64 {
        if batch == 0 {
            return 0.0;
        }
        self.decode_fixed_step_seconds
            + self.decode_batch_step_seconds_per_request * batch as f64
            + self.decode_context_step_seconds_per_token * context_tokens as f64
    }

    /// Duration of a step with prefill cost `p` and decode cost `d`.
    pub fn mixed_step_seconds(&self, p: f64, d: f64) -> f64 {
        p + d - self.decode_throughput_alpha * p.min(d)
    }

    /// Aggregate decode tokens/s for `batch` sequences (the spec's throughput surface).
    pub fn decode_throughput(&self, batch: u64, context_tokens: u64) -> f64 {
        let step = self.decode_step_seconds(batch, context_tokens);
        if step <= 0.0 {
            f64::INFINITY
        } else {
            batch as f64 / step
        }
    }

    /// Every coefficient by the name of the flag that sets it (`--prefill-intercept-seconds`
    /// and so on), so a harness can start a simulator with this model.
    pub fn flags(&self) -> [(&'static str, f64); 7] {
        [
            ("prefill-intercept-seconds", self.prefill_intercept_seconds),
            (
                "prefill-linear-seconds-per-1k-tokens",
                self.prefill_linear_seconds_per_1k_tokens,
            ),
            (
                "prefill-quadratic-seconds-per-1k-tokens-squared",
                self.prefill_quadratic_seconds_per_1k_tokens_squared,
            ),
            ("decode-throughput-alpha", self.decode_throughput_alpha),
            ("decode-fixed-step-seconds", self.decode_fixed_step_seconds),
            (
                "decode-batch-step-seconds-per-request",
                self.decode_batch_step_seconds_per_request,
            ),
            (
                "decode-context-step-seconds-per-token",
                self.decode_context_step_seconds_per_token,
            ),
        ]
    }

    /// Checks every coefficient against the spec's constraints; the error names the field.
    pub fn validate(&self) -> Result<(), String> {
        for (name, v) in self.flags() {
            if !v.is_finite() || v < 0.0 {
                return Err(format!("{name} must be finite and >= 0 (got {v})"));
            }
        }
        let a = self.decode_throughput_alpha;
        if a > 1.0 {
            return Err(format!(
                "decode-throughput-alpha must be at most 1 (got {a})"
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reference_estimates_match_the_spec() {
        let m = TimingModel::default();
        // The spec quotes ~13.93 s for a 50,000-token cold prefill.
        assert!((m.cold_prefill_seconds(50_000) - 13.93).abs() < 0.01);
        // ... and ~98.23 aggregate tokens/s for batch 4 with 200,000 context tokens.
        assert!((m.decode_throughput(4, 200_000) - 98.23).abs() < 0.01);
    }

    #[test]
    fn chunked_prefill_telescopes_to_the_formula() {
        let m = TimingModel::default();
        let total: f64 = [(0, 2048), (2048, 2048), (4096, 904)]
            .iter()
            .map(|(done, chunk)| m.prefill_chunk_seconds(*done, *chunk))
            .sum();
        assert!((total - m.cold_prefill_seconds(5000)).abs() < 1e-12);
    }

    #[test]
    fn mixed_step_overlap() {
        let mut m = TimingModel {
            decode_throughput_alpha: 0.0,
            ..Default::default()
        };
        assert_eq!(m.mixed_step_seconds(1.0, 0.5), 1.5);
        m.decode_throughput_alpha = 1.0;
        assert_eq!(m.mixed_step_seconds(1.0, 0.5), 1.0);
        assert!(m.validate().is_ok());
        m.decode_throughput_alpha = 1.5;
        assert!(m.validate().unwrap_err().contains("alpha"));
    }
}
