//! The router processes of one `compare` run: started from a known binary, proven ready,
//! made each other's `peers`, replaced one at a time as a rolling update does, and stopped.
//!
//! Owns every router replica's life in a run and the counters each one reported, including
//! those of replicas that left during the run (read until they exited). A replica that does not
//! become ready, or one told to stop that does not exit cleanly within its drain, fails the run.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};

use crate::compare::{free_port, get, spawn_logged, wait_ok};
use crate::replay::Endpoints;

/// One router process.
pub(crate) struct Replica {
    pub name: String,
    child: Child,
    pub url: String,
    /// Its peer listener, as the member lists name it.
    peer_url: String,
    prom: u16,
}

impl Replica {
    fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    fn metrics(&self) -> Option<String> {
        get(&format!("http://127.0.0.1:{}/metrics", self.prom)).map(|(_, text)| text)
    }
}

/// How the replicas of a fleet are made each other's `peers`.
#[derive(Debug, Clone, Copy)]
pub struct PeerSetup {
    /// `peers.hand_over`.
    pub hand_over: bool,
    /// Whether each member list carries a `peers.revision` (as the operator renders it), so
    /// that replicas take a newer list from each other.
    pub numbered: bool,
    /// `None`: a changed member list reaches every replica at once, and the fleet waits until
    /// each has taken it. `Some(d)`: as a ConfigMap volume does, each replica's copy arrives
    /// after its own delay, uniform in 0..d (the kubelet's sync period), and nobody waits.
    pub skew: Option<Duration>,
}

/// The member list "ConfigMap" and each replica's copy of it: one `--config` file per replica,
/// rewritten atomically (as a ConfigMap volume swaps its files) with the latest list when that
/// replica's delivery falls due; the replicas pick a change up by their config hot reload.
struct PeersFiles {
    dir: PathBuf,
    setup: PeerSetup,
    /// The latest list's document and revision, and the revision each replica's file has.
    state: Arc<Mutex<Published>>,
    rng: rand::rngs::StdRng,
    /// Set when the fleet is dropped: deliveries still due are not made.
    stop: Arc<AtomicBool>,
}

#[derive(Default)]
struct Published {
    doc: String,
    revision: u64,
    written: BTreeMap<String, u64>,
    /// Every list published, in order, names sorted (a replica may skip a list that a later
    /// one replaced before its copy arrived).
    lists: Vec<Vec<String>>,
}

impl PeersFiles {
    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.json"))
    }

    /// A new list: revision one higher; each live replica's copy arrives now (without skew, or
    /// `at_once`) or after its delay. Returns the list's position in [`Published::lists`].
    fn publish(
        &mut self,
        members: &[(String, String)],
        live: &[String],
        at_once: bool,
    ) -> Result<usize, String> {
        let list: Vec<serde_json::Value> = members
            .iter()
            .map(|(name, url)| serde_json::json!({"name": name, "url": url}))
            .collect();
        let index = {
            let mut st = self.state.lock().map_err(|_| "peers files poisoned")?;
            st.revision += 1;
            let mut peers = serde_json::json!({"members": list, "hand_over": self.setup.hand_over});
            if self.setup.numbered {
                peers["revision"] = serde_json::json!(st.revision);
            }
            st.doc = serde_json::json!({ "peers": peers }).to_string();
            let mut names: Vec<String> = members.iter().map(|m| m.0.clone()).collect();
            names.sort();
            st.lists.push(names);
            st.lists.len() - 1
        };
        for name in live {
            match self.setup.skew.filter(|_| !at_once) {
                None => deliver(&self.state, &self.path(name), name)?,
                Some(max) => {
                    let delay = max.mul_f64(self.rng.random::<f64>());
                    let (state, path, name) = (self.state.clone(), self.path(name), name.clone());
                    let stop = self.stop.clone();
                    std::thread::spawn(move || {
                        std::thread::sleep(delay);
                        if !stop.load(Ordering::Relaxed) {
                            let _ = deliver(&state, &path, &name);
                        }
                    });
                }
            }
        }
        Ok(index)
    }
}

/// Writes the latest list to `name`'s file at `path` unless that file already has it.
fn deliver(state: &Mutex<Published>, path: &Path, name: &str) -> Result<(), String> {
    let mut st = state.lock().map_err(|_| "peers files poisoned")?;
    if st.written.get(name).is_some_and(|r| *r >= st.revision) {
        return Ok(());
    }
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, &st.doc).map_err(|e| e.to_string())?;
    std::fs::rename(&tmp, path).map_err(|e| e.to_string())?;
    let revision = st.revision;
    st.written.insert(name.to_string(), revision);
    Ok(())
}

