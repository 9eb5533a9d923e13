#!/usr/bin/env bash
# Builds the pinned Helm from Go modules into $PROGSCHED_BIN (default: $HOME/.cache/progsched/bin)
# and prints its path; skipped when that version is already there.
set -euo pipefail
version=v3.22.0
command -v go >/dev/null || { echo "build-helm: the Go toolchain is required" >&2; exit 1; }
bin_dir="${PROGSCHED_BIN:-$HOME/.cache/progsched/bin}"
mkdir -p "$bin_dir"
if [ -x "$bin_dir/helm" ] && "$bin_dir/helm" version --template '{{.Version}}' 2>/dev/null | grep -qx "$version"; then
  echo "$bin_dir/helm"
  exit 0
fi
echo "build-helm: building helm $version (a cold build takes minutes)" >&2
started=$(date +%s)
# Stamp the version into the binary as Helm's own release builds do.
GOBIN="$bin_dir" go install -ldflags "-X helm.sh/helm/v3/internal/version.version=$version" "helm.sh/helm/v3/cmd/helm@$version"
echo "build-helm: built in $(( $(date +%s) - started )) s" >&2
echo "$bin_dir/helm"
