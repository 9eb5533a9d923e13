//! `program_router_backlog_requests{model, stage}`: requests the router holds back before any
//! backend has them (waiting for a concurrency place, in Program scheduling's RequestPool, in a
//! fair queue). vLLM's `vllm:num_requests_waiting` cannot see them, so an autoscaler of vLLM
//! workers adds this gauge to it.
//!
//! `model` comes from request bodies, so its values are bounded: the first
//! [`MAX_MODELS`] distinct names (of at most [`MAX_MODEL_LEN`] bytes) get a series each, every
//! other name counts as `other`. A request waiting for a concurrency place has not been read yet:
//! its model is `""`.

use std::collections::BTreeSet;
use std::sync::Mutex;

use prometheus::{IntGauge, IntGaugeVec, Opts, Registry};

/// Distinct `model` label values before the rest count as `other`.
pub const MAX_MODELS: usize = 32;
/// Longer model names count as `other`.
pub const MAX_MODEL_LEN: usize = 128;

/// Where a held request waits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// For a place under `limits.max_concurrent_requests`, before its body is read.
    Concurrency,
    /// In Program scheduling's RequestPool (its Program is paused or its rank is full).
    Program,
    /// In a fair queue, for its tenant's turn.
    Fair,
}

impl Stage {
    fn label(self) -> &'static str {
        match self {
            Stage::Concurrency => "concurrency",
            Stage::Program => "program",
            Stage::Fair => "fair",
        }
    }
}

/// The gauge and the model names that have a series of their own.
pub struct Backlog {
    gauge: IntGaugeVec,
    models: Mutex<BTreeSet<String>>,
}

impl Backlog {
    pub fn new(registry: &Registry) -> Result<Self, prometheus::Error> {
        let gauge = super::metrics::register(
            registry,
            IntGaugeVec::new(
                Opts::new(
                    "program_router_backlog_requests",
                    "Requests the router holds before sending them to a backend, by model and \
                     stage (concurrency: waiting for a place, model \"\" as the body is not read \
                     yet; program: Program scheduling's RequestPool; fair: a fair queue). vLLM's \
                     vllm:num_requests_waiting does not count them.",
                ),
                &["model", "stage"],
            )?,
        )?;
        Ok(Backlog {
            gauge,
            models: Mutex::new(BTreeSet::new()),
        })
    }

    /// The label `model` gets: itself while the bound allows, else `other`.
    fn label<'m>(&self, model: &'m str) -> &'m str {
        if model.is_empty() {
            return "";
        }
        if model.len() > MAX_MODEL_LEN || model == "other" {
            return "other";
        }
        let mut known = self.models.lock().unwrap_or_else(|p| p.into_inner());
        if known.contains(model) {
            return model;
        }
        if known.len() < MAX_MODELS {
            known.insert(model.to_owned());
            return model;
        }
        "other"
    }

    /// Counts one request of `model` held at `stage` until the returned guard drops.
    pub fn hold(&self, model: Option<&str>, stage: Stage) -> Holding {
        let gauge = self
            .gauge
            .with_label_values(&[self.label(model.unwrap_or("")), stage.label()]);
        gauge.inc();
        Holding(gauge)
    }
}

impl Backlog {
    /// Sets the requests waiting for a concurrency place (counted by the limiter; their model is
    /// not read yet), at scrape time.
    pub fn set_unread(&self, waiting: i64) {
        self.gauge
            .with_label_values(&["", Stage::Concurrency.label()])
            .set(waiting);
    }
}

/// One held request, counted until dropped.
pub struct Holding(IntGauge);

impl Drop for Holding {
    fn drop(&mut self) {
        self.0.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus::core::Collector;

    fn value(b: &Backlog, model: &str, stage: &str) -> i64 {
        b.gauge.with_label_values(&[model, stage]).get()
    }

    #[test]
    fn a_held_request_counts_until_its_guard_drops() {
        let b = Backlog::new(&Registry::new()).expect("registers");
        let one = b.hold(Some("llama"), Stage::Program);
        let two = b.hold(Some("llama"), Stage::Program);
        let unread = b.hold(None, Stage::Concurrency);
        assert_eq!(value(&b, "llama", "program"), 2);
        assert_eq!(value(&b, "", "concurrency"), 1);
        drop((one, unread));
        assert_eq!(value(&b, "llama", "program"), 1);
        assert_eq!(value(&b, "", "concurrency"), 0);
        drop(two);
        assert_eq!(value(&b, "llama", "program"), 0);
    }

    #[test]
    fn model_names_from_clients_cannot_grow_the_series_past_the_bound() {
        let b = Backlog::new(&Registry::new()).expect("registers");
        let held: Vec<Holding> = (0..MAX_MODELS + 50)
            .map(|i| b.hold(Some(&format!("m{i}")), Stage::Fair))
            .collect();
        let long = "x".repeat(MAX_MODEL_LEN + 1);
        let _long = b.hold(Some(&long), Stage::Fair);
        let families = b.gauge.collect();
        let series = families[0].get_metric().len();
        assert_eq!(series, MAX_MODELS + 1, "{MAX_MODELS} models and `other`");
        assert_eq!(value(&b, "other", "fair"), 51);
        // A name that has its series keeps it.
        let _again = b.hold(Some("m0"), Stage::Fair);
        assert_eq!(value(&b, "m0", "fair"), 2);
        drop(held);
    }
}
