//! The bound of a hyper-based proxy on this machine: the router's HTTP stack and threading with
//! nothing of the router in it, for `scripts/bench-router-overhead.sh`'s `hyper-bound` row.
//!
//! Same shape as the router's data path: one single-threaded runtime per I/O thread accepting
//! from a shared listener, hyper's server connection, and a per-thread LIFO stack of upstream
//! HTTP/1.1 connections driven by hyper's client connection tasks. It does less than any proxy
//! may: no routing, no headers rewritten, no limits, no metrics, and the upstream response is
//! read whole before it is answered. What program-router costs above this row is the router;
//! what this row costs above nginx is the stack.
//!
//! `bare_proxy LISTEN_ADDR UPSTREAM_ADDR [THREADS] [--auto] [--header-timeout] [--json]`: `--auto`
//! serves with hyper-util's auto (HTTP/1 + HTTP/2) builder as the router does, `--header-timeout`
//! arms hyper's per-request header-read timer as the router does by default, and `--json` adds
//! the least JSON work a router that reads the request can do (`hyper-bound-json`): the request
//! body parsed for its model and stream flag, and the usage object found in the response's tail
//! and parsed, each checked as UTF-8 once. A non-JSON request is forwarded as it is.
#![forbid(unsafe_code)]

use std::cell::RefCell;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

type Sender = SendRequest<Full<Bytes>>;

thread_local! {
    /// This thread's idle upstream connections (most recently returned on top).
    static IDLE: RefCell<Vec<Sender>> = const { RefCell::new(Vec::new()) };
}

struct Opts {
    upstream: SocketAddr,
    auto: bool,
    header_timeout: bool,
    json: bool,
}

/// What any router reads of a generation request (the rest is skipped, but still scanned).
#[derive(serde::Deserialize)]
struct Peek<'a> {
    #[serde(borrow)]
    model: Option<std::borrow::Cow<'a, str>>,
    stream: Option<bool>,
}

/// The token counts a router reads from a response.
#[derive(serde::Deserialize)]
struct Usage {
    prompt_tokens: Option<u64>,
    completion_tokens: Option<u64>,
}

/// The request's model and stream flag, when it is a JSON object.
fn peek(body: &[u8]) -> Option<(usize, bool)> {
    let text = std::str::from_utf8(body).ok()?;
    let p: Peek<'_> = serde_json::from_str(text).ok()?;
    Some((p.model.map_or(0, |m| m.len()), p.stream.unwrap_or(false)))
}

/// The last usage object in a JSON response.
fn usage(body: &[u8]) -> Option<u64> {
    static USAGE: std::sync::LazyLock<memchr::memmem::FinderRev<'static>> =
        std::sync::LazyLock::new(|| memchr::memmem::FinderRev::new(b"\"usage\""));
    let tail = &body[USAGE.rfind(body)? + 7..];
    let tail = &tail[tail.iter().position(|b| *b == b':')? + 1..];
    let text = std::str::from_utf8(tail).ok()?;
    let u = serde_json::Deserializer::from_str(text)
        .into_iter::<Usage>()
        .next()?
        .ok()?;
    Some(u.prompt_tokens.unwrap_or(0) + u.completion_tokens.unwrap_or(0))
}

async fn sender(upstream: SocketAddr) -> std::io::Result<Sender> {
    if let Some(s) = IDLE.with(|i| i.borrow_mut().pop()) {
        return Ok(s);
    }
    let stream = TcpStream::connect(upstream).await?;
    stream.set_nodelay(true)?;
    let (s, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(std::io::Error::other)?;
    tokio::task::spawn_local(async move {
        let _ = conn.await;
    });
    Ok(s)
}

async fn forward(opts: &Opts, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let bad = |what: String| {
        let mut r = Response::new(Full::new(Bytes::from(what)));
        *r.status_mut() = StatusCode::BAD_GATEWAY;
        r
    };
    let (parts, body) = req.into_parts();
    let body = match body.collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => return bad(format!("request body: {e}")),
    };
    let peeked = if opts.json {
        std::hint::black_box(peek(&body))
    } else {
        None
    };
    let mut s = match sender(opts.upstream).await {
        Ok(s) => s,
        Err(e) => return bad(format!("connect: {e}")),
    };
    let up = Request::from_parts(parts, Full::new(body));
    let resp = match s.send_request(up).await {
        Ok(r) => r,
        Err(e) => return bad(format!("send: {e}")),
    };
    let (parts, body) = resp.into_parts();
    let body = match body.collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => return bad(format!("response body: {e}")),
    };
    if peeked.is_some() {
        std::hint::black_box(usage(&body));
    }
    IDLE.with(|i| i.borrow_mut().push(s));
    Response::from_parts(parts, Full::new(body))
}

async fn serve(stream: TcpStream, opts: &'static Opts) {
    let _ = stream.set_nodelay(true);
    let svc = service_fn(move |req| async move { Ok::<_, Infallible>(forward(opts, req).await) });
    let io = TokioIo::new(stream);
    if opts.auto {
        let mut b = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
        let mut h1 = b.http1();
        h1.timer(TokioTimer::new());
        if opts.header_timeout {
            h1.header_read_timeout(Duration::from_secs(60));
        }
        let _ = b.serve_connection_with_upgrades(io, svc).await;
    } else {
        let mut b = hyper::server::conn::http1::Builder::new();
        b.timer(TokioTimer::new());
        if opts.header_timeout {
            b.header_read_timeout(Duration::from_secs(60));
        }
        let _ = b.serve_connection(io, svc).await;
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let flags: Vec<&str> = args
        .iter()
        .map(String::as_str)
        .filter(|a| a.starts_with("--"))
        .collect();
    let pos: Vec<&str> = args
        .iter()
        .map(String::as_str)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let (Some(listen), Some(upstream)) = (pos.first(), pos.get(1)) else {
        return Err(
            "usage: bare_proxy LISTEN_ADDR UPSTREAM_ADDR [THREADS] [--auto] [--header-timeout] [--json]"
                .into(),
        );
    };
    let threads = match pos.get(2) {
        Some(t) => t.parse()?,
        None => std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    let opts: &'static Opts = Box::leak(Box::new(Opts {
        upstream: upstream.parse()?,
        auto: flags.contains(&"--auto"),
        header_timeout: flags.contains(&"--header-timeout"),
        json: flags.contains(&"--json"),
    }));
    let listener = std::net::TcpListener::bind(listen)?;
    listener.set_nonblocking(true)?;
    let mut handles = Vec::new();
    for _ in 0..threads {
        let l = listener.try_clone()?;
        handles.push(std::thread::spawn(move || -> std::io::Result<()> {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            let local = tokio::task::LocalSet::new();
            local.block_on(&rt, async move {
                let l = TcpListener::from_std(l)?;
                loop {
                    let (s, _) = l.accept().await?;
                    tokio::task::spawn_local(serve(s, opts));
                }
            })
        }));
    }
    for h in handles {
        h.join().map_err(|_| "an I/O thread panicked")??;
    }
    Ok(())
}
