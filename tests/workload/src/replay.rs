//! Real-time replay of a workload against an OpenAI-compatible endpoint (a router or a server).
//!
//! Owns the client side of a benchmark run: one task per Program, each turn sent only after the
//! previous one completed plus its tool gap (both scaled by the backend's time scale), the chat
//! history rebuilt from the actual replies (so generated tokens come back as cache hits, as with a
//! real agent), Program identity in the chosen form, and per-request/per-Program records. Bounded
//! by a wall-clock limit; loopback only in tests and benches.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use serde_json::{Value, json};

use rustc_hash::FxHashMap;
use tokio::sync::watch;

use crate::workload::{SPAWN_DELAY_SECONDS, Turn, programs};

/// How a request says which Program it belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[value(rename_all = "kebab-case")]
pub enum ContextMode {
    /// `vllm_xargs.agentic_context` as an object (the canonical contract).
    Object,
    /// The same as a JSON string (what stock vLLM accepts).
    String,
    /// Only `x-session-id` (for `program_scheduling_enable_key: auto` and session-hash routing).
    Headers,
}

/// Where a replay sends its requests: one endpoint, or several as behind a load balancer
/// without affinity — a Program's consecutive turns go to consecutive endpoints (turn k of
/// Program i to endpoint `(i + k) mod n`), so every Program meets every endpoint. The list can
/// change while the replay runs (endpoints joining and leaving, as in a rolling update).
#[derive(Debug, Clone)]
pub struct Endpoints(Arc<std::sync::RwLock<Vec<String>>>);

impl Endpoints {
    pub fn new(urls: Vec<String>) -> Endpoints {
        Endpoints(Arc::new(std::sync::RwLock::new(urls)))
    }

    pub fn one(url: String) -> Endpoints {
        Endpoints::new(vec![url])
    }

    /// Replaces the list: requests sent from now on go to `urls`.
    pub fn set(&self, urls: Vec<String>) {
        if let Ok(mut l) = self.0.write() {
            *l = urls;
        }
    }

    /// The endpoint for turn `step` of Program `index`, without a trailing slash.
    pub fn pick(&self, index: u64, step: u32) -> String {
        let l = self.0.read().map(|l| l.clone()).unwrap_or_default();
        if l.is_empty() {
            return String::new();
        }
        let k = (index + u64::from(step)) % l.len() as u64;
        l[k as usize].trim_end_matches('/').to_string()
    }
}

#[derive(Debug, Clone)]
pub struct ReplayConfig {
    pub endpoints: Endpoints,
    pub model: String,
    pub context: ContextMode,
    /// Simulated seconds per wall second of the backend: gaps and arrivals are divided by it and
    /// latencies multiplied, so the report is in the workload's own seconds.
    pub time_scale: f64,
    pub max_model_len: usize,
    pub limit: Duration,
    /// Send streamed requests (`stream: true` with usage in the last chunk) and record each
    /// one's time to first token.
    pub stream: bool,
    /// Send at most this many requests; Programs still going then stop where they are.
    pub max_requests: Option<u64>,
    /// Sent as `Authorization: Bearer <key>` (a router or vLLM that requires a key).
    pub api_key: Option<String>,
    /// A bound (`compare`'s `pr-clairvoyant`): clients that know each coming tool gap, on
    /// ranks of this many KV tokens. Each request asks for the TTL
    /// [`crate::clients::clairvoyant_ttl`] gives (÷ `time_scale`, plus the trips' slack when it
    /// holds at all), and a Program's last one carries `vllm_xargs.sim_end_program` for a
    /// simulator run with `--end-hint`.
    pub clairvoyant_capacity: Option<usize>,
}

/// One request's record.
#[derive(Debug, Clone, Serialize)]
pub struct RequestRecord {
    pub program: String,
    pub step: u32,
    /// HTTP status; 0 when an answer with status 200 carried no usage (a stream that broke off
    /// before its last chunk): counted as a failed request.
    pub status: u16,
    pub latency_seconds: f64,
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    pub completion_tokens: u64,
    /// Time to the first generated text (streamed requests only), in workload seconds.
    pub ttft_seconds: Option<f64>,
}

