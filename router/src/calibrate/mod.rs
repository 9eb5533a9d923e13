//! `program-router calibrate`: measures one backend rank and fits the Program scheduling cost
//! models (cold prefill, decode step) with non-negative coefficients.
//!
//! Prefill: non-streaming 1-token completions of fresh random prompts (no cache hits) at several
//! sizes; the request time less the median `/health` round trip is the cold-prefill time.
//! Decode: B concurrent streams of fresh C-token prompts; the mean inter-token interval while all
//! B decode is one step of batch B over B·(C + generated) context tokens. `decode_throughput_alpha`
//! is not derived (as in the reference procedure); configure it separately.

pub mod fit;

use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, header};
use http_body_util::{BodyExt, Full};
use rand::Rng;
use serde::Serialize;

use crate::net::client::UpstreamClient;
use crate::net::headers::DP_RANK;

/// What to measure.
#[derive(Debug, Clone, clap::Args)]
pub struct CalibrateArgs {
    /// Base URL of the vLLM server to measure.
    #[arg(long)]
    pub worker_url: String,
    /// GLOBAL DP rank to pin (X-data-parallel-rank).
    #[arg(long)]
    pub dp_rank: Option<u32>,
    /// Bearer token for the server.
    #[arg(long, env = "PROGRAM_ROUTER_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Model name (default: the first one the server lists).
    #[arg(long)]
    pub model: Option<String>,
    /// Prompt sizes (tokens) for the prefill fit.
    #[arg(long, value_delimiter = ',', default_value = "256,1024,2048,4096,8192")]
    pub prompt_sizes: Vec<u32>,
    /// Repetitions per prompt size (the median is used).
    #[arg(long, default_value_t = 3)]
    pub reps: u32,
    /// Batch sizes for the decode fit.
    #[arg(long, value_delimiter = ',', default_value = "1,4,8,16")]
    pub batch_sizes: Vec<u32>,
    /// Per-request contexts (tokens) for the decode fit.
    #[arg(long, value_delimiter = ',', default_value = "512,4096")]
    pub contexts: Vec<u32>,
    /// Tokens generated per decode request.
    #[arg(long, default_value_t = 48)]
    pub output_tokens: u32,
    /// Refuse to print coefficients when a fit's R² is below this.
    #[arg(long, default_value_t = 0.9)]
    pub min_r2: f64,
    /// Timeout of one request.
    #[arg(long, default_value_t = 300.0)]
    pub timeout_secs: f64,
    /// `json`: the fit in the router's field names, with R² and samples; `crd`: YAML to paste
    /// under `spec.programScheduling` of a ProgramScheduling resource.
    #[arg(long, value_enum, default_value_t = Format::Json)]
    pub format: Format,
}

/// How `calibrate` prints its result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Json,
    Crd,
}

#[derive(Debug, Clone, Serialize)]
pub struct Calibration {
    pub prefill_cost_model: PrefillFit,
    pub decode_throughput_model: DecodeFit,
    pub fit: FitReport,
}

impl Calibration {
    /// Why these coefficients should not be used (a fit's R² below `min_r2`, or no positive
    /// decode step), or `None` when they are fit to use.
    pub fn poor_fit(&self, min_r2: f64) -> Option<String> {
        let f = &self.fit;
        (f.prefill_r2 < min_r2
            || f.decode_r2 < min_r2
            || self.decode_throughput_model.fixed_step_seconds <= 0.0)
            .then(|| {
                format!(
                    "poor fit (prefill R² {:.3}, decode R² {:.3}, minimum {min_r2})",
                    f.prefill_r2, f.decode_r2
                )
            })
    }

    /// The two models as the ProgramScheduling resource spells them (camelCase), as YAML for
    /// `spec.programScheduling`, headed by a comment with each fit's R².
    pub fn crd_yaml(&self) -> Result<String, String> {
        let models = serde_json::json!({
            "prefill_cost_model": &self.prefill_cost_model,
            "decode_throughput_model": &self.decode_throughput_model,
        });
        let yaml = serde_yaml::to_string(&camel_keys(models)).map_err(|e| e.to_string())?;
        Ok(format!(
            "# program-router calibrate (prefill R² {:.4}, decode R² {:.4}); under spec.programScheduling:\n{yaml}",
            self.fit.prefill_r2, self.fit.decode_r2
        ))
    }
}

