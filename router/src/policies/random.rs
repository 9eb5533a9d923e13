//! random: a uniformly random available target.

use std::sync::Arc;

use rand::Rng;

use super::{Policy, RequestInfo};
use crate::workers::TargetState;

pub struct Random;

impl Policy for Random {
    fn name(&self) -> &'static str {
        "random"
    }

    fn pick(&self, _req: &RequestInfo<'_>, candidates: &[&Arc<TargetState>]) -> usize {
        rand::rng().random_range(0..candidates.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policies::testing::*;

    #[test]
    fn covers_every_target_roughly_evenly() {
        let set = targets(4);
        let mut counts = [0u32; 4];
        for _ in 0..4000 {
            counts[Random.pick(&RequestInfo::default(), &all(&set))] += 1;
        }
        // 1000 expected each; 5 standard deviations (~137) is far beyond chance.
        assert!(counts.iter().all(|c| (800..1200).contains(c)), "{counts:?}");
    }
}
