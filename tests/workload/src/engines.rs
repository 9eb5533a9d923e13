//! Engine profiles for `progbench matrix`, `sim` and `compare --engine`: vllm-sim's step-time
//! model (in virtual time, or a simulator's flags over HTTP) set to the spec's reference
//! coefficients (what every default was chosen on) or to another deployment's, so a run can show
//! whether the defaults carry over to hardware and models they were not chosen on.
//!
//! A profile scales the reference's prefill or decode coefficients; the router is given the
//! profile's own coefficients (what `program-router calibrate` fits against that engine) unless
//! the run asks it to keep those of `--program-config`, as a deployment that skipped calibration
//! would.

use program_router::config::ProgramSchedulingConfig;
use program_router::config::program::{DecodeThroughputModel, PrefillCostModel};
use serde::Serialize;
use vllm_sim::timing::TimingModel;

/// A deployment's engine, as multiples of the spec's reference step-time coefficients.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum EngineProfile {
    /// The spec's reference coefficients: every default was chosen on these.
    #[default]
    Reference,
    /// Prefill a third of the reference's (every term): more compute per byte of memory
    /// bandwidth, as a newer accelerator or a smaller model has. A miss costs a third as much,
    /// so holding KV for it pays less.
    FastPrefill,
    /// Prefill twice the reference's (every term): a larger model per accelerator. A miss costs
    /// twice as much.
    SlowPrefill,
    /// Decode steps twice the reference's (fixed, per request and per context token): less
    /// memory bandwidth, or more KV read per token. The engine finishes less per second, and a
    /// miss costs less beside a turn's decode.
    SlowDecode,
}

impl EngineProfile {
    pub fn name(self) -> &'static str {
        match self {
            EngineProfile::Reference => "reference",
            EngineProfile::FastPrefill => "fast-prefill",
            EngineProfile::SlowPrefill => "slow-prefill",
            EngineProfile::SlowDecode => "slow-decode",
        }
    }

    /// (prefill, decode) multiples of the reference's coefficients.
    fn factors(self) -> (f64, f64) {
        match self {
            EngineProfile::Reference => (1.0, 1.0),
            EngineProfile::FastPrefill => (1.0 / 3.0, 1.0),
            EngineProfile::SlowPrefill => (2.0, 1.0),
            EngineProfile::SlowDecode => (1.0, 2.0),
        }
    }

    /// The engine's step-time model.
    pub fn timing(self) -> TimingModel {
        let (p, d) = self.factors();
        let r = TimingModel::default();
        TimingModel {
            prefill_intercept_seconds: r.prefill_intercept_seconds * p,
            prefill_linear_seconds_per_1k_tokens: r.prefill_linear_seconds_per_1k_tokens * p,
            prefill_quadratic_seconds_per_1k_tokens_squared: r
                .prefill_quadratic_seconds_per_1k_tokens_squared
                * p,
            decode_throughput_alpha: r.decode_throughput_alpha,
            decode_fixed_step_seconds: r.decode_fixed_step_seconds * d,
            decode_batch_step_seconds_per_request: r.decode_batch_step_seconds_per_request * d,
            decode_context_step_seconds_per_token: r.decode_context_step_seconds_per_token * d,
        }
    }

    /// vllm-sim's flags that give a simulator this profile's step timing (`progbench compare
    /// --engine`), the reference's included.
    pub fn sim_flags(self) -> Vec<(&'static str, String)> {
        self.timing()
            .flags()
            .into_iter()
            .map(|(flag, v)| (flag, v.to_string()))
            .collect()
    }
}

/// Gives the router `t`'s coefficients, as calibrating against that engine would (replacing
/// whatever cost models `cfg` had).
pub fn calibrate(cfg: &mut ProgramSchedulingConfig, t: &TimingModel) {
    cfg.prefill_cost_model = PrefillCostModel {
        intercept_seconds: t.prefill_intercept_seconds,
        linear_seconds_per_1k_tokens: t.prefill_linear_seconds_per_1k_tokens,
        quadratic_seconds_per_1k_tokens_squared: t.prefill_quadratic_seconds_per_1k_tokens_squared,
        decode_throughput_alpha: t.decode_throughput_alpha,
    };
    cfg.decode_throughput_model = DecodeThroughputModel {
        fixed_step_seconds: t.decode_fixed_step_seconds,
        batch_step_seconds_per_request: t.decode_batch_step_seconds_per_request,
        context_step_seconds_per_token: t.decode_context_step_seconds_per_token,
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reference_is_the_routers_default_and_calibration_matches_the_engine() {
        // The router's built-in coefficients are the reference engine's, so a reference run is
        // calibrated whether or not the router is given them.
        let mut cfg = ProgramSchedulingConfig::default();
        let before = serde_json::to_value(&cfg).unwrap_or_default();
        calibrate(&mut cfg, &EngineProfile::Reference.timing());
        assert_eq!(serde_json::to_value(&cfg).unwrap_or_default(), before);

        let fast = EngineProfile::FastPrefill.timing();
        let reference = TimingModel::default();
        let cold = |t: &TimingModel| t.cold_prefill_seconds(30_000);
        assert!((cold(&fast) * 3.0 - cold(&reference)).abs() < 1e-9);
        assert_eq!(
            fast.decode_step_seconds(8, 100_000),
            reference.decode_step_seconds(8, 100_000)
        );
        let slow = EngineProfile::SlowDecode.timing();
        assert!(
            (slow.decode_step_seconds(8, 100_000)
                - 2.0 * reference.decode_step_seconds(8, 100_000))
            .abs()
                < 1e-12
        );
        let mut cfg = ProgramSchedulingConfig::default();
        calibrate(&mut cfg, &slow);
        let est = program_router::program::cost::decode_throughput(
            &cfg.decode_throughput_model,
            8,
            100_000,
        );
        assert!((est - 8.0 / slow.decode_step_seconds(8, 100_000)).abs() < 1e-9);
        cfg.validate().expect("a calibrated config is valid");
    }

    #[test]
    fn a_simulator_given_a_profiles_flags_runs_its_timing() {
        use clap::{Parser, ValueEnum};
        for &profile in EngineProfile::value_variants() {
            let mut argv = vec!["vllm-sim".to_string()];
            for (flag, value) in profile.sim_flags() {
                argv.push(format!("--{flag}"));
                argv.push(value);
            }
            let sim = vllm_sim::config::SimArgs::try_parse_from(&argv)
                .map_err(|e| e.to_string())
                .and_then(|a| a.validate())
                .unwrap_or_else(|e| panic!("{}: {e}", profile.name()));
            assert_eq!(sim.engine.timing, profile.timing(), "{}", profile.name());
        }
        assert_ne!(
            EngineProfile::FastPrefill.timing(),
            TimingModel::default(),
            "the profiles differ from the simulator's defaults"
        );
    }
}
