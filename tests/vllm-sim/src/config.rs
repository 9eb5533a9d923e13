//! Command-line configuration of the simulator, named after vLLM's flags where vLLM has them.
//!
//! Owns parsing and validation only: [`SimArgs`] → [`SimConfig`], with every error naming its flag.

use clap::{Parser, ValueEnum};

use crate::engine::{EngineParams, SchedulingPolicy};
use crate::timing::TimingModel;

/// `vllm-sim`: a simulated vLLM OpenAI server (no GPU) for scheduling experiments.
#[derive(Debug, Clone, Parser)]
#[command(name = "vllm-sim", version, about)]
pub struct SimArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0 picks a free port; the chosen address is logged).
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// Model name clients must use (or omit).
    #[arg(long, default_value = "sim-model")]
    pub served_model_name: String,
    /// DP ranks behind this URL, selected by the `X-data-parallel-rank` header.
    #[arg(long = "data-parallel-size", short = 'd', default_value_t = 1)]
    pub data_parallel_size: u32,
    /// First GLOBAL rank this server owns; it serves K..K+N-1 and rejects other rank headers.
    #[arg(long, default_value_t = 0)]
    pub data_parallel_start_rank: u32,
    /// Tokens per KV block.
    #[arg(long, default_value_t = 16)]
    pub block_size: usize,
    /// KV blocks per rank.
    #[arg(long, default_value_t = 8192)]
    pub num_gpu_blocks: usize,
    /// Most sequences in one batch.
    #[arg(long, default_value_t = 256)]
    pub max_num_seqs: usize,
    /// Token budget of one step (chunked prefill).
    #[arg(long, default_value_t = 8192)]
    pub max_num_batched_tokens: usize,
    /// Longest prompt + completion.
    #[arg(long, default_value_t = 32768)]
    pub max_model_len: usize,
    /// Waiting-queue order.
    #[arg(long, value_enum, default_value_t = PolicyArg::Fcfs)]
    pub scheduling_policy: PolicyArg,
    /// Simulated seconds per wall-clock second (10 runs ten times faster than modelled).
    #[arg(long, default_value_t = 1.0)]
    pub time_scale: f64,
    /// Every step takes no time (router overhead benchmarks).
    #[arg(long)]
    pub instant: bool,
    /// A bound for benchmarks, not vLLM's behaviour: a chat request carrying
    /// `vllm_xargs.sim_end_program` (a non-zero number) is its Program's last, and once it
    /// finishes its blocks past the opening it shares with other Programs (the system message
    /// and the next role header) go to the front of the eviction order.
    #[arg(long)]
    pub end_hint: bool,
    #[arg(long, default_value_t = TimingModel::default().prefill_intercept_seconds)]
    pub prefill_intercept_seconds: f64,
    #[arg(long, default_value_t = TimingModel::default().prefill_linear_seconds_per_1k_tokens)]
    pub prefill_linear_seconds_per_1k_tokens: f64,
    #[arg(long, default_value_t = TimingModel::default().prefill_quadratic_seconds_per_1k_tokens_squared)]
    pub prefill_quadratic_seconds_per_1k_tokens_squared: f64,
    #[arg(long, default_value_t = TimingModel::default().decode_throughput_alpha)]
    pub decode_throughput_alpha: f64,
    #[arg(long, default_value_t = TimingModel::default().decode_fixed_step_seconds)]
    pub decode_fixed_step_seconds: f64,
    #[arg(long, default_value_t = TimingModel::default().decode_batch_step_seconds_per_request)]
    pub decode_batch_step_seconds_per_request: f64,
    #[arg(long, default_value_t = TimingModel::default().decode_context_step_seconds_per_token)]
    pub decode_context_step_seconds_per_token: f64,
    /// Require `Authorization: Bearer <key>` on /v1/* (as vLLM's --api-key).
    #[arg(long, env = "VLLM_API_KEY")]
    pub api_key: Option<String>,
    /// Fraction of requests that fail (0..=1), chosen with --seed.
    #[arg(long, default_value_t = 0.0)]
    pub fail_rate: f64,
    /// Status a failing request gets before any output.
    #[arg(long, default_value_t = 503)]
    pub fail_status: u16,
    /// A failing request instead streams this many tokens, then its connection is cut.
    #[arg(long)]
    pub fail_after_tokens: Option<u32>,
    /// With --fail-after-tokens: a failing stream stops after those tokens and holds its
    /// connection open, sending nothing more (a stalled engine), instead of cutting it.
    #[arg(long)]
    pub fail_stall: bool,
    /// Seed for failure injection and generated tokens.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Accept nested objects in `vllm_xargs` (an engine that understands Program context).
    #[arg(long)]
    pub accept_nested_xargs: bool,
    /// Output length when a request sets neither max_tokens nor max_completion_tokens.
    #[arg(long, default_value_t = 16)]
    pub default_max_tokens: u32,
    /// Largest accepted request body.
    #[arg(long, default_value_t = 32 * 1024 * 1024)]
    pub max_body_bytes: usize,
    /// tracing filter (e.g. info, debug, vllm_sim=debug).
    #[arg(long, default_value = "info")]
    pub log_level: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PolicyArg {
    Fcfs,
    Priority,
}

/// Failure injection.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FailConfig {
    pub rate: f64,
    pub status: http::StatusCode,
    pub after_tokens: Option<u32>,
    /// Hold a failing stream open after `after_tokens` instead of cutting it.
    pub stall: bool,
}

