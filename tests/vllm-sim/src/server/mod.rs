//! The HTTP server: vLLM's OpenAI API over one engine per DP rank.
//!
//! Owns routing, authentication, body limits, DP-rank selection, failure injection and graceful
//! shutdown; request parsing lives in [`openai`], bodies in [`respond`], series in [`metrics`].

mod apis;
mod error;
mod metrics;
pub mod openai;
pub mod rank;
mod respond;

use std::collections::VecDeque;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, Limited, combinators::UnsyncBoxBody};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tokio::net::TcpListener;

use crate::config::SimConfig;
use crate::engine::SeqRequest;
use crate::tokenizer::splitmix;
pub use error::ApiError;
use openai::{Endpoint, Job, Limits};
use rank::{Rank, RankMsg, SimClock};
use respond::{RespCtx, SseBody};

/// Response body type of every route.
pub type Body = UnsyncBoxBody<Bytes, Box<dyn std::error::Error + Send + Sync>>;

fn full(b: impl Into<Bytes>) -> Body {
    Full::new(b.into())
        .map_err(|never: Infallible| match never {})
        .boxed_unsync()
}

/// Header that pins a request to a GLOBAL DP rank.
pub const DP_RANK_HEADER: &str = "x-data-parallel-rank";

struct AppState {
    cfg: SimConfig,
    ranks: Vec<Arc<Rank>>,
    rng: Mutex<SmallRng>,
    next_id: AtomicU64,
    rr: AtomicU64,
    model_json: Arc<str>,
    responses: Arc<apis::ResponseStore>,
    /// Makes ids unique across servers (a router keys stored responses by id, as vLLM's random
    /// ids allow).
    tag: u32,
}

/// Serves until `shutdown` resolves, then stops accepting, lets in-flight requests finish for up
/// to `drain` and returns.
pub async fn serve(
    cfg: SimConfig,
    listener: TcpListener,
    shutdown: impl std::future::Future<Output = ()>,
    drain: Duration,
) -> std::io::Result<()> {
    let clock = SimClock::new(cfg.time_scale);
    let ranks: Vec<_> = (0..cfg.dp_size)
        .map(|i| Rank::new(cfg.dp_start + i, cfg.engine.clone(), clock))
        .collect();
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    for r in &ranks {
        tokio::spawn(r.clone().drive(stop_rx.clone()));
    }
    let state = Arc::new(AppState {
        model_json: serde_json::Value::String(cfg.model.clone())
            .to_string()
            .into(),
        rng: Mutex::new(SmallRng::seed_from_u64(cfg.seed)),
        next_id: AtomicU64::new(0),
        rr: AtomicU64::new(0),
        responses: Default::default(),
        tag: rand::random(),
        ranks,
        cfg,
    });
    let graceful = GracefulShutdown::new();
    let builder = auto::Builder::new(TokioExecutor::new());
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, _peer) = match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let st = state.clone();
                let svc = service_fn(move |req| handle(st.clone(), req));
                let conn = builder.serve_connection_with_upgrades(TokioIo::new(stream), svc);
                let conn = graceful.watch(conn.into_owned());
                tokio::spawn(async move {
                    if let Err(e) = conn.await {
                        tracing::debug!(error = %e, "connection ended with an error");
                    }
                });
            }
            _ = &mut shutdown => break,
        }
    }
    drop(listener);
    tracing::info!("shutting down: draining in-flight requests");
    if tokio::time::timeout(drain, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(
            ?drain,
            "drain timeout reached with requests still in flight"
        );
    }
    let _ = stop_tx.send(true);
    Ok(())
}

/// Binds `host:port` (port 0 picks one) and returns the listener and its address.
pub async fn bind(cfg: &SimConfig) -> std::io::Result<(TcpListener, SocketAddr)> {
    let l = TcpListener::bind((cfg.host.as_str(), cfg.port)).await?;
    let a = l.local_addr()?;
    Ok((l, a))
}

type HandlerError = Box<dyn std::error::Error + Send + Sync>;

async fn handle(st: Arc<AppState>, req: Request<Incoming>) -> Result<Response<Body>, HandlerError> {
    let request_id = req.headers().get("x-request-id").cloned();
    let mut resp = match route(&st, req).await {
        Ok(r) => r,
        Err(Routed::Api(e)) => e.into_response(),
        Err(Routed::Cut(e)) => return Err(e),
    };
    if let Some(id) = request_id {
        resp.headers_mut().insert("x-request-id", id);
    }
    Ok(resp)
}

enum Routed {
    Api(ApiError),
    /// Close the connection without a response (injected failure).
    Cut(HandlerError),
}

impl From<ApiError> for Routed {
    fn from(e: ApiError) -> Self {
        Routed::Api(e)
    }
}