/// The router replicas of one run.
pub(crate) struct Fleet {
    /// Names the run in log file names.
    label: String,
    bin: PathBuf,
    /// Flags every replica gets; each also gets its own ports (and with peers, `--config` and
    /// `--peer-name`).
    args: Vec<String>,
    health: &'static str,
    peers: Option<PeersFiles>,
    live: Vec<Replica>,
    /// Exposition text of each replica that left, as last read before it exited.
    retired: Vec<String>,
    started: usize,
    /// With a skewed delivery: one watcher per member-list change, measuring how far apart
    /// the replicas took it.
    watchers: Vec<std::thread::JoinHandle<Option<f64>>>,
}

/// A directory: when set, each replica's output goes to `<dir>/<variant>-<replica>.log`
/// (otherwise it is discarded).
pub const LOG_DIR_ENV: &str = "PROGBENCH_ROUTER_LOGS";

/// How long a replica may take to become ready, and one told to stop to exit.
const READY_SECS: f64 = 60.0;
const EXIT_SECS: f64 = 60.0;

impl Fleet {
    /// Starts `n` replicas of `bin` with `args`; with `peers`, they are each other's peers as
    /// `r1`, `r2`, … (`seed` draws the delays of a skewed delivery).
    pub fn start(
        label: &str,
        bin: &Path,
        args: Vec<String>,
        health: &'static str,
        n: usize,
        peers: Option<PeerSetup>,
        seed: u64,
    ) -> Result<Fleet, String> {
        let peers = match peers {
            None => None,
            Some(setup) => {
                let dir = std::env::temp_dir().join(format!(
                    "progbench-peers-{}-{}",
                    std::process::id(),
                    free_port()?
                ));
                std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
                // The secret the replicas of this fleet share on their peer listeners.
                let secret: [u8; 32] = rand::random();
                let hex: String = secret.iter().map(|b| format!("{b:02x}")).collect();
                std::fs::write(dir.join(PEER_SECRET), hex)
                    .map_err(|e| format!("{}: {e}", dir.display()))?;
                Some(PeersFiles {
                    dir,
                    setup,
                    state: Arc::default(),
                    rng: rand::rngs::StdRng::seed_from_u64(seed),
                    stop: Arc::default(),
                })
            }
        };
        let mut f = Fleet {
            label: label.to_string(),
            bin: bin.to_path_buf(),
            args,
            health,
            peers,
            live: Vec::new(),
            retired: Vec::new(),
            started: 0,
            watchers: Vec::new(),
        };
        let names: Vec<String> = (1..=n).map(|i| format!("r{i}")).collect();
        let ports = names
            .iter()
            .map(|_| Ok((free_port()?, free_port()?, free_port()?)))
            .collect::<Result<Vec<_>, String>>()?;
        // The first list reaches every replica before it starts (the pods of a new Deployment
        // mount the ConfigMap as it is).
        if let Some(p) = &mut f.peers {
            let members: Vec<(String, String)> = names
                .iter()
                .zip(&ports)
                .map(|(name, (_, _, peer))| (name.clone(), url_of(*peer)))
                .collect();
            p.publish(&members, &names, true)?;
        }
        for (name, (port, prom, peer)) in names.into_iter().zip(ports) {
            f.spawn_replica(name, port, prom, peer)?;
        }
        Ok(f)
    }

    fn spawn_replica(
        &mut self,
        name: String,
        port: u16,
        prom: u16,
        peer: u16,
    ) -> Result<(), String> {
        let mut args = self.args.clone();
        args.extend([
            "--port".into(),
            port.to_string(),
            "--prometheus-port".into(),
            prom.to_string(),
        ]);
        if let Some(p) = &self.peers {
            // A new pod mounts the ConfigMap as it is now (which does not list it yet).
            let path = p.path(&name);
            deliver(&p.state, &path, &name)?;
            args.extend([
                "--config".into(),
                path.display().to_string(),
                "--peer-name".into(),
                name.clone(),
                "--peer-port".into(),
                peer.to_string(),
                "--peer-secret-file".into(),
                p.dir.join(PEER_SECRET).display().to_string(),
            ]);
        }
        let log = std::env::var_os(LOG_DIR_ENV)
            .map(|dir| Path::new(&dir).join(format!("{}-{name}.log", self.label)));
        let child = spawn_logged(&self.bin, &args, log.as_deref())?;
        self.started += 1;
        let mut r = Replica {
            name,
            child,
            url: url_of(port),
            peer_url: url_of(peer),
            prom,
        };
        if !wait_ok(&format!("{}{}", r.url, self.health), READY_SECS) {
            let exited = match r.child.try_wait() {
                Ok(Some(status)) => format!("it exited ({status})"),
                _ => "it was still running".to_string(),
            };
            let _ = r.child.kill();
            let _ = r.child.wait();
            return Err(format!(
                "router replica {} did not become ready on port {port}: {exited}",
                r.name
            ));
        }
        self.live.push(r);
        Ok(())
    }

