//! Loopback ports for the processes a comparison starts: routers anywhere free, simulators at
//! fixed ports where they can be (consistent hashing is keyed by worker URL).

use std::net::TcpListener;

/// Where [`free_port`] looks: below Linux's ephemeral range (32768–60999 by default), so no
/// outgoing connection is given the port between the check here and the router binding it, and
/// below the simulators' ports.
const FREE_PORTS: std::ops::Range<u16> = 20_000..28_000;

/// Ports [`free_port`] has handed out in this process: several are chosen before any is bound.
static HANDED_OUT: std::sync::Mutex<std::collections::BTreeSet<u16>> =
    std::sync::Mutex::new(std::collections::BTreeSet::new());

/// A loopback port nothing is bound to, from [`FREE_PORTS`], never the same twice in a process
/// (the search starts at a point of its own so that test processes side by side rarely meet).
pub(crate) fn free_port() -> Result<u16, String> {
    let mut handed = HANDED_OUT
        .lock()
        .map_err(|_| "the port registry is poisoned".to_string())?;
    let span = usize::from(FREE_PORTS.end - FREE_PORTS.start);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos() as usize);
    let start = (std::process::id() as usize)
        .wrapping_mul(7919)
        .wrapping_add(nanos)
        % span;
    for k in 0..span {
        let port = FREE_PORTS.start + ((start + k) % span) as u16;
        if handed.contains(&port) {
            continue;
        }
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            handed.insert(port);
            return Ok(port);
        }
    }
    Err(format!(
        "no free loopback port in {}..{}",
        FREE_PORTS.start, FREE_PORTS.end
    ))
}

/// First port tried for simulator `i` (below Linux's ephemeral range, away from the routers'
/// and vLLM's defaults).
const SIM_PORT_BASE: u16 = 28_700;

/// The port for simulator `i`: the same one in every run when it is free. Hashing rings are
/// keyed by worker URL, port included, so random ports would give every run (and every variant
/// of one run) a different Program placement under consistent hashing: baselines that moved by
/// ten points of hit between runs of the same workload.
pub(super) fn sim_port(i: usize) -> Result<u16, String> {
    let Some(preferred) = u16::try_from(i)
        .ok()
        .and_then(|i| SIM_PORT_BASE.checked_add(i))
    else {
        return free_port();
    };
    if TcpListener::bind(("127.0.0.1", preferred)).is_ok() {
        return Ok(preferred);
    }
    let p = free_port()?;
    eprintln!(
        "  simulator port {preferred} is taken; using {p} (hashing places Programs differently)"
    );
    Ok(p)
}
