"""program-router with real clients: the OpenAI SDK through a router started with vllm-router's flags,
and the Anthropic SDK (Claude Code's API) and the OpenAI Responses API (Codex's)."""

import json

import anthropic
import httpx
import openai
import pytest

from conftest import binary, free_port, wait_http


@pytest.fixture
def router(sim, spawn):
    def start(*flags, dp="2"):
        backend = sim("--data-parallel-size", dp, "--time-scale", "20")
        port, prom = free_port(), free_port()
        pr = spawn(
            [binary("program-router"), "--host", "127.0.0.1", "--port", str(port),
             "--prometheus-host", "127.0.0.1", "--prometheus-port", str(prom),
             "--worker-urls", backend, "--intra-node-data-parallel-size", dp, *flags],
            "program-router",
        )
        try:
            wait_http(f"http://127.0.0.1:{port}/readiness")
        except TimeoutError:
            pytest.fail(f"program-router did not become ready:\n{pr.output()}")
        return f"http://127.0.0.1:{port}", f"http://127.0.0.1:{prom}"

    return start


def test_openai_sdk_through_the_router(router):
    url, prom = router("--policy", "consistent_hash", "--request-timeout-secs", "60", "--retry-max-retries", "3")
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused")
    assert [m.id for m in client.models.list().data] == ["sim-model"]
    r = client.chat.completions.create(
        model="sim-model", messages=[{"role": "user", "content": "hello"}], max_tokens=5,
        extra_headers={"x-session-id": "s-1"},
    )
    assert r.usage.completion_tokens == 5
    chunks = list(client.chat.completions.create(
        model="sim-model", messages=[{"role": "user", "content": "stream"}], max_tokens=4, stream=True,
        extra_headers={"x-session-id": "s-1"},
    ))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices).count(" w") == 4
    assert all(c.usage is None for c in chunks), "the router's own usage request stays invisible"
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])

    metrics = httpx.get(f"{prom}/metrics").text
    assert 'vllm_router_requests_total{route="/v1/chat/completions"} 3' in metrics
    completion = sum(
        float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
        if line.startswith("vllm_router_tokens_total") and 'kind="completion"' in line
    )
    assert completion == 9.0, metrics
    status = httpx.get(f"{url}/status").json()
    assert status["ready"] and len(status["targets"]) == 2


