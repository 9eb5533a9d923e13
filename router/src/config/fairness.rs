//! `fairness`: fair multi-tenant queueing in front of the backends — who a tenant is, how tenants
//! share a priority class, the classes and their gates, and the limits that bound the queue.
//!
//! Owns the typed configuration and its validation; the queue lives in `crate::fair`.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::ConfigError;

/// Where a request's tenant comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema, Default)]
#[serde(rename_all = "snake_case")]
pub enum TenantSource {
    /// The `tenant_header` request header.
    #[default]
    Header,
    /// A hash of the client's `Authorization: Bearer` key (the key itself is never kept).
    ApiKey,
    /// The OpenAI `user` field of the request body.
    User,
}

/// How tenants share one class.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema, Default)]
#[serde(rename_all = "snake_case")]
pub enum FairDiscipline {
    /// Virtual Token Counter: the backlogged tenant with the least weighted token service goes next.
    #[default]
    Vtc,
    /// Request-count round robin over backlogged tenants.
    RoundRobin,
}

/// One priority class; classes are served in strict order, highest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PriorityClass {
    pub name: String,
    /// Send only while a target reports fewer waiting requests than this (`vllm:num_requests_waiting`).
    #[serde(default = "default_max_waiting")]
    pub max_waiting_requests: u32,
    /// Send only while every fresh target reports an empty waiting queue (e.g. batch).
    #[serde(default)]
    pub only_when_idle: bool,
    /// Hold while a target's recent time per output token exceeds this (seconds); null = no limit.
    #[serde(default)]
    pub max_tpot_seconds: Option<f64>,
}

/// Default `max_waiting_requests` of a class (the fair-queueing account's suggestion: 3).
pub fn default_max_waiting() -> u32 {
    3
}

/// One tenant's quota; an absent field is unlimited.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RateLimitConfig {
    /// Requests admitted per minute (a minute's worth may come at once).
    #[serde(default)]
    pub requests_per_minute: Option<f64>,
    /// Prompt plus generated tokens per minute (from the backend's usage; the prompt is charged
    /// by estimate on admission and corrected when the request ends).
    #[serde(default)]
    pub tokens_per_minute: Option<f64>,
}

impl RateLimitConfig {
    fn validate(&self, field: &str) -> Result<(), ConfigError> {
        for (name, v) in [
            ("requests_per_minute", self.requests_per_minute),
            ("tokens_per_minute", self.tokens_per_minute),
        ] {
            if let Some(v) = v
                && !(v.is_finite() && v > 0.0)
            {
                return Err(ConfigError::new(
                    format!("{field}.{name}"),
                    format!("must be > 0 (got {v})"),
                ));
            }
        }
        Ok(())
    }
}

/// Fair queueing; absent or null = off (requests go straight to the policy).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct FairnessConfig {
    pub tenant_source: TenantSource,
    /// Header naming the tenant when `tenant_source` is `header`.
    pub tenant_header: String,
    /// Tenant of requests that name none.
    pub default_tenant: String,
    pub discipline: FairDiscipline,
    /// Highest priority first.
    pub classes: Vec<PriorityClass>,
    /// Header naming the request's class.
    pub class_header: String,
    /// Class of requests that name none and whose tenant has no default.
    pub default_class: String,
    /// Per-tenant default class.
    pub tenant_classes: BTreeMap<String, String>,
    /// Highest class a request may name in `class_header` when its tenant has no entry in
    /// `tenant_max_classes`; a request naming a higher one gets 403 `class_not_allowed`.
    /// `null`: any class.
    pub max_class: Option<String>,
    /// Per-tenant highest class a request may name (see `max_class`).
    pub tenant_max_classes: BTreeMap<String, String>,
    /// Per-tenant share weights (default 1): a weight-2 tenant gets twice the tokens.
    pub tenant_weights: BTreeMap<String, f64>,
    /// Per-tenant quotas (requests and tokens per minute), enforced even when the backends are
    /// idle; more gets 429 `tenant_rate_limited` with `Retry-After`.
    pub tenant_rate_limits: BTreeMap<String, RateLimitConfig>,
    /// Quota of tenants without an entry in `tenant_rate_limits`; null: none.
    pub default_rate_limit: Option<RateLimitConfig>,
    /// VTC weight of an input (prompt) token.
    pub input_weight: f64,
    /// VTC weight of an output token.
    pub output_weight: f64,
    /// Most requests one tenant may have queued per class; more get 429 with `Retry-After`.
    pub max_queue_per_tenant: u32,
    /// Longest a request may wait in the router's queue; then 504 `queue_timeout`.
    pub queue_timeout_seconds: f64,
    /// Backend metrics older than this count as saturated (nothing is sent on stale data).
    pub metrics_max_age_seconds: f64,
    /// Tenants with their own queue-depth series; the rest are summed as `other`.
    pub metrics_top_tenants: u32,
}

