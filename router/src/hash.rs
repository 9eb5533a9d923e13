//! The one non-cryptographic hash the router uses: 64-bit FNV-1a, stable across processes and
//! releases (placement, config hashes and change detection must not depend on a random seed),
//! the one rendezvous (highest random weight) choice and the one consistent-hash ring built on it.

/// 64-bit FNV-1a.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// FNV-1a with a finaliser, so that nearby keys spread evenly (hash rings, rendezvous hashing).
pub fn stable_hash(bytes: &[u8]) -> u64 {
    let mut h = fnv1a(bytes);
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^ (h >> 33)
}

/// The rendezvous weight of `candidate` for `key`: stable, and independent per candidate, so
/// adding or removing a candidate moves only the keys it wins or held. The name breaks ties
/// (astronomically unlikely), so every process picks the same.
pub fn rendezvous_weight<'a>(candidate: &'a str, key: &str) -> (u64, &'a str) {
    let mut bytes = Vec::with_capacity(candidate.len() + key.len() + 1);
    bytes.extend_from_slice(candidate.as_bytes());
    bytes.push(0xff); // never in UTF-8 text: ("ab","c") and ("a","bc") differ
    bytes.extend_from_slice(key.as_bytes());
    (stable_hash(&bytes), candidate)
}

/// Rendezvous hashing: of `candidates` (each a value and its stable name), the one whose weight
/// for `key` is highest; `None` when there is none.
pub fn rendezvous<'a, T>(
    key: &str,
    candidates: impl IntoIterator<Item = (T, &'a str)>,
) -> Option<T> {
    candidates
        .into_iter()
        .max_by_key(|(_, name)| rendezvous_weight(name, key))
        .map(|(v, _)| v)
}

/// A consistent-hash ring: `virtual_nodes` points per member, so that members share keys evenly
/// and removing one moves only the keys it held.
#[derive(Debug, Clone, Default)]
pub struct Ring {
    /// (point, member index), sorted by point.
    points: Vec<(u64, usize)>,
    members: usize,
}

impl Ring {
    /// The ring of `members` (by their stable names), `virtual_nodes` points each.
    pub fn new<'a>(members: impl IntoIterator<Item = &'a str>, virtual_nodes: u32) -> Ring {
        let mut points = Vec::new();
        let mut n = 0;
        for (i, name) in members.into_iter().enumerate() {
            n = i + 1;
            for v in 0..virtual_nodes {
                points.push((stable_hash(format!("{name}#{v}").as_bytes()), i));
            }
        }
        points.sort_unstable();
        Ring { points, members: n }
    }

    /// Members in ring order from `key`'s point (each once): the first is the key's owner, the
    /// next ones take over when it is unavailable.
    pub fn walk(&self, key: &[u8]) -> impl Iterator<Item = usize> + '_ {
        let start = self.points.partition_point(|(p, _)| *p < stable_hash(key));
        let mut seen = vec![false; self.members];
        (0..self.points.len())
            .map(move |i| self.points[(start + i) % self.points.len()].1)
            .filter(move |m| !std::mem::replace(&mut seen[*m], true))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rendezvous_moves_only_the_keys_of_a_removed_candidate() {
        let all = ["a", "b", "c", "d"];
        let keys: Vec<String> = (0..400).map(|i| format!("program-{i}")).collect();
        fn pick(names: &[&'static str], k: &str) -> Option<&'static str> {
            rendezvous(k, names.iter().map(|n| (*n, *n)))
        }
        let mut moved = 0;
        for k in &keys {
            let before = pick(&all, k).expect("a candidate");
            let after = pick(&["a", "b", "d"], k).expect("a candidate");
            if before != "c" {
                assert_eq!(before, after, "{k} moved though its owner stayed");
            } else {
                moved += 1;
            }
        }
        // Each of four candidates wins about a quarter of the keys.
        assert!((60..140).contains(&moved), "{moved}");
        assert_eq!(pick(&[], "k"), None);
        assert_ne!(rendezvous_weight("ab", "c"), rendezvous_weight("a", "bc"));
    }

    #[test]
    fn the_ring_walks_every_member_once_and_removing_one_moves_only_its_keys() {
        let all = ["r0", "r1", "r2", "r3"];
        let ring = Ring::new(all, 160);
        let order: Vec<usize> = ring.walk(b"program-1").collect();
        let mut sorted = order.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, vec![0, 1, 2, 3]);
        let without = Ring::new(["r0", "r1", "r3"], 160);
        let name = |ring: &Ring, names: &[&'static str], k: &str| {
            names[ring.walk(k.as_bytes()).next().expect("a member")]
        };
        let mut counts = [0; 4];
        for k in 0..400 {
            let key = format!("program-{k}");
            let before = name(&ring, &all, &key);
            counts[all.iter().position(|n| *n == before).expect("member")] += 1;
            if before != "r2" {
                assert_eq!(before, name(&without, &["r0", "r1", "r3"], &key), "{key}");
            }
        }
        // 160 points each spread 400 keys within a factor of two of even.
        assert!(counts.iter().all(|c| (50..200).contains(c)), "{counts:?}");
        assert_eq!(Ring::new([], 160).walk(b"k").next(), None);
    }
}
