//! Real processes for the fault scenarios: the program-router binary started from a config file,
//! and vllm-sim servers started as this test binary re-executed in its simulator role (so a
//! scenario can SIGKILL or SIGSTOP one), each on loopback, each killed when its handle drops.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use program_router::config::RouterConfig;

/// The environment variable that turns this test binary into a simulator process.
pub const SIM_ROLE: &str = "PROGRAM_ROUTER_CHAOS_SIM";

/// A child process killed (SIGKILL) when dropped.
pub struct Proc {
    pub child: Child,
    pub base: String,
    /// The metrics listener's base URL, when the process printed `metrics on <url>`.
    pub metrics: Option<String>,
    /// The peer listener's base URL, when the process printed `peers on <url>`.
    pub peer: Option<String>,
}

impl Proc {
    /// The `/metrics` URL of a router started with a metrics listener.
    pub fn metrics_url(&self) -> String {
        let base = self.metrics.as_deref().expect("a metrics listener");
        format!("{base}/metrics")
    }
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }
    /// Sends `signal` (`TERM`, `KILL`, `STOP`, `CONT`) with kill(1).
    pub fn signal(&self, signal: &str) {
        let ok = Command::new("kill")
            .args([format!("-{signal}"), self.pid().to_string()])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill -{signal} {}", self.pid());
    }
    /// Waits up to `limit` for the process to exit; its exit code (`None`: killed by a signal).
    pub fn wait_exit(&mut self, limit: Duration) -> Result<Option<i32>, String> {
        let until = std::time::Instant::now() + limit;
        loop {
            if let Some(s) = self.child.try_wait().map_err(|e| e.to_string())? {
                return Ok(s.code());
            }
            if std::time::Instant::now() > until {
                return Err(format!("still running after {limit:?}"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `cmd` with stderr to a file in `dir` and reads the `listening on <url>` line it prints
/// on stdout first, and the router's `metrics on` / `peers on` lines written with it.
fn start(mut cmd: Command, dir: &Path, name: &str) -> Proc {
    let log = dir.join(format!("{name}.log"));
    let err = std::fs::File::create(&log).expect("log file");
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(err)
        .spawn()
        .unwrap_or_else(|e| panic!("start {name}: {e}"));
    let mut out = BufReader::new(child.stdout.take().expect("stdout"));
    let mut first = String::new();
    out.read_line(&mut first).expect("the listening line");
    let base = first
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("{name}: {first:?}; log: {}", log.display()))
        .to_string();
    // The router writes all its listener lines at once: the rest are in the reader's buffer.
    let (metrics, peer) = testkit::listener_lines(out.buffer());
    // Keep reading stdout so the child never blocks on a full pipe.
    std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
    Proc {
        child,
        base,
        metrics,
        peer,
    }
}

/// A vllm-sim server with `flags`, in a process of its own.
pub fn sim(dir: &Path, name: &str, flags: &[&str]) -> Proc {
    let mut cmd = Command::new(std::env::current_exe().expect("this binary"));
    cmd.env(SIM_ROLE, "1").args(flags);
    start(cmd, dir, name)
}

/// The simulator role: serve `args` (vllm-sim's flags) on a free loopback port until killed.
pub fn run_sim(args: Vec<String>) -> std::process::ExitCode {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        let flags: Vec<&str> = args.iter().map(String::as_str).collect();
        let s = vllm_sim::server::spawn_with_flags(&flags, Duration::from_secs(5))
            .await
            .expect("simulator");
        println!("listening on {}", s.base());
        std::future::pending::<()>().await;
    });
    std::process::ExitCode::SUCCESS
}

/// Writes `config` as the router's config file `dir/<name>.json`.
pub fn write_config(dir: &Path, name: &str, config: &RouterConfig) -> PathBuf {
    let path = dir.join(format!("{name}.json"));
    let tmp = dir.join(format!(".{name}.json.tmp"));
    std::fs::write(
        &tmp,
        serde_json::to_vec_pretty(config).expect("config json"),
    )
    .expect("write");
    std::fs::rename(&tmp, &path).expect("rename");
    path
}

/// The program-router binary reading `config` (its own file, watched for reloads).
/// `CHAOS_ROUTER_WRAPPER` (words split on spaces) runs it under a tool that keeps its stdout,
/// such as `valgrind --tool=massif --massif-out-file=...`.
pub fn router(dir: &Path, name: &str, config: &Path, extra: &[&str]) -> Proc {
    let bin = env!("CARGO_BIN_EXE_program-router");
    let wrapper = std::env::var("CHAOS_ROUTER_WRAPPER").unwrap_or_default();
    let mut words = wrapper.split_whitespace();
    let mut cmd = match words.next() {
        Some(tool) => {
            let mut c = Command::new(tool);
            c.args(words).arg(bin);
            c
        }
        None => Command::new(bin),
    };
    cmd.arg("--config").arg(config).args(extra);
    cmd.env("RUST_LOG", "info");
    start(cmd, dir, name)
}

/// A config for `workers` on loopback, its listeners (API, metrics) on ports the kernel picks:
/// the router prints them ([`Proc::base`], [`Proc::metrics`]).
pub fn config(workers: &[&Proc]) -> RouterConfig {
    let mut c = RouterConfig {
        host: "127.0.0.1".into(),
        port: 0,
        prometheus_host: "127.0.0.1".into(),
        prometheus_port: Some(0),
        workers: workers
            .iter()
            .map(|w| program_router::config::WorkerConfig {
                url: w.base.clone(),
                dp_rank: None,
            })
            .collect(),
        ..Default::default()
    };
    c.health.interval_secs = 0.5;
    c
}