impl Default for FairnessConfig {
    fn default() -> Self {
        let class = |name: &str, only_when_idle: bool, tpot: Option<f64>| PriorityClass {
            name: name.into(),
            max_waiting_requests: default_max_waiting(),
            only_when_idle,
            max_tpot_seconds: tpot,
        };
        FairnessConfig {
            tenant_source: TenantSource::Header,
            tenant_header: "x-tenant-id".into(),
            default_tenant: "default".into(),
            discipline: FairDiscipline::Vtc,
            classes: vec![
                class("interactive", false, Some(0.15)),
                class("standard", false, None),
                class("batch", true, None),
            ],
            class_header: "x-priority-class".into(),
            default_class: "standard".into(),
            tenant_classes: BTreeMap::new(),
            max_class: None,
            tenant_max_classes: BTreeMap::new(),
            tenant_weights: BTreeMap::new(),
            tenant_rate_limits: BTreeMap::new(),
            default_rate_limit: None,
            input_weight: 1.0,
            output_weight: 2.0,
            max_queue_per_tenant: 256,
            queue_timeout_seconds: 120.0,
            metrics_max_age_seconds: 5.0,
            metrics_top_tenants: 10,
        }
    }
}

impl FairnessConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        let f = |name: &str| format!("fairness.{name}");
        if self.classes.is_empty() {
            return Err(ConfigError::new(f("classes"), "needs at least one class"));
        }
        let mut names = std::collections::BTreeSet::new();
        for (i, c) in self.classes.iter().enumerate() {
            if c.name.is_empty() || !names.insert(c.name.as_str()) {
                return Err(ConfigError::new(
                    format!("fairness.classes[{i}].name"),
                    format!("must be non-empty and unique (got {:?})", c.name),
                ));
            }
            if let Some(t) = c.max_tpot_seconds
                && !(t.is_finite() && t > 0.0)
            {
                return Err(ConfigError::new(
                    format!("fairness.classes[{i}].max_tpot_seconds"),
                    format!("must be > 0 (got {t})"),
                ));
            }
        }
        if !names.contains(self.default_class.as_str()) {
            return Err(ConfigError::new(
                f("default_class"),
                format!("{:?} is not one of the classes", self.default_class),
            ));
        }
        for (tenant, class) in &self.tenant_classes {
            if !names.contains(class.as_str()) {
                return Err(ConfigError::new(
                    format!("fairness.tenant_classes.{tenant}"),
                    format!("{class:?} is not one of the classes"),
                ));
            }
        }
        let index = |c: &str| self.classes.iter().position(|k| k.name == c);
        if let Some(c) = &self.max_class
            && index(c).is_none()
        {
            return Err(ConfigError::new(
                f("max_class"),
                format!("{c:?} is not one of the classes"),
            ));
        }
        for (tenant, c) in &self.tenant_max_classes {
            if index(c).is_none() {
                return Err(ConfigError::new(
                    format!("fairness.tenant_max_classes.{tenant}"),
                    format!("{c:?} is not one of the classes"),
                ));
            }
        }
        // A tenant's own default class must be one it may use.
        let tenants = self
            .tenant_classes
            .keys()
            .chain(self.tenant_max_classes.keys());
        for tenant in tenants.chain(std::iter::once(&String::new())) {
            let ceiling = self
                .tenant_max_classes
                .get(tenant)
                .or(self.max_class.as_ref());
            let default = self
                .tenant_classes
                .get(tenant)
                .unwrap_or(&self.default_class);
            if let Some(ceiling) = ceiling
                && index(default) < index(ceiling)
            {
                let field = if self.tenant_classes.contains_key(tenant) {
                    format!("fairness.tenant_classes.{tenant}")
                } else if self.tenant_max_classes.contains_key(tenant) {
                    format!("fairness.tenant_max_classes.{tenant}")
                } else {
                    f("max_class")
                };
                return Err(ConfigError::new(
                    field,
                    format!(
                        "the default class {default:?} is above the highest class allowed ({ceiling:?})"
                    ),
                ));
            }
        }
        for (tenant, l) in &self.tenant_rate_limits {
            l.validate(&format!("fairness.tenant_rate_limits.{tenant}"))?;
        }
        if let Some(l) = &self.default_rate_limit {
            l.validate("fairness.default_rate_limit")?;
        }
        for (tenant, w) in &self.tenant_weights {
            if !(w.is_finite() && *w > 0.0) {
                return Err(ConfigError::new(
                    format!("fairness.tenant_weights.{tenant}"),
                    format!("must be > 0 (got {w})"),
                ));
            }
        }
        for (name, v) in [
            ("input_weight", self.input_weight),
            ("output_weight", self.output_weight),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(ConfigError::new(f(name), format!("must be >= 0 (got {v})")));
            }
        }
        for (name, v) in [
            ("queue_timeout_seconds", self.queue_timeout_seconds),
            ("metrics_max_age_seconds", self.metrics_max_age_seconds),
        ] {
            if !(v.is_finite() && v > 0.0) {
                return Err(ConfigError::new(f(name), format!("must be > 0 (got {v})")));
            }
        }
        if self.max_queue_per_tenant == 0 {
            return Err(ConfigError::new(f("max_queue_per_tenant"), "must be >= 1"));
        }
        for (name, v) in [
            ("tenant_header", &self.tenant_header),
            ("class_header", &self.class_header),
        ] {
            if http::HeaderName::from_bytes(v.as_bytes()).is_err() {
                return Err(ConfigError::new(
                    f(name),
                    format!("{v:?} is not a header name"),
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_errors_name_the_field() {
        FairnessConfig::default().validate().expect("defaults");
        let cases: Vec<(serde_json::Value, &str)> = vec![
            (serde_json::json!({"classes": []}), "fairness.classes"),
            (
                serde_json::json!({"default_class": "gold"}),
                "fairness.default_class",
            ),
            (
                serde_json::json!({"tenant_classes": {"acme": "gold"}}),
                "fairness.tenant_classes.acme",
            ),
            (
                serde_json::json!({"max_class": "gold"}),
                "fairness.max_class",
            ),
            (
                serde_json::json!({"tenant_rate_limits": {"acme": {"tokens_per_minute": 0}}}),
                "fairness.tenant_rate_limits.acme.tokens_per_minute",
            ),
            (
                serde_json::json!({"default_rate_limit": {"requests_per_minute": -1}}),
                "fairness.default_rate_limit.requests_per_minute",
            ),
            (
                serde_json::json!({"tenant_max_classes": {"acme": "gold"}}),
                "fairness.tenant_max_classes.acme",
            ),
            (
                serde_json::json!({"max_class": "batch"}),
                "fairness.max_class",
            ),
            (
                serde_json::json!({"tenant_max_classes": {"acme": "batch"}}),
                "fairness.tenant_max_classes.acme",
            ),
            (
                serde_json::json!({"tenant_classes": {"acme": "interactive"},
                                   "tenant_max_classes": {"acme": "standard"}}),
                "fairness.tenant_classes.acme",
            ),
            (
                serde_json::json!({"tenant_weights": {"acme": 0.0}}),
                "fairness.tenant_weights.acme",
            ),
            (
                serde_json::json!({"classes": [{"name": "a"}, {"name": "a"}], "default_class": "a"}),
                "fairness.classes[1].name",
            ),
            (
                serde_json::json!({"max_queue_per_tenant": 0}),
                "fairness.max_queue_per_tenant",
            ),
            (
                serde_json::json!({"tenant_header": "bad header"}),
                "fairness.tenant_header",
            ),
            (
                serde_json::json!({"queue_timeout_seconds": -1.0}),
                "fairness.queue_timeout_seconds",
            ),
        ];
        for (v, field) in cases {
            let c: FairnessConfig = serde_json::from_value(v.clone()).expect("parses");
            let e = c.validate().expect_err("invalid");
            assert!(e.to_string().starts_with(field), "{v}: {e}");
        }
    }
}
