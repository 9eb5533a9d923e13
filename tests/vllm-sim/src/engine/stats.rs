//! Counters and histograms one engine keeps, in vLLM's units (tokens, simulated seconds).
//!
//! Owns plain numbers only; the HTTP layer turns a snapshot into Prometheus series. Histograms
//! accept weighted observations so that one decode step observes its inter-token latency once for
//! all `B` sequences in O(1).

/// vLLM's bucket bounds for time-to-first-token.
pub const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];
/// vLLM's bucket bounds for time-per-output-token / inter-token latency.
pub const TPOT_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];
/// vLLM's bucket bounds for request-level latencies (e2e, queue time).
pub const REQUEST_LATENCY_BUCKETS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];

/// A fixed-bucket histogram (non-cumulative counts; exposition makes them cumulative).
#[derive(Debug, Clone)]
pub struct Histogram {
    pub bounds: &'static [f64],
    pub counts: Vec<u64>,
    pub count: u64,
    pub sum: f64,
}

impl Histogram {
    pub fn new(bounds: &'static [f64]) -> Self {
        Histogram {
            bounds,
            counts: vec![0; bounds.len()],
            count: 0,
            sum: 0.0,
        }
    }

    /// Observes `value` `weight` times.
    pub fn observe_n(&mut self, value: f64, weight: u64) {
        if weight == 0 || !value.is_finite() {
            return;
        }
        let idx = self.bounds.partition_point(|b| *b < value);
        if let Some(c) = self.counts.get_mut(idx) {
            *c += weight;
        }
        self.count += weight;
        self.sum += value * weight as f64;
    }

    pub fn observe(&mut self, value: f64) {
        self.observe_n(value, 1);
    }

    /// Cumulative counts per bound, as Prometheus exposes them.
    pub fn cumulative(&self) -> Vec<u64> {
        let mut acc = 0;
        self.counts
            .iter()
            .map(|c| {
                acc += c;
                acc
            })
            .collect()
    }
}

/// Everything one engine counts.
#[derive(Debug, Clone)]
pub struct EngineStats {
    /// Prompt tokens of requests that produced their first token.
    pub prompt_tokens: u64,
    /// Of those, tokens served from the prefix cache at first scheduling.
    pub prompt_tokens_cached: u64,
    /// Tokens looked up in the prefix cache (each scheduling of a waiting request).
    pub prefix_cache_queries: u64,
    /// Tokens found in the prefix cache by those look-ups.
    pub prefix_cache_hits: u64,
    pub generation_tokens: u64,
    pub preemptions: u64,
    pub finished_length: u64,
    pub finished_abort: u64,
    pub steps: u64,
    pub ttft: Histogram,
    pub inter_token: Histogram,
    pub e2e: Histogram,
    pub queue_time: Histogram,
}

impl Default for EngineStats {
    fn default() -> Self {
        EngineStats {
            prompt_tokens: 0,
            prompt_tokens_cached: 0,
            prefix_cache_queries: 0,
            prefix_cache_hits: 0,
            generation_tokens: 0,
            preemptions: 0,
            finished_length: 0,
            finished_abort: 0,
            steps: 0,
            ttft: Histogram::new(TTFT_BUCKETS),
            inter_token: Histogram::new(TPOT_BUCKETS),
            e2e: Histogram::new(REQUEST_LATENCY_BUCKETS),
            queue_time: Histogram::new(REQUEST_LATENCY_BUCKETS),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_upper_inclusive_and_cumulative() {
        let mut h = Histogram::new(&[1.0, 2.0]);
        h.observe(1.0);
        h.observe_n(1.5, 3);
        h.observe(9.0); // above every bound: counted in count/sum only (+Inf)
        assert_eq!(h.cumulative(), vec![1, 4]);
        assert_eq!(h.count, 5);
        assert!((h.sum - 14.5).abs() < 1e-12);
    }
}
