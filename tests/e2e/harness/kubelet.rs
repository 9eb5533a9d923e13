//! The test's kubelet: gives Pods loopback IPs and Ready status, runs vllm-sim for worker Pods
//! and program-router for the router Pods the ReplicaSet creates (with the container's
//! arguments, the environment their Secrets give them and their Secret volumes), and keeps each
//! router's config file equal to its ConfigMap (atomic rename, like a ConfigMap volume) and each
//! Secret volume equal to its Secret (the kubelet's layout and swap).

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use program_router::state::RouterState;
use serde_json::json;
use tokio::sync::Mutex;

/// A Secret volume of a router pod: where it is written here and what it last held.
struct SecretVolume {
    secret: String,
    dir: PathBuf,
    written: BTreeMap<String, Vec<u8>>,
    generation: u32,
}

impl SecretVolume {
    /// Writes `data` as the next generation when it differs from what the volume holds.
    fn sync(&mut self, data: BTreeMap<String, Vec<u8>>) {
        if data == self.written && self.generation > 0 {
            return;
        }
        self.generation += 1;
        let items: Vec<(&str, &[u8])> = data
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_slice()))
            .collect();
        testkit::secret_volume::write(&self.dir, self.generation, &items);
        self.written = data;
    }
}

struct RouterPod {
    ip: String,
    config: PathBuf,
    secrets: Vec<SecretVolume>,
    state: Arc<RouterState>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    ready: bool,
}

struct WorkerPod {
    ip: String,
    sim: vllm_sim::server::Spawned,
}

/// Plays the kubelet for one namespace.
pub struct Kubelet {
    client: Client,
    pub ns: String,
    dir: PathBuf,
    next_ip: AtomicU8,
    routers: Mutex<HashMap<String, RouterPod>>,
    workers: Mutex<HashMap<String, WorkerPod>>,
}

