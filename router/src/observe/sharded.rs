//! Counters and histograms written on every request, kept per thread and summed when scraped:
//! I/O threads (up to one per core) never write the same cache line, where one shared Prometheus
//! series moves its lines between cores on each update (docs/benchmarks.md, router overhead).
//!
//! Owns [`ShardedCounter`], [`ShardedHistogram`] and [`Family`], the collector that exposes a
//! set of them, one per set of label values, as one Prometheus metric family; and
//! [`handle_here`], a thread's own reference to a shared `Arc` (the applied configuration,
//! forwarding's state) that requests clone instead of the shared count.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use prometheus::core::{Collector, Desc};
use prometheus::proto;

/// The most shards a series has: one per core up to this many; threads past the shards share
/// one (still exact, only contended).
pub const MAX_SHARDS: usize = 16;
/// The most bucket bounds a [`ShardedHistogram`] takes.
pub const MAX_BOUNDS: usize = 24;

/// A value on cache lines of its own (128 bytes: adjacent-line prefetch pairs them), so that
/// threads writing neighbouring values do not move one line between their cores: the shards
/// here, a backend's per-shard idle connection stacks (`crate::workers::idle`).
#[repr(align(128))]
#[derive(Default)]
pub struct Padded<T>(pub T);

/// A thread's slot for [`handle_here`]: its handle on the latest value it was asked for.
pub type HandleSlot<T> = std::thread::LocalKey<std::cell::RefCell<Option<Arc<Arc<T>>>>>;

/// A handle on `shared` of this thread's own, kept in `slot`: cloning and dropping it writes a
/// count no other thread writes, where a clone of `shared` writes the count every thread shares.
/// The slot's handle is reused while it points at `shared`, else replaced (the old value is then
/// held no longer by this thread).
pub fn handle_here<T>(slot: &'static HandleSlot<T>, shared: &Arc<T>) -> Arc<Arc<T>> {
    let (handle, replaced) = slot.with(|slot| {
        let mut slot = slot.borrow_mut();
        if let Some(h) = slot.as_ref().filter(|h| Arc::ptr_eq(&***h, shared)) {
            return (h.clone(), None);
        }
        let h = Arc::new(shared.clone());
        (h.clone(), slot.replace(h))
    });
    // Dropped outside the slot's borrow, in case dropping the old value ever asks for a handle.
    drop(replaced);
    handle
}

static NEXT_SHARD: AtomicUsize = AtomicUsize::new(0);

/// Shards per series: the cores this process may use (its CPU quota), at most [`MAX_SHARDS`].
static SHARDS: LazyLock<usize> =
    LazyLock::new(|| std::thread::available_parallelism().map_or(1, |n| n.get().min(MAX_SHARDS)));

thread_local! {
    /// This thread's shard, handed out in turn as threads first record.
    static SHARD: usize = NEXT_SHARD.fetch_add(1, Ordering::Relaxed) % *SHARDS;
}

fn shard() -> usize {
    SHARD.with(|s| *s)
}

/// A monotonic counter.
pub struct ShardedCounter(Box<[Padded<AtomicU64>]>);

impl Default for ShardedCounter {
    fn default() -> Self {
        ShardedCounter((0..*SHARDS).map(|_| Padded::default()).collect())
    }
}

impl ShardedCounter {
    pub fn inc(&self) {
        self.inc_by(1);
    }

    pub fn inc_by(&self, n: u64) {
        self.0[shard()].0.fetch_add(n, Ordering::Relaxed);
    }

    /// The sum over the shards.
    pub fn get(&self) -> u64 {
        self.0
            .iter()
            .fold(0u64, |t, s| t.wrapping_add(s.0.load(Ordering::Relaxed)))
    }
}

/// One shard of a histogram: a count per bucket (the last past every bound) and the sum.
#[derive(Default)]
struct Cells {
    counts: [AtomicU64; MAX_BOUNDS + 1],
    sum_nanos: AtomicU64,
}

