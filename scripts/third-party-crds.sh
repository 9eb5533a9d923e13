#!/usr/bin/env bash
# Prints the directory holding another project's own CRDs, for the chart e2e, which installs them
# so the chart's objects and examples are validated by the real schemas:
#   monitoring  prometheus-operator's (PodMonitor, ServiceMonitor, PrometheusRule, ...)
#   gateway     Gateway API's standard channel (Gateway, HTTPRoute, ...)
# They come from each project's pinned Go module through the Go module proxy (a few MB, kept in
# Go's module cache); nothing is committed.
set -euo pipefail
command -v go >/dev/null || { echo "third-party-crds: the Go toolchain is required" >&2; exit 1; }
case "${1:-}" in
  monitoring)
    module=github.com/prometheus-operator/prometheus-operator@v0.85.0
    sub=example/prometheus-operator-crd
    want="monitoring.coreos.com_podmonitors.yaml monitoring.coreos.com_servicemonitors.yaml monitoring.coreos.com_prometheusrules.yaml"
    ;;
  gateway)
    module=sigs.k8s.io/gateway-api@v1.6.3
    sub=config/crd/standard
    want="gateway.networking.k8s.io_httproutes.yaml gateway.networking.k8s.io_gateways.yaml"
    ;;
  *)
    echo "usage: $0 monitoring|gateway" >&2
    exit 2
    ;;
esac
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
# Outside any module, so the repository's go.mod files are not consulted.
dir=$(cd "$scratch" && GOFLAGS=-mod=mod go mod download -json "$module" |
  python3 -c 'import json, sys; print(json.load(sys.stdin)["Dir"])')
for f in $want; do
  [ -f "$dir/$sub/$f" ] || { echo "third-party-crds: $dir/$sub lacks $f" >&2; exit 1; }
done
echo "$dir/$sub"
