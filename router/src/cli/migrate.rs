//! vllm-router flags program-router does not take, each with what to use instead.
//!
//! Owns the table and the lookup; `main` adds the hint to clap's "unexpected argument" error so
//! someone moving a vllm-router command line over learns what to do, not only what failed.

/// (flag, what program-router does instead).
const VLLM_ROUTER_ONLY: &[(&[&str], &str)] = &[
    (
        &["--rate-limit-tokens-per-second"],
        "vllm-router's token-bucket refill rate: program-router caps requests in progress with \
         --max-concurrent-requests (--queue-size, --queue-timeout-secs as in vllm-router), and \
         shares capacity between tenants with `fairness` in its config file (docs/fairness.md)",
    ),
    (
        &[
            "--worker-startup-timeout-secs",
            "--worker-startup-check-interval",
        ],
        "program-router starts at once and answers /readiness with 503 until a worker passes \
         its health check (--health-check-interval-secs; the first check runs at start)",
    ),
    (
        &["--eviction-interval-secs", "--eviction-interval"],
        "the cache_aware tree evicts continuously, bounded by --max-tree-size",
    ),
    (
        &["--request-id-headers"],
        "program-router takes the request id from x-request-id and makes one when it is absent",
    ),
    (
        &["--log-dir"],
        "program-router logs to stderr; --log-format json suits log collectors",
    ),
    (
        &["--cors-allowed-origins"],
        "CORS is not handled: let the ingress in front of the router answer browsers",
    ),
    (
        &[
            "--service-discovery",
            "--selector",
            "--service-discovery-port",
            "--service-discovery-namespace",
            "--vllm-discovery-address",
        ],
        "Kubernetes discovery is the operator's job: a ProgramScheduling resource with a \
         workerSelector finds the worker pods and their global DP ranks (docs/operator.md); \
         without the operator, list the workers in --worker-urls or the config file",
    ),
    (
        &[
            "--vllm-pd-disaggregation",
            "--prefill",
            "--decode",
            "--prefill-policy",
            "--decode-policy",
            "--prefill-selector",
            "--decode-selector",
            "--pd-kv-events",
            "--kv-connector",
            "--mini-lb",
        ],
        "prefill/decode disaggregation is not supported: program-router routes to DP ranks that \
         each serve whole requests",
    ),
    (
        &[
            "--kv-event-source",
            "--kv-event-replay-source",
            "--kv-event-model",
            "--kv-event-block-size",
            "--kv-penalty-disk",
            "--kv-penalty-external",
            "--kv-penalty-host",
            "--kv-aware-session-affinity-ttl-secs",
            "--router-temperature",
        ],
        "KV-event routing is not supported: --policy cache_aware follows prompt prefixes, and \
         Program scheduling keeps a Program's KV on its rank across tool calls",
    ),
    (
        &["--api-key-validation-urls"],
        "client keys are checked by the router itself: --client-api-keys, or \
         client_api_keys_dir (one file per key, e.g. a mounted Secret; docs/security.md)",
    ),
    (
        &["--history-backend"],
        "the Responses API store stays in vLLM; the router sends each follow-up to the server \
         that stored its response (docs/router.md)",
    ),
    (
        &["--enable-igw"],
        "one router serves one model's DP ranks; run a router per model",
    ),
    (
        &[
            "--wasm-middleware",
            "--wasm-middleware-route",
            "--wasm-middleware-sha256",
        ],
        "WASM middleware is not supported",
    ),
];

/// vllm-router policies program-router does not have, with what to use instead.
const VLLM_ROUTER_POLICIES: &[(&str, &str)] = &[
    (
        "kv_aware",
        "KV-event routing is not supported: cache_aware follows prompt prefixes, and Program \
         scheduling keeps a Program's KV on its rank",
    ),
    (
        "sticky_least_loaded",
        "consistent_hash keeps a session on one rank; Program scheduling binds each Program to \
         the least loaded rank (binding_strategy least_program_count)",
    ),
    (
        "rendezvous_hash",
        "consistent_hash keeps a session on one rank (Program scheduling's consistent_hash \
         binding is rendezvous hashing)",
    ),
];

/// What to use instead of vllm-router's `--policy` value `value`.
pub fn policy_hint(value: &str) -> Option<&'static str> {
    VLLM_ROUTER_POLICIES
        .iter()
        .find(|(p, _)| *p == value)
        .map(|(_, hint)| *hint)
}

/// What to use instead of `flag` (as clap reports it, e.g. `--queue-size` or `--queue-size=5`),
/// when it is a vllm-router flag program-router does not take.
pub fn vllm_router_hint(flag: &str) -> Option<&'static str> {
    let name = flag.split('=').next().unwrap_or(flag);
    VLLM_ROUTER_ONLY
        .iter()
        .find(|(flags, _)| flags.contains(&name))
        .map(|(_, hint)| *hint)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_flags_get_a_hint_and_others_none() {
        assert!(
            vllm_router_hint("--rate-limit-tokens-per-second")
                .is_some_and(|h| h.contains("--max-concurrent-requests"))
        );
        assert!(vllm_router_hint("--rate-limit-tokens-per-second=64").is_some());
        assert!(vllm_router_hint("--service-discovery").is_some_and(|h| h.contains("operator")));
        assert_eq!(vllm_router_hint("--no-such-flag"), None);
    }

    #[test]
    fn every_vllm_router_flag_is_taken_or_refused_with_a_hint() {
        use clap::CommandFactory;
        let cmd = crate::cli::Cli::command();
        let listed = include_str!("../../../tests/reference/vllm-router-0.1.17-flags.txt");
        let flags: Vec<&str> = listed.lines().filter(|l| l.starts_with("--")).collect();
        assert!(flags.len() > 60, "{flags:?}");
        let named = ["--api-key-validation-urls"];
        let mut bare = Vec::new();
        for f in flags
            .iter()
            .chain(named.iter())
            .chain(["--history-backend"].iter())
        {
            let name = f.trim_start_matches("--");
            let taken = cmd.get_arguments().any(|a| a.get_long() == Some(name));
            if !taken && vllm_router_hint(f).is_none() {
                bare.push(*f);
            }
        }
        assert!(
            bare.is_empty(),
            "vllm-router flags that end in a bare error: {bare:?}"
        );
        for p in ["kv_aware", "sticky_least_loaded", "rendezvous_hash"] {
            assert!(policy_hint(p).is_some(), "{p}");
        }
        assert_eq!(policy_hint("round_robin"), None);
    }

    #[test]
    fn no_hinted_flag_is_one_program_router_takes() {
        use clap::CommandFactory;
        let cmd = crate::cli::Cli::command();
        for (flags, _) in VLLM_ROUTER_ONLY {
            for f in *flags {
                let name = f.trim_start_matches("--");
                assert!(
                    cmd.get_arguments().all(|a| a.get_long() != Some(name)),
                    "{f} is a program-router flag now: drop its hint"
                );
            }
        }
    }
}
