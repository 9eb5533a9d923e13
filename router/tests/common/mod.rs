//! Harness: in-process vllm-sim backends and program-router instances on loopback ports.
#![allow(dead_code, unused_imports)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use program_router::config::RouterConfig;
use program_router::config::flags::Flags;
use program_router::state::RouterState;
use tokio::sync::oneshot;

pub struct Server {
    pub addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    pub done: Option<tokio::task::JoinHandle<()>>,
}

impl Server {
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }
    pub fn base(&self) -> String {
        format!("http://{}", self.addr)
    }
    pub fn stop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
    }
    pub async fn stopped(&mut self) {
        self.stop();
        if let Some(d) = self.done.take() {
            let _ = tokio::time::timeout(Duration::from_secs(10), d).await;
        }
    }
}

/// Starts an in-process simulator on a free loopback port with these flags.
pub async fn sim(args: &[&str]) -> vllm_sim::server::Spawned {
    vllm_sim::server::spawn_with_flags(args, Duration::from_secs(5))
        .await
        .expect("simulator")
}

pub struct Router {
    pub server: Server,
    pub metrics_addr: SocketAddr,
    /// The peer listener (every test router has one, with [`PEER_SECRET`]).
    pub peer_addr: SocketAddr,
    pub state: Arc<RouterState>,
}

impl Router {
    pub fn url(&self, path: &str) -> String {
        self.server.url(path)
    }
    /// `path` on the peer listener.
    pub fn peer_url(&self, path: &str) -> String {
        format!("http://{}{}", self.peer_addr, path)
    }
    /// The peer listener's base URL, as `peers.members` names it.
    pub fn peer_base(&self) -> String {
        format!("http://{}", self.peer_addr)
    }
}

/// The peer secret every test router shares.
pub const PEER_SECRET: &str = "test-peer-secret-0123456789abcdef0123456789";

/// The header a replica presents [`PEER_SECRET`] in.
pub const PEER_KEY_HEADER: (&str, &str) = ("x-program-router-peer-key", PEER_SECRET);

/// A file holding [`PEER_SECRET`], written once per test process.
pub fn peer_secret_file() -> String {
    static FILE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    FILE.get_or_init(|| {
        let p = std::env::temp_dir().join(format!(
            "program-router-test-peer-secret-{}",
            std::process::id()
        ));
        std::fs::write(&p, PEER_SECRET).expect("write the peer secret");
        p.display().to_string()
    })
    .clone()
}

/// Starts a router on free ports with `config` (host/ports overridden) and `flags`.
pub async fn router_with(mut config: RouterConfig, flags: Flags) -> Router {
    config.host = "127.0.0.1".into();
    config.port = 0;
    config.prometheus_host = "127.0.0.1".into();
    config.prometheus_port = Some(0);
    // A router reading a config file keeps that file's listeners (a reload could not add one).
    if flags.config.is_none() {
        config.peer_host = "127.0.0.1".into();
        config.peer_port = Some(0);
        if config.peer_secret_file.is_none() {
            config.peer_secret_file = Some(peer_secret_file());
        }
    }
    config.health.interval_secs = 0.2;
    config.validate().expect("valid test config");
    let bound = program_router::run::bind(config, flags)
        .await
        .expect("bind");
    let addr = bound.api_addr;
    let metrics_addr = bound.metrics.as_ref().expect("metrics").1;
    let peer_addr = bound
        .peer
        .as_ref()
        .map_or_else(|| SocketAddr::from(([127, 0, 0, 1], 9)), |p| p.1);
    let state = bound.state.clone();
    let (tx, rx) = oneshot::channel::<()>();
    let done = tokio::spawn(async move {
        let served = bound
            .serve(async {
                let _ = rx.await;
            })
            .await;
        if let Err(e) = served {
            panic!("the router failed: {e}");
        }
    });
    let r = Router {
        server: Server {
            addr,
            stop: Some(tx),
            done: Some(done),
        },
        metrics_addr,
        peer_addr,
        state,
    };
    wait_ready(&r).await;
    r
}

