#!/usr/bin/env bash
# Runs every fuzz target of router/fuzz for SECONDS each (default 60), then minimizes its corpus
# into router/fuzz/corpus/<target> (committed, small). A crash stops the run with the input in
# router/fuzz/artifacts/<target>/; turn it into a regression test before fixing it.
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]
#
# Needs the nightly toolchain (rustup toolchain install nightly); installs cargo-fuzz from
# crates.io into $PROGSCHED_TOOLS (default ~/.cache/progsched/tools) on first use.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-60}"; shift || true
tools="${PROGSCHED_TOOLS:-$HOME/.cache/progsched/tools}"
if [ ! -x "$tools/bin/cargo-fuzz" ]; then
  cargo +nightly install --locked --root "$tools" cargo-fuzz
fi
export PATH="$tools/bin:$PATH"
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(request identity metrics config usage peer_usage scheduler)
cd router
for t in "${targets[@]}"; do
  mkdir -p "fuzz/corpus/$t"
  echo "=== $t: ${seconds}s"
  cargo +nightly fuzz run "$t" "fuzz/corpus/$t" -- -max_total_time="$seconds" -max_len=2048 \
    -print_final_stats=1 2>&1 | grep -E "^(stat::number_of_executed_units|stat::new_units_added|SUMMARY|==[0-9]+==)|panicked" || true
  if [ -d "fuzz/artifacts/$t" ] && [ -n "$(ls -A "fuzz/artifacts/$t" 2>/dev/null)" ]; then
    echo "crash in $t: fuzz/artifacts/$t" >&2
    exit 1
  fi
  cargo +nightly fuzz cmin "$t" "fuzz/corpus/$t" >/dev/null 2>&1
  echo "corpus: $(ls "fuzz/corpus/$t" | wc -l) inputs"
done
