//! Worker pods → DP-rank targets: a pure function, table-tested.
//!
//! A pod counts when it is Ready, has an IP and is not being deleted. Which GLOBAL DP ranks its
//! API server fronts follows vLLM's data-parallel modes (ranks are global, as vLLM checks them):
//!
//! * `--headless` or `--api-server-count 0`: no API server, no targets (a secondary node of an
//!   internally load-balanced deployment; the head's API reaches its engines);
//! * external load balancing, `--data-parallel-rank N`: rank N alone;
//! * hybrid load balancing (`--data-parallel-hybrid-lb`, `--data-parallel-external-lb`, or a
//!   `--data-parallel-start-rank`): its local ranks, `start..start+local` with `local` from
//!   `--data-parallel-size-local` (else `--data-parallel-size`);
//! * internal load balancing (the default): every rank, `0..--data-parallel-size`, whatever
//!   `--data-parallel-size-local` says (the head of a multi-node deployment fronts them all);
//! * no DP flag: the `scheduling.program-router.dev/data-parallel-size` and `-start-rank`
//!   annotations, else one unpinned target.
//!
//! `spec.dataParallel.size` overrides the count of every pod. Flags are read from the
//! containers' command and args, also inside a shell line, in long, short (`-dp`, `-dpl`,
//! `-dpn`, `-dpr`, `-dph`, `-dpe`) or underscore spelling. Two pods claiming the same global
//! rank is an error (the router could not tell them apart), reported with both pod names.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use program_router::config::WorkerConfig;

use crate::crd::{DP_SIZE_ANNOTATION, DP_START_ANNOTATION, ProgramSchedulingSpec};

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DiscoverError {
    #[error("pods {first} and {second} both claim global DP rank {rank}")]
    DuplicateRank {
        rank: u32,
        first: String,
        second: String,
    },
    #[error("pod {pod}: {message}")]
    BadPod { pod: String, message: String },
}

fn ready(p: &Pod) -> bool {
    p.metadata.deletion_timestamp.is_none()
        && p.status.as_ref().is_some_and(|s| {
            s.conditions
                .as_ref()
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        })
}

/// The words of a pod's containers' command and args, each entry split on whitespace (so a
/// shell line `sh -c "vllm serve ... -dp 4"` reads like a list), long flags with underscores
/// spelt with dashes as vLLM's parser accepts them.
fn words(p: &Pod) -> Vec<Vec<String>> {
    let Some(spec) = p.spec.as_ref() else {
        return Vec::new();
    };
    spec.containers
        .iter()
        .map(|c| {
            c.command
                .iter()
                .flatten()
                .chain(c.args.iter().flatten())
                .flat_map(|entry| entry.split_whitespace())
                .map(|w| match w.strip_prefix("--") {
                    Some(rest) => {
                        let (flag, value) = rest
                            .split_once('=')
                            .map_or((rest, None), |(f, v)| (f, Some(v)));
                        let flag = flag.replace('_', "-");
                        match value {
                            Some(v) => format!("--{flag}={v}"),
                            None => format!("--{flag}"),
                        }
                    }
                    None => w.to_string(),
                })
                .collect()
        })
        .collect()
}

/// The value of `--flag N`, `--flag=N` (or `short N`) in any container.
fn arg(words: &[Vec<String>], long: &str, short: &str) -> Option<String> {
    for words in words {
        for (i, w) in words.iter().enumerate() {
            if let Some(v) = w.strip_prefix(&format!("{long}=")) {
                return Some(v.to_string());
            }
            if (w == long || w == short)
                && let Some(v) = words.get(i + 1)
            {
                return Some(v.clone());
            }
        }
    }
    None
}

/// Whether a boolean flag is on in any container (`--flag`, `short`, `--flag=true`).
fn flag(words: &[Vec<String>], long: &str, short: Option<&str>) -> bool {
    words.iter().flatten().any(|w| {
        w == long
            || Some(w.as_str()) == short
            || w.strip_prefix(&format!("{long}="))
                .is_some_and(|v| v.eq_ignore_ascii_case("true"))
    })
}

fn annotation(p: &Pod, key: &str) -> Option<String> {
    p.metadata.annotations.as_ref()?.get(key).cloned()
}

fn number(pod: &str, what: &str, v: Option<String>) -> Result<Option<u32>, DiscoverError> {
    v.map(|s| {
        s.trim().parse::<u32>().map_err(|_| DiscoverError::BadPod {
            pod: pod.to_string(),
            message: format!("{what} is not a non-negative integer: {s:?}"),
        })
    })
    .transpose()
}

/// How many ranks a pod's API server fronts and the first, each `None` when nothing says.
type Ranks = (Option<u32>, Option<u32>);