/// snake_case → camelCase object keys (`per_1k_tokens` → `per1kTokens`), as the CRD's serde
/// `rename_all = "camelCase"` spells the router's field names.
fn camel_keys(v: serde_json::Value) -> serde_json::Value {
    let camel = |k: &str| {
        let mut out = String::with_capacity(k.len());
        let mut upper = false;
        for c in k.chars() {
            match (c, upper) {
                ('_', _) => upper = true,
                (c, true) => {
                    out.push(c.to_ascii_uppercase());
                    upper = false;
                }
                (c, false) => out.push(c),
            }
        }
        out
    };
    match v {
        serde_json::Value::Object(m) => m
            .into_iter()
            .map(|(k, v)| (camel(&k), camel_keys(v)))
            .collect(),
        other => other,
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct PrefillFit {
    pub intercept_seconds: f64,
    pub linear_seconds_per_1k_tokens: f64,
    pub quadratic_seconds_per_1k_tokens_squared: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct DecodeFit {
    pub fixed_step_seconds: f64,
    pub batch_step_seconds_per_request: f64,
    pub context_step_seconds_per_token: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct FitReport {
    pub prefill_r2: f64,
    pub decode_r2: f64,
    /// (prompt tokens, median seconds)
    pub prefill_samples: Vec<(u32, f64)>,
    /// (batch, total context tokens, step seconds)
    pub decode_samples: Vec<(u32, f64, f64)>,
}

struct Ctx {
    client: UpstreamClient,
    url: String,
    rank: Option<u32>,
    key: Option<String>,
    timeout: Duration,
}

impl Ctx {
    fn request(&self, path: &str, body: Option<String>) -> Result<Request<Full<Bytes>>, String> {
        let mut b = Request::builder()
            .method(if body.is_some() { "POST" } else { "GET" })
            .uri(format!("{}{path}", self.url.trim_end_matches('/')))
            .header(header::CONTENT_TYPE, "application/json");
        if let Some(r) = self.rank {
            b = b.header(DP_RANK.clone(), r);
        }
        if let Some(k) = &self.key {
            b = b.header(header::AUTHORIZATION, format!("Bearer {k}"));
        }
        b.body(Full::new(Bytes::from(body.unwrap_or_default())))
            .map_err(|e| e.to_string())
    }

    async fn json(&self, path: &str, body: Option<String>) -> Result<serde_json::Value, String> {
        let req = self.request(path, body)?;
        let fut = async {
            let resp = self
                .client
                .request(req)
                .await
                .map_err(|e| format!("{path}: {e}"))?;
            let status = resp.status();
            let bytes = resp
                .into_body()
                .collect()
                .await
                .map_err(|e| format!("{path}: {e}"))?
                .to_bytes();
            if !status.is_success() {
                return Err(format!(
                    "{path}: HTTP {status}: {}",
                    String::from_utf8_lossy(&bytes)
                ));
            }
            serde_json::from_slice(&bytes).map_err(|e| format!("{path}: {e}"))
        };
        tokio::time::timeout(self.timeout, fut)
            .await
            .map_err(|_| format!("{path}: timed out"))?
    }

    /// Streams one completion; returns the arrival time of each token event.
    async fn stream(&self, body: String) -> Result<Vec<Instant>, String> {
        let req = self.request("/v1/completions", Some(body))?;
        let fut = async {
            let resp = self.client.request(req).await.map_err(|e| e.to_string())?;
            if !resp.status().is_success() {
                return Err(format!("HTTP {}", resp.status()));
            }
            let mut body = resp.into_body();
            let mut times = Vec::new();
            while let Some(frame) = body.frame().await {
                let frame = frame.map_err(|e| e.to_string())?;
                let Some(data) = frame.data_ref() else {
                    continue;
                };
                let now = Instant::now();
                let text = String::from_utf8_lossy(data);
                let tokens = text.matches("data: {").count();
                let usage_only = text.matches("\"choices\":[]").count();
                for _ in 0..tokens.saturating_sub(usage_only) {
                    times.push(now);
                }
            }
            Ok(times)
        };
        tokio::time::timeout(self.timeout, fut)
            .await
            .map_err(|_| "stream timed out".to_string())?
    }
}

fn random_prompt(tokens: u32) -> Vec<u32> {
    let mut rng = rand::rng();
    (0..tokens).map(|_| rng.random_range(100..20_000)).collect()
}

/// Runs the measurements and the fits.
pub async fn run(args: &CalibrateArgs) -> Result<Calibration, String> {
    let ctx = Ctx {
        client: crate::net::client::client(),
        url: args.worker_url.clone(),
        rank: args.dp_rank,
        key: args.api_key.clone(),
        timeout: crate::config::duration(args.timeout_secs),
    };
    let models = ctx.json("/v1/models", None).await?;
    let model = match &args.model {
        Some(m) => m.clone(),
        None => models["data"][0]["id"]
            .as_str()
            .ok_or("the server lists no model")?
            .to_string(),
    };
    let max_len = models["data"][0]["max_model_len"]
        .as_u64()
        .unwrap_or(u64::MAX);

    // Network and HTTP round trip, which the engine's prefill does not include.
    let mut rtts = Vec::new();
    for _ in 0..9 {
        let start = Instant::now();
        let req = ctx.request("/health", None)?;
        if let Ok(resp) = ctx.client.request(req).await {
            let _ = resp.into_body().collect().await;
            rtts.push(start.elapsed().as_secs_f64());
        }
    }
    rtts.sort_by(f64::total_cmp);
    let rtt = rtts.get(rtts.len() / 2).copied().unwrap_or(0.0);

    // Prefill.
    let mut prefill_samples = Vec::new();
    for &size in &args.prompt_sizes {
        if u64::from(size) + 1 > max_len {
            return Err(format!(
                "prompt size {size} does not fit max_model_len {max_len}"
            ));
        }
        let mut times = Vec::new();
        for _ in 0..args.reps.max(1) {
            let body = serde_json::json!({"model": model, "prompt": random_prompt(size), "max_tokens": 1,
                "ignore_eos": true, "temperature": 0.0});
            let start = Instant::now();
            ctx.json("/v1/completions", Some(body.to_string())).await?;
            times.push(start.elapsed().as_secs_f64());
        }
        times.sort_by(f64::total_cmp);
        prefill_samples.push((size, (times[times.len() / 2] - rtt).max(0.0)));
    }
    let px: Vec<Vec<f64>> = prefill_samples
        .iter()
        .map(|(t, _)| {
            let x = f64::from(*t) / 1000.0;
            vec![1.0, x, x * x]
        })
        .collect();
    let py: Vec<f64> = prefill_samples.iter().map(|(_, s)| *s).collect();
    let pb = fit::nnls(&px, &py).ok_or("prefill fit failed")?;
    let prefill_r2 = fit::r_squared(&px, &py, &pb);

    // Decode.
    let mut decode_samples = Vec::new();
    for &ctx_len in &args.contexts {
        for &batch in &args.batch_sizes {
            let tasks: Vec<_> = (0..batch)
                .map(|_| {
                    let body = serde_json::json!({"model": model, "prompt": random_prompt(ctx_len),
                        "max_tokens": args.output_tokens, "ignore_eos": true, "temperature": 0.0, "stream": true});
                    ctx.stream(body.to_string())
                })
                .collect();
            let mut streams = Vec::new();
            // All B requests must be in flight together: poll them concurrently.
            let joined = futures_util::future::join_all(tasks).await;
            for r in joined {
                streams.push(r?);
            }
            if let Some(step) = steady_step(&streams) {
                let context =
                    f64::from(batch) * (f64::from(ctx_len) + f64::from(args.output_tokens) / 2.0);
                decode_samples.push((batch, context, step));
            }
        }
    }
    if decode_samples.len() < 3 {
        return Err(
            "too few decode samples with all streams decoding together; raise --output-tokens"
                .into(),
        );
    }
    let dx: Vec<Vec<f64>> = decode_samples
        .iter()
        .map(|(b, c, _)| vec![1.0, f64::from(*b), *c])
        .collect();
    let dy: Vec<f64> = decode_samples.iter().map(|(_, _, s)| *s).collect();
    let db = fit::nnls(&dx, &dy).ok_or("decode fit failed")?;
    let decode_r2 = fit::r_squared(&dx, &dy, &db);
    Ok(Calibration {
        prefill_cost_model: PrefillFit {
            intercept_seconds: pb[0],
            linear_seconds_per_1k_tokens: pb[1],
            quadratic_seconds_per_1k_tokens_squared: pb[2],
        },
        decode_throughput_model: DecodeFit {
            fixed_step_seconds: db[0],
            batch_step_seconds_per_request: db[1],
            context_step_seconds_per_token: db[2],
        },
        fit: FitReport {
            prefill_r2,
            decode_r2,
            prefill_samples,
            decode_samples,
        },
    })
}

/// Mean inter-token interval while every stream is decoding, or `None` if that window is short.
fn steady_step(streams: &[Vec<Instant>]) -> Option<f64> {
    // From each stream's second token (its prefill is over) ...
    let begin = streams
        .iter()
        .map(|s| s.get(1).copied())
        .collect::<Option<Vec<_>>>()?
        .into_iter()
        .max()?;
    let end = streams
        .iter()
        .map(|s| s.last().copied())
        .collect::<Option<Vec<_>>>()?
        .into_iter()
        .min()?;
    let mut intervals = Vec::new();
    for s in streams {
        let inside: Vec<&Instant> = s.iter().filter(|t| **t >= begin && **t <= end).collect();
        if inside.len() >= 4 {
            let span = inside[inside.len() - 1]
                .duration_since(*inside[0])
                .as_secs_f64();
            intervals.push(span / (inside.len() - 1) as f64);
        }
    }
    (!intervals.is_empty()).then(|| intervals.iter().sum::<f64>() / intervals.len() as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn calibration(prefill_r2: f64, decode_r2: f64, fixed_step_seconds: f64) -> Calibration {
        Calibration {
            prefill_cost_model: PrefillFit {
                intercept_seconds: 0.07,
                linear_seconds_per_1k_tokens: 0.06,
                quadratic_seconds_per_1k_tokens_squared: 0.004,
            },
            decode_throughput_model: DecodeFit {
                fixed_step_seconds,
                batch_step_seconds_per_request: 0.0004,
                context_step_seconds_per_token: 1.4e-7,
            },
            fit: FitReport {
                prefill_r2,
                decode_r2,
                prefill_samples: vec![],
                decode_samples: vec![],
            },
        }
    }

    #[test]
    fn a_poor_fit_is_refused_with_both_r2_values() {
        assert_eq!(calibration(0.999, 0.95, 0.01).poor_fit(0.9), None);
        let why = calibration(0.999, 0.64, 0.01).poor_fit(0.9);
        assert_eq!(
            why.as_deref(),
            Some("poor fit (prefill R² 0.999, decode R² 0.640, minimum 0.9)")
        );
        assert!(calibration(0.5, 0.99, 0.01).poor_fit(0.9).is_some());
        // A decode step of no time cannot be a model of any engine.
        assert!(calibration(0.99, 0.99, 0.0).poor_fit(0.9).is_some());
    }

    #[test]
    fn crd_output_is_camel_case_yaml_with_the_fitted_values() {
        let yaml = calibration(0.9991, 0.9987, 0.011).crd_yaml().expect("yaml");
        assert!(
            yaml.starts_with("# program-router calibrate (prefill R² 0.9991, decode R² 0.9987)"),
            "{yaml}"
        );
        let v: serde_json::Value = serde_yaml::from_str(&yaml).expect("parses");
        let p = &v["prefillCostModel"];
        assert_eq!(p["interceptSeconds"], 0.07);
        assert_eq!(p["linearSecondsPer1kTokens"], 0.06);
        assert_eq!(p["quadraticSecondsPer1kTokensSquared"], 0.004);
        let d = &v["decodeThroughputModel"];
        assert_eq!(d["fixedStepSeconds"], 0.011);
        assert_eq!(d["batchStepSecondsPerRequest"], 0.0004);
        assert_eq!(d["contextStepSecondsPerToken"], 1.4e-7);
        assert_eq!(v.as_object().map(|m| m.len()), Some(2), "{yaml}");
    }
}
