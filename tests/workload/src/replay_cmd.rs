//! `progbench replay`: one real-time replay of a workload against an endpoint already running on
//! loopback (a router, a simulator, or a real server reached through `kubectl port-forward`),
//! with a summary on stdout and every request and Program in JSON.
//!
//! Owns the loopback rule for the target URL and the summary (served work, token hit from the
//! backend's own usage against the oracle's H* over the same turns, JCT, latency and time to
//! first token percentiles). The replay itself is [`crate::replay`].

use std::net::IpAddr;

use serde::Serialize;
use vllm_sim::engine::EngineParams;

use crate::des::{mean, percentile};
use crate::replay::ReplayReport;
use crate::workload::Turn;

/// Refuses a URL whose host is not loopback (127.0.0.0/8, ::1, `localhost`): benchmark traffic
/// stays on this machine. A remote endpoint is reached through a port-forward.
pub fn check_loopback(url: &str) -> Result<(), String> {
    let uri: hyper::Uri = url
        .parse()
        .map_err(|e| format!("--url {url:?} is not a URL: {e}"))?;
    if !matches!(uri.scheme_str(), Some("http")) {
        return Err(format!("--url {url:?}: only http:// is supported"));
    }
    let host = uri.host().unwrap_or_default();
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let loopback = bare.eq_ignore_ascii_case("localhost")
        || bare.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback());
    if loopback {
        Ok(())
    } else {
        Err(format!(
            "--url {url:?} is not on loopback (127.0.0.0/8, [::1], localhost): replay sends \
             benchmark traffic only to this machine; reach a remote endpoint through a \
             port-forward (`kubectl port-forward svc/NAME 8000:8000`)"
        ))
    }
}

/// What one replay served and measured, in the workload's seconds.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub requests: usize,
    pub errors: u64,
    pub programs_completed: u64,
    pub programs_cut: u64,
    pub programs_stopped: u64,
    pub timed_out: bool,
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    pub completion_tokens: u64,
    /// Cached over prompt tokens, from the backend's usage of the answered requests.
    pub token_hit: f64,
    /// H* over exactly the turns answered (every later turn hitting its whole prefix).
    pub oracle_token_hit: f64,
    pub mean_jct: f64,
    pub p50_jct: f64,
    pub p90_jct: f64,
    pub p99_jct: f64,
    pub p50_latency: f64,
    pub p99_latency: f64,
    /// Streamed requests only.
    pub p50_ttft: Option<f64>,
    pub p99_ttft: Option<f64>,
}

/// The summary of `report`, a replay of `turns` (H* with `engine`'s block size).
pub fn summarize(report: &ReplayReport, turns: &[Turn], engine: &EngineParams) -> Summary {
    let ok: Vec<_> = report.requests.iter().filter(|r| r.status == 200).collect();
    let sorted = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v
    };
    let jcts = sorted(report.jct.iter().map(|j| j.1).collect());
    let latencies = sorted(ok.iter().map(|r| r.latency_seconds).collect());
    let ttfts = sorted(ok.iter().filter_map(|r| r.ttft_seconds).collect());
    let (prompt, cached) = (report.prompt_tokens(), report.cached_tokens());
    Summary {
        requests: report.requests.len(),
        errors: report.errors,
        programs_completed: report.completed,
        programs_cut: report.truncated,
        programs_stopped: report.stopped,
        timed_out: report.timed_out,
        prompt_tokens: prompt,
        cached_tokens: cached,
        completion_tokens: report.completion_tokens(),
        token_hit: if prompt == 0 {
            0.0
        } else {
            cached as f64 / prompt as f64
        },
        oracle_token_hit: crate::oracle::bounds_served(turns, engine, &report.served()).token_hit,
        mean_jct: mean(&jcts),
        p50_jct: percentile(&jcts, 0.5),
        p90_jct: percentile(&jcts, 0.9),
        p99_jct: percentile(&jcts, 0.99),
        p50_latency: percentile(&latencies, 0.5),
        p99_latency: percentile(&latencies, 0.99),
        p50_ttft: (!ttfts.is_empty()).then(|| percentile(&ttfts, 0.5)),
        p99_ttft: (!ttfts.is_empty()).then(|| percentile(&ttfts, 0.99)),
    }
}

impl Summary {
    /// Whether every request was answered and the replay ended within its limit.
    pub fn clean(&self) -> bool {
        self.errors == 0 && !self.timed_out
    }

    /// The summary as lines for stdout.
    pub fn lines(&self) -> Vec<String> {
        let ttft = match (self.p50_ttft, self.p99_ttft) {
            (Some(a), Some(b)) => format!("TTFT p50 {a:.3} s, p99 {b:.3} s"),
            _ => "TTFT: not measured (replay with --stream)".into(),
        };
        vec![
            format!(
                "requests {} ({} failed); Programs: {} completed, {} stopped by max_model_len, \
                 {} by --max-requests{}",
                self.requests,
                self.errors,
                self.programs_completed,
                self.programs_cut,
                self.programs_stopped,
                if self.timed_out {
                    "; hit the --limit-secs limit"
                } else {
                    ""
                }
            ),
            format!(
                "token hit {:.1} % (H* over the same turns {:.1} %); prompt {} / cached {} / \
                 output {} tokens",
                self.token_hit * 100.0,
                self.oracle_token_hit * 100.0,
                self.prompt_tokens,
                self.cached_tokens,
                self.completion_tokens
            ),
            format!(
                "JCT mean {:.1} s, p50 {:.1} s, p90 {:.1} s, p99 {:.1} s; request latency p50 \
                 {:.3} s, p99 {:.3} s; {ttft}",
                self.mean_jct,
                self.p50_jct,
                self.p90_jct,
                self.p99_jct,
                self.p50_latency,
                self.p99_latency
            ),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_urls_pass() {
        for ok in [
            "http://127.0.0.1:8000",
            "http://127.3.2.1:1/",
            "http://localhost:29000",
            "http://[::1]:8000",
        ] {
            check_loopback(ok).unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
        for (bad, why) in [
            ("http://10.0.0.1:8000", "not on loopback"),
            ("http://example.com", "not on loopback"),
            ("http://[2001:db8::1]:80", "not on loopback"),
            ("https://127.0.0.1:8000", "only http://"),
            ("127.0.0.1:8000", "only http://"),
            ("http://exa mple", "not a URL"),
        ] {
            let e = check_loopback(bad).expect_err(bad);
            assert!(e.contains(why), "{bad}: {e}");
        }
    }
}