/// The ranks a pod's API server fronts (see the module doc); `None` when the pod runs no API
/// server.
fn api_ranks(
    spec: &ProgramSchedulingSpec,
    p: &Pod,
    name: &str,
) -> Result<Option<Ranks>, DiscoverError> {
    let w = words(p);
    let num = |long: &str, short: &str| number(name, long, arg(&w, long, short));
    if flag(&w, "--headless", None) || num("--api-server-count", "-asc")? == Some(0) {
        return Ok(None);
    }
    let explicit = spec
        .data_parallel
        .as_ref()
        .and_then(|d| d.size)
        .map(|n| u32::try_from(n).unwrap_or(1));
    let size = num("--data-parallel-size", "-dp")?;
    let local = num("--data-parallel-size-local", "-dpl")?;
    let start = num("--data-parallel-start-rank", "-dpr")?;
    if let Some(rank) = num("--data-parallel-rank", "-dpn")? {
        return Ok(Some((explicit.or(Some(1)), Some(rank))));
    }
    let hybrid = start.is_some()
        || flag(&w, "--data-parallel-hybrid-lb", Some("-dph"))
        || flag(&w, "--data-parallel-external-lb", Some("-dpe"));
    let start = match start {
        Some(s) => Some(s),
        None => number(
            name,
            DP_START_ANNOTATION,
            annotation(p, DP_START_ANNOTATION),
        )?,
    };
    let count = match (explicit, hybrid) {
        (Some(n), _) => Some(n),
        (None, true) => local.or(size),
        (None, false) => size,
    };
    let count = match count {
        Some(n) => Some(n),
        None => number(name, DP_SIZE_ANNOTATION, annotation(p, DP_SIZE_ANNOTATION))?,
    };
    Ok(Some((count, start)))
}