/// A histogram of durations with fixed bucket bounds (seconds). The count is the buckets' sum,
/// so a scrape always sees them agree; the sum may miss an observation in flight.
pub struct ShardedHistogram {
    bounds: &'static [f64],
    shards: Box<[Padded<Cells>]>,
}

/// What a scrape reads of a histogram.
#[derive(Debug, Clone, PartialEq)]
pub struct HistogramSnapshot {
    /// Observations at or under each bound, in the bounds' order.
    pub cumulative: Vec<u64>,
    pub count: u64,
    pub sum_seconds: f64,
}

impl ShardedHistogram {
    /// `bounds`: increasing, finite, at most [`MAX_BOUNDS`] (the router's own constants; debug
    /// builds assert it, so every test that builds the router's metrics checks them).
    pub fn new(bounds: &'static [f64]) -> Self {
        debug_assert!(bounds.len() <= MAX_BOUNDS && bounds.is_sorted_by(|a, b| a < b));
        ShardedHistogram {
            bounds: &bounds[..bounds.len().min(MAX_BOUNDS)],
            shards: (0..*SHARDS).map(|_| Padded::default()).collect(),
        }
    }

    pub fn observe(&self, d: Duration) {
        let seconds = d.as_secs_f64();
        // Prometheus buckets are inclusive: the first bound at or over the value. Searched from
        // the start, as most requests land in the first few buckets.
        let i = self
            .bounds
            .iter()
            .position(|b| *b >= seconds)
            .unwrap_or(self.bounds.len());
        let cells = &self.shards[shard()].0;
        cells.counts[i].fetch_add(1, Ordering::Relaxed);
        let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        cells.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> HistogramSnapshot {
        let mut counts = vec![0u64; self.bounds.len() + 1];
        let mut nanos = 0u128;
        for s in self.shards.iter() {
            for (c, cell) in counts.iter_mut().zip(&s.0.counts) {
                *c = c.wrapping_add(cell.load(Ordering::Relaxed));
            }
            nanos += u128::from(s.0.sum_nanos.load(Ordering::Relaxed));
        }
        let mut total = 0u64;
        let mut cumulative: Vec<u64> = counts
            .iter()
            .map(|c| {
                total = total.wrapping_add(*c);
                total
            })
            .collect();
        cumulative.pop();
        HistogramSnapshot {
            cumulative,
            count: total,
            sum_seconds: nanos as f64 / 1e9,
        }
    }
}

/// A series kind a [`Family`] can expose.
pub trait Series: Send + Sync {
    const TYPE: proto::MetricType;
    fn write(&self, m: &mut proto::Metric);
}

impl Series for ShardedCounter {
    const TYPE: proto::MetricType = proto::MetricType::COUNTER;
    fn write(&self, m: &mut proto::Metric) {
        let mut c = proto::Counter::default();
        c.set_value(self.get() as f64);
        m.set_counter(c);
    }
}

impl Series for ShardedHistogram {
    const TYPE: proto::MetricType = proto::MetricType::HISTOGRAM;
    fn write(&self, m: &mut proto::Metric) {
        let s = self.snapshot();
        let mut h = proto::Histogram::default();
        h.set_sample_count(s.count);
        h.set_sample_sum(s.sum_seconds);
        h.set_bucket(
            self.bounds
                .iter()
                .zip(&s.cumulative)
                .map(|(bound, n)| {
                    let mut b = proto::Bucket::default();
                    b.set_upper_bound(*bound);
                    b.set_cumulative_count(*n);
                    b
                })
                .collect(),
        );
        m.set_histogram(h);
    }
}

/// A metric family of sharded series, one per set of label values (none for a family without
/// labels). Series are made when first asked for and live until removed; the request path keeps
/// the handle it was given and never looks one up.
pub struct Family<S> {
    desc: Desc,
    labels: &'static [&'static str],
    make: fn() -> S,
    series: Mutex<Vec<(Vec<String>, Arc<S>)>>,
}

