//! `progbench fairness`: one power user against light tenants on one simulated rank, through
//! program-router without fair queueing (FIFO), with round robin, with VTC, and through
//! vllm-router for reference — each on a fresh simulator.
//!
//! The power tenant sends its whole backlog at once; shortly after, every light tenant sends its
//! own (smaller) backlog. Reported per run: time to first token (the wait a user sees: router
//! queue + engine queue + prefill) per tenant group, Jain's index over the output tokens of the
//! requests whose service began while every tenant still had requests to start (from the light
//! tenants' arrival until the first tenant's last request began), and output-token throughput
//! over the whole run.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde::Serialize;
use serde_json::json;

use crate::compare::{Procs, free_port, spawn, start_sim, wait_ok};
use crate::des::percentile;

/// One router setup to measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[value(rename_all = "kebab-case")]
pub enum FairVariant {
    /// program-router, no fair queueing: the engine's FIFO decides.
    Fifo,
    /// program-router, fair queueing by request-count round robin.
    RoundRobin,
    /// program-router, fair queueing by Virtual Token Counter.
    Vtc,
    /// vllm-router 0.1.17 (round_robin policy), for reference.
    VllmRouter,
}

#[derive(Debug, Clone)]
pub struct FairSetup {
    pub power_requests: usize,
    pub light_tenants: usize,
    pub light_requests: usize,
    /// Seconds after the power backlog that the light tenants arrive.
    pub light_delay: f64,
    pub max_tokens: u32,
    pub prompt_words: usize,
    pub max_num_seqs: usize,
    pub time_scale: f64,
    pub max_waiting: u32,
    pub bin_dir: PathBuf,
    pub vllm_router: Option<PathBuf>,
}

#[derive(Debug, Clone, Serialize)]
pub struct FairResult {
    pub variant: FairVariant,
    pub ok: bool,
    pub failure: Option<String>,
    pub errors: usize,
    pub light_ttft_p50: f64,
    pub light_ttft_p95: f64,
    pub power_ttft_p50: f64,
    pub power_ttft_p95: f64,
    pub jain: f64,
    /// Output tokens per tenant (power first) of the requests counted for Jain's index.
    pub window_tokens: Vec<f64>,
    pub output_tokens: u64,
    pub tokens_per_second: f64,
}

struct Done {
    tenant: usize,
    sent: f64,
    ttft: f64,
    finished: f64,
    tokens: u64,
    ok: bool,
}

type Http = Client<HttpConnector, Full<Bytes>>;

async fn one(c: Http, url: String, tenant: usize, body: String, t0: Instant) -> Done {
    let sent = t0.elapsed().as_secs_f64();
    let fail = |t: f64| Done {
        tenant,
        sent,
        ttft: t,
        finished: t,
        tokens: 0,
        ok: false,
    };
    let Ok(req) = hyper::Request::post(&url)
        .header("content-type", "application/json")
        .header("x-tenant-id", format!("tenant-{tenant}"))
        .body(Full::new(Bytes::from(body)))
    else {
        return fail(sent);
    };
    let Ok(resp) = c.request(req).await else {
        return fail(t0.elapsed().as_secs_f64());
    };
    let ok = resp.status().is_success();
    let mut body = resp.into_body();
    let mut first = None;
    let mut tokens = 0u64;
    let mut buf = Vec::new();
    while let Some(frame) = body.frame().await {
        let Ok(frame) = frame else {
            return fail(t0.elapsed().as_secs_f64());
        };
        if let Some(d) = frame.data_ref() {
            if first.is_none() && memchr_content(d) {
                first = Some(t0.elapsed().as_secs_f64());
            }
            buf.extend_from_slice(d);
        }
    }
    // The final usage chunk carries the output token count.
    let text = String::from_utf8_lossy(&buf);
    for line in text.lines().rev() {
        if let Some(j) = line.strip_prefix("data: ")
            && let Ok(v) = serde_json::from_str::<serde_json::Value>(j)
            && let Some(n) = v["usage"]["completion_tokens"].as_u64()
        {
            tokens = n;
            break;
        }
    }
    let finished = t0.elapsed().as_secs_f64();
    Done {
        tenant,
        sent,
        ttft: first.unwrap_or(finished) - sent,
        finished,
        tokens,
        ok,
    }
}

/// Whether an SSE chunk carries generated text (the first token), not just the role.
fn memchr_content(d: &[u8]) -> bool {
    d.windows(11).any(|w| w == b"\"content\":\"")
        && !d.windows(12).any(|w| w == b"\"content\":\"\"")
}

fn words(tenant: usize, i: usize, n: usize) -> String {
    (0..n)
        .map(|k| format!("t{tenant}r{i}w{k} "))
        .collect::<String>()
}

