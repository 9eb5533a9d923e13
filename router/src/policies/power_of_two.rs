//! power_of_two: sample two targets, send to the less loaded; load is the router's in-flight count
//! plus the backend's reported waiting requests (when observed within three poll intervals).

use std::sync::Arc;
use std::time::Duration;

use rand::Rng;

use super::{Policy, RequestInfo};
use crate::workers::TargetState;

pub struct PowerOfTwo {
    fresh: Duration,
}

impl PowerOfTwo {
    pub fn new(poll_interval_secs: f64) -> Self {
        PowerOfTwo {
            fresh: crate::config::duration(poll_interval_secs * 3.0),
        }
    }

    fn load(&self, t: &TargetState) -> f64 {
        t.in_flight() as f64 + t.observed_waiting(self.fresh).unwrap_or(0.0)
    }
}

impl Policy for PowerOfTwo {
    fn name(&self) -> &'static str {
        "power_of_two"
    }

    fn needs_observation(&self) -> bool {
        true
    }

    fn pick(&self, _req: &RequestInfo<'_>, candidates: &[&Arc<TargetState>]) -> usize {
        let n = candidates.len();
        if n == 1 {
            return 0;
        }
        let mut rng = rand::rng();
        let a = rng.random_range(0..n);
        let b = (a + rng.random_range(1..n)) % n;
        if self.load(candidates[b]) < self.load(candidates[a]) {
            b
        } else {
            a
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policies::testing::*;

    #[test]
    fn avoids_the_busier_of_two() {
        let set = targets(2);
        let _busy: Vec<_> = (0..5).map(|_| set.targets[0].begin()).collect();
        let p = PowerOfTwo::new(1.0);
        for _ in 0..50 {
            assert_eq!(p.pick(&RequestInfo::default(), &all(&set)), 1);
        }
    }
}