/// The targets of `pods` under `spec`, sorted by URL and rank.
pub fn discover(
    spec: &ProgramSchedulingSpec,
    pods: &[Pod],
) -> Result<Vec<WorkerConfig>, DiscoverError> {
    let mut owners: BTreeMap<u32, String> = BTreeMap::new();
    let mut out = Vec::new();
    for p in pods.iter().filter(|p| ready(p)) {
        let Some(ip) = p
            .status
            .as_ref()
            .and_then(|s| s.pod_ip.clone())
            .filter(|ip| !ip.is_empty())
        else {
            continue;
        };
        let name = p.metadata.name.clone().unwrap_or_default();
        let Some((local, start)) = api_ranks(spec, p, &name)? else {
            continue; // no API server on this pod
        };
        let host = if ip.contains(':') {
            format!("[{ip}]")
        } else {
            ip
        };
        let url = format!("http://{host}:{}", spec.worker_port);
        match (local, start) {
            (None | Some(1), None) => out.push(WorkerConfig { url, dp_rank: None }),
            (Some(0), _) => {
                return Err(DiscoverError::BadPod {
                    pod: name,
                    message: "data-parallel size 0".into(),
                });
            }
            (local, start) => {
                let (local, start) = (local.unwrap_or(1), start.unwrap_or(0));
                for r in start..start + local {
                    if let Some(first) = owners.insert(r, name.clone()) {
                        return Err(DiscoverError::DuplicateRank {
                            rank: r,
                            first,
                            second: name,
                        });
                    }
                    out.push(WorkerConfig {
                        url: url.clone(),
                        dp_rank: Some(r),
                    });
                }
            }
        }
    }
    out.sort_by(|a, b| (&a.url, a.dp_rank).cmp(&(&b.url, b.dp_rank)));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Container, PodCondition, PodSpec, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, Time};

    fn pod(
        name: &str,
        ip: Option<&str>,
        ready: bool,
        args: &[&str],
        annotations: &[(&str, &str)],
    ) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                annotations: Some(
                    annotations
                        .iter()
                        .map(|(k, v)| ((*k).into(), (*v).into()))
                        .collect(),
                ),
                ..Default::default()
            },
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "vllm".into(),
                    args: Some(args.iter().map(|a| (*a).into()).collect()),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            status: Some(PodStatus {
                pod_ip: ip.map(Into::into),
                conditions: Some(vec![PodCondition {
                    type_: "Ready".into(),
                    status: if ready { "True" } else { "False" }.into(),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
        }
    }

    fn spec() -> ProgramSchedulingSpec {
        ProgramSchedulingSpec {
            worker_selector: LabelSelector::default(),
            worker_port: 8000,
            data_parallel: None,
            router: Default::default(),
            program_scheduling: None,
            api_key_secret_ref: None,
            client_api_keys_secret_ref: None,
            client_api_keys_secret: None,
            fairness: None,
        }
    }

    fn ids(w: &[WorkerConfig]) -> Vec<String> {
        w.iter()
            .map(|w| format!("{}@{:?}", w.url, w.dp_rank))
            .collect()
    }

    #[test]
    fn table() {
        let cases: Vec<(&str, Vec<Pod>, Vec<&str>)> = vec![
            (
                "no DP: one unpinned target",
                vec![pod("a", Some("10.0.0.1"), true, &[], &[])],
                vec!["http://10.0.0.1:8000@None"],
            ),
            (
                "hybrid load balancing: each node's API fronts its local ranks",
                vec![
                    pod(
                        "a",
                        Some("10.0.0.1"),
                        true,
                        &[
                            "--data-parallel-hybrid-lb",
                            "--data-parallel-size",
                            "4",
                            "--data-parallel-size-local",
                            "2",
                        ],
                        &[],
                    ),
                    pod(
                        "b",
                        Some("10.0.0.2"),
                        true,
                        &[
                            "--data-parallel-size=4",
                            "--data-parallel-size-local=2",
                            "--data-parallel-start-rank=2",
                        ],
                        &[],
                    ),
                ],
                vec![
                    "http://10.0.0.1:8000@Some(0)",
                    "http://10.0.0.1:8000@Some(1)",
                    "http://10.0.0.2:8000@Some(2)",
                    "http://10.0.0.2:8000@Some(3)",
                ],
            ),
            (
                "-dp short form and annotations",
                vec![
                    pod("a", Some("10.0.0.1"), true, &["-dp", "2"], &[]),
                    pod(
                        "b",
                        Some("10.0.0.2"),
                        true,
                        &[],
                        &[(DP_SIZE_ANNOTATION, "2"), (DP_START_ANNOTATION, "2")],
                    ),
                ],
                vec![
                    "http://10.0.0.1:8000@Some(0)",
                    "http://10.0.0.1:8000@Some(1)",
                    "http://10.0.0.2:8000@Some(2)",
                    "http://10.0.0.2:8000@Some(3)",
                ],
            ),
            (
                "internal load balancing across nodes: the head fronts every rank, headless nodes none",
                vec![
                    pod(
                        "head",
                        Some("10.0.0.1"),
                        true,
                        &[
                            "-dp",
                            "4",
                            "-dpl",
                            "2",
                            "--data-parallel-address",
                            "10.0.0.1",
                        ],
                        &[],
                    ),
                    pod(
                        "worker",
                        Some("10.0.0.2"),
                        true,
                        &[
                            "--headless",
                            "-dp",
                            "4",
                            "-dpl",
                            "2",
                            "--data-parallel-start-rank",
                            "2",
                        ],
                        &[],
                    ),
                    pod(
                        "api-off",
                        Some("10.0.0.3"),
                        true,
                        &["--api-server-count", "0", "-dp", "4"],
                        &[],
                    ),
                ],
                vec![
                    "http://10.0.0.1:8000@Some(0)",
                    "http://10.0.0.1:8000@Some(1)",
                    "http://10.0.0.1:8000@Some(2)",
                    "http://10.0.0.1:8000@Some(3)",
                ],
            ),
            (
                "external load balancing: one rank per server, underscore spelling",
                vec![
                    pod(
                        "r0",
                        Some("10.0.0.1"),
                        true,
                        &["--data_parallel_size=2", "--data_parallel_rank=0"],
                        &[],
                    ),
                    pod(
                        "r1",
                        Some("10.0.0.2"),
                        true,
                        &["-dp", "2", "-dpn", "1"],
                        &[],
                    ),
                ],
                vec![
                    "http://10.0.0.1:8000@Some(0)",
                    "http://10.0.0.2:8000@Some(1)",
                ],
            ),
            (
                "flags inside a shell command line",
                vec![pod(
                    "a",
                    Some("10.0.0.1"),
                    true,
                    &[
                        "-c",
                        "exec vllm serve Qwen/Qwen3-8B --port 8000 --data-parallel-size 2\n  --max-model-len 32768",
                    ],
                    &[],
                )],
                vec![
                    "http://10.0.0.1:8000@Some(0)",
                    "http://10.0.0.1:8000@Some(1)",
                ],
            ),
            (
                "not ready, no IP and terminating pods do not count",
                vec![
                    pod("a", Some("10.0.0.1"), false, &[], &[]),
                    pod("b", None, true, &[], &[]),
                    {
                        let mut p = pod("c", Some("10.0.0.3"), true, &[], &[]);
                        p.metadata.deletion_timestamp = Some(Time(Default::default()));
                        p
                    },
                    pod("d", Some("fd00::4"), true, &[], &[]),
                ],
                vec!["http://[fd00::4]:8000@None"],
            ),
        ];
        for (name, pods, want) in cases {
            assert_eq!(ids(&discover(&spec(), &pods).expect(name)), want, "{name}");
        }
    }

    #[test]
    fn spec_size_overrides_pods_and_conflicts_are_errors() {
        let mut s = spec();
        s.data_parallel = Some(crate::crd::DataParallelSpec { size: Some(2) });
        let w = discover(&s, &[pod("a", Some("10.0.0.1"), true, &["-dp", "8"], &[])]).expect("ok");
        assert_eq!(w.len(), 2);
        let e = discover(
            &s,
            &[
                pod("a", Some("10.0.0.1"), true, &[], &[]),
                pod("b", Some("10.0.0.2"), true, &[], &[]),
            ],
        )
        .expect_err("both claim ranks 0 and 1");
        assert_eq!(
            e,
            DiscoverError::DuplicateRank {
                rank: 0,
                first: "a".into(),
                second: "b".into()
            }
        );
        let e = discover(
            &spec(),
            &[pod("x", Some("10.0.0.1"), true, &["-dp", "two"], &[])],
        )
        .expect_err("bad arg");
        assert!(e.to_string().contains("pod x"), "{e}");
    }
}
