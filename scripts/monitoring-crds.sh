#!/usr/bin/env bash
# Prints the directory holding prometheus-operator's own CRDs (PodMonitor, ServiceMonitor,
# PrometheusRule, ...) for the chart e2e, which installs them so the chart's monitoring objects
# are validated by the real schemas. They come from the pinned prometheus-operator Go module
# through the Go module proxy (about 4 MB, kept in Go's module cache); nothing is committed.
set -euo pipefail
command -v go >/dev/null || { echo "monitoring-crds: the Go toolchain is required" >&2; exit 1; }
version=v0.85.0
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
# Outside any module, so the repository's go.mod files are not consulted.
dir=$(cd "$scratch" && GOFLAGS=-mod=mod go mod download -json "github.com/prometheus-operator/prometheus-operator@$version" |
  python3 -c 'import json, sys; print(json.load(sys.stdin)["Dir"])')
crds="$dir/example/prometheus-operator-crd"
for kind in podmonitors servicemonitors prometheusrules; do
  [ -f "$crds/monitoring.coreos.com_$kind.yaml" ] || { echo "monitoring-crds: $crds lacks $kind" >&2; exit 1; }
done
echo "$crds"
