//! Entry points of the fuzz targets (`router/fuzz/`, `scripts/fuzz.sh`) and of the corpus
//! replay test (`router/tests/fuzz_corpus.rs`): each takes arbitrary bytes, drives one parser of
//! untrusted input, and panics only when an invariant of that parser breaks.

use bytes::Bytes;

use crate::config::AgenticContextMode;

/// A client's request body: peek, then every rewrite the router may apply. What the router
/// forwards after an edit must still be JSON.
pub fn request(data: &[u8]) {
    let Ok(peeked) = crate::proxy::request::peek(data) else {
        return;
    };
    let _ = crate::proxy::request::hash_key(&http::HeaderMap::new(), &peeked);
    let modes = [
        AgenticContextMode::Strip,
        AgenticContextMode::JsonString,
        AgenticContextMode::Passthrough,
    ];
    for mode in modes {
        for usage in [false, true] {
            let body = Bytes::copy_from_slice(data);
            if let Ok(out) = crate::proxy::request::rewrite(body, &peeked, mode, usage) {
                let parsed = serde_json::from_slice::<serde::de::IgnoredAny>(&out.body);
                assert!(
                    parsed.is_ok(),
                    "a rewrite produced invalid JSON ({mode:?}, {usage})"
                );
            }
        }
    }
}

/// Program identity from `agentic_context`, as an object and as its JSON-string form.
pub fn identity(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let as_string = serde_json::Value::String(text.to_string());
    let _ = crate::program::identity::from_agentic_context(&as_string);
    if let Ok(v) = serde_json::from_str::<serde_json::Value>(text)
        && let Ok(id) = crate::program::identity::from_agentic_context(&v)
    {
        // The object and its JSON-string form name the same Program.
        let again = crate::program::identity::from_agentic_context(&as_string);
        if let Ok(again) = again {
            assert_eq!(again.program_id, id.program_id);
        }
    }
}

/// A backend's `/metrics`: every value the router keeps is finite, and in range where it has one.
pub fn metrics(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    for s in crate::observe::scrape::samples(&text) {
        let _ = s.label("engine");
    }
    for e in crate::observe::scrape::parse_vllm_metrics(&text).values() {
        for v in [e.running, e.waiting, e.kv_usage, e.itl_sum, e.itl_count] {
            assert!(v.is_finite(), "{e:?}");
        }
    }
}

/// A config file: a file that parses and validates round-trips through its own serialization,
/// and its hash does not depend on the order of the fields it was written in.
pub fn config(data: &[u8]) {
    let Ok(cfg) = crate::config::flags::parse_config(data) else {
        return;
    };
    if cfg.validate().is_err() {
        return;
    }
    let json = serde_json::to_vec(&cfg).expect("a config serializes");
    let again = crate::config::flags::parse_config(&json).expect("a serialized config parses");
    assert_eq!(again, cfg);
    assert_eq!(again.hash(), cfg.hash());
}

/// A streamed response's events and a JSON body's tail: usage is read or not, never a panic,
/// and a usage that is read has its token counts.
pub fn usage(data: &[u8]) {
    let _ = crate::proxy::relay::sse_usage(data);
    let _ = crate::proxy::relay::usage_in_json_tail(data);
}

/// Another replica's quota-use document (`/peers/usage`), read twice as successive reads of
/// one member: every charge is finite, requests never negative (tokens may be: a give-back of
/// an admission estimate), and the same totals read twice charge nothing.
pub fn peer_usage(data: &[u8]) {
    let Ok(doc) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    let now = std::time::Instant::now();
    let (first, seen) = crate::peers::exchange::read_usage(None, &doc, now);
    let (again, _) = crate::peers::exchange::read_usage(Some(&seen), &doc, now);
    for (tenant, requests, tokens) in first.iter().chain(&again) {
        assert!(
            requests.is_finite() && tokens.is_finite() && *requests >= 0.0,
            "{tenant}: {requests} {tokens}"
        );
    }
    assert!(
        again.is_empty(),
        "the same totals read twice charge nothing: {again:?}"
    );
}

