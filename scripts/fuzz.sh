#!/usr/bin/env bash
# Runs every fuzz target of router/fuzz for SECONDS each (default 60) — or until FUZZ_RUNS
# executions when that comes first — then minimizes its corpus into router/fuzz/corpus/<target>
# (committed, small). A crash stops the run with the input in router/fuzz/artifacts/<target>/;
# turn it into a regression test before fixing it. One line per target (executions, seconds,
# corpus size) is printed and appended to $FUZZ_REPORT when set.
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]
#   FUZZ_RUNS=10000000 scripts/fuzz.sh 3600      # each target: 10 M executions or an hour
#
# Needs the nightly toolchain (rustup toolchain install nightly); installs cargo-fuzz from
# crates.io into $PROGSCHED_TOOLS (default ~/.cache/progsched/tools) on first use. Builds
# without a sanitizer (the code is safe Rust; a sanitizer halves the executions) and with debug
# assertions, so an arithmetic overflow is a crash.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-60}"; shift || true
tools="${PROGSCHED_TOOLS:-$HOME/.cache/progsched/tools}"
target_dir="${FUZZ_TARGET_DIR:-$HOME/.cache/progsched/fuzz-target}"
if [ ! -x "$tools/bin/cargo-fuzz" ]; then
  cargo +nightly install --locked --root "$tools" cargo-fuzz
fi
export PATH="$tools/bin:$PATH"
all=(request identity metrics config cli usage peer_usage peers scheduler render)
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=("${all[@]}")
opts=(--sanitizer none --debug-assertions --target-dir "$target_dir")
cd router
for t in "${targets[@]}"; do
  mkdir -p "fuzz/corpus/$t"
  case "$t" in scheduler|peers|cli) max_len=2048 ;; *) max_len=8192 ;; esac
  echo "=== $t: ${seconds}s${FUZZ_RUNS:+ or $FUZZ_RUNS executions}"
  cargo +nightly fuzz build "${opts[@]}" "$t" >/dev/null
  start=$(date +%s)
  log=$(mktemp)
  cargo +nightly fuzz run "${opts[@]}" "$t" "fuzz/corpus/$t" -- \
    -max_total_time="$seconds" -runs="${FUZZ_RUNS:--1}" -max_len="$max_len" \
    -print_final_stats=1 >"$log" 2>&1 || true
  took=$(( $(date +%s) - start ))
  grep -E "^(SUMMARY|==[0-9]+==)|panicked" "$log" || true
  execs=$(grep -E "^stat::number_of_executed_units" "$log" | awk '{print $2}' || true)
  rm -f "$log"
  if [ -d "fuzz/artifacts/$t" ] && [ -n "$(ls -A "fuzz/artifacts/$t" 2>/dev/null)" ]; then
    echo "crash in $t: fuzz/artifacts/$t" >&2
    exit 1
  fi
  cargo +nightly fuzz cmin "${opts[@]}" "$t" "fuzz/corpus/$t" -- -max_len="$max_len" >/dev/null 2>&1
  line="$t executions=${execs:-?} seconds=$took corpus=$(ls "fuzz/corpus/$t" | wc -l) crashes=0"
  echo "$line"
  [ -z "${FUZZ_REPORT:-}" ] || echo "$(date -u +%FT%TZ) $line" >> "$FUZZ_REPORT"
done
