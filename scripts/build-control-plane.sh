#!/usr/bin/env bash
# Builds tests/control-plane (etcd + kube-apiserver + kube-controller-manager in one Go binary)
# into $PROGSCHED_BIN (default: $HOME/.cache/progsched/bin) and prints the binary's path.
# Go's module and build caches make rebuilds quick; a stamp over the module's sources skips the
# build entirely when nothing changed. A cold build takes several minutes on two cores.
set -euo pipefail
self="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
cd "$(dirname "$0")/../tests/control-plane"

command -v go >/dev/null || { echo "build-control-plane: the Go toolchain is required (go.mod: $(grep '^go ' go.mod))" >&2; exit 1; }
bin_dir="${PROGSCHED_BIN:-$HOME/.cache/progsched/bin}"
mkdir -p "$bin_dir"
out="$bin_dir/control-plane"
want=$( (go version; cat go.mod go.sum ./*.go "$self") | sha256sum | cut -d' ' -f1)
if [ -x "$out" ] && [ "$(cat "$out.sha256" 2>/dev/null)" = "$want" ]; then
  echo "$out"
  exit 0
fi
echo "build-control-plane: building $out (cold builds take minutes)" >&2
started=$(date +%s)
# Stamp the Kubernetes version the module pins, as release builds do (clients such as helm check
# the server version; an unstamped build reports v0.0.0-master).
k8s=$(go list -m -f '{{.Version}}' k8s.io/kubernetes)
minor=$(echo "$k8s" | cut -d. -f2)
pkg=k8s.io/component-base/version
go build -ldflags "-X $pkg.gitVersion=$k8s -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean" -o "$out.tmp" . &
build=$!
# A cold build is long and go build is silent: say every half minute that it is still going.
while kill -0 "$build" 2>/dev/null; do
  for _ in 1 2 3 4 5 6; do
    sleep 5
    kill -0 "$build" 2>/dev/null || break 2
  done
  echo "build-control-plane: still building ($(( $(date +%s) - started )) s)" >&2
done
wait "$build"
mv "$out.tmp" "$out"
echo "$want" > "$out.sha256"
echo "build-control-plane: built in $(( $(date +%s) - started )) s" >&2
echo "$out"
