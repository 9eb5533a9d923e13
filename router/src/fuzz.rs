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
    // The bytes that name the Program's kind: inside the body, at most SCAN_BYTES of it.
    if let Some(r) = peeked.system(data) {
        assert!(
            r.start <= r.end && r.end <= data.len(),
            "system range {r:?} outside the body"
        );
        assert!(r.len() <= crate::proxy::system_prompt::SCAN_BYTES);
    }
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

/// One sample as a reference parser reads it: name, labels, value.
pub type ReferenceSample = (String, Vec<(String, String)>, f64);

/// [`metrics`], and differentially: where `reference` (a strict Prometheus text parser; the
/// fuzz target and the corpus replay pass `openmetrics-parser`) accepts the exposition, every
/// gauge, counter and untyped sample it reads is read by the router's scanner too, with the same
/// value and the same label values (except those that may come from an escape — a quote, a
/// backslash, a newline — which the scanner keeps raw).
pub fn metrics_against(data: &[u8], reference: impl Fn(&str) -> Option<Vec<ReferenceSample>>) {
    metrics(data);
    let text = String::from_utf8_lossy(data);
    // Lines end at LF (CRLF too, for the scanner); a lone CR is no line end in the exposition
    // format, but the reference parser splits lines at it. Such text is not compared.
    let lone_cr = text
        .match_indices('\r')
        .any(|(i, _)| text.as_bytes().get(i + 1) != Some(&b'\n'));
    // Quoted (UTF-8) metric and label names, `{"name"} 1` or `m{"label"="v"}`, are newer
    // syntax the scanner does not read: no vLLM series uses them. Text that may hold them is
    // not compared.
    let quoted_names = text.match_indices(['{', ',']).any(|(i, _)| {
        text[i + 1..]
            .trim_start_matches([' ', '\t'])
            .starts_with('"')
    });
    let Some(expected) = reference(&text).filter(|_| !lone_cr && !quoted_names) else {
        return;
    };
    // Only names in the classic character set are compared.
    let classic = |n: &str| {
        let mut c = n.chars();
        c.next()
            .is_some_and(|f| f.is_ascii_alphabetic() || f == '_' || f == ':')
            && c.all(|x| x.is_ascii_alphanumeric() || x == '_' || x == ':')
    };
    let expected: Vec<_> = expected.into_iter().filter(|e| classic(&e.0)).collect();
    let ours: Vec<_> = crate::observe::scrape::samples(&text).collect();
    let mut used = vec![false; ours.len()];
    let same = |a: f64, b: f64| a == b || (a.is_nan() && b.is_nan());
    for (name, labels, value) in &expected {
        let found = ours.iter().enumerate().position(|(i, s)| {
            !used[i]
                && s.name == name
                && same(s.value, *value)
                && labels
                    .iter()
                    .filter(|(_, v)| !v.contains(['\\', '"', '\n']))
                    .all(|(k, v)| s.label(k) == Some(v.as_str()))
        });
        match found {
            Some(i) => used[i] = true,
            None => panic!("the reference read {name} {labels:?} {value}; the scanner did not"),
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

/// A streamed response's events (split as the relay splits them) and a JSON body's tail: usage
/// and the first tool call's name are read or not, never a panic, and the tail's usage scanner
/// never answers otherwise than serde.
pub fn usage(data: &[u8]) {
    let _ = crate::proxy::sse::sse_usage(data);
    let _ = crate::proxy::usage::usage_in_json_tail(data);
    if let Some(name) = crate::proxy::tool_call::tool_in_json(data) {
        assert!(
            !name.is_empty() && name.len() <= crate::proxy::tool_call::MAX_NAME_BYTES,
            "a tool name within its bounds: {name:?}"
        );
    }
    assert!(
        crate::proxy::usage::scanner_agrees(data),
        "the usage scanner and serde disagree"
    );
    // The stream split into events as the relay splits it (LF or CRLF lines).
    let mut whole = Vec::new();
    let mut rest = data;
    while let Some(n) = crate::proxy::sse::event_len(rest) {
        assert!(
            n > 0 && n <= rest.len() && rest[n - 1] == b'\n',
            "{n} of {rest:?}"
        );
        let _ = crate::proxy::sse::sse_usage(&rest[..n]);
        whole.push(&rest[..n]);
        rest = &rest[n..];
    }
    // Arriving in chunks (sizes taken from the bytes themselves), the same stream splits into
    // the same events, and no byte is lost or doubled.
    let mut splitter = crate::proxy::sse::SseSplitter::default();
    let mut events = Vec::new();
    let (mut at, mut k) = (0, 0);
    while at < data.len() {
        let end = (at + 1 + usize::from(data[k % data.len()] % 64)).min(data.len());
        k += 1;
        splitter.push(&data[at..end]);
        while let Some(e) = splitter.next_event() {
            events.push(e);
        }
        at = end;
    }
    assert_eq!(events.len(), whole.len(), "chunked and whole splits differ");
    for (a, b) in events.iter().zip(&whole) {
        assert_eq!(&a[..], *b);
    }
    assert_eq!(splitter.rest(), rest);
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
/// any identity values, completions with any usage, cancels, observations, ticks, hand-overs
/// and adoptions, tuning reloads, target-set changes and availability): its ledger invariants
/// hold after every event.
pub fn scheduler(data: &[u8]) {
    use crate::program::scheduler::{Arrival, Decision, HandedOver, Observation, Scheduler, Usage};
    let cfg = crate::config::ProgramSchedulingConfig {
        token_capacity_per_dp_rank: Some(4096),
        global_queue: data.first().is_some_and(|b| b & 1 == 1),
        queue_backfill_depth: data.first().map_or(0, |b| u32::from(b >> 1 & 7)),
        force_resume_engine_grace_seconds: data.first().map_or(60.0, |b| f64::from(b >> 4)),
        ..Default::default()
    };
    let mut s = Scheduler::new(cfg.clone(), vec!["r0".into(), "r1".into(), "r2".into()]);
    let mut handed: Vec<HandedOver> = Vec::new();
    let mut now = 0.0;
    let mut next = 1u64;
    let mut running: Vec<u64> = Vec::new();
    let mut waiting: Vec<u64> = Vec::new();
    let word = |c: &[u8], i: usize| u64::from(c.get(i).copied().unwrap_or(0));
    for c in data.get(1..).unwrap_or_default().chunks(4) {
        let out = match c[0] % 11 {
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
                        // Three system prompts and none: renewals under the same key and not.
                        lead: (word(c, 2) % 4 != 3).then(|| word(c, 2) % 4),
                        system: (word(c, 2) % 4 != 3).then(|| word(c, 2) % 4),
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
                s.on_observation(now, word(c, 1) as usize % s.num_ranks(), o)
            }
            5 => {
                let key = ("m".to_string(), format!("p{}", word(c, 1) % 8));
                let (given, out) = s.hand_over(now, &key);
                handed.extend(given);
                out
            }
            6 => {
                let h = handed.pop().unwrap_or_else(|| HandedOver {
                    model: "m".into(),
                    program_id: format!("p{}", word(c, 1) % 8),
                    root: format!("p{}", word(c, 1) % 8),
                    target: format!("r{}", word(c, 2) % 4),
                    context_tokens: word(c, 3) << (word(c, 2) % 40),
                    idle_seconds: word(c, 3) as f64 / 8.0,
                    finished: word(c, 2) % 3 == 0,
                    called_tool: word(c, 2) % 2 == 0,
                });
                s.adopt(now, &[h]);
                Vec::new()
            }
            7 => {
                let tuned = crate::config::ProgramSchedulingConfig {
                    token_capacity_per_dp_rank: Some((word(c, 1) + 1) << (word(c, 2) % 16)),
                    max_retained_requests: (word(c, 3) % 64) as u32,
                    hash_virtual_nodes: (word(c, 2) % 200) as u32 + 1,
                    resume_most_turns_first_min_queued_ratio: (word(c, 3) % 4) as f64 / 2.0,
                    ..cfg.clone()
                };
                s.reconfigure(now, &tuned).unwrap_or_default()
            }
            8 => {
                let ids: Vec<String> = (0..4)
                    .filter(|i| word(c, 1) >> i & 1 == 1)
                    .map(|i| format!("r{i}"))
                    .collect();
                s.retarget(now, ids)
            }
            9 => s.set_available(now, word(c, 1) as usize % 4, word(c, 2) % 2 == 0),
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

/// The command line: `data` split at NUL bytes into arguments. Parsing never panics; a hint
/// is looked up for every argument (as a failed parse does); a command line that yields a
/// configuration yields a valid one that round-trips through the file format.
pub fn cli(data: &[u8]) {
    use clap::FromArgMatches;
    let args: Vec<String> = std::iter::once("program-router".to_string())
        .chain(
            data.split(|b| *b == 0)
                .map(|a| String::from_utf8_lossy(a).into_owned()),
        )
        .collect();
    for a in &args[1..] {
        let _ = crate::cli::migrate::vllm_router_hint(a.split('=').next().unwrap_or(a));
        let _ = crate::cli::migrate::policy_hint(a);
    }
    // Built once: building the command (every flag's help with its default) costs more than
    // parsing.
    static COMMAND: std::sync::OnceLock<clap::Command> = std::sync::OnceLock::new();
    let command = COMMAND.get_or_init(crate::cli::command).clone();
    let Ok(matches) = command.try_get_matches_from(&args) else {
        return;
    };
    let Ok(cli) = crate::cli::Cli::from_arg_matches(&matches) else {
        return;
    };
    // A file named on the command line is not read here: the `config` target covers files.
    if cli.flags.config.is_some() {
        return;
    }
    let Ok(cfg) = cli.flags.effective(None) else {
        return;
    };
    let json = serde_json::to_vec(&cfg).expect("a config serializes");
    let again = crate::config::flags::parse_config(&json).expect("an effective config parses");
    assert_eq!(again, cfg);
    assert!(again.validate().is_ok(), "an effective config validates");
}

/// Payloads of the peer plane, from `data` as one JSON document: a hand-over answer
/// (`program`), an adopt body (`programs`, taken by a scheduler whose invariants then hold, and
/// whose adopted Programs take their next request), and a member list (`revision`, `members`)
/// — refused unsigned, and when signed with the peer secret adopted only as a valid
/// configuration with the list's revision.
pub fn peers(data: &[u8]) {
    use crate::config::peers::{PeerMember, PeersConfig};
    use crate::program::scheduler::{Arrival, HandedOver, Scheduler};
    let Ok(doc) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    let _ = serde_json::from_value::<Option<HandedOver>>(doc["program"].clone());
    if let Ok(programs) = serde_json::from_value::<Vec<HandedOver>>(doc["programs"].clone()) {
        let cfg = crate::config::ProgramSchedulingConfig {
            token_capacity_per_dp_rank: Some(4096),
            ..Default::default()
        };
        let mut s = Scheduler::new(cfg, vec!["r0".into(), "r1".into()]);
        let taken = s.adopt(0.0, &programs);
        assert!(taken <= programs.len());
        if let Err(e) = s.check_invariants() {
            panic!("after adopting {programs:?}: {e}");
        }
        for (i, h) in programs.iter().enumerate().take(16) {
            let identity = crate::program::identity::Identity {
                program_id: h.program_id.clone(),
                ..Default::default()
            };
            let arrival = Arrival {
                ticket: i as u64 + 1,
                model: h.model.clone(),
                identity,
                prompt_tokens: h.context_tokens.min(1 << 20),
                tenant: None,
                prefix: Vec::new(),
                lead: None,
                system: None,
            };
            let _ = s.on_arrival(1.0 + i as f64, arrival);
            if let Err(e) = s.check_invariants() {
                panic!("after a request of adopted {h:?}: {e}");
            }
        }
    }
    const SECRET: &str = "fuzz-peer-secret-0123456789abcdef0123456789";
    let Ok(key) = crate::peers::PeerKey::new(SECRET) else {
        return;
    };
    let me = PeerMember {
        name: "a".into(),
        url: "http://127.0.0.1:1".into(),
    };
    let mut current = crate::config::RouterConfig {
        workers: vec![crate::config::WorkerConfig {
            url: "http://127.0.0.1:2".into(),
            dp_rank: None,
        }],
        ..Default::default()
    };
    let peers_cfg = PeersConfig {
        self_name: Some("a".into()),
        members: vec![me],
        revision: Some(1),
        ..Default::default()
    };
    current.peers = Some(peers_cfg.clone());
    let peers = crate::peers::Peers::new(&peers_cfg, None, Some(std::sync::Arc::new(key)));
    let unsigned = crate::peers::gossip::adoptable(&current, Some(&peers), &doc);
    if doc.get("signature").is_none() {
        assert!(unsigned.is_err(), "an unsigned list is refused");
    }
    let (Some(revision), Ok(members)) = (
        doc["revision"].as_u64(),
        serde_json::from_value::<Vec<PeerMember>>(doc["members"].clone()),
    ) else {
        return;
    };
    let Some(signature) = crate::peers::gossip::sign(SECRET, revision, &members) else {
        return;
    };
    let signed =
        serde_json::json!({"revision": revision, "members": members, "signature": signature});
    match crate::peers::gossip::adoptable(&current, Some(&peers), &signed) {
        Ok(Some(cfg)) => {
            assert!(revision > 1);
            assert!(cfg.validate().is_ok(), "an adopted list validates");
            let p = cfg.peers.as_ref().expect("peers stay");
            assert_eq!((p.revision, &p.members), (Some(revision), &members));
        }
        Ok(None) => assert!(revision <= 1, "a newer signed list is adopted or refused"),
        Err(_) => {}
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
            cli(input);
            peers(input);
        }
        peer_usage(br#"{"epoch":"e","age_secs":1,"tenants":{"t":[3,100],"u":[-1,"x"]}}"#);
        scheduler(&[
            1, 0, 1, 2, 3, 0, 2, 9, 9, 4, 1, 1, 1, 2, 0, 1, 1, 5, 40, 0, 0,
        ]);
        identity(br#"{"program_id":"p"}"#);
        metrics(b"vllm:num_requests_running{engine=\"0\"} NaN\nvllm:kv_cache_usage_perc 0.5\n");
        config(br#"{"workers":[{"url":"http://127.0.0.1:9"}]}"#);
        usage(br#"data: {"usage":{"prompt_tokens":3,"completion_tokens":2}}"#);
        cli(b"--worker-urls\0http://127.0.0.1:9\0--policy\0cache_aware");
        cli(b"--policy\0power_of_two");
        peers(br#"{"programs":[{"model":"m","program_id":"p","root":"p","target":"r1","context_tokens":900,"idle_seconds":2.5}]}"#);
        peers(br#"{"revision":7,"members":[{"name":"a","url":"http://127.0.0.1:1"},{"name":"b","url":"http://127.0.0.1:3"}]}"#);
    }
}
