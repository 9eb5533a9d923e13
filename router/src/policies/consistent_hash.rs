//! consistent_hash: a session key maps to a stable target on a ring of virtual nodes, so the
//! same session keeps its KV cache; removing a target moves only the sessions it held.

use std::sync::Arc;

use super::{Policy, RequestInfo};
use crate::workers::TargetState;

pub struct ConsistentHash {
    ring: crate::hash::Ring,
    /// The target ids, in the ring's member order.
    ids: Vec<String>,
    fallback: super::RoundRobin,
}

impl ConsistentHash {
    pub fn new<'a>(ids: impl Iterator<Item = &'a str>, virtual_nodes: u32) -> Self {
        let ids: Vec<String> = ids.map(String::from).collect();
        ConsistentHash {
            ring: crate::hash::Ring::new(ids.iter().map(String::as_str), virtual_nodes),
            ids,
            fallback: super::RoundRobin::default(),
        }
    }
}

impl Policy for ConsistentHash {
    fn name(&self) -> &'static str {
        "consistent_hash"
    }

    fn reads_hash_key(&self) -> bool {
        true
    }

    fn pick(&self, req: &RequestInfo<'_>, candidates: &[&Arc<TargetState>]) -> usize {
        let Some(key) = req.hash_key else {
            return self.fallback.pick(req, candidates);
        };
        if self.ids.is_empty() {
            return 0;
        }
        // Walk clockwise to the first target that is available.
        for m in self.ring.walk(key.as_bytes()) {
            let id = &self.ids[m];
            if let Some(c) = candidates.iter().position(|t| &t.id == id) {
                return c;
            }
        }
        self.fallback.pick(req, candidates)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policies::testing::*;

    fn pick(p: &ConsistentHash, key: &str, c: &[&Arc<TargetState>]) -> String {
        c[p.pick(
            &RequestInfo {
                hash_key: Some(key),
                prompt: b"",
            },
            c,
        )]
        .id
        .clone()
    }

    #[test]
    fn sticky_balanced_and_minimal_movement() {
        let set = targets(4);
        let p = ConsistentHash::new(set.targets.iter().map(|t| t.id.as_str()), 160);
        let c = all(&set);
        let keys: Vec<String> = (0..4000).map(|i| format!("session-{i}")).collect();
        let before: Vec<String> = keys.iter().map(|k| pick(&p, k, &c)).collect();
        assert_eq!(
            before,
            keys.iter().map(|k| pick(&p, k, &c)).collect::<Vec<_>>(),
            "sticky"
        );
        for t in &set.targets {
            let n = before.iter().filter(|x| **x == t.id).count();
            assert!((700..1300).contains(&n), "{} got {n} of 4000", t.id);
        }
        // Take target 0 out: only its sessions move.
        let fewer: Vec<_> = c[1..].to_vec();
        for (k, b) in keys.iter().zip(&before) {
            let after = pick(&p, k, &fewer);
            if *b != set.targets[0].id {
                assert_eq!(&after, b, "{k} moved although its target stayed");
            }
        }
    }
}