impl FairResult {
    fn new(variant: FairVariant) -> Self {
        FairResult {
            variant,
            ok: false,
            failure: None,
            errors: 0,
            light_ttft_p50: 0.0,
            light_ttft_p95: 0.0,
            power_ttft_p50: 0.0,
            power_ttft_p95: 0.0,
            jain: 0.0,
            window_tokens: Vec::new(),
            output_tokens: 0,
            tokens_per_second: 0.0,
        }
    }
}

/// Runs one variant on a fresh simulator.
pub async fn run(v: FairVariant, s: &FairSetup) -> FairResult {
    let mut r = FairResult::new(v);
    match inner(v, s, &mut r).await {
        Ok(()) => r.ok = true,
        Err(e) => r.failure = Some(e),
    }
    r
}

async fn inner(v: FairVariant, s: &FairSetup, r: &mut FairResult) -> Result<(), String> {
    let mut procs = Procs(Vec::new());
    let sim = start_sim(
        &mut procs,
        &s.bin_dir,
        free_port()?,
        &[
            ("max-num-seqs", s.max_num_seqs.to_string()),
            ("time-scale", s.time_scale.to_string()),
        ],
    )?;
    let (port, prom) = (free_port()?, free_port()?);
    let dir = std::env::temp_dir().join(format!("progbench-fair-{}-{port}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let (bin, args, health) = match v {
        FairVariant::Fifo | FairVariant::RoundRobin | FairVariant::Vtc => {
            let mut cfg = json!({
                "host": "127.0.0.1", "port": port,
                "prometheus_host": "127.0.0.1", "prometheus_port": prom,
                "workers": [{"url": sim}],
                "policy": {"kind": "round_robin"},
                "observation": {"interval_secs": 0.5},
                "log_level": "warn",
            });
            if v != FairVariant::Fifo {
                cfg["fairness"] = json!({
                    "discipline": if v == FairVariant::Vtc { "vtc" } else { "round_robin" },
                    "classes": [{"name": "standard", "max_waiting_requests": s.max_waiting}],
                    "default_class": "standard",
                    "max_queue_per_tenant": s.power_requests.max(s.light_requests) + 1,
                    "queue_timeout_seconds": 3600.0,
                });
            }
            let path = dir.join("router.json");
            std::fs::write(&path, cfg.to_string()).map_err(|e| e.to_string())?;
            (
                s.bin_dir.join("program-router"),
                vec!["--config".to_string(), path.display().to_string()],
                "/readiness",
            )
        }
        FairVariant::VllmRouter => {
            let bin = s
                .vllm_router
                .clone()
                .ok_or("vllm-router is not installed (pip install vllm-router==0.1.17)")?;
            let args = [
                "--host",
                "127.0.0.1",
                "--port",
                &port.to_string(),
                "--worker-urls",
                &sim,
                "--policy",
                "round_robin",
                "--prometheus-host",
                "127.0.0.1",
                "--prometheus-port",
                &prom.to_string(),
                "--log-level",
                "warning",
            ]
            .iter()
            .map(|a| a.to_string())
            .collect();
            (bin, args, "/health")
        }
    };
    procs.0.push(spawn(&bin, &args)?);
    let base = format!("http://127.0.0.1:{port}");
    if !wait_ok(&format!("{base}{health}"), 60.0) {
        return Err(format!("{v:?}: router did not become ready"));
    }
    let url = format!("{base}/v1/chat/completions");
    let client: Http = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(2048)
        // Drop idle connections well before the router's idle limit (60 s) closes them, so a
        // turn after a long tool call does not race the server's close.
        .pool_idle_timeout(std::time::Duration::from_secs(30))
        .pool_timer(hyper_util::rt::TokioTimer::new())
        .build_http();
    let body = |tenant: usize, i: usize| {
        json!({"model": "sim-model", "stream": true, "stream_options": {"include_usage": true},
            "max_tokens": s.max_tokens,
            "messages": [{"role": "user", "content": words(tenant, i, s.prompt_words)}]})
        .to_string()
    };
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..s.power_requests {
        tasks.push(tokio::spawn(one(
            client.clone(),
            url.clone(),
            0,
            body(0, i),
            t0,
        )));
    }
    tokio::time::sleep(Duration::from_secs_f64(s.light_delay)).await;
    for t in 1..=s.light_tenants {
        for i in 0..s.light_requests {
            tasks.push(tokio::spawn(one(
                client.clone(),
                url.clone(),
                t,
                body(t, i),
                t0,
            )));
        }
    }
    let mut done = Vec::new();
    for t in tasks {
        done.push(t.await.map_err(|e| e.to_string())?);
    }
    let _ = std::fs::remove_dir_all(&dir);
    drop(procs);
    if let Ok(path) = std::env::var("PROGBENCH_FAIR_TRACE") {
        // tenant, sent, first token, finished, tokens — one line per request, for inspection.
        let lines: String = done
            .iter()
            .map(|d| {
                format!(
                    "{} {:.4} {:.4} {:.4} {}\n",
                    d.tenant,
                    d.sent,
                    d.sent + d.ttft,
                    d.finished,
                    d.tokens
                )
            })
            .collect();
        let _ = std::fs::write(format!("{path}.{v:?}"), lines);
    }
    summarize(&done, s.light_tenants, r);
    if r.errors > 0 {
        return Err(format!("{} requests failed", r.errors));
    }
    Ok(())
}

fn summarize(done: &[Done], light_tenants: usize, r: &mut FairResult) {
    r.errors = done.iter().filter(|d| !d.ok).count();
    let ttft = |power: bool| -> Vec<f64> {
        let mut v: Vec<f64> = done
            .iter()
            .filter(|d| d.ok && (d.tenant == 0) == power)
            .map(|d| d.ttft)
            .collect();
        v.sort_by(f64::total_cmp);
        v
    };
    let (light, power) = (ttft(false), ttft(true));
    r.light_ttft_p50 = percentile(&light, 0.5);
    r.light_ttft_p95 = percentile(&light, 0.95);
    r.power_ttft_p50 = percentile(&power, 0.5);
    r.power_ttft_p95 = percentile(&power, 0.95);
    // Contention: from the light tenants' arrival until the first tenant has nothing left to
    // start (its last request began). A request counts when its service began (first token)
    // inside the window, so work the engine accepted before the light tenants arrived, and a
    // tenant's in-flight tail after it stopped competing, do not count.
    let opened = done
        .iter()
        .filter(|d| d.tenant != 0)
        .map(|d| d.sent)
        .fold(f64::INFINITY, f64::min);
    let window = (0..=light_tenants)
        .filter_map(|t| {
            done.iter()
                .filter(|d| d.tenant == t)
                .map(|d| d.sent + d.ttft)
                .reduce(f64::max)
        })
        .fold(f64::INFINITY, f64::min);
    let served: Vec<f64> = (0..=light_tenants)
        .map(|t| {
            done.iter()
                .filter(|d| {
                    let began = d.sent + d.ttft;
                    d.tenant == t && began >= opened && began <= window
                })
                .map(|d| d.tokens as f64)
                .sum()
        })
        .collect();
    let (sum, sq) = served
        .iter()
        .fold((0.0, 0.0), |(a, b), x| (a + x, b + x * x));
    r.jain = if sq > 0.0 {
        sum * sum / (served.len() as f64 * sq)
    } else {
        0.0
    };
    r.window_tokens = served;
    r.output_tokens = done.iter().map(|d| d.tokens).sum();
    let start = done.iter().map(|d| d.sent).fold(f64::INFINITY, f64::min);
    let end = done.iter().map(|d| d.finished).fold(0.0, f64::max);
    r.tokens_per_second = r.output_tokens as f64 / (end - start).max(1e-9);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(tenant: usize, sent: f64, began: f64, finished: f64, tokens: u64) -> Done {
        Done {
            tenant,
            sent,
            ttft: began - sent,
            finished,
            tokens,
            ok: true,
        }
    }

    #[test]
    fn jain_counts_service_begun_while_everyone_has_work() {
        // Equal service inside [light arrival 0.2, first tenant done 2.0]; power's big request
        // begins after the window and does not count.
        let done = [
            d(0, 0.0, 0.5, 1.0, 10),
            d(0, 0.0, 2.5, 3.0, 100),
            d(1, 0.2, 0.6, 2.0, 10),
        ];
        let mut r = run_result();
        summarize(&done, 1, &mut r);
        assert!((r.jain - 1.0).abs() < 1e-9, "{}", r.jain);
        assert_eq!(r.output_tokens, 120);
        // FIFO-like: the light tenant's request begins only after power is done.
        let done = [
            d(0, 0.0, 0.5, 1.0, 10),
            d(0, 0.0, 1.2, 2.0, 10),
            d(1, 0.2, 2.5, 3.0, 10),
        ];
        summarize(&done, 1, &mut r);
        assert!((r.jain - 0.5).abs() < 1e-9, "{}", r.jain);
        assert!((r.light_ttft_p95 - 2.3).abs() < 1e-9);
    }

    fn run_result() -> FairResult {
        FairResult::new(FairVariant::Vtc)
    }
}