async fn route(st: &Arc<AppState>, req: Request<Incoming>) -> Result<Response<Body>, Routed> {
    let path = req.uri().path();
    if path.starts_with("/v1/") {
        authorize(&st.cfg, req.headers())?;
    }
    match (req.method(), path) {
        (&Method::GET, "/health") => Ok(Response::new(full(Bytes::new()))),
        (&Method::GET, "/metrics") => {
            let text = metrics::render(&st.cfg.model, &st.ranks).map_err(|e| {
                ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!("metrics encoding failed: {e}"),
                )
            })?;
            let mut r = Response::new(full(text));
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
            );
            Ok(r)
        }
        (&Method::GET, "/v1/models") => Ok(json_response(models_json(st))),
        (&Method::GET, "/version") => Ok(json_response(
            serde_json::json!({ "version": concat!("vllm-sim ", env!("CARGO_PKG_VERSION")) })
                .to_string(),
        )),
        (&Method::POST, "/tokenize") => {
            let body = read_body(st, req).await?;
            let tokens = openai::tokenize_body(&body, &st.cfg.model)?;
            Ok(json_response(
                serde_json::json!({
                    "count": tokens.len(),
                    "max_model_len": st.cfg.engine.max_model_len,
                    "tokens": tokens,
                })
                .to_string(),
            ))
        }
        (&Method::POST, "/v1/chat/completions") => generate(st, req, Endpoint::Chat).await,
        (&Method::POST, "/v1/completions") => generate(st, req, Endpoint::Completion).await,
        (&Method::POST, "/v1/messages") => generate(st, req, Endpoint::Messages).await,
        (&Method::POST, "/v1/responses") => generate(st, req, Endpoint::Responses).await,
        (&Method::GET, p) if p.starts_with("/v1/responses/") => {
            let id = &p["/v1/responses/".len()..];
            st.responses.check(id)?;
            Ok(json_response(st.responses.get(id).unwrap_or_default()))
        }
        (
            _,
            "/health"
            | "/metrics"
            | "/v1/models"
            | "/v1/chat/completions"
            | "/v1/completions"
            | "/v1/messages"
            | "/v1/responses"
            | "/version"
            | "/tokenize",
        ) => Err(ApiError::new(StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed").into()),
        _ => Err(ApiError::new(StatusCode::NOT_FOUND, format!("no route for {path}")).into()),
    }
}

fn authorize(cfg: &SimConfig, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(key) = &cfg.api_key else {
        return Ok(());
    };
    let ok = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .is_some_and(|v| v == key);
    if ok {
        Ok(())
    } else {
        Err(ApiError::new(StatusCode::UNAUTHORIZED, "Unauthorized"))
    }
}

fn json_response(body: String) -> Response<Body> {
    let mut r = Response::new(full(body));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

fn models_json(st: &AppState) -> String {
    serde_json::json!({
        "object": "list",
        "data": [{
            "id": st.cfg.model,
            "object": "model",
            "created": unix_now(),
            "owned_by": "vllm",
            "root": st.cfg.model,
            "parent": null,
            "max_model_len": st.cfg.engine.max_model_len,
            "permission": [],
        }]
    })
    .to_string()
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

async fn read_body(st: &AppState, req: Request<Incoming>) -> Result<Bytes, ApiError> {
    let limit = st.cfg.max_body_bytes;
    let too_large = || {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("request body is larger than the limit of {limit} bytes"),
        )
    };
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(too_large());
    }
    match Limited::new(req.into_body(), limit).collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(too_large()),
        Err(e) => Err(ApiError::bad_request(format!(
            "could not read the request body: {e}"
        ))),
    }
}

fn pick_rank(st: &AppState, headers: &HeaderMap) -> Result<Arc<Rank>, ApiError> {
    let (start, size) = (st.cfg.dp_start, st.cfg.dp_size);
    if let Some(v) = headers.get(DP_RANK_HEADER) {
        let rank = v
            .to_str()
            .ok()
            .and_then(|s| s.trim().parse::<u32>().ok())
            .ok_or_else(|| {
                ApiError::bad_request(format!("{DP_RANK_HEADER} must be an integer"))
                    .with_param(DP_RANK_HEADER)
            })?;
        if rank < start || rank >= start + size {
            return Err(ApiError::bad_request(format!(
                "data_parallel_rank {rank} is out of range [{start}, {})",
                start + size
            ))
            .with_param(DP_RANK_HEADER));
        }
        return Ok(st.ranks[(rank - start) as usize].clone());
    }
    if st.ranks.len() == 1 {
        return Ok(st.ranks[0].clone());
    }
    // Least loaded, round robin among equals (vLLM's DP coordinator balances by load too).
    let offset = st.rr.fetch_add(1, Ordering::Relaxed) as usize;
    let n = st.ranks.len();
    let best = (0..n)
        .map(|i| (i + offset) % n)
        .min_by_key(|i| {
            let l = st.ranks[*i].load();
            l.waiting * 4 + l.running
        })
        .unwrap_or(0);
    Ok(st.ranks[best].clone())
}

