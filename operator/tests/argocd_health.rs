//! The chart's Argo CD health check (charts/program-scheduling/files/argocd-health.lua) run in a
//! Lua 5.1 interpreter over ProgramScheduling objects in every state it must tell apart.

use mlua::{Lua, LuaSerdeExt, Value};
use serde_json::json;

const SCRIPT: &str = include_str!("../../charts/program-scheduling/files/argocd-health.lua");

fn health(obj: serde_json::Value) -> (String, String) {
    let lua = Lua::new();
    let v = lua.to_value(&obj).expect("to lua");
    lua.globals().set("obj", v).expect("set obj");
    let out: Value = lua.load(SCRIPT).eval().expect("script runs");
    let t = out.as_table().expect("returns a table");
    (
        t.get::<String>("status").expect("status"),
        t.get::<String>("message").expect("message"),
    )
}

fn ps(
    generation: i64,
    observed: Option<i64>,
    ready: Option<(&str, &str, &str)>,
) -> serde_json::Value {
    let mut o = json!({
        "apiVersion": "scheduling.program-router.dev/v1alpha1",
        "kind": "ProgramScheduling",
        "metadata": {"name": "agents", "generation": generation},
        "spec": {"workerSelector": {}},
    });
    if observed.is_some() || ready.is_some() {
        let mut conditions = vec![
            json!({"type": "WorkersDiscovered", "status": "True", "reason": "Discovered", "message": "2 worker pods"}),
        ];
        if let Some((status, reason, message)) = ready {
            conditions.push(
                json!({"type": "Ready", "status": status, "reason": reason, "message": message}),
            );
        }
        o["status"] = json!({"observedGeneration": observed, "conditions": conditions});
    }
    o
}

#[test]
fn every_state_maps_to_its_health() {
    let table = [
        (
            ps(1, None, None),
            "Progressing",
            "Waiting for program-operator to report status",
        ),
        (
            ps(3, Some(2), Some(("True", "Ready", "routing"))),
            "Progressing",
            "observe generation 3",
        ),
        (
            ps(2, Some(2), None),
            "Progressing",
            "Ready is not reported yet",
        ),
        (
            ps(2, Some(2), Some(("Unknown", "Reconciling", "first pass"))),
            "Progressing",
            "first pass",
        ),
        (
            ps(
                2,
                Some(2),
                Some(("True", "Ready", "routing over the discovered workers")),
            ),
            "Healthy",
            "routing over the discovered workers",
        ),
        (
            ps(
                2,
                Some(2),
                Some((
                    "False",
                    "Pending",
                    "ConfigApplied: 1 of 2 routers not yet on config ab",
                )),
            ),
            "Progressing",
            "Pending: ConfigApplied: 1 of 2 routers",
        ),
        (
            ps(
                2,
                Some(2),
                Some((
                    "False",
                    "InvalidSpec",
                    "program_scheduling.stats_window_size: must be >= 1",
                )),
            ),
            "Degraded",
            "InvalidSpec: program_scheduling.stats_window_size",
        ),
        (
            ps(
                2,
                Some(2),
                Some((
                    "False",
                    "NoWorkers",
                    "WorkersDiscovered: no Ready worker pod",
                )),
            ),
            "Degraded",
            "NoWorkers: WorkersDiscovered",
        ),
        (
            ps(
                2,
                Some(2),
                Some((
                    "False",
                    "NoHealthyBackends",
                    "BackendsObserved: no healthy target",
                )),
            ),
            "Degraded",
            "NoHealthyBackends",
        ),
    ];
    for (obj, want_status, want_message) in table {
        let (status, message) = health(obj.clone());
        assert_eq!(status, want_status, "{obj}");
        assert!(
            message.contains(want_message),
            "{message:?} lacks {want_message:?}"
        );
    }
}

#[test]
fn every_ready_false_reason_the_operator_emits_is_classified() {
    // Reasons from operator/src/conditions/: settling ones are Progressing, the rest Degraded.
    for (reason, want) in [
        ("NotRendered", "Progressing"),
        ("NoRouters", "Progressing"),
        ("Pending", "Progressing"),
        ("StatusUnreachable", "Progressing"),
        ("Unavailable", "Progressing"),
        ("ScaledToZero", "Suspended"),
        ("DiscoveryFailed", "Degraded"),
        ("InvalidSpec", "Degraded"),
    ] {
        let (status, _) = health(ps(1, Some(1), Some(("False", reason, "m"))));
        assert_eq!(status, want, "{reason}");
    }
}