    /// Publishes the live replicas as the member list (as the operator does from its Ready
    /// router pods); without skew, waits until every live replica has taken it, with skew,
    /// watches how far apart the replicas in `staying` take it.
    fn publish_members(&mut self, staying: &[usize]) -> Result<(), String> {
        let members = self.members();
        let names: Vec<String> = members.iter().map(|m| m.0.clone()).collect();
        let Some(p) = &mut self.peers else {
            return Ok(());
        };
        let index = p.publish(&members, &names, false)?;
        match p.setup.skew {
            None => self.wait_members(&names)?,
            Some(max) => {
                let urls: Vec<String> = staying.iter().map(|i| self.live[*i].url.clone()).collect();
                // Long enough for the last copy to arrive by itself.
                let limit = max.mul_f64(2.0) + Duration::from_secs(5);
                let published = p.state.clone();
                self.watchers.push(std::thread::spawn(move || {
                    spread(&urls, &published, index, limit)
                }));
            }
        }
        Ok(())
    }

    /// For each member-list change of a skewed delivery, in order: the wall seconds between the
    /// first and the last of the replicas that stayed taking it (`None`: one had not taken it
    /// within twice the delivery's longest delay).
    pub fn member_spreads(&mut self) -> Vec<Option<f64>> {
        self.watchers
            .drain(..)
            .map(|w| w.join().ok().flatten())
            .collect()
    }

