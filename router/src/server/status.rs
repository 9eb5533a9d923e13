//! `GET /status`: what the router applied and how its targets look — the operator reads this.

use std::time::{Instant, UNIX_EPOCH};

use serde_json::{Value, json};

use crate::state::RouterState;

fn unix(t: std::time::SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// The status document.
pub fn status(state: &RouterState) -> Value {
    let applied = state.applied.load_full();
    let now = Instant::now();
    let fresh = crate::config::duration(applied.config.observation.interval_secs * 3.0);
    let observing = applied.needs_observation();
    let targets: Vec<Value> = applied
        .targets
        .targets
        .iter()
        .map(|t| {
            let age = t.backend.observation_age();
            json!({
                "id": t.id,
                "url": t.spec.url,
                "dp_rank": t.spec.dp_rank,
                "healthy": t.backend.healthy(),
                "routable": t.available(now),
                "circuit": t.breaker.state(now).as_str(),
                "in_flight": t.in_flight(),
                "observation_age_seconds": age.map(|a| a.as_secs_f64()),
                "observation_fresh": observing && age.is_some_and(|a| a <= fresh),
            })
        })
        .collect();
    let last_error = state
        .last_reload_error
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .as_ref()
        .map(|e| json!({ "at_unix": unix(e.at), "message": e.message }));
    // The key directory's state: names and counts, never keys.
    let dir = applied.config.client_api_keys_dir.as_ref().and_then(|_| {
        state.client_dir.load_full().map(|d| {
            json!({ "path": d.dir.display().to_string(), "keys": d.keys.len(),
                    "names": d.keys.iter().map(|k| &*k.name).collect::<Vec<_>>(),
                    "loaded_at_unix": unix(d.loaded_at), "error": d.error })
        })
    });
    let limits = applied.limiter.as_ref().map(|l| {
        json!({ "max_concurrent_requests": l.max(), "in_progress": l.in_progress(),
                "waiting": l.waiting() })
    });
    let hashes = state
        .file_hash
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    // Program forwarding between replicas: who this replica is and whom it skips.
    let peers = applied.peers.as_ref().map(|p| {
        json!({ "self_name": p.self_name, "member": p.is_member(),
                "members": p.members.iter().map(|m| &m.name).collect::<Vec<_>>(),
                "revision": p.revision,
                // `null`: the config file's list; a name: read from that member, whose list
                // was newer than this replica's copy of the file.
                "members_from": state.peer_list_source(),
                "unreachable": p.down_members(),
                "usage_errors": p.usage_errors(),
                "forwarding": applied.program.is_some() })
    });
    json!({
        "version": env!("CARGO_PKG_VERSION"),
        "limits": limits,
        "peers": peers,
        "ready": ready(state),
        "draining": state.is_draining(),
        "config": {
            "hash": applied.hash,
            "source": state.source,
            "file_hash": hashes.as_ref().map(|h| &h.0),
            "settings_hash": hashes.as_ref().map(|h| &h.1),
            "generation": applied.generation,
            "loaded_at_unix": unix(applied.loaded_at),
            "policy": applied.policy.name(),
            "program_scheduling": applied.config.program_scheduling.is_some(),
            // Which keys clients must present (never the keys themselves).
            "client_auth": client_auth(&applied, dir.is_some()),
        },
        "client_api_keys_dir": dir,
        "last_reload_error": last_error,
        "targets": targets,
    })
}

/// Which keys clients must present (never the keys themselves).
fn client_auth(applied: &crate::applied::Applied, dir: bool) -> &'static str {
    match (&applied.config.client_api_keys, &applied.client_keys, dir) {
        (_, None, false) => "off",
        (_, _, true) => "client_api_keys_dir",
        (Some(_), Some(_), false) => "client_api_keys",
        (None, Some(_), false) => "api_key",
    }
}

/// Ready: not draining and at least one target passed its health checks.
pub fn ready(state: &RouterState) -> bool {
    !state.is_draining()
        && state.failure().is_none()
        && state
            .applied
            .load()
            .targets
            .targets
            .iter()
            .any(|t| t.backend.healthy())
}
