//! What the metrics written on every proxied request cost when several I/O threads write them:
//! one shared Prometheus series each (the `prometheus` crate's counter and histograms) against
//! the router's per-thread shards (`observe::sharded`).
//!
//! Each thread runs "requests": a stretch of private work (`WORK_NS`, default 2 µs, so the
//! threads do not write back to back, as in a proxy), then the updates a proxied request makes —
//! the route's request counter, three duration histograms (upstream header, route duration,
//! generation duration), the target's status-class, breaker-outcome and three token counters,
//! and (shared only: the router now reads it from the target's in-flight count when scraped)
//! its running-requests gauge up and down — timed around the updates. Prints nanoseconds per
//! request, less the clock's own cost, per thread count: the median of 9 batches, so a stall of
//! the machine lands in one batch. No network.
//! `cargo run --release -p program-router --example metric_contention -- 2` (the argument: the
//! most threads; docs/benchmarks.md, "Router overhead").
#![forbid(unsafe_code)]

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use program_router::observe::metrics::DURATION_BUCKETS as BOUNDS;
use program_router::observe::sharded::{ShardedCounter, ShardedHistogram};
use prometheus::{Histogram, HistogramOpts, IntCounter, IntGauge};

const BATCHES: usize = 9;
const REQUESTS: u32 = 200_000;

/// The metrics one request writes.
trait PerRequest: Send + Sync {
    fn record(&self, took: Duration);
}

/// Counters: the route's requests, the target's 2xx, breaker successes, three token kinds.
struct Shared([IntCounter; 6], [Histogram; 3], IntGauge);
struct Sharded([ShardedCounter; 6], [ShardedHistogram; 3]);

impl PerRequest for Shared {
    fn record(&self, took: Duration) {
        self.2.inc();
        for c in &self.0 {
            c.inc();
        }
        for h in &self.1 {
            h.observe(took.as_secs_f64());
        }
        self.2.dec();
    }
}

impl PerRequest for Sharded {
    fn record(&self, took: Duration) {
        for c in &self.0 {
            c.inc();
        }
        for h in &self.1 {
            h.observe(took);
        }
    }
}

/// Private work of about `ns` nanoseconds (a chain of dependent multiplies).
fn work(ns: u64, spins_per_ns: f64) -> u64 {
    let mut x = black_box(0x9e37_79b9_7f4a_7c15_u64);
    for _ in 0..(ns as f64 * spins_per_ns) as u64 {
        x = x.wrapping_mul(0x2545_f491_4f6c_dd1d).rotate_left(7);
    }
    x
}

/// Nanoseconds the metric updates of a request take, averaged over `threads` threads each
/// running [`REQUESTS`] (timed around the updates alone; `None` times nothing, the clock's own
/// cost, which the caller subtracts).
fn batch(m: Option<Arc<dyn PerRequest>>, threads: usize, ns: u64, spins: f64) -> f64 {
    let total: u128 = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let m = m.clone();
                s.spawn(move || {
                    let mut spent = 0u128;
                    for i in 0..REQUESTS {
                        black_box(work(ns, spins));
                        let took = Duration::from_micros(u64::from(i % 5_000) + t as u64);
                        let start = Instant::now();
                        if let Some(m) = &m {
                            m.record(took);
                        }
                        spent += start.elapsed().as_nanos();
                    }
                    spent
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or(0)).sum()
    });
    total as f64 / (f64::from(REQUESTS) * threads as f64)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let max_threads: usize = std::env::args().nth(1).map_or(Ok(2), |a| a.parse())?;
    let ns: u64 = std::env::var("WORK_NS").map_or(Ok(2_000), |v| v.parse())?;
    // Calibrate the spin loop to nanoseconds on this machine.
    let t = Instant::now();
    black_box(work(10_000_000, 1.0));
    let spins = 1e7 / t.elapsed().as_nanos() as f64;
    let hist = || Histogram::with_opts(HistogramOpts::new("h", "h").buckets(BOUNDS.to_vec()));
    let counter = || IntCounter::new("c", "c");
    let shared: Arc<dyn PerRequest> = Arc::new(Shared(
        [
            counter()?,
            counter()?,
            counter()?,
            counter()?,
            counter()?,
            counter()?,
        ],
        [hist()?, hist()?, hist()?],
        IntGauge::new("g", "g")?,
    ));
    let sharded: Arc<dyn PerRequest> = Arc::new(Sharded(
        std::array::from_fn(|_| ShardedCounter::default()),
        std::array::from_fn(|_| ShardedHistogram::new(BOUNDS)),
    ));
    println!("threads\tshared ns/request\tsharded ns/request\t({ns} ns of private work between)");
    for threads in 1..=max_threads {
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for _ in 0..BATCHES {
            let base = batch(None, threads, ns, spins);
            a.push(batch(Some(Arc::clone(&shared)), threads, ns, spins) - base);
            b.push(batch(Some(Arc::clone(&sharded)), threads, ns, spins) - base);
        }
        println!("{threads}\t{:.0}\t{:.0}", median(a), median(b));
    }
    Ok(())
}
