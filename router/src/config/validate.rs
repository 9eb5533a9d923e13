//! Validation of a [`RouterConfig`]: every rule a config file, the flags or the operator's
//! rendering must satisfy, each error naming its field.

use super::*;

impl RouterConfig {
    /// Checks every field; the error names it.
    pub fn validate(&self) -> Result<(), ConfigError> {
        check_durations(
            &serde_json::to_value(self).map_err(|e| ConfigError::new("config", e.to_string()))?,
            "",
        )?;
        if let Some(key) = &self.api_key
            && (key.is_empty() || http::HeaderValue::from_str(&format!("Bearer {key}")).is_err())
        {
            return Err(ConfigError::new(
                "api_key",
                "must be non-empty printable ASCII (it is sent as `Authorization: Bearer <key>`)",
            ));
        }
        for (i, key) in self.client_api_keys.iter().flatten().enumerate() {
            if key.is_empty() || http::HeaderValue::from_str(key).is_err() {
                return Err(ConfigError::new(
                    format!("client_api_keys[{i}]"),
                    "must be non-empty printable ASCII",
                ));
            }
        }
        if self
            .client_api_keys_dir
            .as_ref()
            .is_some_and(|d| d.trim().is_empty())
        {
            return Err(ConfigError::new(
                "client_api_keys_dir",
                "must name a directory (or be null)",
            ));
        }
        if let Some(n) = self.io_threads
            && n > MAX_IO_THREADS
        {
            return Err(ConfigError::new(
                "io_threads",
                format!("must be <= {MAX_IO_THREADS} (got {n})"),
            ));
        }
        if !(1..=MAX_DP_PER_URL).contains(&self.intra_node_data_parallel_size) {
            return Err(ConfigError::new(
                "intra_node_data_parallel_size",
                format!("must be between 1 and {MAX_DP_PER_URL}"),
            ));
        }
        for (i, w) in self.workers.iter().enumerate() {
            let uri: http::Uri = w.url.parse().map_err(|e| {
                ConfigError::new(format!("workers[{i}].url"), format!("not a URL: {e}"))
            })?;
            if uri.scheme_str() != Some("http") || uri.authority().is_none() {
                return Err(ConfigError::new(
                    format!("workers[{i}].url"),
                    format!("must be an http:// URL with a host (got {:?})", w.url),
                ));
            }
            if uri.query().is_some() {
                return Err(ConfigError::new(
                    format!("workers[{i}].url"),
                    "must not have a query",
                ));
            }
        }
        let targets = self.targets();
        let mut seen = std::collections::BTreeSet::new();
        for t in &targets {
            if !seen.insert(t.clone()) {
                return Err(ConfigError::new(
                    "workers",
                    format!("target {} is listed twice", t.id()),
                ));
            }
        }
        let p = &self.policy;
        if !(0.0..=1.0).contains(&p.cache_threshold) {
            return Err(ConfigError::new(
                "policy.cache_threshold",
                "must be within [0, 1]",
            ));
        }
        if !p.balance_rel_threshold.is_finite() || p.balance_rel_threshold < 1.0 {
            return Err(ConfigError::new(
                "policy.balance_rel_threshold",
                "must be >= 1",
            ));
        }
        if !(1..=MAX_VIRTUAL_NODES).contains(&p.virtual_nodes) {
            return Err(ConfigError::new(
                "policy.virtual_nodes",
                format!("must be between 1 and {MAX_VIRTUAL_NODES}"),
            ));
        }
        if p.max_tree_size == 0 {
            return Err(ConfigError::new("policy.max_tree_size", "must be > 0"));
        }
        if self.limits.max_payload_size == 0 {
            return Err(ConfigError::new("limits.max_payload_size", "must be > 0"));
        }
        positive(
            "limits.request_timeout_secs",
            self.limits.request_timeout_secs,
        )?;
        for (field, t) in [
            (
                "limits.client_header_timeout_secs",
                self.limits.client_header_timeout_secs,
            ),
            (
                "limits.upstream_idle_timeout_secs",
                self.limits.upstream_idle_timeout_secs,
            ),
            (
                "limits.client_body_timeout_secs",
                self.limits.client_body_timeout_secs,
            ),
            (
                "limits.http2_keep_alive_interval_secs",
                self.limits.http2_keep_alive_interval_secs,
            ),
            (
                "limits.client_idle_timeout_secs",
                self.limits.client_idle_timeout_secs,
            ),
        ] {
            if let Some(t) = t {
                positive(field, t)?;
            }
        }
        if self
            .limits
            .max_buffered_bytes
            .is_some_and(|b| b < self.limits.max_payload_size)
        {
            return Err(ConfigError::new(
                "limits.max_buffered_bytes",
                "must be >= limits.max_payload_size (null: no budget)",
            ));
        }
        if self.limits.max_client_connections == Some(0) {
            return Err(ConfigError::new(
                "limits.max_client_connections",
                "must be >= 1 (null: no cap)",
            ));
        }
        if self.limits.max_concurrent_requests == Some(0) {
            return Err(ConfigError::new(
                "limits.max_concurrent_requests",
                "must be >= 1 (null: no cap)",
            ));
        }
        positive("limits.queue_timeout_secs", self.limits.queue_timeout_secs)?;
        for (field, v) in [
            ("limits.drain_timeout_secs", self.limits.drain_timeout_secs),
            (
                "limits.shutdown_delay_secs",
                self.limits.shutdown_delay_secs,
            ),
        ] {
            if !v.is_finite() || v < 0.0 {
                return Err(ConfigError::new(field, "must be >= 0"));
            }
        }
        let h = &self.health;
        positive("health.timeout_secs", h.timeout_secs)?;
        positive("health.interval_secs", h.interval_secs)?;
        if h.failure_threshold == 0 || h.success_threshold == 0 {
            return Err(ConfigError::new(
                "health.failure_threshold",
                "thresholds must be >= 1",
            ));
        }
        if !h.endpoint.starts_with('/') {
            return Err(ConfigError::new("health.endpoint", "must start with '/'"));
        }
        let r = &self.retry;
        if r.max_retries == 0 {
            return Err(ConfigError::new(
                "retry.max_retries",
                "must be >= 1 (attempts in total)",
            ));
        }
        if !r.backoff_multiplier.is_finite() || r.backoff_multiplier < 1.0 {
            return Err(ConfigError::new("retry.backoff_multiplier", "must be >= 1"));
        }
        if !(0.0..=1.0).contains(&r.jitter_factor) {
            return Err(ConfigError::new(
                "retry.jitter_factor",
                "must be within [0, 1]",
            ));
        }
        if r.initial_backoff_ms > r.max_backoff_ms {
            return Err(ConfigError::new(
                "retry.initial_backoff_ms",
                "must be <= retry.max_backoff_ms",
            ));
        }
        let cb = &self.circuit_breaker;
        if cb.failure_threshold == 0 || cb.success_threshold == 0 {
            return Err(ConfigError::new(
                "circuit_breaker.failure_threshold",
                "thresholds must be >= 1",
            ));
        }
        positive(
            "circuit_breaker.timeout_duration_secs",
            cb.timeout_duration_secs,
        )?;
        positive(
            "circuit_breaker.window_duration_secs",
            cb.window_duration_secs,
        )?;
        positive("observation.interval_secs", self.observation.interval_secs)?;
        if let Some(f) = &self.fairness {
            f.validate()?;
        }
        if let Some(ps) = &self.program_scheduling {
            ps.validate()?;
        }
        if let Some(p) = &self.peers {
            p.validate()?;
            if self.peer_port.is_none() {
                return Err(ConfigError::new(
                    "peer_port",
                    "`peers` needs the peer listener: set peer_port (--peer-port) and \
                     peer_secret_file (--peer-secret-file)",
                ));
            }
        }
        if self.peer_port.is_some() && self.peer_secret_file.is_none() {
            return Err(ConfigError::new(
                "peer_secret_file",
                "the peer listener needs the peers' shared secret (--peer-secret-file)",
            ));
        }
        crate::observe::log_filter::parse(&self.log_level)
            .map_err(|e| ConfigError::new("log_level", e))?;
        if !(0.0..=1.0).contains(&self.otel_sampling_ratio) {
            return Err(ConfigError::new(
                "otel_sampling_ratio",
                format!("must be within 0..=1 ({})", self.otel_sampling_ratio),
            ));
        }
        if let Some(e) = &self.otlp_traces_endpoint {
            let uri: http::Uri = e
                .parse()
                .map_err(|err| ConfigError::new("otlp_traces_endpoint", format!("{e:?}: {err}")))?;
            if !matches!(uri.scheme_str(), Some("http")) || uri.host().is_none() {
                return Err(ConfigError::new(
                    "otlp_traces_endpoint",
                    format!(
                        "{e:?}: an http:// URL of an OTLP/gRPC collector, e.g. http://otel-collector:4317"
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// Every number under a key ending in `_secs` or `_seconds`, at any depth of the configuration
/// (Program scheduling and fairness included), is at most [`MAX_SECONDS`]; the error names its
/// path. Lower bounds stay with each field's own check.
fn check_durations(v: &serde_json::Value, path: &str) -> Result<(), ConfigError> {
    match v {
        serde_json::Value::Object(map) => {
            for (k, child) in map {
                let here = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                if (k.ends_with("_secs") || k.ends_with("_seconds"))
                    && child.as_f64().is_some_and(|x| x > MAX_SECONDS)
                {
                    return Err(ConfigError::new(
                        here,
                        format!("must be at most {MAX_SECONDS} (a year)"),
                    ));
                }
                check_durations(child, &here)?;
            }
        }
        serde_json::Value::Array(items) => {
            for (i, child) in items.iter().enumerate() {
                check_durations(child, &format!("{path}[{i}]"))?;
            }
        }
        _ => {}
    }
    Ok(())
}

fn positive(field: &str, v: f64) -> Result<(), ConfigError> {
    if v.is_finite() && v > 0.0 {
        Ok(())
    } else {
        Err(ConfigError::new(
            field,
            format!("must be finite and > 0 (got {v})"),
        ))
    }
}
