//! The one non-cryptographic hash the router uses: 64-bit FNV-1a, stable across processes and
//! releases (placement, config hashes and change detection must not depend on a random seed),
//! and the one rendezvous (highest random weight) choice built on it.

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
}
