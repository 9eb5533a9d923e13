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
//! the router's own reading of the JSON (`hyper-bound-json`): the request body read by
//! `proxy::request::peek`, the response's usage by `proxy::usage::usage_in_json_tail`. A request
//! the router would refuse is forwarded as it is.
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
        std::hint::black_box(program_router::proxy::request::peek(&body).ok())
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
        std::hint::black_box(program_router::proxy::usage::usage_in_json_tail(&body));
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
                // As the router's I/O threads: its timers would wake the driver otherwise.
                tokio::task::spawn_local(program_router::net::timer_floor::keep_a_timer_pending());
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
