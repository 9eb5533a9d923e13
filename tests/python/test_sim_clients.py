"""The simulator with real clients: the stock OpenAI SDK and the peer vllm-router 0.1.17."""

import json
import os
import time

import httpx
import openai
import pytest

from conftest import free_port, vllm_router_bin, wait_http


def test_openai_sdk_uses_two_ranks(sim):
    base = sim("--data-parallel-size", "2", "--time-scale", "20")
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused")
    assert [m.id for m in client.models.list().data] == ["sim-model"]

    r = client.chat.completions.create(
        model="sim-model", messages=[{"role": "user", "content": "hello there"}], max_tokens=4
    )
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 4
    assert r.usage.prompt_tokens_details.cached_tokens == 0

    chunks = list(
        client.chat.completions.create(
            model="sim-model",
            messages=[{"role": "user", "content": "stream please"}],
            max_tokens=3,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(text.split()) == 3
    assert chunks[-1].usage.completion_tokens == 3

    for rank in ("0", "1"):
        r = client.completions.create(
            model="sim-model", prompt="pin me", max_tokens=2, extra_headers={"X-data-parallel-rank": rank}
        )
        assert r.usage.completion_tokens == 2
    with pytest.raises(openai.BadRequestError):
        client.completions.create(
            model="sim-model", prompt="x", max_tokens=1, extra_headers={"X-data-parallel-rank": "2"}
        )
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])


def require_vllm_router() -> str:
    path = vllm_router_bin()
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("vllm-router==0.1.17 must be installed in CI (tests/python/requirements.txt)")
        pytest.skip("vllm-router is not installed; pip install -r tests/python/requirements.txt")
    return path


def test_vllm_router_observes_the_simulator(sim, spawn):
    """The peer polls our /metrics and reports fresh per-rank observations."""
    exe = require_vllm_router()
    base = sim("--data-parallel-size", "2", "--api-key", "k", "--time-scale", "20")
    port, prom = free_port(), free_port()
    cfg = json.dumps({"global_queue": True, "token_capacity_per_dp_rank": 8192, "metrics_interval_seconds": 0.5})
    router = spawn(
        [exe, "--host", "127.0.0.1", "--port", str(port), "--worker-urls", base,
         "--intra-node-data-parallel-size", "2", "--api-key", "k", "--policy", "consistent_hash",
         "--enable-program-scheduling", "--program-scheduling-config-json", cfg,
         "--prometheus-host", "127.0.0.1", "--prometheus-port", str(prom)],
        "vllm-router",
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{url}/health", timeout=30)
    except TimeoutError:
        pytest.fail(f"vllm-router did not start:\n{router.output()}")
    headers = {"authorization": "Bearer k", "content-type": "application/json"}
    with httpx.Client(timeout=30) as c:
        for turn in range(3):
            ctx = json.dumps({"program_id": "prog-a", "task_id": "t", "step_id": turn})
            body = {
                "model": "sim-model",
                "messages": [{"role": "user", "content": "turn " * (turn + 1)}],
                "max_tokens": 3,
                "vllm_xargs": {"agentic_context": ctx},
            }
            r = c.post(f"{url}/v1/chat/completions", json=body, headers=headers)
            assert r.status_code == 200, r.text
        # The canonical nested object is forwarded unchanged and stock vLLM (and the simulator) rejects it.
        nested = {"model": "sim-model", "messages": [{"role": "user", "content": "x"}], "max_tokens": 1,
                  "vllm_xargs": {"agentic_context": {"program_id": "prog-b"}}}
        r = c.post(f"{url}/v1/chat/completions", json=nested, headers=headers)
        assert r.status_code == 400, r.text
        # The peer's --api-key authenticates its own calls; a client still needs the key
        # (program-router refuses such a client itself, see test_router_clients.py).
        r = c.post(f"{url}/v1/chat/completions", json=body, headers={"content-type": "application/json"})
        assert r.status_code == 401, r.text

        deadline = time.monotonic() + 15
        ranks = []
        while time.monotonic() < deadline:
            d = c.get(f"{url}/scheduling/diagnostics").json()
            ranks = d["ranks"]
            if len(ranks) == 2 and all(r["observation_fresh"] for r in ranks):
                break
            time.sleep(0.25)
        assert len(ranks) == 2, ranks
        assert all(r["observation_fresh"] for r in ranks), ranks
        assert all(r["observation_age_seconds"] < 2.0 for r in ranks), ranks
        assert sorted(r["dp_rank"] for r in ranks) == [0, 1]
        assert all(r["capacity_accounting_source"] == "backend_observation" for r in ranks), ranks
