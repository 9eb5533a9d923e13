//! Entry point of the `render` fuzz target (`router/fuzz/`, `scripts/fuzz.sh`) and of its
//! corpus replay (`operator/tests/fuzz_corpus.rs`): a ProgramScheduling spec from arbitrary
//! bytes is rendered into a router config, and what the operator renders the router loads.

use program_router::config::WorkerConfig;

/// `data` as a ProgramScheduling spec (JSON): rendering never panics, and a rendered config,
/// written as the operator writes it into the ConfigMap, is read back by the router unchanged.
pub fn render(data: &[u8]) {
    let Ok(spec) = serde_json::from_slice::<crate::crd::ProgramSchedulingSpec>(data) else {
        return;
    };
    let workers = vec![
        WorkerConfig {
            url: "http://10.0.0.1:8000".into(),
            dp_rank: Some(0),
        },
        WorkerConfig {
            url: "http://[fd00::2]:8000".into(),
            dp_rank: Some(1),
        },
    ];
    let routers = [
        ("router-0".to_string(), "10.0.0.9".to_string()),
        ("router-1".to_string(), "fd00::9".to_string()),
    ];
    let Ok(cfg) = crate::render::render(&spec, workers, &routers) else {
        return;
    };
    let file = crate::objects::ConfigFile::new(&cfg).expect("a rendered config serializes");
    let again = program_router::config::flags::parse_config(file.json.as_bytes())
        .unwrap_or_else(|e| panic!("the router refuses what the operator rendered: {e}"));
    assert_eq!(again, cfg);
}

#[cfg(test)]
mod tests {
    #[test]
    fn renders_examples_and_refuses_junk() {
        super::render(b"");
        super::render(b"{\"workerSelector\":{}}");
        super::render(
            br#"{"workerSelector":{"matchLabels":{"app":"vllm"}},"router":{"replicas":2,"peerForwarding":true},
                "programScheduling":{"enableKey":"auto"},"fairness":{"tenantHeader":"x-tenant"}}"#,
        );
    }
}
