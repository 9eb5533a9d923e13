#!/usr/bin/env bash
# Interleaved A/B of two program-router binaries behind one vllm-sim (--instant): a warm-up, then
# six rounds of 5 s each with wrk (c=64, 1-token chat completions; STREAM_TOKENS=N: streams of N
# tokens), the order alternating, so a slow minute on this noisy machine hits both. Prints one
# line per run: binary, req/s, router CPU microseconds per request; then the medians. Loopback
# only; everything started here is stopped.
#
#   scripts/ab-router.sh OLD_BINARY NEW_BINARY
# (build the old one from a worktree into another CARGO_TARGET_DIR, e.g. `git worktree add
# /tmp/old REV && cd /tmp/old && CARGO_TARGET_DIR=/tmp/old-target cargo build --release -p
# program-router`). Both run at `--log-level warn` (no access lines) unless LOG_LEVEL_A /
# LOG_LEVEL_B say otherwise (e.g. the same binary twice, `LOG_LEVEL_B=info`: what the access log
# and the request span cost); LOG_FORMAT (text) is both routers' `--log-format`.
set -euo pipefail
[ $# = 2 ] || { echo "usage: $0 OLD_BINARY NEW_BINARY" >&2; exit 2; }
old_bin=$(realpath "$1"); new_bin=$(realpath "$2")
cd "$(dirname "$0")/.."
command -v wrk >/dev/null || { echo "wrk is required (apt-get install wrk)" >&2; exit 1; }
target="${CARGO_TARGET_DIR:-target}"
cargo build --release --locked -q -p vllm-sim
declare -A bin=([A]=$old_bin [B]=$new_bin) level=([A]=${LOG_LEVEL_A:-warn} [B]=${LOG_LEVEL_B:-warn}) port pid
. scripts/bench-lib.sh
lua=$(chat_lua)
start_instant_sim
for n in A B; do
  p=$(free_port); q=$(free_port)
  "${bin[$n]}" --port "$p" --prometheus-port "$q" --worker-urls "http://127.0.0.1:$sim_port" \
    --policy round_robin --log-level "${level[$n]}" --log-format "${LOG_FORMAT:-text}" >/dev/null 2>&1 & pid[$n]=$!; pids+=($!)
  port[$n]=$p
  wait_up "http://127.0.0.1:$p/readiness"
  wrk -t1 -c64 -d2s -s "$lua" "http://127.0.0.1:$p/v1/chat/completions" >/dev/null
done
results=$(for r in 1 2 3 4 5 6; do
  order="A B"; [ $((r % 2)) = 0 ] && order="B A"
  for n in $order; do
    c0=$(awk '{print $14+$15}' "/proc/${pid[$n]}/stat")
    out=$(wrk -t1 -c64 -d5s -s "$lua" "http://127.0.0.1:${port[$n]}/v1/chat/completions")
    c1=$(awk '{print $14+$15}' "/proc/${pid[$n]}/stat")
    echo "$out" | grep -qE "Non-2xx|Socket errors" && { echo "$n: errors during the run" >&2; echo "$out" >&2; exit 1; }
    rps=$(echo "$out" | awk '/Requests\/sec/ {print $2}')
    reqs=$(echo "$out" | awk '/requests in/ {print $1}')
    printf '%s %s %s\n' "$n" "$rps" "$(awk -v t=$((c1 - c0)) -v n="$reqs" -v hz="$(getconf CLK_TCK)" 'BEGIN {printf "%.1f", t / hz * 1e6 / n}')"
  done
done)
echo "$results"
median() { sort -g | awk '{v[NR]=$1} END {printf "%.1f", (v[3]+v[4])/2}'; }
for n in A B; do
  rps=$(echo "$results" | awk -v n="$n" '$1==n {print $2}' | median)
  cpu=$(echo "$results" | awk -v n="$n" '$1==n {print $3}' | median)
  echo "$n (${bin[$n]}, ${level[$n]}): median $rps req/s, $cpu us CPU per request"
done
rm -f "$lua"