impl Kubelet {
    pub fn new(client: Client, ns: &str, dir: PathBuf) -> Arc<Self> {
        Arc::new(Kubelet {
            client,
            ns: ns.into(),
            dir,
            next_ip: AtomicU8::new(10),
            routers: Mutex::new(HashMap::new()),
            workers: Mutex::new(HashMap::new()),
        })
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    fn next_ip(&self) -> String {
        format!("127.0.0.{}", self.next_ip.fetch_add(1, Ordering::Relaxed))
    }

    async fn set_status(&self, name: &str, ip: &str, ready: bool) -> kube::Result<()> {
        let status = if ready { "True" } else { "False" };
        let body = json!({"status": {
            "phase": "Running",
            "podIP": ip,
            "podIPs": [{"ip": ip}],
            "conditions": [
                {"type": "Ready", "status": status},
                {"type": "ContainersReady", "status": status},
            ],
        }});
        self.pods()
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&body))
            .await
            .map(|_| ())
    }

    /// Creates a worker Pod running vllm-sim with `dp_size` ranks from global rank `start`,
    /// serving on a fresh loopback IP and `port`; returns that IP.
    pub async fn add_worker(
        &self,
        name: &str,
        labels: BTreeMap<String, String>,
        port: u16,
        dp_size: u32,
        start: u32,
    ) -> String {
        let ip = self.next_ip();
        let mut cfg = vllm_sim::config::SimConfig::defaults();
        cfg.host = ip.clone();
        cfg.port = port;
        cfg.dp_size = dp_size;
        cfg.dp_start = start;
        cfg.engine.num_gpu_blocks = 2048;
        cfg.time_scale = 50.0;
        let sim = vllm_sim::server::spawn(cfg, Duration::from_secs(1))
            .await
            .expect("vllm-sim");
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": labels},
            "spec": {
                "automountServiceAccountToken": false,
                "containers": [{
                    "name": "vllm",
                    "image": "vllm/vllm-openai:latest",
                    "args": [
                        "--port", port.to_string(),
                        "--data-parallel-size", dp_size.to_string(),
                        "--data-parallel-start-rank", start.to_string(),
                    ],
                }],
            },
        }))
        .expect("pod");
        self.pods()
            .create(&PostParams::default(), &pod)
            .await
            .expect("create worker pod");
        self.set_status(name, &ip, true)
            .await
            .expect("worker status");
        self.workers.lock().await.insert(
            name.to_string(),
            WorkerPod {
                ip: ip.clone(),
                sim,
            },
        );
        ip
    }

    /// Flips a worker Pod's Ready condition (its simulator keeps running).
    pub async fn set_worker_ready(&self, name: &str, ready: bool) {
        let ip = self.workers.lock().await.get(name).map(|w| w.ip.clone());
        let ip = ip.expect("known worker");
        self.set_status(name, &ip, ready)
            .await
            .expect("worker status");
    }

    /// Stops a worker's simulator as if its process died; the Pod stays as it was (no API call:
    /// works while the API server is down).
    pub async fn kill_worker_process(&self, name: &str) {
        if let Some(w) = self.workers.lock().await.get_mut(name) {
            w.sim.stop();
        }
    }

    /// Deletes a worker Pod and stops its simulator.
    pub async fn delete_worker(&self, name: &str) {
        self.pods()
            .delete(name, &DeleteParams::default().grace_period(0))
            .await
            .expect("delete worker");
        if let Some(mut w) = self.workers.lock().await.remove(name) {
            w.sim.stop();
        }
    }

    /// Router pods as this kubelet runs them: (pod name, IP).
    pub async fn routers(&self) -> Vec<(String, String)> {
        let mut v: Vec<_> = self
            .routers
            .lock()
            .await
            .iter()
            .map(|(n, r)| (n.clone(), r.ip.clone()))
            .collect();
        v.sort();
        v
    }

    /// The router state of a running router pod.
    pub async fn router_state(&self, pod: &str) -> Option<Arc<RouterState>> {
        self.routers.lock().await.get(pod).map(|r| r.state.clone())
    }

    /// Runs the router half of the kubelet every 100 ms until the returned handle is aborted.
    pub fn run_routers(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let me = self.clone();
        tokio::spawn(async move {
            loop {
                if let Err(e) = me.sync_routers().await {
                    eprintln!("kubelet: {e}");
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    }

    async fn sync_routers(&self) -> Result<(), String> {
        let lp = ListParams::default().labels("app.kubernetes.io/component=router");
        let pods = self.pods().list(&lp).await.map_err(|e| e.to_string())?;
        let cms: Api<ConfigMap> = Api::namespaced(self.client.clone(), &self.ns);
        let mut routers = self.routers.lock().await;
        let live: Vec<String> = pods
            .items
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter_map(|p| p.metadata.name.clone())
            .collect();
        routers.retain(|name, r| {
            let keep = live.contains(name);
            if !keep && let Some(tx) = r.stop.take() {
                let _ = tx.send(());
            }
            keep
        });
        for pod in &pods.items {
            let Some(name) = pod.metadata.name.clone() else {
                continue;
            };
            if pod.metadata.deletion_timestamp.is_some() {
                continue;
            }
            let Some(cm_name) = pod
                .spec
                .as_ref()
                .and_then(|s| s.volumes.as_ref())
                .and_then(|v| v.iter().find_map(|v| v.config_map.as_ref()))
                .map(|c| c.name.clone())
            else {
                continue;
            };
            let Some(body) = cms
                .get_opt(&cm_name)
                .await
                .map_err(|e| e.to_string())?
                .and_then(|c| c.data)
                .and_then(|d| d.get("config.json").cloned())
            else {
                continue; // the volume cannot mount yet
            };
            if let Some(r) = routers.get_mut(&name) {
                for v in &mut r.secrets {
                    // A Secret that is gone keeps its last content, as the kubelet does.
                    if let Some(data) = self.secret_data(&v.secret).await? {
                        v.sync(data);
                    }
                }
                if std::fs::read_to_string(&r.config).ok().as_deref() != Some(body.as_str()) {
                    let tmp = r.config.with_extension("tmp");
                    std::fs::write(&tmp, &body).map_err(|e| e.to_string())?;
                    std::fs::rename(&tmp, &r.config).map_err(|e| e.to_string())?;
                }
                let ready = program_router::server::status::ready(&r.state);
                if ready != r.ready {
                    self.set_status(&name, &r.ip, ready)
                        .await
                        .map_err(|e| e.to_string())?;
                    r.ready = ready;
                }
                continue;
            }
            let Some(env) = self.secret_env(pod).await? else {
                continue; // a Secret it names is missing: CreateContainerConfigError
            };
            let Some(container) = pod.spec.as_ref().and_then(|s| s.containers.first()) else {
                continue;
            };
            // Secret volumes, written here; the paths the container names are mapped onto them.
            let mut secrets = Vec::new();
            let mut mounts: Vec<(String, PathBuf)> = Vec::new();
            let volumes = pod
                .spec
                .as_ref()
                .and_then(|s| s.volumes.clone())
                .unwrap_or_default();
            let mut missing = false;
            for m in container.volume_mounts.iter().flatten() {
                let Some(secret) = volumes
                    .iter()
                    .find(|v| v.name == m.name)
                    .and_then(|v| v.secret.as_ref())
                    .and_then(|s| s.secret_name.clone())
                else {
                    continue;
                };
                let Some(data) = self.secret_data(&secret).await? else {
                    missing = true; // FailedMount: the container does not start
                    break;
                };
                let dir = self.dir.join(format!("{name}-{}", m.name));
                std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
                let mut v = SecretVolume {
                    secret,
                    dir: dir.clone(),
                    written: BTreeMap::new(),
                    generation: 0,
                };
                v.sync(data);
                secrets.push(v);
                mounts.push((m.mount_path.clone(), dir));
            }
            if missing {
                continue;
            }
            // The container's own arguments, parsed by the router's command line.
            let args = container.args.clone().unwrap_or_default();
            let cli = <program_router::cli::Cli as clap::Parser>::try_parse_from(
                std::iter::once("program-router".to_string()).chain(args),
            )
            .map_err(|e| format!("router {name}: its arguments: {e}"))?;
            let mut flags = cli.flags;
            // A container path on a Secret volume, as the file written here.
            let local = |path: &str| {
                mounts
                    .iter()
                    .find_map(|(at, dir)| {
                        std::path::Path::new(path)
                            .strip_prefix(at)
                            .ok()
                            .map(|rest| dir.join(rest).display().to_string())
                    })
                    .ok_or_else(|| format!("router {name}: {path} is on no volume"))
            };
            if let Some(d) = flags.client_api_keys_dir.take() {
                flags.client_api_keys_dir = Some(local(&d)?);
            }
            // The peer secret the config names, read from its Secret volume here (a flag wins
            // over the file, also after a reload).
            let named = serde_json::from_str::<serde_json::Value>(&body)
                .ok()
                .and_then(|v| v["peer_secret_file"].as_str().map(String::from));
            if let Some(f) = named {
                flags.peer_secret_file = Some(local(&f)?);
            }
            let ip = self.next_ip();
            let path = self.dir.join(format!("{name}.json"));
            std::fs::write(&path, &body).map_err(|e| e.to_string())?;
            flags.config = Some(path.clone());
            flags.host = Some(ip.clone());
            flags.prometheus_host = Some(ip.clone());
            flags.peer_host = Some(ip.clone());
            // The variables the router's flags read (`env = ...` in its CLI).
            for (var, value) in env {
                match var.as_str() {
                    "PROGRAM_ROUTER_API_KEY" => flags.api_key = Some(value),
                    "PROGRAM_ROUTER_CLIENT_API_KEYS" => flags.client_api_keys = Some(vec![value]),
                    "PROGRAM_ROUTER_PEER_NAME" => flags.peer_name = Some(value),
                    _ => {}
                }
            }
            let file =
                program_router::config::flags::load_file(&path).map_err(|e| e.to_string())?;
            let cfg = flags.effective(Some(file)).map_err(|e| e.to_string())?;
            let bound = program_router::run::bind(cfg, flags)
                .await
                .map_err(|e| format!("router {name} on {ip}: {e}"))?;
            let state = bound.state.clone();
            let (tx, rx) = tokio::sync::oneshot::channel::<()>();
            tokio::spawn(bound.serve(async move {
                let _ = rx.await;
            }));
            self.set_status(&name, &ip, false)
                .await
                .map_err(|e| e.to_string())?;
            routers.insert(
                name,
                RouterPod {
                    ip,
                    config: path,
                    secrets,
                    state,
                    stop: Some(tx),
                    ready: false,
                },
            );
        }
        Ok(())
    }

    /// The router container's variables that come from Secrets or the pod's name, read as the
    /// kubelet does; `None` while a Secret or key they name is missing.
    async fn secret_env(&self, pod: &Pod) -> Result<Option<Vec<(String, String)>>, String> {
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), &self.ns);
        let mut out = Vec::new();
        let env = pod
            .spec
            .iter()
            .flat_map(|s| &s.containers)
            .flat_map(|c| c.env.iter().flatten());
        for e in env {
            let field = e.value_from.as_ref().and_then(|v| v.field_ref.as_ref());
            if let Some(f) = field {
                match f.field_path.as_str() {
                    "metadata.name" => out.push((
                        e.name.clone(),
                        pod.metadata.name.clone().unwrap_or_default(),
                    )),
                    other => return Err(format!("env {}: fieldRef {other} not supported", e.name)),
                }
                continue;
            }
            let Some(r) = e
                .value_from
                .as_ref()
                .and_then(|v| v.secret_key_ref.as_ref())
            else {
                continue;
            };
            let value = secrets
                .get_opt(&r.name)
                .await
                .map_err(|e| e.to_string())?
                .and_then(|s| s.data)
                .and_then(|d| d.get(&r.key).cloned());
            match value {
                Some(v) => out.push((e.name.clone(), String::from_utf8_lossy(&v.0).into_owned())),
                None => return Ok(None),
            }
        }
        Ok(Some(out))
    }

    /// A Secret's data, `None` while it does not exist.
    async fn secret_data(&self, name: &str) -> Result<Option<BTreeMap<String, Vec<u8>>>, String> {
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), &self.ns);
        Ok(secrets
            .get_opt(name)
            .await
            .map_err(|e| e.to_string())?
            .map(|s| {
                s.data
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(k, v)| (k, v.0))
                    .collect()
            }))
    }

    /// Stops every simulator and router.
    pub async fn shutdown(&self) {
        for (_, mut r) in self.routers.lock().await.drain() {
            if let Some(tx) = r.stop.take() {
                let _ = tx.send(());
            }
        }
        for (_, mut w) in self.workers.lock().await.drain() {
            w.sim.stop();
        }
    }
}