/// What a replay measured.
#[derive(Debug, Clone, Serialize)]
pub struct ReplayReport {
    pub requests: Vec<RequestRecord>,
    /// (program, JCT seconds) of every Program that started and ended without an error: those
    /// that finished every turn, and those whose next turn outgrew `max_model_len` (counted
    /// until that turn would have been sent).
    pub jct: Vec<(String, f64)>,
    /// Programs that finished every turn.
    pub completed: u64,
    pub errors: u64,
    /// Programs cut by `max_model_len`, and subagents never started because their parent was.
    pub truncated: u64,
    /// Programs stopped by `max_requests` before they ended.
    pub stopped: u64,
    pub timed_out: bool,
}

/// How one Program's task ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    /// Every turn answered.
    Completed,
    /// Its next turn outgrew `max_model_len`, or (a subagent) its parent never spawned it.
    Cut,
    /// The request budget ran out.
    Stopped,
    /// A request failed.
    Failed,
}

/// What one Program's task returns.
struct Ended {
    program: String,
    records: Vec<RequestRecord>,
    /// Its JCT, for a Program that started and ended without an error.
    jct: Option<f64>,
    end: End,
}

/// Requests answered (for the progress bar) and sent (against `max_requests`).
#[derive(Default)]
struct Counts {
    answered: AtomicU64,
    sent: AtomicU64,
}

impl ReplayReport {
    pub fn prompt_tokens(&self) -> u64 {
        self.requests.iter().map(|r| r.prompt_tokens).sum()
    }
    pub fn cached_tokens(&self) -> u64 {
        self.requests.iter().map(|r| r.cached_tokens).sum()
    }
    pub fn completion_tokens(&self) -> u64 {
        self.requests.iter().map(|r| r.completion_tokens).sum()
    }
    /// Turns answered (status 200) per Program: what the oracle is computed over.
    pub fn served(&self) -> crate::oracle::Served {
        let mut served = crate::oracle::Served::new();
        for r in self.requests.iter().filter(|r| r.status == 200) {
            *served.entry(r.program.clone()).or_default() += 1;
        }
        served
    }
}

/// A word the simulator's tokenizer counts as one token (a space and at most 7 characters).
fn word(a: u64, b: u64) -> String {
    let v =
        vllm_sim::tokenizer::splitmix(a.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ b) % 2_176_782_336; // 36^6
    let mut s = String::from(" ");
    let mut x = v;
    let mut digits = [0u8; 6];
    for d in digits.iter_mut().rev() {
        *d = b"0123456789abcdefghijklmnopqrstuvwxyz"[(x % 36) as usize];
        x /= 36;
    }
    s.push_str(std::str::from_utf8(&digits).unwrap_or("x"));
    s
}

fn text(a: u64, b: u64, tokens: u32) -> String {
    (0..u64::from(tokens))
        .map(|i| word(a, b.wrapping_mul(1_000_003).wrapping_add(i)))
        .collect()
}

type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// How far a Program got: turns completed, and whether it has ended (finished or failed).
#[derive(Debug, Clone, Copy, Default)]
struct Progress {
    steps_done: u32,
    ended: bool,
}

/// Every Program's progress, for subagent dependencies: a subagent starts when its parent's
/// turn completes; a parent's next turn waits for its blocking subagents.
struct Links {
    progress: FxHashMap<String, watch::Sender<Progress>>,
    /// (parent, step) → blocking subagents spawned after that step.
    blockers: FxHashMap<(String, u32), Vec<String>>,
}

impl Links {
    fn new(programs: &[Vec<Turn>]) -> Self {
        let mut blockers: FxHashMap<(String, u32), Vec<String>> = FxHashMap::default();
        for p in programs {
            let t = &p[0];
            if let (Some(parent), Some(step), true) =
                (&t.parent_program_id, t.spawned_after_step, t.blocks_parent)
            {
                blockers
                    .entry((parent.clone(), step))
                    .or_default()
                    .push(t.program_id.clone());
            }
        }
        Links {
            progress: programs
                .iter()
                .map(|p| {
                    (
                        p[0].program_id.clone(),
                        watch::channel(Progress::default()).0,
                    )
                })
                .collect(),
            blockers,
        }
    }