async fn generate(
    st: &Arc<AppState>,
    req: Request<Incoming>,
    endpoint: Endpoint,
) -> Result<Response<Body>, Routed> {
    let rank = pick_rank(st, req.headers())?;
    let body = read_body(st, req).await?;
    let limits = Limits {
        model: &st.cfg.model,
        default_max_tokens: st.cfg.default_max_tokens,
        accept_nested_xargs: st.cfg.accept_nested_xargs,
    };
    let job: Job = openai::parse(endpoint, &body, &limits)?;
    if let Some(prev) = &job.previous_response_id {
        st.responses.check(prev)?;
    }
    // Responses kept for `previous_response_id` and `GET /v1/responses/{id}`.
    let store = (endpoint == Endpoint::Responses && job.store).then(|| st.responses.clone());
    st.cfg
        .engine
        .check(job.prompt.len(), job.max_tokens)
        .map_err(ApiError::bad_request)?;

    let fail = st.cfg.fail;
    let failing = fail.rate > 0.0
        && st
            .rng
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .random_bool(fail.rate);
    if failing && fail.after_tokens.is_none() {
        return Err(ApiError::new(fail.status, "injected failure").into());
    }
    let fail_after = if failing { fail.after_tokens } else { None };

    let n = st.next_id.fetch_add(1, Ordering::Relaxed);
    let output_seed = {
        let mut h = st.cfg.seed;
        for t in &job.prompt {
            h = splitmix(h ^ u64::from(*t));
        }
        h
    };
    let prefix = match endpoint {
        Endpoint::Chat => "chatcmpl",
        Endpoint::Completion => "cmpl",
        Endpoint::Messages => "msg",
        Endpoint::Responses => "resp",
    };
    let ctx = RespCtx {
        id: format!("{prefix}_sim{:08x}r{}n{n}", st.tag, rank.global_rank),
        created: unix_now(),
        model_json: st.model_json.clone(),
        endpoint,
        output_seed,
        tool_call: job
            .tool_call
            .as_deref()
            .map(|name| serde_json::Value::String(name.to_string()).to_string()),
    };
    let prompt_tokens = job.prompt.len();
    let seq = SeqRequest {
        prompt: job.prompt,
        max_tokens: job.max_tokens,
        priority: job.priority,
        output_seed,
        prefix_hashes: Vec::new(),
    };
    let (mut submission, mut rx) =
        rank.submit(seq, job.stream || fail_after.is_some(), job.ends_program);

    if job.stream {
        let body = SseBody {
            ctx,
            rx,
            submission,
            include_usage: job.include_usage,
            continuous_usage: job.continuous_usage,
            prompt_tokens,
            fail_after,
            sent: 0,
            finished: false,
            buf: VecDeque::new(),
            cut: None,
            stall: fail.stall,
            store: store.clone(),
        };
        let mut r = Response::new(
            body.map_err(|e| -> HandlerError { Box::new(e) })
                .boxed_unsync(),
        );
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/event-stream"),
        );
        r.headers_mut()
            .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        return Ok(r);
    }
    let mut tokens = 0u32;
    while let Some(msg) = rx.recv().await {
        match msg {
            RankMsg::Token { .. } => {
                tokens += 1;
                if fail_after.is_some_and(|n| tokens > n) {
                    return Err(Routed::Cut(Box::new(respond::InjectedFailure(tokens - 1))));
                }
            }
            RankMsg::Done(o) => {
                submission.finish();
                let json = respond::full_json(&ctx, &o);
                if let Some(store) = &store {
                    store.insert(ctx.id.clone(), json.clone());
                }
                return Ok(json_response(json));
            }
        }
    }
    Err(ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "the engine dropped the request",
    )
    .into())
}

/// A simulator serving from a task of this process (tests, benchmarks, embedding).
pub struct Spawned {
    pub addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    pub done: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
}

impl Spawned {
    pub fn base(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Signals shutdown; requests in flight are drained.
    pub fn stop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
    }
}

/// Starts a simulator in this process on a free loopback port, configured by `vllm-sim`'s own
/// command-line `flags`: for tests and benches that need one without the binary. The error
/// names a bad flag or the bind failure.
pub async fn spawn_with_flags(flags: &[&str], drain: Duration) -> Result<Spawned, String> {
    use clap::Parser;
    let mut argv = vec!["vllm-sim", "--port", "0"];
    argv.extend_from_slice(flags);
    let cfg = crate::config::SimArgs::try_parse_from(argv)
        .map_err(|e| e.to_string())?
        .validate()?;
    spawn(cfg, drain).await.map_err(|e| format!("bind: {e}"))
}

/// Binds `cfg` (port 0 picks one) and serves it from a task until [`Spawned::stop`] or drop.
pub async fn spawn(cfg: SimConfig, drain: Duration) -> std::io::Result<Spawned> {
    let (listener, addr) = bind(&cfg).await?;
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let done = tokio::spawn(async move {
        let stop = async {
            let _ = rx.await;
        };
        serve(cfg, listener, stop, drain).await
    });
    Ok(Spawned {
        addr,
        stop: Some(tx),
        done: Some(done),
    })
}
