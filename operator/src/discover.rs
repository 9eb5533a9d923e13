//! Worker pods → DP-rank targets: a pure function, table-tested.
//!
//! A pod counts when it is Ready, has an IP and is not being deleted. Its ranks are
//! `start..start+local`: `local` from `spec.dataParallel.size`, else the pod's
//! `--data-parallel-size-local`, else `--data-parallel-size` (`-dp`), else the
//! `scheduling.program-router.dev/data-parallel-size` annotation, else 1 (no DP: one unpinned
//! target); `start` from `--data-parallel-start-rank` or its annotation, else 0. Ranks are GLOBAL,
//! as vLLM checks them. Two pods claiming the same global rank is an error (the router could not
//! tell them apart), reported with both pod names.

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

/// The value of `--flag N`, `--flag=N` (or `short N`) in any container's command or args,
/// also inside a shell command line (`sh -c "vllm serve ... --data-parallel-size 4"`): each
/// entry is split on whitespace.
fn arg(p: &Pod, long: &str, short: Option<&str>) -> Option<String> {
    let spec = p.spec.as_ref()?;
    for c in &spec.containers {
        let words: Vec<&str> = c
            .command
            .iter()
            .flatten()
            .chain(c.args.iter().flatten())
            .flat_map(|entry| entry.split_whitespace())
            .collect();
        for (i, w) in words.iter().enumerate() {
            if let Some(v) = w.strip_prefix(&format!("{long}=")) {
                return Some(v.to_string());
            }
            if (*w == long || Some(*w) == short)
                && let Some(v) = words.get(i + 1)
            {
                return Some((*v).to_string());
            }
        }
    }
    None
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
        let local = match spec.data_parallel.as_ref().and_then(|d| d.size) {
            Some(n) => Some(u32::try_from(n).unwrap_or(1)),
            None => match number(
                &name,
                "--data-parallel-size-local",
                arg(p, "--data-parallel-size-local", None),
            )? {
                Some(n) => Some(n),
                None => match number(
                    &name,
                    "--data-parallel-size",
                    arg(p, "--data-parallel-size", Some("-dp")),
                )? {
                    Some(n) => Some(n),
                    None => number(&name, DP_SIZE_ANNOTATION, annotation(p, DP_SIZE_ANNOTATION))?,
                },
            },
        };
        let start = match number(
            &name,
            "--data-parallel-start-rank",
            arg(p, "--data-parallel-start-rank", None),
        )? {
            Some(s) => Some(s),
            None => number(
                &name,
                DP_START_ANNOTATION,
                annotation(p, DP_START_ANNOTATION),
            )?,
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
                "args give size and start (multi-node DP)",
                vec![
                    pod(
                        "a",
                        Some("10.0.0.1"),
                        true,
                        &[
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
