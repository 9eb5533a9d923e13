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
        }
        identity(br#"{"program_id":"p"}"#);
        metrics(b"vllm:num_requests_running{engine=\"0\"} NaN\nvllm:kv_cache_usage_perc 0.5\n");
        config(br#"{"workers":[{"url":"http://127.0.0.1:9"}]}"#);
        usage(br#"data: {"usage":{"prompt_tokens":3,"completion_tokens":2}}"#);
    }
}
