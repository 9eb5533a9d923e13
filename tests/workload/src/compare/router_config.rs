//! What the routers under test are configured with: durations converted to the simulators'
//! speed (the spec's for both routers, our extensions' for ours) and the peer's copy of the
//! Program-scheduling config.

use program_router::config::ProgramSchedulingConfig;

/// The spec's settings given in seconds, with their defaults (the same in both routers).
pub(super) const SECONDS_FIELDS: [(&str, f64); 6] = [
    ("metrics_interval_seconds", 1.0),
    ("queue_timeout_seconds", 600.0),
    ("force_resume_timeout_seconds", 300.0),
    ("paused_retention_ttl_seconds", 1800.0),
    ("shared_prefix_freshness_warmup_seconds", 100.0),
    ("max_acting_ttl_seconds", 10.0),
];

/// Our extensions given in seconds, with our defaults: every other top-level `*_seconds` field
/// of the config, read from its schema's defaults so that a new one cannot be missed. Only
/// program-router gets them (the peer does not know them).
pub(super) fn extension_seconds_fields() -> Vec<(String, f64)> {
    let defaults = serde_json::to_value(ProgramSchedulingConfig::default()).unwrap_or_default();
    let Some(fields) = defaults.as_object() else {
        return Vec::new();
    };
    fields
        .iter()
        .filter(|(k, _)| k.ends_with("_seconds") && !SECONDS_FIELDS.iter().any(|(f, _)| f == k))
        .filter_map(|(k, v)| Some((k.clone(), v.as_f64()?)))
        .collect()
}

/// The simulators run `time_scale` times faster than the workload, so every duration a router
/// is configured with (given in workload seconds, or defaulted) is divided by it: a 1 s metrics
/// poll must stay 1 s of workload time, not become 20. `fields` are the durations to scale with
/// their defaults. The cost-model coefficients are not touched here: [`super::calibrate`] measures
/// them and converts them to the simulators' speed.
pub(super) fn to_workload_time<'a>(
    ps: &mut serde_json::Value,
    time_scale: f64,
    fields: impl IntoIterator<Item = (&'a str, f64)>,
) {
    if time_scale == 1.0 || !time_scale.is_finite() || time_scale <= 0.0 {
        return;
    }
    for (field, default) in fields {
        let v = ps
            .get(field)
            .and_then(serde_json::Value::as_f64)
            .unwrap_or(default);
        ps[field] = serde_json::json!(v / time_scale);
    }
}

/// The peer's copy of the Program-scheduling config: a resume order only ours has
/// (`last_use`) becomes the peer's default (`mru`), so the peer runs as shipped.
pub(super) fn peer_config(ps: &serde_json::Value) -> serde_json::Value {
    use program_router::config::program::ResumeOrder;
    let mut peer = ps.clone();
    let order = peer.get("resume_order").cloned();
    if let Some(Ok(ResumeOrder::LastUse)) = order.map(serde_json::from_value::<ResumeOrder>) {
        peer["resume_order"] = serde_json::to_value(ResumeOrder::Mru).unwrap_or_default();
    }
    peer
}
