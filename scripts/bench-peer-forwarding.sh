#!/usr/bin/env bash
# What a hop between router replicas costs (`peers`): two program-router replicas with Program
# scheduling over one instant vllm-sim, wrk sending Program requests (1,000 Program ids, 1-token
# answers) to replica A. Runs, interleaved: A alone (no peers: every Program is scheduled where it
# lands) and A with B as its peer (about half the Programs are B's, forwarded A -> B). Prints
# requests/s and latency per run, at CONNS connections (default 64) and at 1.
#   DURATION=5s scripts/bench-peer-forwarding.sh
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-5s}
CONNS=${CONNS:-64}
ROUNDS=${ROUNDS:-3}
target="${CARGO_TARGET_DIR:-target}"
command -v wrk >/dev/null || { echo "wrk is required (apt-get install wrk)" >&2; exit 1; }
cargo build --release --locked -q -p vllm-sim -p program-router

. scripts/bench-lib.sh
tmp=$(mktemp -d)
lua=$(program_lua '"bench-" .. (n % 1000)')

start_instant_sim

a_port=$(free_port); b_port=$(free_port); a_prom=$(free_port); b_prom=$(free_port)
a_peer=$(free_port); b_peer=$(free_port)
# The replicas reach each other on their peer listeners, with a shared secret.
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$tmp/peer-secret"
config() { # peers-json
  cat <<JSON
{"workers":[{"url":"http://127.0.0.1:$sim_port"}],"program_scheduling":{},"log_level":"warn",
 "peers":$1}
JSON
}
members='[{"name":"a","url":"http://127.0.0.1:'$a_peer'"},{"name":"b","url":"http://127.0.0.1:'$b_peer'"}]'
config "{\"members\":$members}" > "$tmp/b.json"
config "null" > "$tmp/a.json"
start() { # name port config metrics-port peer-port
  "$target/release/program-router" --config "$3" --port "$2" --prometheus-port "$4" \
    --peer-name "$1" --peer-port "$5" --peer-secret-file "$tmp/peer-secret" >/dev/null 2>&1 & pids+=($!)
  wait_up "http://127.0.0.1:$2/readiness"
}
start a "$a_port" "$tmp/a.json" "$a_prom" "$a_peer"
start b "$b_port" "$tmp/b.json" "$b_prom" "$b_peer"

# Switches A's peers by rewriting its config file (hot reload) and waits until /status shows it.
set_peers() { # on|off
  if [ "$1" = on ]; then config "{\"members\":$members}"; else config null; fi > "$tmp/a.next"
  mv "$tmp/a.next" "$tmp/a.json"
  for _ in $(seq 1 50); do
    local p
    p=$(curl -fs "http://127.0.0.1:$a_port/status" | python3 -c 'import json,sys; print(json.load(sys.stdin)["peers"] is not None)')
    { [ "$1" = on ] && [ "$p" = True ]; } || { [ "$1" = off ] && [ "$p" = False ]; } && return 0
    sleep 0.1
  done
  echo "config switch to $1 did not apply" >&2; exit 1
}

run() { # label conns
  wrk_line "$1" "$2" "http://127.0.0.1:$a_port/v1/chat/completions"
}

for round in $(seq 1 "$ROUNDS"); do
  for conns in "$CONNS" 1; do
    set_peers off; run "A alone      (round $round)" "$conns"
    set_peers on;  run "A with peer B (round $round)" "$conns"
  done
done
count() { curl -fs "http://127.0.0.1:$1/metrics" | awk -v o="$2" '$1 == "program_router_peer_forwards_total{outcome=\""o"\"}" {print $2}'; }
f=$(count "$a_prom" forwarded); r=$(count "$b_prom" received); u=$(count "$a_prom" unreachable)
echo "A forwarded ${f:-0} requests (B received ${r:-0}: those wrk cut at the end of a run count only there); unreachable ${u:-0}"
rm -rf "$tmp" "$lua"
