//! round_robin: each request goes to the next available target.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::{Policy, RequestInfo};
use crate::workers::TargetState;

#[derive(Default)]
pub struct RoundRobin {
    next: AtomicUsize,
}

impl Policy for RoundRobin {
    fn name(&self) -> &'static str {
        "round_robin"
    }

    fn pick(&self, _req: &RequestInfo<'_>, candidates: &[&Arc<TargetState>]) -> usize {
        self.next.fetch_add(1, Ordering::Relaxed) % candidates.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policies::testing::*;

    #[test]
    fn cycles_evenly() {
        let set = targets(3);
        let p = RoundRobin::default();
        let picks: Vec<_> = (0..6)
            .map(|_| p.pick(&RequestInfo::default(), &all(&set)))
            .collect();
        assert_eq!(picks, [0, 1, 2, 0, 1, 2]);
    }
}