impl<S: Series + 'static> Family<S> {
    /// A family with these labels whose series `make` makes.
    pub fn new(
        name: &str,
        help: &str,
        labels: &'static [&'static str],
        make: fn() -> S,
    ) -> Result<Self, prometheus::Error> {
        let names = labels.iter().map(|l| l.to_string()).collect();
        Ok(Family {
            desc: Desc::new(name.into(), help.into(), names, Default::default())?,
            labels,
            make,
            series: Mutex::new(Vec::new()),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(Vec<String>, Arc<S>)>> {
        self.series.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The series of `values` (one per label, in the labels' order), made if new.
    pub fn with_values(&self, values: &[&str]) -> Arc<S> {
        debug_assert_eq!(values.len(), self.labels.len(), "{}", self.desc.fq_name);
        let mut series = self.lock();
        if let Some((_, s)) = series.iter().find(|(v, _)| v.iter().eq(values)) {
            return Arc::clone(s);
        }
        let s = Arc::new((self.make)());
        series.push((
            values.iter().map(|v| v.to_string()).collect(),
            Arc::clone(&s),
        ));
        s
    }

    /// Forgets the series of `values` (a handle still held records into nothing exposed).
    pub fn remove(&self, values: &[&str]) {
        self.lock().retain(|(v, _)| !v.iter().eq(values));
    }

    /// Registers the family with `registry`, keeping a handle to it.
    pub fn register(self, registry: &prometheus::Registry) -> Result<Arc<Self>, prometheus::Error> {
        let family = Arc::new(self);
        registry.register(Box::new(Registered(Arc::clone(&family))))?;
        Ok(family)
    }
}

/// The registry's handle on a family.
struct Registered<S>(Arc<Family<S>>);

impl<S: Series + 'static> Collector for Registered<S> {
    fn desc(&self) -> Vec<&Desc> {
        vec![&self.0.desc]
    }

    fn collect(&self) -> Vec<proto::MetricFamily> {
        let f = &self.0;
        let metrics = f
            .lock()
            .iter()
            .map(|(values, s)| {
                let mut m = proto::Metric::default();
                let mut pairs: Vec<proto::LabelPair> = f
                    .labels
                    .iter()
                    .zip(values)
                    .map(|(name, value)| {
                        let mut pair = proto::LabelPair::default();
                        pair.set_name(name.to_string());
                        pair.set_value(value.clone());
                        pair
                    })
                    .collect();
                // In name order, as the prometheus crate writes its own series.
                pairs.sort_by(|a, b| a.name().cmp(b.name()));
                m.set_label(pairs);
                s.write(&mut m);
                m
            })
            .collect();
        vec![family_of(&f.desc, S::TYPE, metrics)]
    }
}

/// A collected family: `desc`'s name and help, `kind`, `metrics`.
pub(super) fn family_of(
    desc: &Desc,
    kind: proto::MetricType,
    metrics: Vec<proto::Metric>,
) -> proto::MetricFamily {
    let mut family = proto::MetricFamily::default();
    family.set_name(desc.fq_name.clone());
    family.set_help(desc.help.clone());
    family.set_field_type(kind);
    family.set_metric(metrics);
    family
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threads_record_apart_and_a_scrape_sums_them() {
        let c = Arc::new(ShardedCounter::default());
        let h = Arc::new(ShardedHistogram::new(&[0.001, 0.01, 0.1]));
        std::thread::scope(|s| {
            for t in 0..(MAX_SHARDS + 3) as u64 {
                let (c, h) = (Arc::clone(&c), Arc::clone(&h));
                s.spawn(move || {
                    for _ in 0..100 {
                        c.inc();
                        h.observe(Duration::from_micros(500 + 5_000 * (t % 3)));
                    }
                });
            }
        });
        assert_eq!(c.get(), 100 * (MAX_SHARDS as u64 + 3));
        let snap = h.snapshot();
        // Threads t % 3 == 0 at 0.5 ms, 1 at 5.5 ms, 2 at 10.5 ms (over every bound but the last).
        let per = |k: u64| 100 * (0..(MAX_SHARDS + 3) as u64).filter(|t| t % 3 == k).count() as u64;
        assert_eq!(snap.cumulative, vec![per(0), per(0) + per(1), snap.count]);
        assert_eq!(snap.count, 100 * (MAX_SHARDS as u64 + 3));
        let want = (per(0) as f64 * 0.5e-3) + (per(1) as f64 * 5.5e-3) + (per(2) as f64 * 10.5e-3);
        assert!(
            (snap.sum_seconds - want).abs() < 1e-9,
            "{snap:?} against {want}"
        );
    }

    #[test]
    fn a_value_on_a_bound_is_in_that_bucket() {
        let h = ShardedHistogram::new(&[0.5, 1.0]);
        h.observe(Duration::from_millis(500));
        h.observe(Duration::from_secs(1));
        h.observe(Duration::from_secs(3));
        assert_eq!(h.snapshot().cumulative, vec![1, 2]);
        assert_eq!(h.snapshot().count, 3);
    }

    #[test]
    fn a_family_renders_as_the_prometheus_types_do() {
        use prometheus::{
            Encoder, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, Opts, Registry,
            TextEncoder,
        };
        let text = |r: &Registry| {
            let mut buf = Vec::new();
            TextEncoder::new()
                .encode(&r.gather(), &mut buf)
                .expect("encode");
            String::from_utf8(buf).expect("utf8")
        };
        const BOUNDS: &[f64] = &[0.25, 1.0];
        let ours = Registry::new();
        let family = Family::new("d_seconds", "help.", &["route", "class"], || {
            ShardedHistogram::new(BOUNDS)
        })
        .expect("family")
        .register(&ours)
        .expect("register");
        let theirs = Registry::new();
        let vec = HistogramVec::new(
            HistogramOpts::new("d_seconds", "help.").buckets(BOUNDS.to_vec()),
            &["route", "class"],
        )
        .expect("vec");
        theirs.register(Box::new(vec.clone())).expect("register");
        for (route, ms) in [("/b", 500), ("/a", 100), ("/a", 2_000), ("/c", 1)] {
            family
                .with_values(&[route, "x"])
                .observe(Duration::from_millis(ms));
            vec.with_label_values(&[route, "x"])
                .observe(ms as f64 / 1000.0);
        }
        family.remove(&["/c", "x"]);
        vec.remove_label_values(&["/c", "x"]).expect("removed");
        // A counter family beside it, with a series of no label and one of two.
        let counted = Family::new("n_total", "counted.", &["worker", "kind"], || {
            ShardedCounter::default()
        })
        .expect("family")
        .register(&ours)
        .expect("register");
        let counter =
            IntCounterVec::new(Opts::new("n_total", "counted."), &["worker", "kind"]).expect("vec");
        theirs
            .register(Box::new(counter.clone()))
            .expect("register");
        for (worker, kind, n) in [
            ("w2", "prompt", 7),
            ("w1", "prompt", 3),
            ("w1", "cached", 0),
        ] {
            counted.with_values(&[worker, kind]).inc_by(n);
            counter.with_label_values(&[worker, kind]).inc_by(n);
        }
        let plain = Family::new("p_total", "plain.", &[], ShardedCounter::default)
            .expect("family")
            .register(&ours)
            .expect("register");
        let one = IntCounter::new("p_total", "plain.").expect("counter");
        theirs.register(Box::new(one.clone())).expect("register");
        plain.with_values(&[]).inc();
        one.inc();
        assert_eq!(text(&ours), text(&theirs));
        assert!(!text(&ours).contains("/c"), "a removed series is gone");
        assert!(
            Family::new("d_seconds", "again", &[], ShardedCounter::default)
                .expect("family")
                .register(&ours)
                .is_err(),
            "a name registered twice is refused"
        );
    }
}