/// Validated configuration.
#[derive(Debug, Clone)]
pub struct SimConfig {
    pub host: String,
    pub port: u16,
    pub model: String,
    pub dp_size: u32,
    pub dp_start: u32,
    pub engine: EngineParams,
    pub time_scale: f64,
    pub api_key: Option<String>,
    pub fail: FailConfig,
    pub seed: u64,
    pub accept_nested_xargs: bool,
    pub default_max_tokens: u32,
    pub max_body_bytes: usize,
}

impl SimConfig {
    /// A configuration with every default, for tests and embedding.
    pub fn defaults() -> Self {
        SimArgs::parse_from(["vllm-sim"])
            .validate()
            .expect("defaults are valid")
    }
}

impl SimArgs {
    /// Checks every flag; the error names the flag.
    pub fn validate(self) -> Result<SimConfig, String> {
        if self.data_parallel_size == 0 {
            return Err("--data-parallel-size must be >= 1".into());
        }
        if self
            .data_parallel_start_rank
            .checked_add(self.data_parallel_size)
            .is_none()
        {
            return Err("--data-parallel-start-rank + --data-parallel-size overflows".into());
        }
        if !self.time_scale.is_finite() || self.time_scale <= 0.0 {
            return Err(format!(
                "--time-scale must be > 0 (got {})",
                self.time_scale
            ));
        }
        if !(0.0..=1.0).contains(&self.fail_rate) {
            return Err(format!(
                "--fail-rate must be within [0, 1] (got {})",
                self.fail_rate
            ));
        }
        let status = http::StatusCode::from_u16(self.fail_status)
            .ok()
            .filter(|s| s.is_client_error() || s.is_server_error())
            .ok_or_else(|| {
                format!(
                    "--fail-status must be a 4xx or 5xx status (got {})",
                    self.fail_status
                )
            })?;
        if self.default_max_tokens == 0 {
            return Err("--default-max-tokens must be >= 1".into());
        }
        if self.served_model_name.is_empty() {
            return Err("--served-model-name must not be empty".into());
        }
        let timing = if self.instant {
            TimingModel::zero()
        } else {
            TimingModel {
                prefill_intercept_seconds: self.prefill_intercept_seconds,
                prefill_linear_seconds_per_1k_tokens: self.prefill_linear_seconds_per_1k_tokens,
                prefill_quadratic_seconds_per_1k_tokens_squared: self
                    .prefill_quadratic_seconds_per_1k_tokens_squared,
                decode_throughput_alpha: self.decode_throughput_alpha,
                decode_fixed_step_seconds: self.decode_fixed_step_seconds,
                decode_batch_step_seconds_per_request: self.decode_batch_step_seconds_per_request,
                decode_context_step_seconds_per_token: self.decode_context_step_seconds_per_token,
            }
        };
        let engine = EngineParams {
            block_size: self.block_size,
            num_gpu_blocks: self.num_gpu_blocks,
            max_num_seqs: self.max_num_seqs,
            max_num_batched_tokens: self.max_num_batched_tokens,
            max_model_len: self.max_model_len,
            policy: match self.scheduling_policy {
                PolicyArg::Fcfs => SchedulingPolicy::Fcfs,
                PolicyArg::Priority => SchedulingPolicy::Priority,
            },
            timing,
            // A bound for benchmarks, never the server's behaviour.
            free_retention: false,
            end_hint: self.end_hint,
        };
        engine.validate().map_err(|e| format!("--{e}"))?;
        Ok(SimConfig {
            host: self.host,
            port: self.port,
            model: self.served_model_name,
            dp_size: self.data_parallel_size,
            dp_start: self.data_parallel_start_rank,
            engine,
            time_scale: self.time_scale,
            api_key: self.api_key.filter(|k| !k.is_empty()),
            fail: FailConfig {
                rate: self.fail_rate,
                status,
                after_tokens: self.fail_after_tokens,
                stall: self.fail_stall,
            },
            seed: self.seed,
            accept_nested_xargs: self.accept_nested_xargs,
            default_max_tokens: self.default_max_tokens,
            max_body_bytes: self.max_body_bytes,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<SimConfig, String> {
        let mut v = vec!["vllm-sim"];
        v.extend_from_slice(args);
        SimArgs::try_parse_from(v)
            .map_err(|e| e.to_string())?
            .validate()
    }

    #[test]
    fn defaults_are_valid_and_match_the_spec_coefficients() {
        let c = parse(&[]).expect("valid");
        assert_eq!(c.engine.timing, TimingModel::default());
        assert_eq!((c.dp_size, c.dp_start, c.engine.block_size), (1, 0, 16));
    }

    #[test]
    fn errors_name_the_flag() {
        assert!(
            parse(&["--data-parallel-size", "0"])
                .unwrap_err()
                .contains("--data-parallel-size")
        );
        assert!(
            parse(&["--time-scale", "0"])
                .unwrap_err()
                .contains("--time-scale")
        );
        assert!(
            parse(&["--fail-rate", "2"])
                .unwrap_err()
                .contains("--fail-rate")
        );
        assert!(
            parse(&["--fail-status", "200"])
                .unwrap_err()
                .contains("--fail-status")
        );
        assert!(
            parse(&["--decode-throughput-alpha=-1"])
                .unwrap_err()
                .contains("alpha")
        );
        let e = parse(&["--num-gpu-blocks", "10", "--max-model-len", "1000"]).unwrap_err();
        assert!(e.contains("--max-model-len"), "{e}");
    }

    #[test]
    fn instant_zeroes_the_timing() {
        assert_eq!(
            parse(&["--instant"]).expect("valid").engine.timing,
            TimingModel::zero()
        );
    }
}
