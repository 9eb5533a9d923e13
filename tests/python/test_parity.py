"""Drop-in parity with vllm-router 0.1.17: the same Program traffic through the peer and through
program-router, each in front of its own fresh simulator, and the parts users and dashboards read
compared — the diagnostics field set, the Prometheus families (type and label names), and that
each router keeps every Program on one rank under consistent_hash binding."""

import json
import re
import time

import httpx
import pytest

from conftest import binary, free_port, wait_http
from test_sim_clients import require_vllm_router

CONFIG = json.dumps({
    "global_queue": True,
    "token_capacity_per_dp_rank": 8192,
    "metrics_interval_seconds": 0.5,
    "binding_strategy": "consistent_hash",
})


def start(spawn, sim, exe, name):
    """A router (`exe`, taking vllm-router's flags) over a fresh 2-rank simulator."""
    base = sim("--data-parallel-size", "2", "--time-scale", "20")
    port, prom = free_port(), free_port()
    proc = spawn(
        [exe, "--host", "127.0.0.1", "--port", str(port), "--worker-urls", base,
         "--intra-node-data-parallel-size", "2", "--policy", "consistent_hash",
         "--enable-program-scheduling", "--program-scheduling-config-json", CONFIG,
         "--prometheus-host", "127.0.0.1", "--prometheus-port", str(prom)],
        name,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{url}/health", timeout=30)
    except TimeoutError:
        pytest.fail(f"{name} did not start:\n{proc.output()}")
    return url, f"http://127.0.0.1:{prom}/metrics"


def traffic(url):
    """Three Programs of three turns each, identity as the JSON string stock vLLM accepts."""
    with httpx.Client(timeout=30) as c:
        for turn in range(3):
            for p in ("prog-a", "prog-b", "prog-c"):
                ctx = json.dumps({"program_id": p, "task_id": "t", "step_id": turn})
                body = {
                    "model": "sim-model",
                    "messages": [{"role": "user", "content": f"{p} turn " * (turn + 2)}],
                    "max_tokens": 3,
                    "vllm_xargs": {"agentic_context": ctx},
                }
                r = c.post(f"{url}/v1/chat/completions", json=body)
                assert r.status_code == 200, r.text
            time.sleep(0.6)


def key_paths(v, prefix=""):
    """Every key path of a JSON document (list items under `[]`)."""
    out = set()
    if isinstance(v, dict):
        for k, x in v.items():
            out.add(prefix + k)
            out |= key_paths(x, f"{prefix}{k}.")
    elif isinstance(v, list):
        for x in v:
            out |= key_paths(x, prefix[:-1] + "[].") if prefix else key_paths(x, "[].")
    return out


def families(text):
    """family -> (type, label names without le/quantile)."""
    out = {}
    for line in text.splitlines():
        m = re.match(r"# TYPE (\S+) (\S+)", line)
        if m:
            out[m.group(1)] = (m.group(2), set())
    for line in text.splitlines():
        m = re.match(r"([a-zA-Z_:][\w:]*)\{([^}]*)\}", line)
        if not m:
            continue
        name = m.group(1)
        for suffix in ("_bucket", "_sum", "_count"):
            if name.endswith(suffix) and name[: -len(suffix)] in out:
                name = name[: -len(suffix)]
        if name in out:
            out[name][1].update(k for k in re.findall(r'(\w+)="', m.group(2)) if k not in ("le", "quantile"))
    return out


def homes(diagnostics):
    """Program -> the set of ranks (dp_rank) it is listed under."""
    out = {}
    for rank in diagnostics["ranks"]:
        for p in rank.get("programs", []):
            out.setdefault(p["program"], set()).add(rank["dp_rank"])
    return out


def test_same_traffic_same_diagnostics_fields_metric_families_and_stable_placement(sim, spawn):
    peer_url, peer_metrics = start(spawn, sim, require_vllm_router(), "vllm-router")
    ours_url, ours_metrics = start(spawn, sim, binary("program-router"), "program-router")
    traffic(peer_url)
    traffic(ours_url)
    time.sleep(1.0)  # an observation interval and a rolling-gauge refresh

    with httpx.Client(timeout=10) as c:
        peer_d = c.get(f"{peer_url}/scheduling/diagnostics").json()
        ours_d = c.get(f"{ours_url}/scheduling/diagnostics").json()
        peer_m = c.get(peer_metrics).text
        ours_m = c.get(ours_metrics).text

    missing = sorted(key_paths(peer_d) - key_paths(ours_d))
    assert not missing, f"diagnostics fields the peer has and we do not: {missing}"

    theirs, ours = families(peer_m), families(ours_m)
    compared = {n: t for n, t in theirs.items()
                if n.startswith("vllm_router_agent_aware_") and not n.startswith("vllm_router_workflow_")}
    assert len(compared) >= 20, sorted(theirs)
    differ = [f"{n}: ours {ours.get(n)}, the peer's {t}" for n, t in sorted(compared.items()) if ours.get(n) != t]
    assert not differ, "\n".join(differ)

    for name, d in (("vllm-router", peer_d), ("program-router", ours_d)):
        placed = homes(d)
        # The peer lists Programs under a hash of their id: count them rather than name them.
        assert len(placed) == 3, (name, placed)
        assert all(len(r) == 1 for r in placed.values()), (name, placed)
