//! The CRD → router-config mapping: each part of a `ProgramScheduling` spec that has a router
//! twin becomes the router's typed config, defaulted and validated by the router's own rules,
//! with errors that name the field.

use crate::crd::{FairnessParams, ProgramSchedulingParams, RateLimitParams};

impl RateLimitParams {
    pub fn to_router(self) -> program_router::config::fairness::RateLimitConfig {
        program_router::config::fairness::RateLimitConfig {
            requests_per_minute: self.requests_per_minute,
            tokens_per_minute: self.tokens_per_minute,
        }
    }
}

impl FairnessParams {
    pub fn to_router(&self) -> Result<program_router::config::FairnessConfig, String> {
        use program_router::config::fairness::PriorityClass;
        let mut c = program_router::config::FairnessConfig::default();
        let word = |v: &String| serde_json::Value::String(v.clone());
        if let Some(v) = &self.tenant_source {
            c.tenant_source = serde_json::from_value(word(v))
                .map_err(|_| format!("fairness.tenantSource: unknown source {v:?}"))?;
        }
        if let Some(v) = &self.discipline {
            c.discipline = serde_json::from_value(word(v))
                .map_err(|_| format!("fairness.discipline: unknown discipline {v:?}"))?;
        }
        macro_rules! set {
            ($($f:ident),*) => { $( if let Some(v) = &self.$f { c.$f = v.clone(); } )* };
        }
        set!(
            tenant_header,
            default_tenant,
            class_header,
            default_class,
            tenant_classes,
            tenant_max_classes,
            tenant_weights,
            input_weight,
            output_weight,
            max_queue_per_tenant,
            queue_timeout_seconds,
            metrics_max_age_seconds,
            metrics_top_tenants
        );
        if let Some(v) = &self.max_class {
            c.max_class = Some(v.clone());
        }
        if let Some(m) = &self.tenant_rate_limits {
            c.tenant_rate_limits = m.iter().map(|(t, l)| (t.clone(), l.to_router())).collect();
        }
        if let Some(l) = self.default_rate_limit {
            c.default_rate_limit = Some(l.to_router());
        }
        if let Some(classes) = &self.classes {
            c.classes = classes
                .iter()
                .map(|p| PriorityClass {
                    name: p.name.clone(),
                    max_waiting_requests: p
                        .max_waiting_requests
                        .unwrap_or_else(program_router::config::fairness::default_max_waiting),
                    only_when_idle: p.only_when_idle.unwrap_or(false),
                    max_tpot_seconds: p.max_tpot_seconds,
                })
                .collect();
        }
        c.validate().map_err(|e| e.to_string())?;
        Ok(c)
    }
}

impl ProgramSchedulingParams {
    /// The router's configuration: the camelCase fields renamed to the router's names, omitted
    /// fields defaulted and every rule checked by the router's own validation. The error names
    /// the field in the router's terms.
    pub fn to_router(&self) -> Result<program_router::config::ProgramSchedulingConfig, String> {
        let camel = serde_json::to_value(self).map_err(|e| e.to_string())?;
        let snake = rename_keys(camel);
        let cfg: program_router::config::ProgramSchedulingConfig =
            serde_json::from_value(snake).map_err(|e| format!("programScheduling: {e}"))?;
        cfg.validate().map_err(|e| e.to_string())?;
        Ok(cfg)
    }
}

/// camelCase → snake_case, with a digit run as a word of its own (`per1k` → `per_1k`), as the
/// router's field names spell it.
fn snake(key: &str) -> String {
    let mut out = String::with_capacity(key.len() + 4);
    let mut prev: Option<char> = None;
    for c in key.chars() {
        let boundary = match prev {
            None => false,
            Some(p) => c.is_ascii_uppercase() || (c.is_ascii_digit() && !p.is_ascii_digit()),
        };
        if boundary {
            out.push('_');
        }
        out.push(c.to_ascii_lowercase());
        prev = Some(c);
    }
    out
}

