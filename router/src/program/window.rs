//! Rolling windows of samples and the Progress-TTL rule that reads them.
//!
//! Owns a fixed-size window (the spec's `stats_window_size`: estimates stay inactive until it is
//! full) and the TTL choice `τ* = argmax_τ F(τ)·B − c·H(τ)` over the observed tool-call
//! intervals, where `F` is their empirical CDF, `B` the cache-miss impact in seconds, `c` what a
//! held second costs and `H(τ)` how long a hold is charged for (`τ` in the spec).

use std::collections::VecDeque;

/// A fixed-capacity window of the most recent samples.
#[derive(Debug, Clone)]
pub struct Window {
    cap: usize,
    samples: VecDeque<f64>,
    sum: f64,
}

impl Window {
    pub fn new(cap: usize) -> Self {
        Window {
            cap: cap.max(1),
            samples: VecDeque::with_capacity(cap.max(1)),
            sum: 0.0,
        }
    }

    pub fn push(&mut self, v: f64) {
        if !v.is_finite() {
            return;
        }
        if self.samples.len() == self.cap
            && let Some(old) = self.samples.pop_front()
        {
            self.sum -= old;
        }
        self.samples.push_back(v);
        self.sum += v;
    }

    pub fn len(&self) -> usize {
        self.samples.len()
    }

    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    /// Full: the estimates built on this window are active.
    pub fn complete(&self) -> bool {
        self.samples.len() >= self.cap
    }

    pub fn mean(&self) -> Option<f64> {
        (!self.samples.is_empty()).then(|| self.sum / self.samples.len() as f64)
    }

    /// The samples' (population) variance.
    pub fn variance(&self) -> Option<f64> {
        let mean = self.mean()?;
        let n = self.samples.len() as f64;
        Some(self.samples.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n)
    }

    /// The largest sample.
    pub fn max(&self) -> Option<f64> {
        self.samples.iter().copied().reduce(f64::max)
    }

    /// The samples in ascending order.
    pub fn sorted(&self) -> Vec<f64> {
        let mut v: Vec<f64> = self.samples.iter().copied().collect();
        v.sort_by(f64::total_cmp);
        v
    }
}

/// Per-request measurements of a rank's latest completions, for the diagnostics' rolling means.
#[derive(Debug, Clone)]
pub struct RequestWindows {
    pub prompt_tokens: Window,
    pub completion_tokens: Window,
    pub cached_tokens: Window,
    pub cached_ratio: Window,
    /// Dispatch to completion, and time waited in the pool before dispatch.
    pub e2e_seconds: Window,
    pub queue_seconds: Window,
}

impl RequestWindows {
    pub fn new(cap: usize) -> Self {
        RequestWindows {
            prompt_tokens: Window::new(cap),
            completion_tokens: Window::new(cap),
            cached_tokens: Window::new(cap),
            cached_ratio: Window::new(cap),
            e2e_seconds: Window::new(cap),
            queue_seconds: Window::new(cap),
        }
    }

    pub fn push(&mut self, prompt: u64, completion: u64, cached: u64, e2e: f64, queue: f64) {
        self.prompt_tokens.push(prompt as f64);
        self.completion_tokens.push(completion as f64);
        self.cached_tokens.push(cached as f64);
        self.cached_ratio.push(if prompt == 0 {
            0.0
        } else {
            cached as f64 / prompt as f64
        });
        self.e2e_seconds.push(e2e);
        self.queue_seconds.push(queue);
    }
}

/// Request and token throughput of a rank over its most recent completions (at most `cap`).
#[derive(Debug, Clone)]
pub struct Throughput {
    cap: usize,
    /// (completion time, tokens processed by that request: prompt + completion).
    samples: VecDeque<(f64, u64)>,
    tokens: u64,
}

impl Throughput {
    pub fn new(cap: usize) -> Self {
        Throughput {
            cap: cap.max(2),
            samples: VecDeque::with_capacity(cap.max(2)),
            tokens: 0,
        }
    }

    pub fn push(&mut self, at: f64, tokens: u64) {
        if !at.is_finite() {
            return;
        }
        if self.samples.len() == self.cap
            && let Some((_, old)) = self.samples.pop_front()
        {
            self.tokens -= old;
        }
        self.samples.push_back((at, tokens));
        self.tokens += tokens;
    }

    pub fn len(&self) -> usize {
        self.samples.len()
    }

    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    fn span(&self) -> Option<f64> {
        let (first, last) = (self.samples.front()?.0, self.samples.back()?.0);
        (self.samples.len() >= 2 && last > first).then_some(last - first)
    }

    /// Completions per second between the first and the last sample.
    pub fn requests_per_second(&self) -> Option<f64> {
        self.span().map(|s| (self.samples.len() - 1) as f64 / s)
    }

    /// Tokens per second between the first and the last sample (the first sample's tokens were
    /// processed before the span began).
    pub fn tokens_per_second(&self) -> Option<f64> {
        let first = self.samples.front()?.1;
        self.span().map(|s| (self.tokens - first) as f64 / s)
    }
}

