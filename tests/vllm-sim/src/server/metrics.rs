//! `/metrics`: the engines' counters in vLLM's Prometheus names, one series per `engine` (the
//! GLOBAL DP rank) and `model_name`.
//!
//! Owns the translation of [`EngineStats`] snapshots into metric families at scrape time (no
//! per-request metric updates on the hot path); encoding is the `prometheus` crate's.

use prometheus::proto::{Bucket, Counter, Gauge, LabelPair, Metric, MetricFamily, MetricType};
use prometheus::{Encoder, TextEncoder};

use super::rank::Rank;
use crate::engine::{EngineStats, Histogram, Load};

/// (name, help, accessor) of one counter or histogram family.
type Series<T> = (&'static str, &'static str, fn(&EngineStats) -> T);

/// (name, help, accessor) of one histogram family.
type HistSeries = (
    &'static str,
    &'static str,
    for<'a> fn(&'a EngineStats) -> &'a Histogram,
);

struct Snapshot {
    engine: String,
    load: Load,
    stats: EngineStats,
    block_size: usize,
    num_gpu_blocks: usize,
}

fn labels(pairs: &[(&str, &str)]) -> Vec<LabelPair> {
    pairs
        .iter()
        .map(|(k, v)| {
            let mut l = LabelPair::default();
            l.set_name((*k).to_string());
            l.set_value((*v).to_string());
            l
        })
        .collect()
}

fn family(name: &str, help: &str, kind: MetricType, metrics: Vec<Metric>) -> MetricFamily {
    let mut f = MetricFamily::default();
    f.set_name(name.to_string());
    f.set_help(help.to_string());
    f.set_field_type(kind);
    f.set_metric(metrics);
    f
}

fn gauge(l: Vec<LabelPair>, v: f64) -> Metric {
    let mut g = Gauge::default();
    g.set_value(v);
    let mut m = Metric::default();
    m.set_label(l);
    m.set_gauge(g);
    m
}

fn counter(l: Vec<LabelPair>, v: f64) -> Metric {
    let mut c = Counter::default();
    c.set_value(v);
    let mut m = Metric::default();
    m.set_label(l);
    m.set_counter(c);
    m
}

fn histogram(l: Vec<LabelPair>, h: &Histogram) -> Metric {
    let mut p = prometheus::proto::Histogram::default();
    p.set_sample_count(h.count);
    p.set_sample_sum(h.sum);
    p.set_bucket(
        h.bounds
            .iter()
            .zip(h.cumulative())
            .map(|(b, c)| {
                let mut bk = Bucket::default();
                bk.set_upper_bound(*b);
                bk.set_cumulative_count(c);
                bk
            })
            .collect(),
    );
    let mut m = Metric::default();
    m.set_label(l);
    m.set_histogram(p);
    m
}

/// Renders the exposition text for all ranks.
pub fn render(model: &str, ranks: &[std::sync::Arc<Rank>]) -> Result<Vec<u8>, prometheus::Error> {
    let snaps: Vec<Snapshot> = ranks
        .iter()
        .map(|r| {
            r.with_engine(|e| Snapshot {
                engine: r.global_rank.to_string(),
                load: e.load(),
                stats: e.stats().clone(),
                block_size: e.params().block_size,
                num_gpu_blocks: e.params().num_gpu_blocks,
            })
        })
        .collect();
    let base = |s: &Snapshot| labels(&[("model_name", model), ("engine", &s.engine)]);
    let per = |f: &dyn Fn(&Snapshot) -> Metric| snaps.iter().map(f).collect::<Vec<_>>();
    use MetricType::{COUNTER, GAUGE, HISTOGRAM};
    let mut families = vec![
        family(
            "vllm:num_requests_running",
            "Number of requests in model execution batches.",
            GAUGE,
            per(&|s| gauge(base(s), s.load.running as f64)),
        ),
        family(
            "vllm:num_requests_waiting",
            "Number of requests waiting to be processed.",
            GAUGE,
            per(&|s| gauge(base(s), s.load.waiting as f64)),
        ),
        family(
            "vllm:kv_cache_usage_perc",
            "KV-cache usage. 1 means 100 percent usage.",
            GAUGE,
            per(&|s| gauge(base(s), s.load.kv_usage)),
        ),
        family(
            "vllm:cache_config_info",
            "Information of the KV cache configuration.",
            GAUGE,
            per(&|s| {
                let bs = s.block_size.to_string();
                let nb = s.num_gpu_blocks.to_string();
                gauge(
                    labels(&[
                        ("block_size", &bs),
                        ("enable_prefix_caching", "True"),
                        ("engine", &s.engine),
                        ("model_name", model),
                        ("num_gpu_blocks", &nb),
                    ]),
                    1.0,
                )
            }),
        ),
    ];
    let counters: [Series<u64>; 6] = [
        (
            "vllm:prompt_tokens_total",
            "Number of prefill tokens processed.",
            |s| s.prompt_tokens,
        ),
        (
            "vllm:prompt_tokens_cached_total",
            "Number of prompt tokens served from the prefix cache.",
            |s| s.prompt_tokens_cached,
        ),
        (
            "vllm:prefix_cache_queries_total",
            "Prefix cache queries, in tokens.",
            |s| s.prefix_cache_queries,
        ),
        (
            "vllm:prefix_cache_hits_total",
            "Prefix cache hits, in tokens.",
            |s| s.prefix_cache_hits,
        ),
        (
            "vllm:generation_tokens_total",
            "Number of generation tokens processed.",
            |s| s.generation_tokens,
        ),
        (
            "vllm:num_preemptions_total",
            "Cumulative number of preemptions.",
            |s| s.preemptions,
        ),
    ];
    for (name, help, get) in counters {
        families.push(family(
            name,
            help,
            COUNTER,
            per(&|s| counter(base(s), get(&s.stats) as f64)),
        ));
    }
    let mut success = Vec::new();
    for s in &snaps {
        for (reason, v) in [
            ("length", s.stats.finished_length),
            ("abort", s.stats.finished_abort),
        ] {
            let mut l = base(s);
            l.extend(labels(&[("finished_reason", reason)]));
            success.push(counter(l, v as f64));
        }
    }
    families.push(family(
        "vllm:request_success_total",
        "Count of finished requests by finish reason.",
        COUNTER,
        success,
    ));
    let hists: [HistSeries; 5] = [
        (
            "vllm:time_to_first_token_seconds",
            "Time to first token (simulated seconds).",
            |s| &s.ttft,
        ),
        (
            "vllm:inter_token_latency_seconds",
            "Inter-token latency (simulated seconds).",
            |s| &s.inter_token,
        ),
        (
            "vllm:time_per_output_token_seconds",
            "Time per output token (simulated seconds).",
            |s| &s.inter_token,
        ),
        (
            "vllm:e2e_request_latency_seconds",
            "End-to-end request latency (simulated seconds).",
            |s| &s.e2e,
        ),
        (
            "vllm:request_queue_time_seconds",
            "Time spent waiting (simulated seconds).",
            |s| &s.queue_time,
        ),
    ];
    for (name, help, get) in hists {
        families.push(family(
            name,
            help,
            HISTOGRAM,
            per(&|s| histogram(base(s), get(&s.stats))),
        ));
    }
    let mut buf = Vec::with_capacity(16 * 1024);
    TextEncoder::new().encode(&families, &mut buf)?;
    Ok(buf)
}
