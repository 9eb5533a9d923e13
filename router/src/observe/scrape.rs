//! Reads Prometheus text expositions: the one sample scanner of the project ([`samples`]) and
//! the few vLLM series the router needs from a backend's exposition.
//!
//! Owns a tolerant line scanner; the router reads `vllm:num_requests_running`, `vllm:num_requests_waiting`,
//! `vllm:kv_cache_usage_perc` (or the older `vllm:gpu_cache_usage_perc`), `vllm:cache_config_info`
//! and the inter-token latency histogram's sum and count, keyed by the `engine` label (the DP rank; missing means 0). It skips
//! every other line, whatever its shape, so that new vLLM series or format details never break
//! observation; general-purpose parsers reject whole expositions on one unfamiliar line.

use rustc_hash::FxHashMap;

/// What one rank reported.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct EngineSample {
    pub running: f64,
    pub waiting: f64,
    pub kv_usage: f64,
    /// num_gpu_blocks × block_size from `vllm:cache_config_info`, when present.
    pub token_capacity: Option<u64>,
    /// Cumulative inter-token latency histogram (`vllm:inter_token_latency_seconds`, or the
    /// older `vllm:time_per_output_token_seconds`): sum of seconds and count of tokens.
    pub itl_sum: f64,
    pub itl_count: f64,
    /// Mean time per output token since the previous observation (set by the observer; `None`
    /// when no token was decoded in between).
    pub recent_tpot: Option<f64>,
}

/// Parses an exposition into samples per engine (DP rank).
pub fn parse_vllm_metrics(text: &str) -> FxHashMap<u32, EngineSample> {
    let mut out: FxHashMap<u32, EngineSample> = FxHashMap::default();
    for Sample {
        name,
        labels,
        value,
    } in samples(text)
    {
        if !value.is_finite() {
            // NaN and infinities say nothing a scheduler can use: the sample is skipped.
            continue;
        }
        let field = match name {
            "vllm:num_requests_running" => 0,
            "vllm:num_requests_waiting" => 1,
            "vllm:kv_cache_usage_perc" | "vllm:gpu_cache_usage_perc" => 2,
            "vllm:cache_config_info" => 3,
            "vllm:inter_token_latency_seconds_sum" | "vllm:time_per_output_token_seconds_sum" => 4,
            "vllm:inter_token_latency_seconds_count"
            | "vllm:time_per_output_token_seconds_count" => 5,
            _ => continue,
        };
        let engine = label(labels, "engine")
            .and_then(|e| e.parse::<u32>().ok())
            .unwrap_or(0);
        let s = out.entry(engine).or_default();
        match field {
            0 => s.running = value,
            1 => s.waiting = value,
            2 => s.kv_usage = value,
            4 => s.itl_sum = value,
            5 => s.itl_count = value,
            _ => {
                let blocks = label(labels, "num_gpu_blocks").and_then(|v| v.parse::<u64>().ok());
                let size = label(labels, "block_size").and_then(|v| v.parse::<u64>().ok());
                if let (Some(b), Some(z)) = (blocks, size) {
                    // Absurd labels (a product past u64) are no capacity at all.
                    s.token_capacity = b.checked_mul(z);
                }
            }
        }
    }
    out
}

/// One sample line of an exposition: `name{labels} value [timestamp]`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample<'a> {
    pub name: &'a str,
    /// The text between the braces (`a="x",b="y"`); read one with [`Sample::label`].
    pub labels: &'a str,
    pub value: f64,
}

impl<'a> Sample<'a> {
    /// The value of label `key`.
    pub fn label(&self, key: &str) -> Option<&'a str> {
        label(self.labels, key)
    }
}

/// Every sample line of `text` that parses; comments, blank lines and lines of any other shape
/// are skipped (a partial exposition, a new format detail), never an error.
pub fn samples(text: &str) -> impl Iterator<Item = Sample<'_>> {
    text.lines().filter_map(|line| {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            return None;
        }
        split_sample(line)
    })
}

/// The sum of `name` over its series whose labels match `labels`.
pub fn sum(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    samples(text)
        .filter(|s| s.name == name && labels.iter().all(|(k, v)| s.label(k) == Some(*v)))
        .fold(0.0, |a, s| a + s.value)
}

