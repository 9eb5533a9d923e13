"""Shared fixtures: start project binaries and the peer on free loopback ports, stop them after."""

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def binary(name: str) -> str:
    """The most recently built of the release and debug binaries: test-all.sh builds debug just
    before these tests, and an older release build left in a shared target directory must not
    stand in for the code under test."""
    target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    built = [p for p in (target / "release" / name, target / "debug" / name) if p.exists()]
    if not built:
        pytest.fail(f"{name} is not built under {target}; run `cargo build -p {name}` first")
    return str(max(built, key=lambda p: p.stat().st_mtime))


def wait_http(url: str, timeout: float = 20.0, headers=None) -> None:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            r = httpx.get(url, timeout=1.0, headers=headers)
            if r.status_code == 200:
                return
            last = f"HTTP {r.status_code}"
        except httpx.HTTPError as e:
            last = repr(e)
        time.sleep(0.1)
    raise TimeoutError(f"{url} did not become ready: {last}")


class Proc:
    """A child process on loopback whose output is kept for failure messages."""

    def __init__(self, args, name):
        self.name = name
        self.log = open(f"/tmp/pytest-{name}-{os.getpid()}.log", "w+")
        self.p = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT)

    def output(self) -> str:
        self.log.flush()
        self.log.seek(0)
        return self.log.read()[-4000:]

    def stop(self):
        if self.p.poll() is None:
            self.p.terminate()
            try:
                self.p.wait(10)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        self.log.close()


@pytest.fixture
def spawn():
    procs = []

    def start(args, name):
        pr = Proc(args, name)
        procs.append(pr)
        return pr

    yield start
    for pr in procs:
        pr.stop()


@pytest.fixture
def sim(spawn):
    """Starts vllm-sim with extra flags; returns its base URL."""

    def start(*flags):
        port = free_port()
        pr = spawn([binary("vllm-sim"), "--host", "127.0.0.1", "--port", str(port), *flags], "vllm-sim")
        try:
            wait_http(f"http://127.0.0.1:{port}/health")
        except TimeoutError:
            pytest.fail(f"vllm-sim did not start:\n{pr.output()}")
        return f"http://127.0.0.1:{port}"

    return start


def vllm_router_bin() -> str | None:
    return shutil.which("vllm-router")
