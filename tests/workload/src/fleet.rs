//! The router processes of one `compare` run: started from a known binary, proven ready,
//! made each other's `peers`, replaced one at a time as a rolling update does, and stopped.
//!
//! Owns every router replica's life in a run and the counters each one reported, including
//! those of replicas that left during the run (read until they exited). A replica that does not
//! become ready, or one told to stop that does not exit cleanly within its drain, fails the run.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use crate::compare::{free_port, get, spawn_logged, wait_ok};
use crate::replay::Endpoints;

/// One router process.
pub(crate) struct Replica {
    pub name: String,
    child: Child,
    pub url: String,
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

/// The `peers` file every replica of a fleet reads (`--config`), rewritten as members come and
/// go; the replicas pick a change up by their config hot reload.
struct PeersFile {
    path: PathBuf,
    hand_over: bool,
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
    peers: Option<PeersFile>,
    live: Vec<Replica>,
    /// Exposition text of each replica that left, as last read before it exited.
    retired: Vec<String>,
    started: usize,
}

/// A directory: when set, each replica's output goes to `<dir>/<variant>-<replica>.log`
/// (otherwise it is discarded).
pub const LOG_DIR_ENV: &str = "PROGBENCH_ROUTER_LOGS";

/// How long a replica may take to become ready, and one told to stop to exit.
const READY_SECS: f64 = 60.0;
const EXIT_SECS: f64 = 60.0;

impl Fleet {
    /// Starts `n` replicas of `bin` with `args`; with `peers` (`Some(hand_over)`), they are
    /// each other's peers as `r1`, `r2`, …
    pub fn start(
        label: &str,
        bin: &Path,
        args: Vec<String>,
        health: &'static str,
        n: usize,
        peers: Option<bool>,
    ) -> Result<Fleet, String> {
        let mut f = Fleet {
            label: label.to_string(),
            bin: bin.to_path_buf(),
            args,
            health,
            peers: peers.map(|hand_over| PeersFile {
                path: std::env::temp_dir().join(format!(
                    "progbench-peers-{}-{}.json",
                    std::process::id(),
                    free_port().unwrap_or(0)
                )),
                hand_over,
            }),
            live: Vec::new(),
            retired: Vec::new(),
            started: 0,
        };
        let names: Vec<String> = (1..=n).map(|i| format!("r{i}")).collect();
        let ports = names
            .iter()
            .map(|_| Ok((free_port()?, free_port()?)))
            .collect::<Result<Vec<_>, String>>()?;
        f.write_members(
            &names
                .iter()
                .zip(&ports)
                .map(|(name, (port, _))| (name.clone(), url_of(*port)))
                .collect::<Vec<_>>(),
        )?;
        for (name, (port, prom)) in names.into_iter().zip(ports) {
            f.spawn_replica(name, port, prom)?;
        }
        Ok(f)
    }

    fn spawn_replica(&mut self, name: String, port: u16, prom: u16) -> Result<(), String> {
        let mut args = self.args.clone();
        args.extend([
            "--port".into(),
            port.to_string(),
            "--prometheus-port".into(),
            prom.to_string(),
        ]);
        if let Some(p) = &self.peers {
            args.extend([
                "--config".into(),
                p.path.display().to_string(),
                "--peer-name".into(),
                name.clone(),
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
            prom,
        };
        if !wait_ok(&format!("{}{}", r.url, self.health), READY_SECS) {
            let _ = r.child.kill();
            let _ = r.child.wait();
            return Err(format!("router replica {} did not become ready", r.name));
        }
        self.live.push(r);
        Ok(())
    }

    /// Writes the member list (atomically, as a ConfigMap volume swaps its files).
    fn write_members(&self, members: &[(String, String)]) -> Result<(), String> {
        let Some(p) = &self.peers else {
            return Ok(());
        };
        let list: Vec<serde_json::Value> = members
            .iter()
            .map(|(name, url)| serde_json::json!({"name": name, "url": url}))
            .collect();
        let doc = serde_json::json!({"peers": {"members": list, "hand_over": p.hand_over}});
        let tmp = p.path.with_extension("tmp");
        std::fs::write(&tmp, doc.to_string()).map_err(|e| e.to_string())?;
        std::fs::rename(&tmp, &p.path).map_err(|e| e.to_string())
    }

    /// Waits until every live replica's `/status` lists exactly `names` as its members.
    fn wait_members(&self, names: &[String]) -> Result<(), String> {
        let mut want = names.to_vec();
        want.sort();
        let deadline = Instant::now() + Duration::from_secs(10);
        for r in &self.live {
            loop {
                let got = get(&format!("{}/status", r.url)).and_then(|(_, body)| {
                    let v: serde_json::Value = serde_json::from_str(json_part(&body)).ok()?;
                    let mut m: Vec<String> = v["peers"]["members"]
                        .as_array()?
                        .iter()
                        .filter_map(|x| x.as_str().map(String::from))
                        .collect();
                    m.sort();
                    Some(m)
                });
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
            .map(|r| (r.name.clone(), r.url.clone()))
            .collect()
    }

    /// The live replicas' API URLs.
    pub fn urls(&self) -> Vec<String> {
        self.live.iter().map(|r| r.url.clone()).collect()
    }

    /// Replaces live replica `old` as a Deployment's rolling update does (one extra pod, none
    /// unavailable): a new replica joins the members and the load balancer, then `old` leaves
    /// the load balancer, is told to stop (SIGTERM: it hands its Programs over and drains), and
    /// leaves the members once it has exited.
    pub fn replace(&mut self, old: usize, endpoints: &Endpoints) -> Result<(), String> {
        let name = format!("r{}", self.started + 1);
        let (port, prom) = (free_port()?, free_port()?);
        let mut members = self.members();
        members.push((name.clone(), url_of(port)));
        self.write_members(&members)?;
        self.spawn_replica(name, port, prom)?;
        let names: Vec<String> = members.iter().map(|m| m.0.clone()).collect();
        self.wait_members(&names)?;
        let gone = self.live.remove(old);
        endpoints.set(self.urls());
        let retired = self.stop_gracefully(gone)?;
        self.retired.push(retired);
        self.write_members(&self.members())?;
        let names: Vec<String> = self.live.iter().map(|r| r.name.clone()).collect();
        self.wait_members(&names)
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
            let _ = std::fs::remove_file(&p.path);
        }
    }
}

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

/// The counters of `metric` in an exposition, summed by the value of its label `label`.
pub(crate) fn by_label(text: &str, metric: &str, labels: &[&str]) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    let prefix = format!("{metric}{{");
    for l in text.lines().filter(|l| l.starts_with(&prefix)) {
        let kind = labels.iter().find_map(|k| {
            let k = format!("{k}=\"");
            let at = l.find(&k)? + k.len();
            Some(&l[at..at + l[at..].find('"')?])
        });
        if let (Some(kind), Some(v)) = (
            kind,
            l.rsplit(' ')
                .next()
                .and_then(|v| v.trim().parse::<f64>().ok()),
        ) {
            *out.entry(kind.to_string()).or_insert(0.0) += v;
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