/// camelCase → snake_case keys, dropping nulls (omitted = router default).
fn rename_keys(v: serde_json::Value) -> serde_json::Value {
    match v {
        serde_json::Value::Object(m) => serde_json::Value::Object(
            m.into_iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (snake(&k), rename_keys(v)))
                .collect(),
        ),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::*;
    use kube::CustomResourceExt;

    /// Every key path below an object (`a.b`), through nested objects.
    fn key_paths(
        v: &serde_json::Value,
        prefix: &str,
        out: &mut std::collections::BTreeSet<String>,
    ) {
        if let Some(m) = v.as_object() {
            for (k, v) in m {
                let p = format!("{prefix}{k}");
                key_paths(v, &format!("{p}."), out);
                out.insert(p);
            }
        }
    }

    #[test]
    fn every_router_field_has_a_camel_case_twin_and_back() {
        let router =
            serde_json::to_value(program_router::config::ProgramSchedulingConfig::default())
                .expect("json");
        let mut want = std::collections::BTreeSet::new();
        key_paths(&router, "", &mut want);
        // The CRD's own schema, nested models included, renamed as `to_router` renames it.
        let crd = serde_json::to_value(ProgramScheduling::crd()).expect("crd");
        let schema = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
            ["properties"]["programScheduling"];
        fn props(s: &serde_json::Value) -> serde_json::Value {
            match s.get("properties").and_then(|p| p.as_object()) {
                Some(m) => m.iter().map(|(k, v)| (k.clone(), props(v))).collect(),
                // A leaf: an empty object, which renaming keeps (it drops nulls).
                None => serde_json::json!({}),
            }
        }
        let mut got = std::collections::BTreeSet::new();
        key_paths(&rename_keys(props(schema)), "", &mut got);
        let lacking: Vec<_> = want.difference(&got).collect();
        assert!(lacking.is_empty(), "CRD lacks {lacking:?}");
        let unknown: Vec<_> = got.difference(&want).collect();
        assert!(unknown.is_empty(), "router does not know {unknown:?}");
        assert!(got.len() > 30, "{got:?}");
        assert_eq!(
            snake("linearSecondsPer1kTokens"),
            "linear_seconds_per_1k_tokens"
        );
        assert_eq!(
            snake("tokenCapacityPerDpRank"),
            "token_capacity_per_dp_rank"
        );
    }

    /// Every string a schema admits through `enum` or `const`, anywhere below it.
    fn admitted(v: &serde_json::Value, out: &mut std::collections::BTreeSet<String>) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, v) in m {
                    match (k.as_str(), v) {
                        ("const", serde_json::Value::String(s)) => {
                            out.insert(s.clone());
                        }
                        ("enum", serde_json::Value::Array(a)) => {
                            out.extend(a.iter().filter_map(|s| s.as_str().map(String::from)));
                        }
                        _ => admitted(v, out),
                    }
                }
            }
            serde_json::Value::Array(a) => a.iter().for_each(|v| admitted(v, out)),
            _ => {}
        }
    }

    #[test]
    fn every_schema_enum_is_the_routers_list() {
        let crd = serde_json::to_value(ProgramScheduling::crd()).expect("crd");
        let spec = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"];
        let router = program_router::config::RouterConfig::schema();
        let defs = &router["$defs"];
        let mut checked = 0;
        for (section, def) in [
            ("programScheduling", "ProgramSchedulingConfig"),
            ("fairness", "FairnessConfig"),
            ("router", "PolicyConfig"),
        ] {
            let props = spec[section]["properties"].as_object().expect("properties");
            for (field, schema) in props {
                // The router spec's policy is PolicyConfig.kind; its other words are
                // Kubernetes' own (Service settings) or the operator's (logLevel). The other
                // sections share the router's names.
                let key = match (section, field.as_str()) {
                    ("router", "policy") => "kind".to_string(),
                    ("router", _) => continue,
                    _ => snake(field),
                };
                let Some(list) = schema["enum"].as_array() else {
                    continue;
                };
                let allowed: std::collections::BTreeSet<String> = list
                    .iter()
                    .filter_map(|w| w.as_str().map(String::from))
                    .collect();
                let target = &defs[def]["properties"][&key];
                let named = target["$ref"]
                    .as_str()
                    .and_then(|r| r.rsplit('/').next())
                    .map(|n| &defs[n])
                    .unwrap_or(target);
                let mut words = std::collections::BTreeSet::new();
                admitted(named, &mut words);
                assert_eq!(allowed, words, "{section}.{field}");
                checked += 1;
            }
        }
        assert_eq!(checked, 9, "word lists checked");
        let rules = serde_json::to_string(spec).expect("json");
        assert!(
            !rules.contains("self in ["),
            "word lists are enums, not CEL rules"
        );
    }

    #[test]
    fn the_fitted_coefficients_are_schema_paths_and_calibrate_sets_them_all() {
        let crd = serde_json::to_value(ProgramScheduling::crd()).expect("crd");
        let ps = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
            ["programScheduling"];
        for path in FITTED_COEFFICIENTS {
            let (model, field) = path.split_once('.').expect("model.field");
            assert!(
                ps["properties"][model]["properties"][field].is_object(),
                "{path} is not in the CRD"
            );
        }
        assert_eq!(
            ProgramSchedulingParams::default().uncalibrated(),
            FITTED_COEFFICIENTS.to_vec()
        );
    }

    #[test]
    fn calibrate_crd_output_pastes_into_the_spec() {
        use program_router::calibrate::{Calibration, DecodeFit, FitReport, PrefillFit};
        let fit = Calibration {
            prefill_cost_model: PrefillFit {
                intercept_seconds: 0.045,
                linear_seconds_per_1k_tokens: 0.031,
                quadratic_seconds_per_1k_tokens_squared: 0.0021,
            },
            decode_throughput_model: DecodeFit {
                fixed_step_seconds: 0.011,
                batch_step_seconds_per_request: 0.00042,
                context_step_seconds_per_token: 1.4e-7,
            },
            fit: FitReport {
                prefill_r2: 0.999,
                decode_r2: 0.998,
                prefill_samples: vec![],
                decode_samples: vec![],
            },
        };
        let yaml = fit.crd_yaml().expect("yaml");
        let p: ProgramSchedulingParams = serde_yaml::from_str(&yaml).expect("params");
        assert!(p.uncalibrated().is_empty(), "{yaml}");
        assert_calibrated(&p.to_router().expect("valid"));
    }

    /// The coefficients both calibration tests give.
    fn assert_calibrated(c: &program_router::config::ProgramSchedulingConfig) {
        let m = &c.prefill_cost_model;
        assert_eq!(
            (
                m.intercept_seconds,
                m.linear_seconds_per_1k_tokens,
                m.quadratic_seconds_per_1k_tokens_squared
            ),
            (0.045, 0.031, 0.0021)
        );
        let d = &c.decode_throughput_model;
        assert_eq!(
            (
                d.fixed_step_seconds,
                d.batch_step_seconds_per_request,
                d.context_step_seconds_per_token
            ),
            (0.011, 0.00042, 1.4e-7)
        );
    }

    #[test]
    fn calibrated_models_reach_the_router() {
        let p: ProgramSchedulingParams = serde_json::from_value(serde_json::json!({
            "prefillCostModel": {
                "interceptSeconds": 0.045,
                "linearSecondsPer1kTokens": 0.031,
                "quadraticSecondsPer1kTokensSquared": 0.0021,
                "decodeThroughputAlpha": 0.2
            },
            "decodeThroughputModel": {
                "fixedStepSeconds": 0.011,
                "batchStepSecondsPerRequest": 0.00042,
                "contextStepSecondsPerToken": 1.4e-7
            }
        }))
        .expect("params");
        let c = p.to_router().expect("valid");
        assert_calibrated(&c);
        assert_eq!(c.prefill_cost_model.decode_throughput_alpha, 0.2);
    }

    #[test]
    fn fairness_converts_keeping_tenant_names_and_defaults() {
        let p: FairnessParams = serde_json::from_value(serde_json::json!({
            "tenantSource": "api_key",
            "tenantWeights": {"searchTeam": 2.0},
            "tenantClasses": {"nightlyEvals": "batch"},
            "maxClass": "standard",
            "tenantMaxClasses": {"searchTeam": "interactive", "nightlyEvals": "batch"},
            "tenantRateLimits": {"nightlyEvals": {"tokensPerMinute": 100000}},
            "defaultRateLimit": {"requestsPerMinute": 600},
            "classes": [{"name": "interactive", "maxTpotSeconds": 0.1}, {"name": "standard"}, {"name": "batch", "onlyWhenIdle": true}],
            "maxQueuePerTenant": 8
        }))
        .expect("params");
        let c = p.to_router().expect("valid");
        assert_eq!(
            c.tenant_weights.get("searchTeam"),
            Some(&2.0),
            "tenant names kept"
        );
        assert_eq!(c.tenant_classes["nightlyEvals"], "batch");
        assert_eq!(c.max_class.as_deref(), Some("standard"));
        assert_eq!(c.tenant_max_classes["searchTeam"], "interactive");
        assert_eq!(
            c.tenant_rate_limits["nightlyEvals"].tokens_per_minute,
            Some(100000.0)
        );
        assert_eq!(
            c.default_rate_limit.and_then(|l| l.requests_per_minute),
            Some(600.0)
        );
        assert_eq!(c.classes[0].max_tpot_seconds, Some(0.1));
        assert_eq!(c.classes[1].max_waiting_requests, 3);
        assert!(c.classes[2].only_when_idle);
        assert_eq!(c.max_queue_per_tenant, 8);
        assert_eq!(
            c.tenant_header, "x-tenant-id",
            "omitted fields take the router default"
        );
        let bad = FairnessParams {
            default_class: Some("gold".into()),
            ..Default::default()
        };
        assert!(
            bad.to_router()
                .expect_err("invalid")
                .contains("fairness.default_class")
        );
    }

    #[test]
    fn a_partial_router_spec_is_completed_with_defaults() {
        let r: RouterSpec =
            serde_json::from_str(r#"{"image": "example/router:1"}"#).expect("partial");
        assert_eq!(
            r,
            RouterSpec {
                image: Some("example/router:1".into()),
                ..Default::default()
            }
        );
    }

    #[test]
    fn conversion_defaults_and_validates() {
        let p = ProgramSchedulingParams {
            global_queue: Some(true),
            token_capacity_per_dp_rank: Some(266_864),
            prefill_cost_model: Some(PrefillCostModelParams {
                intercept_seconds: Some(0.05),
                ..Default::default()
            }),
            ..Default::default()
        };
        let c = p.to_router().expect("valid");
        assert!(c.global_queue);
        assert_eq!(c.token_capacity_per_dp_rank, Some(266_864));
        assert_eq!(c.prefill_cost_model.intercept_seconds, 0.05);
        assert_eq!(
            c.stats_window_size, 100,
            "omitted fields take the router default"
        );
        let bad = ProgramSchedulingParams {
            low_watermark_ratio: Some(2.0),
            ..Default::default()
        };
        assert!(
            bad.to_router()
                .expect_err("invalid")
                .contains("high_watermark_ratio")
        );
        let bad = ProgramSchedulingParams {
            resume_order: Some("lifo".into()),
            ..Default::default()
        };
        assert!(bad.to_router().expect_err("invalid").contains("lifo"));
    }

    #[test]
    fn every_resume_order_the_crd_admits_is_one_the_router_takes() {
        use kube::CustomResourceExt;
        let crd = serde_json::to_value(crate::crd::ProgramScheduling::crd()).expect("crd");
        let found = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
            ["properties"]["programScheduling"]["properties"]["resumeOrder"]["enum"]
            .as_array()
            .cloned()
            .expect("resumeOrder is an enum in the schema");
        assert!(found.len() >= 3, "{found:?}");
        for v in found {
            let name = v.as_str().expect("a string").to_string();
            let p = ProgramSchedulingParams {
                resume_order: Some(name.clone()),
                ..Default::default()
            };
            let c = p.to_router().expect("the router takes it");
            let back = serde_json::to_value(c.resume_order).expect("serialize");
            assert_eq!(back, serde_json::Value::String(name));
        }
    }
}
