//! The cost models a comparison gives both routers: `program-router calibrate` run against a
//! fresh simulator of the comparison's engine, its coefficients converted to the comparison's
//! time scale. A fit that cannot be trusted stops the comparison.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Serialize;

use super::{Procs, free_port, start_sim};
use crate::engines::EngineProfile;

/// How fast the simulator that `program-router calibrate` measures runs. Its clock is linear
/// (simulated seconds = wall seconds × scale), so coefficients measured at one speed convert
/// exactly to another; at the comparison's own speeds a decode step is too short on the wall
/// clock to fit through scheduling noise (docs/engine-profiles.md).
pub const CALIBRATION_TIME_SCALE: f64 = 4.0;

/// Cost-model coefficients measured by `program-router calibrate` against a simulator, in the
/// wall-clock seconds of simulators running at the comparison's `time_scale`.
#[derive(Debug, Clone, Serialize)]
pub struct Calibrated {
    pub prefill_cost_model: BTreeMap<String, f64>,
    pub decode_throughput_model: BTreeMap<String, f64>,
    pub prefill_r2: f64,
    pub decode_r2: f64,
}

impl Calibrated {
    /// Sets every coefficient `ps` (a Program scheduling JSON config) does not give itself.
    pub fn apply(&self, ps: &mut serde_json::Value) {
        for (model, fields) in [
            ("prefill_cost_model", &self.prefill_cost_model),
            ("decode_throughput_model", &self.decode_throughput_model),
        ] {
            for (field, v) in fields {
                if ps.get(model).and_then(|m| m.get(field)).is_none() {
                    ps[model][field] = serde_json::json!(v);
                }
            }
        }
    }
}

/// A fit's fields by name, each multiplied by `factor`.
fn scaled_fields(fit: &impl Serialize, factor: f64) -> Result<BTreeMap<String, f64>, String> {
    let fit = serde_json::to_value(fit).map_err(|e| e.to_string())?;
    let fields = fit.as_object().ok_or("a fit that is not an object")?;
    Ok(fields
        .iter()
        .filter_map(|(k, v)| Some((k.clone(), v.as_f64()? * factor)))
        .collect())
}

/// Runs `program-router calibrate` against a fresh simulator (one DP rank, KV for the
/// calibration's largest batch, [`CALIBRATION_TIME_SCALE`]) and converts the coefficients to
/// simulators running `time_scale` times faster than the workload. An unusable fit is an error:
/// a comparison with cost models off by an unknown factor would not say what it seems to.
pub async fn calibrate(
    bin_dir: &Path,
    time_scale: f64,
    engine: EngineProfile,
) -> Result<Calibrated, String> {
    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: program_router::calibrate::CalibrateArgs,
    }
    let mut sim = Procs(Vec::new());
    let mut flags = vec![
        ("data-parallel-size", "1".into()),
        ("num-gpu-blocks", "16384".into()),
        // Room for the largest calibration prompt whatever the comparison's own limit: the
        // cost model does not depend on it.
        ("max-model-len", "32768".into()),
        ("time-scale", CALIBRATION_TIME_SCALE.to_string()),
    ];
    flags.extend(engine.sim_flags());
    let url = start_sim(&mut sim, bin_dir, free_port()?, &flags)
        .map_err(|e| format!("calibration: {e}"))?;
    let cli = <Cli as clap::Parser>::try_parse_from([
        "calibrate",
        "--worker-url",
        &url,
        "--dp-rank",
        "0",
        "--timeout-secs",
        "60",
    ])
    .map_err(|e| e.to_string())?;
    let c = program_router::calibrate::run(&cli.args)
        .await
        .map_err(|e| format!("calibrating against a simulator: {e}"))?;
    if let Some(why) = c.poor_fit(cli.args.min_r2) {
        return Err(format!("calibrating against a simulator: {why}"));
    }
    // Every coefficient is seconds at the calibration's speed: convert to the comparison's.
    let f = CALIBRATION_TIME_SCALE / time_scale;
    let mut prefill_cost_model = scaled_fields(&c.prefill_cost_model, f)?;
    // Not fitted by calibrate, and a ratio (no time scale): the simulators' own value, which
    // they use when a step mixes prefill with decode (all of them run `engine`'s timing).
    prefill_cost_model.insert(
        "decode_throughput_alpha".into(),
        engine.timing().decode_throughput_alpha,
    );
    Ok(Calibrated {
        prefill_cost_model,
        decode_throughput_model: scaled_fields(&c.decode_throughput_model, f)?,
        prefill_r2: c.fit.prefill_r2,
        decode_r2: c.fit.decode_r2,
    })
}
