//! What `compare` reads from the routers' and simulators' `/metrics`: counters, Program
//! transitions, per-engine KV usage, and the sampler that records them over the run.

use super::*;

/// Sums a counter over every series of an exposition (chunked bodies included: lines with a
/// sample of `name` anywhere).
pub(super) fn counter(text: &str, name: &str) -> f64 {
    program_router::observe::scrape::sum(text, name, &[])
}

/// Program scheduling transitions in a router's exposition, by kind: program-router labels them
/// `transition`, vllm-router `reason` (per target).
pub(super) fn transitions(text: &str) -> BTreeMap<String, f64> {
    crate::fleet::by_label(
        text,
        "vllm_router_agent_aware_transitions_total",
        &["transition", "reason"],
    )
}

pub(super) fn sum_of(t: &BTreeMap<String, f64>, kinds: &[&str]) -> f64 {
    // fold from +0.0: an empty f64 sum is -0.0, which prints as "-0".
    kinds
        .iter()
        .filter_map(|k| t.get(*k))
        .fold(0.0, |a, b| a + b)
}

/// Program admissions (ordinary and forced).
pub(super) fn admissions(t: &BTreeMap<String, f64>) -> f64 {
    sum_of(t, &["admit", "program_admit", "force_resume"])
}

/// Each engine's gauge `name` in an exposition, keyed by its `engine` label.
pub(super) fn per_engine(text: &str, name: &str) -> Vec<(String, f64)> {
    program_router::observe::scrape::samples(text)
        .filter(|s| s.name == name)
        .filter_map(|s| Some((s.label("engine")?.to_string(), s.value)))
        .collect()
}

/// (workload seconds, value) samples.
type Points = Vec<(f64, f64)>;

/// Scrapes the simulators every `every` until stopped: token cache hit so far (all servers) and
/// each engine's KV usage, against workload time (wall time × `time_scale`).
pub(super) fn sample(
    sims: Vec<String>,
    every: Duration,
    time_scale: f64,
    stop: Arc<AtomicBool>,
) -> (Points, Vec<(String, Points)>) {
    let start = Instant::now();
    let mut hit = Vec::new();
    let mut kv: BTreeMap<(usize, String), Points> = BTreeMap::new();
    loop {
        let t = start.elapsed().as_secs_f64() * time_scale;
        let (mut prompt, mut cached) = (0.0, 0.0);
        for (i, sim) in sims.iter().enumerate() {
            let Some((200, text)) = get(&format!("{sim}/metrics")) else {
                continue;
            };
            prompt += counter(&text, "vllm:prompt_tokens_total");
            cached += counter(&text, "vllm:prompt_tokens_cached_total");
            for (engine, usage) in per_engine(&text, "vllm:kv_cache_usage_perc") {
                kv.entry((i, engine)).or_default().push((t, usage));
            }
        }
        if prompt > 0.0 {
            hit.push((t, cached / prompt));
        }
        if stop.load(Ordering::Relaxed) {
            break;
        }
        std::thread::sleep(every);
    }
    let kv = kv
        .into_iter()
        .map(|((server, engine), pts)| (format!("server {server} rank {engine}"), pts))
        .collect();
    (hit, kv)
}
