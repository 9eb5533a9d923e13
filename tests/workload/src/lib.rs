//! progbench: agentic workloads and the measurements that say whether Program scheduling helps.
//!
//! [`workload`] generates seeded agent sessions; [`des`] replays them through the production
//! scheduler core and vllm-sim's engine model in virtual time.
#![forbid(unsafe_code)]

pub mod clients;
pub mod compare;
pub mod des;
pub mod engines;
pub mod fairness;
pub mod families;
pub mod fleet;
pub mod kv_bound;
pub mod matrix;
pub mod matrix_report;
pub mod oracle;
pub mod replay;
pub mod replay_cmd;
pub mod report;
pub mod verdict;
pub mod workload;
