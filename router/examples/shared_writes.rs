//! What the writes of every proxied request cost when several I/O threads make them, shared
//! against kept per thread:
//!
//! - *metrics*: one shared Prometheus series each (the `prometheus` crate's counter and
//!   histograms) against the router's per-thread shards (`observe::sharded`): the route's request
//!   counter, three duration histograms (upstream header, route duration, generation duration),
//!   the target's status-class, breaker-outcome and three token counters, and (shared only: the
//!   router now reads it from the target's in-flight count when scraped) its running-requests
//!   gauge up and down;
//! - *handles*: a request's hold on the applied configuration and on forwarding's state (a clone
//!   and a drop each) and its take and return of an idle upstream connection (a lock of its I/O
//!   thread's stack, twice): clones of the shared `Arc`s beside unpadded stacks, against the
//!   router's per-thread handles (`observe::sharded::handle_here`) and stacks on cache lines of
//!   their own.
//!
//! Each thread runs "requests": a stretch of private work (`WORK_NS`, default 2 µs, so the
//! threads do not write back to back, as in a proxy), then one request's writes, timed around
//! them. Prints nanoseconds per request, less the clock's own cost, per thread count: the median
//! of 9 batches, so a stall of the machine lands in one batch. No network.
//! `cargo run --release -p program-router --example shared_writes -- 2` (the argument: the most
//! threads; docs/benchmarks.md, "Router overhead").
#![forbid(unsafe_code)]

use std::cell::RefCell;
use std::hint::black_box;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use program_router::observe::metrics::DURATION_BUCKETS as BOUNDS;
use program_router::observe::sharded::{Padded, ShardedCounter, ShardedHistogram, handle_here};
use prometheus::{Histogram, HistogramOpts, IntCounter, IntGauge};

// The router's allocator: it keeps each thread's small allocations (handles) on pages of its own.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const BATCHES: usize = 9;
const REQUESTS: u32 = 200_000;

/// The writes of one request on thread `thread`.
trait PerRequest: Send + Sync {
    fn record(&self, thread: usize, took: Duration);
}

/// Counters: the route's requests, the target's 2xx, breaker successes, three token kinds.
struct Shared([IntCounter; 6], [Histogram; 3], IntGauge);
struct Sharded([ShardedCounter; 6], [ShardedHistogram; 3]);

impl PerRequest for Shared {
    fn record(&self, _: usize, took: Duration) {
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
    fn record(&self, _: usize, took: Duration) {
        for c in &self.0 {
            c.inc();
        }
        for h in &self.1 {
            h.observe(took);
        }
    }
}

/// Stand-ins for the applied configuration and forwarding's state (a few lines each).
type Config = [u64; 32];
type Forwarding = [u64; 16];

/// The request clones the shared `Arc`s; the threads' stacks sit side by side.
struct SharedHandles(Arc<Config>, Arc<Forwarding>, Box<[Mutex<Vec<u64>>]>);
/// The request clones its thread's handles; each stack is on lines of its own.
struct ThreadHandles(Arc<Config>, Arc<Forwarding>, Box<[Padded<Mutex<Vec<u64>>>]>);

/// A thread's handle (see `handle_here`).
type Handle<T> = Arc<Arc<T>>;

thread_local! {
    static CONFIG: RefCell<Option<Handle<Config>>> = const { RefCell::new(None) };
    static FORWARDING: RefCell<Option<Handle<Forwarding>>> = const { RefCell::new(None) };
}

/// A take and a return of an idle connection on `stack`.
fn take_and_return(stack: &Mutex<Vec<u64>>) {
    let c = stack.lock().map(|mut s| s.pop()).unwrap_or(None);
    if let Ok(mut s) = stack.lock() {
        s.push(c.unwrap_or(1));
    }
}

impl PerRequest for SharedHandles {
    fn record(&self, thread: usize, _: Duration) {
        let (config, forwarding) = (Arc::clone(&self.0), Arc::clone(&self.1));
        take_and_return(&self.2[thread % self.2.len()]);
        black_box((config[0], forwarding[0]));
    }
}

impl PerRequest for ThreadHandles {
    fn record(&self, thread: usize, _: Duration) {
        let (config, forwarding) = (
            handle_here(&CONFIG, &self.0),
            handle_here(&FORWARDING, &self.1),
        );
        take_and_return(&self.2[thread % self.2.len()].0);
        black_box((config[0], forwarding[0]));
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

/// Nanoseconds the writes of a request take, averaged over `threads` threads each
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
                            m.record(t, took);
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
    // Empty: a thread's first return allocates its stack's buffer on its own pages (mimalloc's
    // per-thread heaps), as a shard's does in the router.
    let stacks = 16;
    let handles: Arc<dyn PerRequest> = Arc::new(SharedHandles(
        Arc::new([1; 32]),
        Arc::new([1; 16]),
        (0..stacks).map(|_| Mutex::new(Vec::new())).collect(),
    ));
    let thread_handles: Arc<dyn PerRequest> = Arc::new(ThreadHandles(
        Arc::new([1; 32]),
        Arc::new([1; 16]),
        (0..stacks)
            .map(|_| Padded(Mutex::new(Vec::new())))
            .collect(),
    ));
    println!(
        "threads\tmetrics shared\tmetrics sharded\thandles shared\thandles per thread\t(ns a request; {ns} ns of private work between)"
    );
    for threads in 1..=max_threads {
        let mut cols = [Vec::new(), Vec::new(), Vec::new(), Vec::new()];
        for _ in 0..BATCHES {
            let base = batch(None, threads, ns, spins);
            for (col, m) in cols
                .iter_mut()
                .zip([&shared, &sharded, &handles, &thread_handles])
            {
                col.push(batch(Some(Arc::clone(m)), threads, ns, spins) - base);
            }
        }
        let [a, b, c, d] = cols.map(median);
        println!("{threads}\t{a:.0}\t{b:.0}\t{c:.0}\t{d:.0}");
    }
    Ok(())
}