/// `argmax_τ F(τ)·B − c·H(τ)` over `τ ∈ {0} ∪ samples`, `τ ≤ cap` (samples ascending), with `c`
/// the cost of a second held (1 in the spec) and `H(τ)` the seconds a hold is charged for:
/// `reserved_share` × `τ` (the whole TTL; 1 in the spec) + the rest × the hold's expected length
/// `E[min(gap, τ)]` over the samples (a Program back within the TTL held only its gap).
pub fn best_ttl(
    sorted_intervals: &[f64],
    miss_impact_seconds: f64,
    cap: f64,
    c: f64,
    reserved_share: f64,
) -> f64 {
    let n = sorted_intervals.len();
    if n == 0 || miss_impact_seconds <= 0.0 || cap <= 0.0 {
        return 0.0;
    }
    let (mut best_tau, mut best_utility) = (0.0, 0.0);
    // The sum of the intervals within τ, grown as τ rises.
    let (mut summed, mut within) = (0, 0.0);
    for (i, tau) in sorted_intervals.iter().enumerate() {
        if *tau > cap {
            break;
        }
        // F(τ): share of intervals that end within τ (ties included).
        let covered = sorted_intervals[i..]
            .iter()
            .take_while(|x| *x <= tau)
            .count()
            + i;
        let held = if reserved_share >= 1.0 {
            *tau
        } else {
            within += sorted_intervals[summed..covered].iter().sum::<f64>();
            summed = covered;
            let expected = (within + (n - covered) as f64 * tau) / n as f64;
            reserved_share.max(0.0) * tau + (1.0 - reserved_share.max(0.0)) * expected
        };
        let utility = covered as f64 / n as f64 * miss_impact_seconds - c * held;
        if utility > best_utility {
            best_utility = utility;
            best_tau = *tau;
        }
    }
    best_tau
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The whole TTL charged, as in the spec.
    const R: f64 = 1.0;

    #[test]
    fn window_keeps_the_newest_and_reports_completion() {
        let mut w = Window::new(3);
        for v in [1.0, 2.0, 3.0, 4.0] {
            w.push(v);
        }
        assert!(w.complete());
        assert_eq!(w.sorted(), vec![2.0, 3.0, 4.0]);
        assert_eq!(w.mean(), Some(3.0));
        // Of the kept samples only: ((2-3)² + 0 + (4-3)²) / 3.
        assert_eq!(w.variance(), Some(2.0 / 3.0));
        assert_eq!(Window::new(3).variance(), None);
    }

    #[test]
    fn throughput_over_the_newest_completions() {
        let mut t = Throughput::new(3);
        assert_eq!(t.requests_per_second(), None);
        t.push(0.0, 1000);
        assert_eq!(t.requests_per_second(), None, "one sample has no span");
        t.push(1.0, 100);
        t.push(2.0, 300);
        assert_eq!(t.requests_per_second(), Some(1.0));
        assert_eq!(t.tokens_per_second(), Some(200.0));
        // The oldest falls out: samples at 1, 2, 5.
        t.push(5.0, 600);
        assert_eq!(t.requests_per_second(), Some(0.5));
        assert_eq!(t.tokens_per_second(), Some(225.0));
    }

    #[test]
    fn ttl_covers_short_gaps_when_misses_are_expensive() {
        // 80 % of tool calls end within 2 s, the rest take 60 s.
        let mut v: Vec<f64> = (0..80).map(|i| 0.5 + 1.5 * i as f64 / 80.0).collect();
        v.extend(std::iter::repeat_n(60.0, 20));
        v.sort_by(f64::total_cmp);
        let tau = best_ttl(&v, 10.0, 30.0, 1.0, R);
        assert!((1.9..=2.0).contains(&tau), "tau {tau}");
        // Cheap misses are not worth holding KV for.
        assert_eq!(best_ttl(&v, 0.5, 30.0, 1.0, R), 0.0);
        // The cap bounds the choice.
        assert!(best_ttl(&v, 1000.0, 1.0, 1.0, R) <= 1.0);
        assert_eq!(best_ttl(&[], 10.0, 10.0, 1.0, R), 0.0);
    }

    #[test]
    fn cheaper_holding_covers_longer_gaps() {
        // Half the tool calls end within 2 s, a third at 20 s, the rest at 60 s.
        let mut v: Vec<f64> = (0..50).map(|i| 0.5 + 1.5 * f64::from(i) / 50.0).collect();
        v.extend(std::iter::repeat_n(20.0, 33));
        v.extend(std::iter::repeat_n(60.0, 17));
        v.sort_by(f64::total_cmp);
        // A second held costing a second: covering the 20 s calls (+3.3 s) is not worth 18 s more.
        assert_eq!(best_ttl(&v, 10.0, 30.0, 1.0, R), 2.0 - 1.5 / 50.0);
        // At a tenth of that (a Program holding a tenth of its rank's KV) it is: 8.3 − 2 > 5 − 0.2.
        assert_eq!(best_ttl(&v, 10.0, 30.0, 0.1, R), 20.0);
        // Nothing costs nothing: the longest gap under the cap.
        assert_eq!(best_ttl(&v, 10.0, 30.0, 0.0, R), 20.0);
    }

    #[test]
    fn charging_the_expected_hold_covers_gaps_the_whole_ttl_would_not() {
        // 80 % of tool calls end at 1 s, the rest at 10 s; a miss costs 10 s.
        let mut v = vec![1.0; 80];
        v.extend(std::iter::repeat_n(10.0, 20));
        // Charged the whole TTL, covering the 10 s calls earns 2 s for 9 s more held.
        assert_eq!(best_ttl(&v, 10.0, 30.0, 1.0, R), 1.0);
        // Charged what the hold lasts (8 of 10 Programs are back after 1 s): 10 − 2.8 > 8 − 1.
        assert_eq!(best_ttl(&v, 10.0, 30.0, 1.0, 0.0), 10.0);
        // Half charged as the whole TTL: 10 − (5 + 1.4) < 8 − 1.
        assert_eq!(best_ttl(&v, 10.0, 30.0, 1.0, 0.5), 1.0);
        // Both agree where nothing comes back early enough to matter, and the cap holds.
        assert_eq!(best_ttl(&v, 0.5, 30.0, 1.0, 0.0), 0.0);
        assert!(best_ttl(&v, 1000.0, 5.0, 1.0, 0.0) <= 5.0);
    }
}
