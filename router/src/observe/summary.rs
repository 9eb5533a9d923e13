//! A Prometheus summary per label value, as vllm-router exposes its queue waits: the quantiles
//! 0, 0.5, 0.9, 0.95, 0.99, 0.999 and 1 over the most recent samples, with the lifetime sum and
//! count. The `prometheus` crate has no summary type, so this is a small collector of its own.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;

use prometheus::core::{Collector, Desc};
use prometheus::proto::{LabelPair, Metric, MetricFamily, MetricType, Quantile, Summary};

/// The quantiles reported, as the peer reports them.
const QUANTILES: [f64; 7] = [0.0, 0.5, 0.9, 0.95, 0.99, 0.999, 1.0];
/// Recent samples kept per label value (the quantiles are over these).
const WINDOW: usize = 1024;
/// Label values kept; a new one past this replaces none (its samples are not recorded).
const MAX_SERIES: usize = 4096;

#[derive(Default)]
struct Series {
    recent: VecDeque<f64>,
    sum: f64,
    count: u64,
}

/// A summary vector over one label.
pub struct SummaryVec {
    desc: Desc,
    label: String,
    series: Mutex<BTreeMap<String, Series>>,
}

impl SummaryVec {
    pub fn new(name: &str, help: &str, label: &str) -> Result<Self, prometheus::Error> {
        Ok(SummaryVec {
            desc: Desc::new(
                name.to_string(),
                help.to_string(),
                vec![label.to_string()],
                Default::default(),
            )?,
            label: label.to_string(),
            series: Mutex::new(BTreeMap::new()),
        })
    }

    /// Records `v` (non-finite values are dropped) under label value `value`.
    pub fn observe(&self, value: &str, v: f64) {
        if !v.is_finite() {
            return;
        }
        let mut g = self.series.lock().unwrap_or_else(|p| p.into_inner());
        if !g.contains_key(value) && g.len() >= MAX_SERIES {
            return;
        }
        let s = g.entry(value.to_string()).or_default();
        if s.recent.len() == WINDOW {
            s.recent.pop_front();
        }
        s.recent.push_back(v);
        s.sum += v;
        s.count += 1;
    }

    /// Gives label value `value` a series (count 0) if it has none, so that its family is
    /// exported before the first sample.
    pub fn touch(&self, value: &str) {
        let mut g = self.series.lock().unwrap_or_else(|p| p.into_inner());
        if g.len() < MAX_SERIES && !g.contains_key(value) {
            g.insert(value.to_string(), Series::default());
        }
    }

    /// Forgets label value `value` (a target that left).
    pub fn remove(&self, value: &str) {
        let mut g = self.series.lock().unwrap_or_else(|p| p.into_inner());
        g.remove(value);
    }
}

/// The `q` quantile of sorted `xs` (nearest rank).
fn quantile(xs: &[f64], q: f64) -> f64 {
    if xs.is_empty() {
        return 0.0;
    }
    let i = ((xs.len() - 1) as f64 * q).round() as usize;
    xs[i.min(xs.len() - 1)]
}

impl Collector for SummaryVec {
    fn desc(&self) -> Vec<&Desc> {
        vec![&self.desc]
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let g = self.series.lock().unwrap_or_else(|p| p.into_inner());
        let metrics = g
            .iter()
            .map(|(value, s)| {
                let mut sorted: Vec<f64> = s.recent.iter().copied().collect();
                sorted.sort_by(f64::total_cmp);
                let mut summary = Summary::default();
                summary.set_sample_count(s.count);
                summary.set_sample_sum(s.sum);
                summary.set_quantile(
                    QUANTILES
                        .iter()
                        .map(|q| {
                            let mut x = Quantile::default();
                            x.set_quantile(*q);
                            x.set_value(quantile(&sorted, *q));
                            x
                        })
                        .collect(),
                );
                let mut label = LabelPair::default();
                label.set_name(self.label.clone());
                label.set_value(value.clone());
                let mut m = Metric::from_label(vec![label]);
                m.set_summary(summary);
                m
            })
            .collect();
        vec![super::sharded::family_of(
            &self.desc,
            MetricType::SUMMARY,
            metrics,
        )]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_sum_and_count_per_label_value_in_the_text_format() {
        let s = SummaryVec::new("w_seconds", "waits", "target").expect("summary");
        for v in [1.0, 2.0, 3.0, 4.0, f64::NAN] {
            s.observe("a", v);
        }
        s.observe("b", 9.0);
        let r = prometheus::Registry::new();
        r.register(Box::new(s)).expect("register");
        let text = prometheus::TextEncoder::new()
            .encode_to_string(&r.gather())
            .expect("encode");
        assert!(text.contains("# TYPE w_seconds summary"), "{text}");
        assert!(
            text.contains("w_seconds{target=\"a\",quantile=\"0\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("w_seconds{target=\"a\",quantile=\"1\"} 4"),
            "{text}"
        );
        assert!(text.contains("w_seconds_sum{target=\"a\"} 10"), "{text}");
        assert!(text.contains("w_seconds_count{target=\"a\"} 4"), "{text}");
        assert!(text.contains("w_seconds_count{target=\"b\"} 1"), "{text}");
    }

    #[test]
    fn the_window_and_the_series_are_bounded() {
        let s = SummaryVec::new("w", "w", "t").expect("summary");
        for i in 0..(WINDOW + 10) {
            s.observe("a", i as f64);
        }
        for i in 0..(MAX_SERIES + 5) {
            s.observe(&format!("s{i}"), 1.0);
        }
        let g = s.series.lock().expect("lock");
        assert_eq!(g["a"].recent.len(), WINDOW);
        assert_eq!(g["a"].count, (WINDOW + 10) as u64);
        assert_eq!(g.len(), MAX_SERIES);
    }
}