/// `name{labels} value [timestamp]` → its sample.
fn split_sample(line: &str) -> Option<Sample<'_>> {
    let (name, rest) = match line.find('{') {
        Some(i) => {
            let end = line[i..].rfind('}')? + i;
            (&line[..i], (&line[i + 1..end], &line[end + 1..]))
        }
        None => {
            let i = line.find(char::is_whitespace)?;
            (&line[..i], ("", &line[i..]))
        }
    };
    let value = rest.1.split_whitespace().next()?.parse::<f64>().ok()?;
    Some(Sample {
        name: name.trim(),
        labels: rest.0,
        value,
    })
}

/// The value of label `key` in `a="x",b="y"`, raw: an escaped value (`\"`, `\\`, `\n`,
/// which vLLM never emits) is returned as written, and the labels after it still read.
fn label<'a>(labels: &'a str, key: &str) -> Option<&'a str> {
    let mut rest = labels;
    while !rest.is_empty() {
        let eq = rest.find('=')?;
        let k = rest[..eq].trim().trim_start_matches(',').trim();
        let after = rest[eq + 1..].trim_start().strip_prefix('"')?;
        let close = closing_quote(after)?;
        if k == key {
            return Some(&after[..close]);
        }
        rest = &after[close + 1..];
    }
    None
}

/// Where the quoted value that `s` starts inside ends: the first `"` not escaped by a backslash.
fn closing_quote(s: &str) -> Option<usize> {
    let mut escaped = false;
    for (i, b) in s.bytes().enumerate() {
        match b {
            _ if escaped => escaped = false,
            b'\\' => escaped = true,
            b'"' => return Some(i),
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_escaped_label_value_does_not_hide_the_labels_after_it() {
        let line = r#"m{a="x\\\"y",b="16",c="q\\"} 1"#;
        let s = samples(line).next().expect("a sample");
        assert_eq!(s.label("a"), Some(r#"x\\\"y"#));
        assert_eq!(s.label("b"), Some("16"));
        assert_eq!(s.label("c"), Some(r#"q\\"#));
    }

    #[test]
    fn reads_per_engine_series_and_capacity() {
        let text = r#"
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 1.0
vllm:num_requests_waiting{model_name="m",engine="1"} 7
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.25
vllm:cache_config_info{block_size="16",engine="1",num_gpu_blocks="1000",model_name="m"} 1.0
vllm:prompt_tokens_total{engine="0",model_name="m"} 123 1700000000
some_weird{line
vllm:time_to_first_token_seconds_bucket{le="+Inf",engine="0"} 5
vllm:inter_token_latency_seconds_sum{engine="1",model_name="m"} 4.5
vllm:inter_token_latency_seconds_count{engine="1",model_name="m"} 90
"#;
        let m = parse_vllm_metrics(text);
        assert_eq!(m[&0].running, 3.0);
        assert_eq!(
            m[&1],
            EngineSample {
                running: 1.0,
                waiting: 7.0,
                kv_usage: 0.25,
                token_capacity: Some(16_000),
                itl_sum: 4.5,
                itl_count: 90.0,
                recent_tpot: None,
            }
        );
    }

    #[test]
    fn missing_engine_label_is_rank_zero_and_old_names_work() {
        let m = parse_vllm_metrics(
            "vllm:num_requests_waiting 2\nvllm:gpu_cache_usage_perc{model_name=\"m\"} 0.5\n",
        );
        assert_eq!(m[&0].waiting, 2.0);
        assert_eq!(m[&0].kv_usage, 0.5);
    }

    #[test]
    fn values_a_backend_cannot_mean_are_skipped() {
        let text = "vllm:num_requests_waiting{engine=\"0\"} NaN\n\
                    vllm:num_requests_running{engine=\"0\"} +Inf\n\
                    vllm:kv_cache_usage_perc{engine=\"0\"} 0.5\n\
                    vllm:cache_config_info{engine=\"0\",num_gpu_blocks=\"18446744073709551615\",block_size=\"16\"} 1\n";
        let s = parse_vllm_metrics(text)[&0];
        assert_eq!((s.waiting, s.running, s.kv_usage), (0.0, 0.0, 0.5));
        assert_eq!(
            s.token_capacity, None,
            "an overflowing product is no capacity"
        );
    }
}