    fn set(&self, program: &str, f: impl FnOnce(&mut Progress)) {
        if let Some(tx) = self.progress.get(program) {
            tx.send_modify(f);
        }
    }

    /// Whether `program` completed its turn `step` (an unknown Program counts as done: it
    /// cannot hold anyone).
    fn reached(&self, program: &str, step: u32) -> bool {
        self.progress
            .get(program)
            .is_none_or(|tx| tx.borrow().steps_done > step)
    }

    /// Waits until `program` satisfies `ready` (or has ended, or is unknown).
    async fn wait(&self, program: &str, ready: impl Fn(&Progress) -> bool) {
        let Some(tx) = self.progress.get(program) else {
            return;
        };
        let mut rx = tx.subscribe();
        let _ = rx.wait_for(|p| p.ended || ready(p)).await;
    }
}

/// Marks the Program ended however its task returns, so nothing waits on it forever.
struct EndGuard(Arc<Links>, String);

impl Drop for EndGuard {
    fn drop(&mut self) {
        self.0.set(&self.1, |p| p.ended = true);
    }
}

async fn program_task(
    client: HttpClient,
    cfg: Arc<ReplayConfig>,
    turns: Vec<Turn>,
    index: u64,
    start: Instant,
    counts: Arc<Counts>,
    links: Arc<Links>,
) -> Ended {
    let first = &turns[0];
    let _end = EndGuard(links.clone(), first.program_id.clone());
    let mut out = Ended {
        program: first.program_id.clone(),
        records: Vec::new(),
        jct: None,
        end: End::Cut,
    };
    match (&first.parent_program_id, first.spawned_after_step) {
        (Some(parent), Some(step)) => {
            links.wait(parent, |p| p.steps_done > step).await;
            if !links.reached(parent, step) {
                // The parent ended before the turn that spawns it: it never starts (as in `sim`).
                return out;
            }
            tokio::time::sleep(Duration::from_secs_f64(
                SPAWN_DELAY_SECONDS / cfg.time_scale,
            ))
            .await;
        }
        _ => {
            let arrive = start + Duration::from_secs_f64(first.program_arrival / cfg.time_scale);
            tokio::time::sleep_until(arrive.into()).await;
        }
    }
    let began = Instant::now();
    let elapsed = || began.elapsed().as_secs_f64() * cfg.time_scale;
    let mut messages = vec![
        json!({"role": "system", "content": text(1, u64::from(first.system_prompt), first.system_tokens)}),
    ];
    let mut context_estimate = first.system_tokens as usize;
    for turn in &turns {
        let user = text(1000 + index, u64::from(turn.step), turn.append_tokens);
        context_estimate += turn.append_tokens as usize + 8;
        if context_estimate + turn.output_tokens as usize + 64 > cfg.max_model_len {
            // The Program ends here, at the moment this turn would have been sent (as `sim` and
            // the oracle count a Program whose context outgrew the model).
            out.jct = Some(elapsed());
            return out;
        }
        if cfg
            .max_requests
            .is_some_and(|max| counts.sent.fetch_add(1, Ordering::Relaxed) >= max)
        {
            out.end = End::Stopped;
            return out;
        }
        messages.push(json!({"role": "user", "content": user}));
        let body = turn_body(&cfg, turn, &messages, context_estimate);
        let mut req = hyper::Request::post(format!(
            "{}/v1/chat/completions",
            cfg.endpoints.pick(index, turn.step)
        ))
        .header("content-type", "application/json")
        .header("x-session-id", turn.program_id.as_str());
        if let Some(key) = &cfg.api_key {
            req = req.header("authorization", format!("Bearer {key}"));
        }
        let req = req.body(Full::new(Bytes::from(body.to_string())));
        let Ok(req) = req else {
            out.end = End::Failed;
            return out;
        };
        let sent = Instant::now();
        let Ok(resp) = client.request(req).await else {
            out.end = End::Failed;
            return out;
        };
        let status = resp.status().as_u16();
        let answer = if cfg.stream && status == 200 {
            read_stream(resp.into_body(), sent).await
        } else {
            resp.into_body().collect().await.ok().map(|c| {
                (
                    serde_json::from_slice(&c.to_bytes()).unwrap_or(Value::Null),
                    None,
                )
            })
        };
        let latency = sent.elapsed().as_secs_f64() * cfg.time_scale;
        let (v, ttft) = answer.unwrap_or((Value::Null, None));
        let u = &v["usage"];
        let rec = RequestRecord {
            program: turn.program_id.clone(),
            step: turn.step,
            // A stream that broke off is a failed request, whatever its status line said.
            status: if u.is_null() && status == 200 {
                0
            } else {
                status
            },
            latency_seconds: latency,
            prompt_tokens: u["prompt_tokens"].as_u64().unwrap_or(0),
            cached_tokens: u["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap_or(0),
            completion_tokens: u["completion_tokens"].as_u64().unwrap_or(0),
            ttft_seconds: ttft.map(|t| t.as_secs_f64() * cfg.time_scale),
        };
        counts.answered.fetch_add(1, Ordering::Relaxed);
        let ok = rec.status == 200;
        if ok {
            context_estimate = (rec.prompt_tokens + rec.completion_tokens) as usize + 8;
        }
        out.records.push(rec);
        if !ok {
            out.end = End::Failed;
            return out;
        }
        let reply = v["choices"][0]["message"]["content"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        messages.push(json!({"role": "assistant", "content": reply}));
        links.set(&turn.program_id, |p| p.steps_done = turn.step + 1);
        let gap = tokio::time::sleep(Duration::from_secs_f64(turn.gap_after / cfg.time_scale));
        // The next turn needs its own tool gap to pass and every blocking subagent to finish.
        let kids = links
            .blockers
            .get(&(turn.program_id.clone(), turn.step))
            .cloned()
            .unwrap_or_default();
        let children = async {
            for k in &kids {
                links.wait(k, |_| false).await;
            }
        };
        tokio::join!(gap, children);
    }
    out.jct = Some(elapsed());
    out.end = End::Completed;
    out
}

/// Reads a streamed chat completion: the reply's text, the usage of its last chunk and the time
/// from `sent` to the first text, as a non-streamed body's shape (`choices[0].message.content`,
/// `usage`). `None` when the stream broke off.
async fn read_stream(
    mut body: hyper::body::Incoming,
    sent: Instant,
) -> Option<(Value, Option<Duration>)> {
    let (mut buf, mut content, mut usage, mut first) =
        (Vec::<u8>::new(), String::new(), Value::Null, None);
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame.ok()?.into_data() else {
            continue;
        };
        buf.extend_from_slice(&data);
        while let Some(end) = buf.windows(2).position(|w| w == b"\n\n") {
            let event: Vec<u8> = buf.drain(..end + 2).collect();
            for line in event.split(|b| *b == b'\n') {
                // `data:` with or without its optional space.
                let Some(json) = line.strip_prefix(b"data:") else {
                    continue;
                };
                let json = json.strip_prefix(b" ").unwrap_or(json);
                let Ok(chunk) = serde_json::from_slice::<Value>(json) else {
                    continue; // `[DONE]`
                };
                if let Some(t) = chunk["choices"][0]["delta"]["content"].as_str() {
                    if first.is_none() && !t.is_empty() {
                        first = Some(sent.elapsed());
                    }
                    content.push_str(t);
                }
                if !chunk["usage"].is_null() {
                    usage = chunk["usage"].clone();
                }
            }
        }
    }
    Some((
        json!({"choices": [{"message": {"content": content}}], "usage": usage}),
        first,
    ))
}

/// Replays `turns` against `cfg.endpoints`; stops by itself at `cfg.limit`.
pub async fn replay(turns: &[Turn], cfg: ReplayConfig) -> ReplayReport {
    let mut http = HttpConnector::new();
    http.set_nodelay(true);
    let client: HttpClient = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(1024)
        // Drop idle connections well before the router's idle limit (60 s) closes them, so a
        // turn after a long tool call does not race the server's close.
        .pool_idle_timeout(std::time::Duration::from_secs(30))
        .pool_timer(hyper_util::rt::TokioTimer::new())
        .build(http);
    let cfg = Arc::new(cfg);
    let start = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    let counts = Arc::new(Counts::default());
    let all = programs(turns);
    let links = Arc::new(Links::new(&all));
    for (i, p) in all.into_iter().enumerate() {
        set.spawn(program_task(
            client.clone(),
            cfg.clone(),
            p,
            i as u64,
            start,
            counts.clone(),
            links.clone(),
        ));
    }
    // Progress on stderr (drawn only when it is a terminal): requests answered, with an ETA.
    let bar = ProgressBar::new(turns.len() as u64);
    bar.set_style(
        ProgressStyle::with_template(
            "{elapsed_precise} [{wide_bar}] {pos}/{len} requests, ETA {eta}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let ticker = {
        let (bar, counts) = (bar.clone(), counts.clone());
        tokio::spawn(async move {
            loop {
                bar.set_position(counts.answered.load(Ordering::Relaxed));
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        })
    };
    let mut report = ReplayReport {
        requests: Vec::new(),
        jct: Vec::new(),
        completed: 0,
        errors: 0,
        truncated: 0,
        stopped: 0,
        timed_out: false,
    };
    let deadline = tokio::time::Instant::from_std(start + cfg.limit);
    loop {
        match tokio::time::timeout_at(deadline, set.join_next()).await {
            Ok(Some(Ok(ended))) => {
                if let Some(j) = ended.jct {
                    report.jct.push((ended.program, j));
                }
                match ended.end {
                    End::Completed => report.completed += 1,
                    End::Cut => report.truncated += 1,
                    End::Stopped => report.stopped += 1,
                    End::Failed => report.errors += 1,
                }
                report.requests.extend(ended.records);
            }
            Ok(Some(Err(_))) => report.errors += 1,
            Ok(None) => break,
            Err(_) => {
                report.timed_out = true;
                set.abort_all();
                break;
            }
        }
    }
    ticker.abort();
    bar.finish_and_clear();
    report
}

/// Wall seconds a clairvoyant client's hold lasts past its gap: the response's and the next
/// request's trips and the replay's timer, which virtual time has none of (without it, holds
/// run out just before their Program comes back; docs/generalization.md).
const CLAIRVOYANT_SLACK_SECONDS: f64 = 0.05;

/// The body of `turn`'s request: the conversation so far (`messages`, ending with the turn's
/// user message), the turn's output length, and the Program context the routers read (in
/// `vllm_xargs`, as `cfg.context` says). `context` estimates the prompt's tokens. Clairvoyant
/// clients (`cfg.clairvoyant_capacity`) add each turn's TTL and mark a Program's last request.
fn turn_body(cfg: &ReplayConfig, turn: &Turn, messages: &[Value], context: usize) -> Value {
    let mut body =
        json!({"model": cfg.model, "messages": messages, "max_tokens": turn.output_tokens});
    if cfg.stream {
        body["stream"] = json!(true);
        body["stream_options"] = json!({"include_usage": true});
    }
    let last = turn.gap_after <= 0.0;
    let mut ctx = json!({"program_id": turn.program_id, "task_id": turn.task_id, "step_id": turn.step,
        "expected_resume": !last});
    if let Some(parent) = &turn.parent_program_id {
        ctx["parent_program_id"] = json!(parent);
        ctx["root_program_id"] = json!(turn.root_program_id());
        ctx["blocks_parent"] = json!(turn.blocks_parent);
    }
    if let Some(capacity) = cfg.clairvoyant_capacity.filter(|_| !last) {
        let held = context + turn.output_tokens as usize;
        let ttl =
            crate::clients::clairvoyant_ttl(held, turn.gap_after, capacity, &Default::default());
        // A hold must cover the gap as the router sees it: from its completion to the next
        // request's arrival, which the response's and the request's trips lengthen.
        let wall = if ttl > 0.0 {
            ttl / cfg.time_scale + CLAIRVOYANT_SLACK_SECONDS
        } else {
            0.0
        };
        ctx["kv_retention_ttl_seconds"] = json!(wall);
    }
    match cfg.context {
        ContextMode::Object => body["vllm_xargs"] = json!({"agentic_context": ctx}),
        ContextMode::String => body["vllm_xargs"] = json!({"agentic_context": ctx.to_string()}),
        ContextMode::Headers => {}
    }
    if cfg.clairvoyant_capacity.is_some() && last {
        // An engine run with `--end-hint` evicts the Program's own blocks first once it ends.
        body["vllm_xargs"]["sim_end_program"] = json!(1);
    }
    if let Some(tool) = &turn.tool {
        // The simulator has no model to choose a tool: its response calls the one named.
        body["vllm_xargs"]["sim_tool_call"] = json!(tool);
    }
    body
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_words_are_single_simulator_tokens() {
        let t = text(3, 4, 50);
        assert_eq!(vllm_sim::tokenizer::count_tokens(&t), 50);
        assert_eq!(t, text(3, 4, 50));
        assert_ne!(t, text(3, 5, 50));
    }

    #[test]
    fn clairvoyant_clients_send_each_turns_ttl_and_mark_the_last_request() {
        let turns = crate::workload::generate(crate::workload::Preset::SweAgent, 1, 1.0, 7);
        let (first, last) = (&turns[0], &turns[turns.len() - 1]);
        assert!(first.gap_after > 0.0 && last.gap_after <= 0.0);
        let mut cfg = ReplayConfig {
            endpoints: Endpoints::one("http://127.0.0.1:1".into()),
            model: "sim-model".into(),
            context: ContextMode::Object,
            time_scale: 20.0,
            max_model_len: 32768,
            limit: Duration::from_secs(1),
            stream: false,
            max_requests: None,
            api_key: None,
            clairvoyant_capacity: None,
        };
        let messages = [json!({"role": "user", "content": "x"})];
        let plain = turn_body(&cfg, first, &messages, 4000);
        assert!(plain["vllm_xargs"]["agentic_context"]["kv_retention_ttl_seconds"].is_null());
        assert!(turn_body(&cfg, last, &messages, 4000)["vllm_xargs"]["sim_end_program"].is_null());
        cfg.clairvoyant_capacity = Some(100_000);
        let held = 4000 + first.output_tokens as usize;
        let want =
            crate::clients::clairvoyant_ttl(held, first.gap_after, 100_000, &Default::default());
        assert!(want > 0.0, "a short gap on a roomy rank is worth holding");
        let body = turn_body(&cfg, first, &messages, 4000);
        let ctx = &body["vllm_xargs"]["agentic_context"];
        assert_eq!(
            ctx["kv_retention_ttl_seconds"],
            json!(want / 20.0 + CLAIRVOYANT_SLACK_SECONDS),
            "in the simulators' wall seconds, with the trips' slack"
        );
        assert!(body["vllm_xargs"]["sim_end_program"].is_null());
        let end = turn_body(&cfg, last, &messages, 4000);
        assert_eq!(end["vllm_xargs"]["sim_end_program"], json!(1));
        assert_eq!(
            end["vllm_xargs"]["agentic_context"]["expected_resume"],
            json!(false)
        );
        assert!(end["vllm_xargs"]["agentic_context"]["kv_retention_ttl_seconds"].is_null());
        // A gap longer than holding is worth: the TTL asks to drop the KV at once.
        cfg.clairvoyant_capacity = Some(5_000);
        let tight = turn_body(&cfg, first, &messages, 4000);
        assert_eq!(
            tight["vllm_xargs"]["agentic_context"]["kv_retention_ttl_seconds"],
            json!(0.0)
        );
    }

    #[test]
    fn endpoints_take_turns_and_follow_a_changed_list() {
        let e = Endpoints::new(vec!["http://a/".into(), "http://b".into()]);
        let seen: Vec<String> = (0..4).map(|k| e.pick(1, k)).collect();
        assert_eq!(seen, ["http://b", "http://a", "http://b", "http://a"]);
        // One endpoint leaves and two join, as in a rolling update: later turns spread over the
        // new list only.
        e.set(vec![
            "http://b".into(),
            "http://c".into(),
            "http://d".into(),
        ]);
        let later: std::collections::BTreeSet<String> = (0..6).map(|k| e.pick(0, k)).collect();
        assert_eq!(later.len(), 3);
        assert!(!later.contains("http://a"));
        e.set(Vec::new());
        assert_eq!(e.pick(0, 0), "");
    }
}
