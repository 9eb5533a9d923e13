//! The soak (run by name only: `cargo test --release -p program-router --test chaos -- soak`):
//! a million distinct Program ids from ten thousand tenants through one router over twenty
//! minutes, against instant simulators; the router's resident memory is sampled throughout and
//! after the paused retention, and must stay under a ceiling the caps explain.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use program_router::config::ProgramSchedulingConfig;
use program_router::config::fairness::FairnessConfig;

use crate::client::{self, Tally, chat};
use crate::procs;
use crate::scenarios::Report;

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Resident memory of `pid` in MiB.
fn rss_mib(pid: i32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

/// The ceiling the caps explain: `max_programs` Programs (about 1 KiB each with their index
/// entry and windows), 10,000 rate-limited tenants, the RequestPool's bodies, plus the
/// baseline. Set by measurement on the 2-core machine (docs/reliability.md).
const CEILING_MIB: f64 = 512.0;

pub async fn soak(dir: &Path) -> Report {
    let secs = env("SOAK_SECS", 1200);
    let programs = env("SOAK_PROGRAMS", 1_000_000) as usize;
    let tenants = env("SOAK_TENANTS", 10_000) as usize;
    let retention = env("SOAK_RETENTION_SECS", 60) as f64;
    let sims: Vec<_> = (0..2)
        .map(|i| procs::sim(dir, &format!("sim-{i}"), &["--instant", "-d", "2"]))
        .collect();
    let mut cfg = procs::config(&sims.iter().collect::<Vec<_>>());
    // SOAK_FEATURES=program,fairness (the default) turns features on; a subset tells which one
    // holds memory.
    let features = std::env::var("SOAK_FEATURES").unwrap_or_else(|_| "program,fairness".into());
    if features.contains("program") {
        cfg.program_scheduling = Some(ProgramSchedulingConfig {
            paused_retention_ttl_seconds: retention,
            ..Default::default()
        });
    }
    if features.contains("fairness") {
        cfg.fairness = Some(FairnessConfig::default());
    }
    let file = procs::write_config(dir, "router", &cfg);
    let mut router = procs::router(dir, "router", &file, &[]);
    // Phase times from here line up with a heap profile's clock (CHAOS_ROUTER_WRAPPER).
    let launched = Instant::now();
    let mut phases = Vec::new();
    let pid = router.pid();
    let c = client::client();
    let url = format!("{}/v1/chat/completions", router.base);
    // Warm-up, then the baseline.
    let warm: Vec<_> = (0..2000)
        .map(|i| chat(Some(&format!("warm-{i}")), &format!("t{}", i % 100), 200, 1))
        .collect();
    let _ = client::run_load(&c, &url, warm, 32, Duration::from_secs(30)).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let baseline = rss_mib(pid);
    phases.push(format!(
        "baseline {:.0} s",
        launched.elapsed().as_secs_f64()
    ));
    let peak = Arc::new(std::sync::Mutex::new(baseline));
    let sampler = {
        let peak = peak.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(5)).await;
                let r = rss_mib(pid);
                if let Ok(mut p) = peak.lock() {
                    *p = p.max(r);
                }
            }
        })
    };
    // SOAK_CYCLES > 1 repeats the load with new ids after each retention: memory kept after the
    // first cycle that is reused by the next stays flat; a leak grows cycle by cycle.
    let cycles = env("SOAK_CYCLES", 1).max(1);
    let mut tally = Tally::default();
    let (mut ran, mut at_end, mut after) = (Duration::ZERO, baseline, baseline);
    let mut per_cycle = Vec::new();
    for cycle in 0..cycles {
        let next = Arc::new(AtomicUsize::new(0));
        let start = Instant::now();
        let per = Duration::from_secs(secs).as_secs_f64() / programs as f64;
        let workers: Vec<_> = (0..32)
            .map(|_| {
                let (c, url, next) = (c.clone(), url.clone(), next.clone());
                tokio::spawn(async move {
                    let mut t = Tally::default();
                    loop {
                        let n = next.fetch_add(1, Ordering::Relaxed);
                        if n >= programs {
                            return t;
                        }
                        let due = start + Duration::from_secs_f64(per * n as f64);
                        tokio::time::sleep_until(due.into()).await;
                        let r = chat(
                            Some(&format!("soak-{cycle}-{n}")),
                            &format!("t{}", n % tenants),
                            200,
                            1,
                        );
                        t.add(client::send(&c, &url, &r, Duration::from_secs(30)).await);
                    }
                })
            })
            .collect();
        for w in workers {
            if let Ok(t) = w.await {
                tally.merge(&t);
            }
        }
        ran += start.elapsed();
        at_end = rss_mib(pid);
        phases.push(format!(
            "end of load {:.0} s",
            launched.elapsed().as_secs_f64()
        ));
        // The paused retention passes; every Program of the cycle is forgotten.
        tokio::time::sleep(Duration::from_secs_f64(retention + 15.0)).await;
        after = rss_mib(pid);
        phases.push(format!(
            "after the retention {:.0} s",
            launched.elapsed().as_secs_f64()
        ));
        per_cycle.push(format!("{after:.0}"));
    }
    sampler.abort();
    let peak = peak.lock().map(|p| p.max(at_end)).unwrap_or(at_end);
    let m = client::get_text(&c, &router.metrics_url()).await;
    let held = client::metric(&m, "vllm_router_agent_aware_rank_active_programs");
    let within = peak < CEILING_MIB;
    // A clean exit, which also lets a heap profiler write its profile.
    router.signal("TERM");
    let exit = match router.wait_exit(Duration::from_secs(60)) {
        Ok(code) => format!("router exit code {code:?}"),
        Err(e) => format!("router did not exit: {e}"),
    };
    Report {
        name: "soak",
        load: format!(
            "{} distinct Programs from {tenants} tenants over {:.0} s ({:.0} req/s)",
            programs as u64 * cycles,
            ran.as_secs_f64(),
            tally.accepted() as f64 / ran.as_secs_f64()
        ),
        fault: "none (memory over time)".into(),
        tally,
        recovery: format!(
            "RSS MiB: baseline {baseline:.0}, peak {peak:.0} (ceiling {CEILING_MIB:.0}{}), end of load {at_end:.0}, after the retention {after:.0}",
            if within { "" } else { " EXCEEDED" }
        ),
        notes: vec![
            format!("active Programs after the retention: {held}"),
            format!(
                "RSS MiB after each cycle's retention ({cycles} cycles): {}",
                per_cycle.join(", ")
            ),
            format!("since the router started: {}", phases.join(", ")),
            exit,
        ],
    }
}