pub async fn router(config: RouterConfig) -> Router {
    router_with(config, Flags::default()).await
}

async fn wait_ready(r: &Router) {
    let c = client();
    for _ in 0..100 {
        if r.state.applied.load().targets.targets.is_empty() {
            return;
        }
        if get(&c, &r.url("/readiness")).await.status == 200 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("router did not become ready");
}

pub fn workers(urls: &[String], dp: u32) -> RouterConfig {
    RouterConfig {
        workers: urls
            .iter()
            .map(|u| program_router::config::WorkerConfig {
                url: u.clone(),
                dp_rank: None,
            })
            .collect(),
        intra_node_data_parallel_size: dp,
        ..Default::default()
    }
}

pub use testkit::{HttpClient, Reply, client, get, post, send};

pub fn chat(content: &str, max_tokens: u32) -> String {
    serde_json::json!({"model": "sim-model", "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens})
        .to_string()
}

/// Sum of a metric over the series matching `labels` (0 when absent).
pub fn metric_in(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    testkit::metric_value(text, name, labels, false)
}

pub async fn metric(c: &HttpClient, base: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    metric_in(
        &get(c, &format!("{base}/metrics")).await.text(),
        name,
        labels,
    )
}

/// Polls `f` until it returns true (20 ms steps, `secs` at most).
pub async fn eventually<F, Fut>(secs: f64, mut f: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs_f64(secs);
    while tokio::time::Instant::now() < deadline {
        if f().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

/// Whether the router closes `stream` within `secs` (reads until EOF or a reset).
pub async fn closed_within(stream: &mut tokio::net::TcpStream, secs: f64) -> bool {
    use tokio::io::AsyncReadExt;
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + Duration::from_secs_f64(secs);
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => continue, // a response; keep reading
        }
    }
}

/// A router binary started by [`start_binary`]: the process and the URLs of its listeners.
pub struct Started {
    pub child: std::process::Child,
    /// The API listener, `http://ADDR`.
    pub base: String,
    /// The metrics listener, when it has one.
    pub metrics: Option<String>,
    /// The peer listener, when it has one.
    pub peer: Option<String>,
}

/// Starts the program-router binary with `args` (stdout and stderr piped) and reads the lines it
/// prints once it listens (`listening on`, `metrics on`, `peers on`, in one write); the caller
/// stops it with [`stop_binary`] and reads its log from stderr. Pass `--port 0` (and `0` for the
/// other listeners): the kernel picks a free port as the router binds it, where a port chosen
/// before and released can be taken in between by any connection another test opens.
pub fn start_binary(args: &[String]) -> Started {
    use std::io::BufRead;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_program-router"))
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start program-router");
    let mut out = std::io::BufReader::new(child.stdout.take().expect("stdout"));
    let mut first = String::new();
    out.read_line(&mut first).expect("listening line");
    let Some(base) = first
        .trim()
        .strip_prefix("listening on ")
        .map(str::to_string)
    else {
        // It did not start: what it said on stderr is the reason.
        let _ = child.kill();
        let _ = child.wait();
        let mut log = String::new();
        if let Some(mut e) = child.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut e, &mut log);
        }
        panic!("program-router did not start ({first:?}); its log:\n{log}");
    };
    // The other lines came in the same write, so they are in the reader's buffer already.
    let (metrics, peer) = testkit::listener_lines(out.buffer());
    Started {
        child,
        base,
        metrics,
        peer,
    }
}

/// Stops `child` (SIGTERM, so that it drains and writes out its buffered log; SIGKILL after 10 s)
/// and returns what it wrote to stderr (its log).
pub fn stop_binary(mut child: std::process::Child) -> String {
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while std::time::Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    let mut log = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().expect("stderr"), &mut log)
        .expect("log");
    log
}
