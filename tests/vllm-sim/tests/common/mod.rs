//! Test harness: an in-process simulator on a loopback port and a small HTTP client.
#![allow(dead_code, unused_imports)]

use std::time::Duration;

pub use vllm_sim::server::Spawned as Sim;

/// Starts an in-process simulator on a free loopback port with these flags.
pub async fn start(args: &[&str]) -> Sim {
    vllm_sim::server::spawn_with_flags(args, Duration::from_secs(10))
        .await
        .expect("simulator")
}

pub use testkit::{HttpClient, Reply, client, get, post, send};

/// Reads `/metrics`, parses it with a Prometheus text parser and returns the sum of `name` over
/// the series whose labels match. `name_sum` / `name_count` read a histogram's sum and count.
pub async fn metric(c: &HttpClient, sim: &Sim, name: &str, labels: &[(&str, &str)]) -> f64 {
    let text = get(c, &sim.url("/metrics")).await.text();
    metric_in(&text, name, labels)
}

pub fn metric_in(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    testkit::metric_value(text, name, labels, true)
}

pub fn chat_body(content: &str, max_tokens: u32) -> String {
    serde_json::json!({
        "model": "sim-model",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
    })
    .to_string()
}

/// A prompt of about `words` tokens.
pub fn words(seed: u32, words: usize) -> String {
    (0..words).map(|i| format!(" t{seed}x{i}")).collect()
}
