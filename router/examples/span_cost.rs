//! What a span entered on each poll of a request costs at `info` when several I/O threads enter
//! theirs, with the log's filter the router installs (`observe::log_filter`) against `EnvFilter`
//! behind `reload::Layer` (the filter the router had before `log_filter`). The router builds such
//! spans only with tracing on (`observe::trace`); its log lines name their request without one
//! (`observe::log_context`).
//!
//! Each thread runs "requests": a `request` span made with three fields (id, method, path), entered
//! and left six times (a proxied request's polls, each after a stretch of private work,
//! `WORK_NS`, default 300 ns), then closed. Prints nanoseconds per request, less the work, per
//! thread count: the median of 9 batches. Nothing is logged (no event fires), so this is the
//! span alone; no network.
//! `cargo run --release -p program-router --example span_cost -- own 2` and `-- env 2` (the
//! filter, then the most threads; one filter per process, as the subscriber is global).
#![forbid(unsafe_code)]

use std::hint::black_box;
use std::time::{Duration, Instant};

use program_router::observe::log_filter::{self, LogFilter};
use program_router::observe::log_format::LineFormat;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::{EnvFilter, reload};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const BATCHES: usize = 9;
const REQUESTS: u32 = 100_000;
const POLLS: u32 = 6;

fn work(ns: u64) {
    let until = Instant::now() + Duration::from_nanos(ns);
    while Instant::now() < until {
        black_box(());
    }
}

/// One thread's batch: nanoseconds per request, the work included.
fn batch(work_ns: u64) -> f64 {
    let start = Instant::now();
    for i in 0..REQUESTS {
        let span = tracing::info_span!(
            "request",
            id = black_box("req-1"),
            method = "POST",
            path = "/v1/chat/completions"
        );
        for _ in 0..POLLS {
            let _in = span.enter();
            work(work_ns);
            black_box(i);
        }
    }
    start.elapsed().as_nanos() as f64 / f64::from(REQUESTS)
}

/// The router's log layer (JSON lines), to nowhere.
fn log<S>() -> impl tracing_subscriber::Layer<S>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    let format = LineFormat::json();
    tracing_subscriber::fmt::layer()
        .event_format(format)
        .fmt_fields(format.fields())
        .with_writer(std::io::sink)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> Result<(), String> {
    let mut args = std::env::args().skip(1);
    let which = args.next().unwrap_or_else(|| "own".into());
    let most: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(2);
    let work_ns: u64 = std::env::var("WORK_NS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let installed = match which.as_str() {
        "own" => tracing::subscriber::set_global_default(
            tracing_subscriber::registry()
                .with(LogFilter::new(log_filter::parse("info")?))
                .with(log()),
        ),
        "env" => tracing::subscriber::set_global_default(
            tracing_subscriber::registry()
                .with(reload::Layer::new(EnvFilter::new("info")).0)
                .with(log()),
        ),
        other => return Err(format!("the filter is `own` or `env`, not `{other}`")),
    };
    installed.map_err(|e| e.to_string())?;
    // The work alone, on one thread, to subtract.
    let alone = median(
        (0..BATCHES)
            .map(|_| {
                let start = Instant::now();
                for i in 0..REQUESTS {
                    for _ in 0..POLLS {
                        work(work_ns);
                        black_box(i);
                    }
                }
                start.elapsed().as_nanos() as f64 / f64::from(REQUESTS)
            })
            .collect(),
    );
    for threads in 1..=most {
        let per_thread: Vec<f64> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..threads)
                .map(|_| s.spawn(move || median((0..BATCHES).map(|_| batch(work_ns)).collect())))
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or(f64::NAN))
                .collect()
        });
        let worst = per_thread.iter().copied().fold(f64::MIN, f64::max);
        println!(
            "{which}: {threads} thread(s): {:.0} ns a request's span (worst thread; work {alone:.0} ns subtracted)",
            worst - alone
        );
    }
    Ok(())
}