/// The Program scheduler under an arbitrary event sequence decoded from `data` (arrivals with
/// any identity values, completions with any usage, cancels, observations, ticks): its ledger
/// invariants hold after every event.
pub fn scheduler(data: &[u8]) {
    use crate::program::scheduler::{Arrival, Decision, Observation, Scheduler, Usage};
    let cfg = crate::config::ProgramSchedulingConfig {
        token_capacity_per_dp_rank: Some(4096),
        global_queue: data.first().is_some_and(|b| b & 1 == 1),
        ..Default::default()
    };
    let mut s = Scheduler::new(cfg, vec!["r0".into(), "r1".into(), "r2".into()]);
    let mut now = 0.0;
    let mut next = 1u64;
    let mut running: Vec<u64> = Vec::new();
    let mut waiting: Vec<u64> = Vec::new();
    let word = |c: &[u8], i: usize| u64::from(c.get(i).copied().unwrap_or(0));
    for c in data.get(1..).unwrap_or_default().chunks(4) {
        let out = match c[0] % 6 {
            0 | 1 => {
                let mut identity = crate::program::identity::Identity {
                    program_id: format!("p{}", word(c, 1) % 8),
                    expected_resume: word(c, 2) % 4 != 0,
                    ..Default::default()
                };
                identity.priority = i64::from(c.get(2).copied().unwrap_or(0) as i8) << 56;
                identity.kv_retention_ttl_seconds =
                    (word(c, 3) % 3 == 0).then(|| word(c, 3) as f64);
                identity.deadline_seconds = (word(c, 3) % 5 == 0).then(|| word(c, 2) as f64);
                let ticket = next;
                next += 1;
                waiting.push(ticket);
                s.on_arrival(
                    now,
                    Arrival {
                        ticket,
                        model: "m".into(),
                        identity,
                        prompt_tokens: (word(c, 1) << 8 | word(c, 3)) * 4,
                        tenant: None,
                        prefix: Vec::new(),
                    },
                )
            }
            2 if !running.is_empty() => {
                let t = running.remove(word(c, 1) as usize % running.len());
                let usage = (word(c, 2) % 4 != 0).then(|| Usage {
                    prompt_tokens: word(c, 2) << (word(c, 3) % 48),
                    completion_tokens: word(c, 3) * 8,
                    cached_tokens: word(c, 1) * 16,
                });
                s.on_complete(now, t, usage)
            }
            3 if !waiting.is_empty() || !running.is_empty() => {
                let all: Vec<u64> = waiting.iter().chain(&running).copied().collect();
                let t = all[word(c, 1) as usize % all.len()];
                waiting.retain(|x| *x != t);
                running.retain(|x| *x != t);
                s.on_cancel(now, t)
            }
            4 => {
                let o = Observation {
                    waiting: word(c, 2) as f64,
                    running: word(c, 3) as f64,
                    kv_usage: word(c, 1) as f64 / 200.0,
                    token_capacity: (word(c, 2) % 2 == 0).then(|| word(c, 3) << 20),
                };
                s.on_observation(now, (word(c, 1) % 3) as usize, o)
            }
            _ => {
                now += word(c, 1) as f64 / 4.0;
                s.on_tick(now)
            }
        };
        for d in out {
            match d {
                Decision::Dispatch { ticket, .. } => {
                    waiting.retain(|x| *x != ticket);
                    running.push(ticket);
                }
                Decision::Reject { ticket, .. } => waiting.retain(|x| *x != ticket),
            }
        }
        if let Err(e) = s.check_invariants() {
            panic!("after {c:?} at {now}: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_entry_point_takes_bad_and_good_input() {
        let good = br#"{"model":"m","messages":[{"role":"user","content":"x"}],"stream":true,
            "vllm_xargs":{"agentic_context":{"program_id":"p","step_id":1}}}"#;
        for input in [&good[..], b"", b"{", b"\xff\xfe", b"[1,2", b"{\"model\":1}"] {
            request(input);
            identity(input);
            metrics(input);
            config(input);
            usage(input);
            peer_usage(input);
            scheduler(input);
        }
        peer_usage(br#"{"epoch":"e","age_secs":1,"tenants":{"t":[3,100],"u":[-1,"x"]}}"#);
        scheduler(&[
            1, 0, 1, 2, 3, 0, 2, 9, 9, 4, 1, 1, 1, 2, 0, 1, 1, 5, 40, 0, 0,
        ]);
        identity(br#"{"program_id":"p"}"#);
        metrics(b"vllm:num_requests_running{engine=\"0\"} NaN\nvllm:kv_cache_usage_perc 0.5\n");
        config(br#"{"workers":[{"url":"http://127.0.0.1:9"}]}"#);
        usage(br#"data: {"usage":{"prompt_tokens":3,"completion_tokens":2}}"#);
    }
}
