//! Fault injection on real processes (issue 33): each scenario starts the program-router binary
//! and vllm-sim servers (this binary re-executed in its simulator role) on loopback, injects one
//! fault — SIGTERM or SIGKILL of a process, a stalled, frozen or garbage-sending backend, a
//! config-reload storm — and counts what the load's requests became. The goal is 0 lost.
//!
//!   cargo test -p program-router --test chaos                 # every scenario (CI)
//!   cargo test -p program-router --test chaos -- reload       # the scenarios whose name matches
//!   cargo test --release -p program-router --test chaos -- soak   # the 20-minute soak
//!
//! Set `CHAOS_REPORT=<file>` to append the table rows for docs/reliability.md.

mod client;
mod procs;
mod scenarios;
mod soak;

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::process::ExitCode;

type Scenario = for<'a> fn(&'a Path) -> Pin<Box<dyn Future<Output = scenarios::Report> + 'a>>;

fn main() -> ExitCode {
    if std::env::var_os(procs::SIM_ROLE).is_some() {
        return procs::run_sim(std::env::args().skip(1).collect());
    }
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let all: [(&str, Scenario); 8] = [
        ("sigterm_drains_200_streams", |d| {
            Box::pin(scenarios::sigterm_drains_200_streams(d))
        }),
        ("sigterm_while_connecting", |d| {
            Box::pin(scenarios::sigterm_while_connecting(d))
        }),
        ("sim_killed_midstream", |d| {
            Box::pin(scenarios::sim_killed_midstream(d))
        }),
        ("stalled_backends", |d| {
            Box::pin(scenarios::stalled_backends(d))
        }),
        ("garbage_backend", |d| {
            Box::pin(scenarios::garbage_backend_answers(d))
        }),
        ("reload_storm", |d| Box::pin(scenarios::reload_storm(d))),
        ("router_replica_killed", |d| {
            Box::pin(scenarios::router_replica_killed(d))
        }),
        ("soak", |d| Box::pin(soak::soak(d))),
    ];
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let mut failed = Vec::new();
    let mut ran = 0;
    for (name, run) in all {
        // The soak runs for twenty minutes: only when named.
        let named = filters.iter().any(|f| name.contains(f.as_str()));
        if (!filters.is_empty() || name == "soak") && !named {
            continue;
        }
        ran += 1;
        let dir = tempfile::tempdir().expect("temp dir");
        let started = std::time::Instant::now();
        let r = rt.block_on(run(dir.path()));
        let t = &r.tally;
        println!(
            "chaos {name}: accepted {} completed {} errored {} lost {} (not accepted {}) in {:.1} s; {}",
            t.accepted(),
            t.completed,
            t.errored,
            t.lost,
            t.not_accepted,
            started.elapsed().as_secs_f64(),
            r.recovery
        );
        for n in r.notes.iter().chain(&t.why) {
            println!("    {n}");
        }
        if let Ok(path) = std::env::var("CHAOS_REPORT") {
            let row = format!(
                "| `{}` | {} | {} | {} | {} | {} | {} | {} |\n",
                r.name,
                r.load,
                r.fault,
                t.accepted(),
                t.completed,
                t.errored,
                t.lost,
                r.recovery
            );
            let _ = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .and_then(|mut f| std::io::Write::write_all(&mut f, row.as_bytes()));
        }
        let healthy = !["DIED", "not recovered", "EXCEEDED"]
            .iter()
            .any(|bad| r.recovery.contains(bad));
        if std::env::var_os("CHAOS_KEEP").is_some() {
            println!("    logs kept in {}", dir.keep().display());
            continue;
        }
        if t.lost > 0 || t.accepted() == 0 || !healthy {
            for p in std::fs::read_dir(dir.path())
                .into_iter()
                .flatten()
                .flatten()
            {
                if p.path().extension().is_some_and(|e| e == "log") {
                    let log = std::fs::read_to_string(p.path()).unwrap_or_default();
                    // The access lines are one per request; the others tell how it stopped.
                    let access = log.lines().filter(|l| l.contains(" access: ")).count();
                    let tail: Vec<&str> = log
                        .lines()
                        .filter(|l| !l.contains(" access: "))
                        .rev()
                        .take(25)
                        .collect();
                    eprintln!(
                        "--- {} (last lines but the {access} access lines)",
                        p.path().display()
                    );
                    for l in tail.iter().rev() {
                        eprintln!("{l}");
                    }
                }
            }
            failed.push(name);
        }
    }
    if failed.is_empty() {
        println!("chaos: {ran} scenarios, 0 lost");
        ExitCode::SUCCESS
    } else {
        eprintln!("chaos: requests lost or service not recovered in {failed:?}");
        ExitCode::FAILURE
    }
}