def test_anthropic_sdk_and_responses_api_are_program_scheduled(router):
    config = json.dumps({"program_scheduling_enable_key": "auto", "token_capacity_per_dp_rank": 100000})
    url, prom = router("--enable-program-scheduling", "--program-scheduling-config-json", config)
    claude = anthropic.Anthropic(base_url=url, api_key="unused")
    headers = {"x-claude-code-session-id": "cc-py"}
    msg = claude.messages.create(
        model="sim-model", max_tokens=5, system="You are Claude Code.",
        messages=[{"role": "user", "content": "hello"}], extra_headers=headers,
    )
    assert msg.usage.output_tokens == 5 and msg.content[0].type == "text"
    with claude.messages.stream(
        model="sim-model", max_tokens=4, messages=[{"role": "user", "content": "stream"}],
        extra_headers=headers,
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text.count(" w") == 4 and final.usage.output_tokens == 4

    codex = openai.OpenAI(base_url=f"{url}/v1", api_key="unused")
    r = codex.responses.create(
        model="sim-model", instructions="You are Codex.", input="hello", max_output_tokens=3,
        extra_headers={"session-id": "codex-py"},
    )
    assert r.usage.output_tokens == 3 and r.output_text.count(" w") == 3
    events = list(codex.responses.create(
        model="sim-model", input="stream", max_output_tokens=2, stream=True,
        extra_headers={"session-id": "codex-py"},
    ))
    assert events[-1].type == "response.completed" and events[-1].response.usage.output_tokens == 2

    programs = httpx.get(f"{url}/scheduling/diagnostics").json()["ranks"]
    ids = {p["program"] for rank in programs for p in rank["programs"]}
    assert {"cc-py", "codex-py"} <= ids, ids
    metrics = httpx.get(f"{prom}/metrics").text
    assert 'vllm_router_requests_total{route="/v1/messages"} 2' in metrics
    assert 'vllm_router_requests_total{route="/v1/responses"} 2' in metrics

    # With client keys, the SDK's own `x-api-key` (Claude Code's ANTHROPIC_API_KEY) is checked.
    keyed, _ = router("--client-api-keys", "team-key")
    ok = anthropic.Anthropic(base_url=keyed, api_key="team-key").messages.create(
        model="sim-model", max_tokens=2, messages=[{"role": "user", "content": "hi"}])
    assert ok.usage.output_tokens == 2
    with pytest.raises(anthropic.AuthenticationError) as refused:
        anthropic.Anthropic(base_url=keyed, api_key="wrong").messages.create(
            model="sim-model", max_tokens=2, messages=[{"role": "user", "content": "hi"}])
    # The router's own errors on /v1/messages come in the Anthropic shape, as vLLM's do there.
    body = refused.value.body
    assert body["type"] == "error" and body["error"]["type"] == "authentication_error", body


def test_invalid_flags_fail_fast_with_the_field_name(spawn):
    import subprocess
    out = subprocess.run(
        [binary("program-router"), "--program-scheduling-config-json", "{}"], capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 2
    assert "--enable-program-scheduling" in out.stderr
    out = subprocess.run(
        [binary("program-router"), "--enable-program-scheduling", "--program-scheduling-config-json",
         '{"low_watermark_ratio": 2}', "config", "print"], capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 2
    assert "program_scheduling.high_watermark_ratio" in out.stderr
    # A duration too large for the clocks is refused at start (it used to panic per request).
    out = subprocess.run(
        [binary("program-router"), "--worker-urls", "http://127.0.0.1:9", "--request-timeout-secs", "1e20",
         "config", "print"], capture_output=True, text=True, timeout=30,
    )
    assert out.returncode == 2
    assert "limits.request_timeout_secs: must be at most" in out.stderr, out.stderr
    # A vllm-router flag program-router does not take is refused with what to use instead.
    out = subprocess.run(
        [binary("program-router"), "--worker-urls", "http://127.0.0.1:9", "--rate-limit-tokens-per-second", "64"],
        capture_output=True, text=True, timeout=30,
    )
    assert out.returncode == 2
    assert "hint: --rate-limit-tokens-per-second is a vllm-router flag" in out.stderr, out.stderr
    assert "--max-concurrent-requests" in out.stderr
    # ... and so is one of its policies.
    out = subprocess.run(
        [binary("program-router"), "--worker-urls", "http://127.0.0.1:9", "--policy", "kv_aware"],
        capture_output=True, text=True, timeout=30,
    )
    assert out.returncode == 2
    assert "hint: kv_aware is a vllm-router policy" in out.stderr, out.stderr
    # ... while its concurrency limiter's flags are taken as they are.
    out = subprocess.run(
        [binary("program-router"), "--worker-urls", "http://127.0.0.1:9", "--max-concurrent-requests", "64",
         "--queue-size", "0", "--queue-timeout-secs", "5", "config", "print"],
        capture_output=True, text=True, timeout=30,
    )
    assert out.returncode == 0, out.stderr
    limits = json.loads(out.stdout)["limits"]
    assert (limits["max_concurrent_requests"], limits["queue_size"], limits["queue_timeout_secs"]) == (64, 0, 5.0)
    # calibrate measures one server; a config file it would ignore is refused, not skipped.
    out = subprocess.run(
        [binary("program-router"), "calibrate", "--worker-url", "http://127.0.0.1:9", "--config", "router.json"],
        capture_output=True, text=True, timeout=30,
    )
    assert out.returncode == 2
    assert "reads no --config" in out.stderr


def test_a_busy_port_is_named_and_help_shows_the_real_defaults():
    import socket
    import subprocess
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = subprocess.run(
            [binary("program-router"), "--host", "127.0.0.1", "--port", str(port),
             "--worker-urls", "http://127.0.0.1:9"], capture_output=True, text=True, timeout=30,
        )
    assert out.returncode == 1
    assert f"API listener on 127.0.0.1:{port}" in out.stderr, out.stderr
    out = subprocess.run([binary("program-router"), "--help"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0
    assert "[config: limits.request_timeout_secs; default: 1800]" in out.stdout, out.stdout
    assert "[config: health.interval_secs; default: 60]" in out.stdout


def keyed_router(spawn, backend: str, name: str) -> str:
    """program-router with --api-key k in front of `backend`; returns its /v1 base URL."""
    port = free_port()
    pr = spawn(
        [binary("program-router"), "--host", "127.0.0.1", "--port", str(port), "--prometheus-port", str(free_port()),
         "--worker-urls", backend, "--api-key", "k"],
        name,
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/readiness")
    except TimeoutError:
        pytest.fail(f"program-router did not become ready:\n{pr.output()}")
    return f"http://127.0.0.1:{port}/v1"


def test_api_key_is_required_from_clients_as_vllm_does(sim, spawn, monkeypatch):
    """A drop-in for vllm-router must not open a keyed vLLM to clients without the key."""
    backend = sim("--api-key", "k", "--time-scale", "20")
    url = keyed_router(spawn, backend, "program-router")
    ok = openai.OpenAI(base_url=url, api_key="k")
    assert ok.chat.completions.create(
        model="sim-model", messages=[{"role": "user", "content": "hi"}], max_tokens=1
    ).usage.completion_tokens == 1
    bad = openai.OpenAI(base_url=url, api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as e:
        bad.chat.completions.create(model="sim-model", messages=[{"role": "user", "content": "hi"}], max_tokens=1)
    assert e.value.code == "invalid_api_key"

    # Per-team keys from the environment variable the operator fills from a Secret (one per line).
    monkeypatch.setenv("PROGRAM_ROUTER_CLIENT_API_KEYS", "team-a\nteam-b\n")
    url = keyed_router(spawn, backend, "program-router-teams")
    team = openai.OpenAI(base_url=url, api_key="team-b", max_retries=0)
    assert team.models.list().data[0].id == "sim-model"
    worker_key = openai.OpenAI(base_url=url, api_key="k", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        worker_key.models.list()
    # An empty Secret must not open the router.
    import subprocess
    monkeypatch.setenv("PROGRAM_ROUTER_CLIENT_API_KEYS", "\n")
    out = subprocess.run([binary("program-router"), "--worker-urls", backend, "--api-key", "k", "config", "print"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 2, out.stdout
    assert "--client-api-keys" in out.stderr