    /// Waits until every live replica's `/status` lists exactly `names` as its members.
    fn wait_members(&self, names: &[String]) -> Result<(), String> {
        let mut want = names.to_vec();
        want.sort();
        let deadline = Instant::now() + Duration::from_secs(10);
        for r in &self.live {
            loop {
                let got = members_at(&r.url);
                if got.as_ref() == Some(&want) {
                    break;
                }
                if Instant::now() > deadline {
                    return Err(format!(
                        "router replica {} did not take the member list {want:?} (has {got:?})",
                        r.name
                    ));
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Ok(())
    }

    fn members(&self) -> Vec<(String, String)> {
        self.live
            .iter()
            .map(|r| (r.name.clone(), r.peer_url.clone()))
            .collect()
    }

    /// The live replicas' API URLs.
    pub fn urls(&self) -> Vec<String> {
        self.live.iter().map(|r| r.url.clone()).collect()
    }

    /// Replaces live replica `old` as a Deployment's rolling update does (one extra pod, none
    /// unavailable): a new replica starts (with the member list as it is), joins the members
    /// once ready and then the load balancer; then `old` leaves the load balancer, is told to
    /// stop (SIGTERM: it hands its Programs over and drains), and leaves the members once it has
    /// exited. With a skewed delivery the replicas take each new list at their own time.
    pub fn replace(&mut self, old: usize, endpoints: &Endpoints) -> Result<(), String> {
        let name = format!("r{}", self.started + 1);
        let (port, prom, peer) = (free_port()?, free_port()?, free_port()?);
        self.spawn_replica(name, port, prom, peer)?;
        let staying: Vec<usize> = (0..self.live.len()).filter(|i| *i != old).collect();
        self.publish_members(&staying)?;
        let gone = self.live.remove(old);
        endpoints.set(self.urls());
        let retired = self.stop_gracefully(gone)?;
        self.retired.push(retired);
        let all: Vec<usize> = (0..self.live.len()).collect();
        self.publish_members(&all)
    }

    /// SIGTERM, then the replica's counters read until it exits; it must exit with status 0.
    fn stop_gracefully(&self, mut r: Replica) -> Result<String, String> {
        let signalled = Command::new("kill")
            .args(["-TERM", &r.child.id().to_string()])
            .status()
            .map_err(|e| format!("cannot run kill: {e}"))?;
        if !signalled.success() {
            return Err(format!("could not signal router replica {}", r.name));
        }
        let mut last = String::new();
        let deadline = Instant::now() + Duration::from_secs_f64(EXIT_SECS);
        loop {
            if let Some(text) = r.metrics() {
                last = text;
            }
            match r.child.try_wait() {
                Ok(Some(st)) if st.success() => return Ok(last),
                Ok(Some(st)) => {
                    return Err(format!("router replica {} exited with {st}", r.name));
                }
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(50))
                }
                _ => {
                    let _ = r.child.kill();
                    let _ = r.child.wait();
                    return Err(format!(
                        "router replica {} did not exit within {EXIT_SECS} s of SIGTERM",
                        r.name
                    ));
                }
            }
        }
    }

    /// Whether every live replica is running and answers its health check.
    pub fn healthy(&mut self) -> bool {
        let health = self.health;
        self.live
            .iter_mut()
            .all(|r| r.alive() && matches!(get(&format!("{}{health}", r.url)), Some((200, _))))
    }

    /// Every replica's exposition text: the live ones read now, the departed ones as last read.
    pub fn expositions(&self) -> Vec<String> {
        self.live
            .iter()
            .filter_map(Replica::metrics)
            .chain(self.retired.iter().cloned())
            .collect()
    }

    /// How many replicas were started in all.
    pub fn started(&self) -> usize {
        self.started
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for r in &mut self.live {
            let _ = r.child.kill();
            let _ = r.child.wait();
        }
        if let Some(p) = &self.peers {
            p.stop.store(true, Ordering::Relaxed);
            let _ = std::fs::remove_dir_all(&p.dir);
        }
    }
}

/// The names a replica's `/status` lists as its members, sorted.
fn members_at(url: &str) -> Option<Vec<String>> {
    let (_, body) = get(&format!("{url}/status"))?;
    let v: serde_json::Value = serde_json::from_str(json_part(&body)).ok()?;
    let mut m: Vec<String> = v["peers"]["members"]
        .as_array()?
        .iter()
        .filter_map(|x| x.as_str().map(String::from))
        .collect();
    m.sort();
    Some(m)
}

/// Polls the replicas at `urls` every 10 ms until each lists the members of the `index`th list
/// published or of a later one: the wall seconds between the first and the last doing so, `None` when one
/// had not within `limit`. A replica that stops answering has left (a later replacement) and
/// is not waited for.
fn spread(
    urls: &[String],
    published: &Mutex<Published>,
    index: usize,
    limit: Duration,
) -> Option<f64> {
    let start = Instant::now();
    // Per replica: not yet, took it at, or left.
    let mut took: Vec<Option<Option<Instant>>> = vec![None; urls.len()];
    while start.elapsed() < limit {
        for (url, t) in urls.iter().zip(took.iter_mut()) {
            if t.is_some() {
                continue;
            }
            match members_at(url) {
                None => *t = Some(None),
                Some(has) if published.lock().ok()?.lists.get(index..)?.contains(&has) => {
                    *t = Some(Some(Instant::now()))
                }
                Some(_) => {}
            }
        }
        if took.iter().all(Option::is_some) {
            let times: Vec<Instant> = took.into_iter().flatten().flatten().collect();
            let first = times.iter().min()?;
            let last = times.iter().max()?;
            return Some(last.duration_since(*first).as_secs_f64());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    None
}

/// The file in a fleet's peers folder holding its peer secret.
const PEER_SECRET: &str = "peer-secret";

fn url_of(port: u16) -> String {
    format!("http://127.0.0.1:{port}")
}

/// The JSON document in an HTTP body read by [`get`] (which does not undo chunked framing): from
/// its first `{` to its last `}`.
fn json_part(body: &str) -> &str {
    match (body.find('{'), body.rfind('}')) {
        (Some(a), Some(b)) if a < b => &body[a..=b],
        _ => body,
    }
}

/// The counters of `metric` in an exposition, summed by the value of the first of `labels` a
/// series has.
pub(crate) fn by_label(text: &str, metric: &str, labels: &[&str]) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for s in program_router::observe::scrape::samples(text).filter(|s| s.name == metric) {
        if let Some(kind) = labels.iter().find_map(|k| s.label(k)) {
            *out.entry(kind.to_string()).or_insert(0.0) += s.value;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_summed_per_label_value() {
        let t = "program_router_peer_handovers_total{event=\"claimed\"} 3\nprogram_router_peer_handovers_total{event=\"given\"} 2\nprogram_router_peer_handovers_total_other{event=\"claimed\"} 9\nprogram_router_peer_handovers_total{event=\"claimed\",x=\"y\"} 1\n";
        let m = by_label(t, "program_router_peer_handovers_total", &["event"]);
        assert_eq!(m.get("claimed"), Some(&4.0));
        assert_eq!(m.get("given"), Some(&2.0));
        assert_eq!(m.len(), 2);
    }

    #[test]
    fn the_json_of_a_chunked_body_is_found() {
        assert_eq!(
            json_part("1a\r\n{\"a\": {\"b\": 1}}\r\n0\r\n"),
            "{\"a\": {\"b\": 1}}"
        );
        assert_eq!(json_part("plain"), "plain");
    }
}
