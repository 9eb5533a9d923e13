//! The load of a fault scenario and what each of its requests became, judged as a client would:
//! completed, answered with an error (an OpenAI-style JSON error, or an error event ending a
//! stream), not accepted (the connection was refused: safe to retry elsewhere), or lost (a hang
//! past the client's deadline, a reset before any response, a 200 stream ending without
//! `[DONE]` or an error event, a non-JSON error).

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

pub type HttpClient = Client<HttpConnector, Full<Bytes>>;

pub fn client() -> HttpClient {
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(2))
        .build_http()
}

/// One request of the load.
#[derive(Clone, Debug)]
pub struct Req {
    pub body: String,
    pub headers: Vec<(&'static str, String)>,
}

/// A streamed chat request of Program `program` (via `vllm_xargs.agentic_context`) or, with
/// `None`, a plain one; `prompt_chars` of prompt.
pub fn chat(program: Option<&str>, tenant: &str, prompt_chars: usize, max_tokens: u32) -> Req {
    let mut body = serde_json::json!({
        "model": "sim-model",
        "messages": [{"role": "user", "content": "x ".repeat(prompt_chars / 2)}],
        "max_tokens": max_tokens,
        "stream": true,
    });
    if let Some(p) = program {
        body["vllm_xargs"] = serde_json::json!({"agentic_context": {"program_id": p}});
    }
    Req {
        body: body.to_string(),
        headers: vec![("x-tenant-id", tenant.to_string())],
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Completed,
    Errored(String),
    NotAccepted(String),
    Lost(String),
}

/// Sends `req` to `url` and follows it to its end or to `deadline`.
pub async fn send(c: &HttpClient, url: &str, req: &Req, deadline: Duration) -> Outcome {
    match tokio::time::timeout(deadline, follow(c, url, req)).await {
        Ok(o) => o,
        Err(_) => Outcome::Lost(format!(
            "no end within the client's deadline of {deadline:?}"
        )),
    }
}

async fn follow(c: &HttpClient, url: &str, req: &Req) -> Outcome {
    let mut b = hyper::Request::post(url).header("content-type", "application/json");
    for (k, v) in &req.headers {
        b = b.header(*k, v.as_str());
    }
    let Ok(r) = b.body(Full::new(Bytes::from(req.body.clone()))) else {
        return Outcome::Lost("could not build the request".into());
    };
    let resp = match c.request(r).await {
        Ok(r) => r,
        Err(e) if e.is_connect() => return Outcome::NotAccepted(format!("{e}")),
        Err(e) => return Outcome::Lost(format!("no response: {e:?}")),
    };
    let status = resp.status();
    let stream = resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    let mut body = resp.into_body();
    let mut got = Vec::new();
    let mut cut = None;
    while let Some(f) = body.frame().await {
        match f {
            Ok(f) => {
                if let Some(d) = f.data_ref() {
                    got.extend_from_slice(d);
                }
            }
            Err(e) => {
                cut = Some(format!("{e}"));
                break;
            }
        }
    }
    let text = String::from_utf8_lossy(&got);
    if !status.is_success() {
        let openai = serde_json::from_slice::<serde_json::Value>(&got)
            .ok()
            .is_some_and(|v| v["error"]["message"].is_string());
        return if openai {
            Outcome::Errored(format!("{status}"))
        } else {
            Outcome::Lost(format!(
                "{status} without an OpenAI-style error: {text:.200}"
            ))
        };
    }
    if stream {
        if text.contains("data: [DONE]") {
            return Outcome::Completed;
        }
        let error_event = text
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .filter_map(|d| serde_json::from_str::<serde_json::Value>(d).ok())
            .find(|v| v["error"].is_object());
        return match (error_event, cut) {
            (Some(v), _) => Outcome::Errored(format!(
                "error event {}",
                v["error"]["code"].as_str().unwrap_or("?")
            )),
            (None, Some(e)) => Outcome::Lost(format!("stream cut: {e}")),
            (None, None) => Outcome::Lost(format!("stream ended without [DONE]: {text:.200}")),
        };
    }
    match (cut, serde_json::from_slice::<serde_json::Value>(&got)) {
        (None, Ok(v)) if v["choices"].is_array() => Outcome::Completed,
        (Some(e), _) => Outcome::Lost(format!("body cut: {e}")),
        (None, _) => Outcome::Lost(format!("200 without a completion: {text:.200}")),
    }
}

/// What a load's requests became.
#[derive(Debug, Default, Clone)]
pub struct Tally {
    pub completed: usize,
    pub errored: usize,
    pub not_accepted: usize,
    pub lost: usize,
    /// The first few reasons per kind, for the report.
    pub why: Vec<String>,
}

impl Tally {
    pub fn add(&mut self, o: Outcome) {
        let why = match o {
            Outcome::Completed => {
                self.completed += 1;
                None
            }
            Outcome::Errored(w) => {
                self.errored += 1;
                Some(format!("errored: {w}"))
            }
            Outcome::NotAccepted(w) => {
                self.not_accepted += 1;
                Some(format!("not accepted: {w}"))
            }
            Outcome::Lost(w) => {
                self.lost += 1;
                Some(format!("LOST: {w}"))
            }
        };
        if let Some(w) = why
            && !self.why.contains(&w)
            && self.why.len() < 6
        {
            self.why.push(w);
        }
    }
    pub fn merge(&mut self, o: &Tally) {
        self.completed += o.completed;
        self.errored += o.errored;
        self.not_accepted += o.not_accepted;
        self.lost += o.lost;
        for w in &o.why {
            if !self.why.contains(w) && self.why.len() < 6 {
                self.why.push(w.clone());
            }
        }
    }
    pub fn accepted(&self) -> usize {
        self.completed + self.errored + self.lost
    }
}

/// Sends every request of `load` to `url` at once (each in its own task), returning the tasks.
pub fn launch(
    c: &HttpClient,
    url: &str,
    load: Vec<Req>,
    deadline: Duration,
) -> Vec<tokio::task::JoinHandle<Outcome>> {
    load.into_iter()
        .map(|r| {
            let (c, url) = (c.clone(), url.to_string());
            tokio::spawn(async move { send(&c, &url, &r, deadline).await })
        })
        .collect()
}

/// Waits for every task of a launched load.
pub async fn collect(tasks: Vec<tokio::task::JoinHandle<Outcome>>) -> Tally {
    let mut t = Tally::default();
    for task in tasks {
        t.add(
            task.await
                .unwrap_or_else(|e| Outcome::Lost(format!("client task: {e}"))),
        );
    }
    t
}

/// Sends `load` with at most `concurrency` requests in flight.
pub async fn run_load(
    c: &HttpClient,
    url: &str,
    load: Vec<Req>,
    concurrency: usize,
    deadline: Duration,
) -> Tally {
    use futures_util::StreamExt;
    let outcomes: Vec<Outcome> = futures_util::stream::iter(load)
        .map(|r| {
            let (c, url) = (c.clone(), url.to_string());
            async move { send(&c, &url, &r, deadline).await }
        })
        .buffer_unordered(concurrency)
        .collect()
        .await;
    let mut t = Tally::default();
    for o in outcomes {
        t.add(o);
    }
    t
}

/// The body of a GET (empty on any failure).
pub async fn get_text(c: &HttpClient, url: &str) -> String {
    let Ok(req) = hyper::Request::get(url).body(Full::new(Bytes::new())) else {
        return String::new();
    };
    let Ok(Ok(resp)) = tokio::time::timeout(Duration::from_secs(5), c.request(req)).await else {
        return String::new();
    };
    resp.into_body()
        .collect()
        .await
        .map(|b| String::from_utf8_lossy(&b.to_bytes()).into_owned())
        .unwrap_or_default()
}

/// The sum of metric `name` in a Prometheus exposition (0 when absent).
pub fn metric(text: &str, name: &str) -> f64 {
    program_router::observe::scrape::sum(text, name, &[])
}
