#!/usr/bin/env bash
# What asking the other replicas for an unknown Program costs (`peers`, hand-over): two
# program-router replicas A and B with Program scheduling over one instant vllm-sim, wrk sending
# to A requests that each start a NEW Program (1-token answers) — the worst case, since only a
# Program a replica does not know is asked about. Runs, interleaved, on fresh replicas:
#   asking:   paused_retention_ttl_seconds 1800, so the window after start is open and every
#             request first asks the other replica (POST /peers/hand-over);
#   silent:   paused_retention_ttl_seconds 0.05, so the window closed before the run.
# Both pairs forward about half the Programs to B alike. Prints requests/s and latency per run.
#   DURATION=5s ROUNDS=2 scripts/bench-handover.sh
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-5s}
CONNS=${CONNS:-64}
ROUNDS=${ROUNDS:-2}
target="${CARGO_TARGET_DIR:-target}"
command -v wrk >/dev/null || { echo "wrk is required (apt-get install wrk)" >&2; exit 1; }
cargo build --release --locked -q -p vllm-sim -p program-router

. scripts/bench-lib.sh
tmp=$(mktemp -d)
lua=$(program_lua '"new-" .. run .. "-" .. n')

start_instant_sim

# Starts a fresh pair with this retention (A listens on $a_port); `stop_pair` stops it.
pair_pids=()
a_port=
start_pair() { # retention-seconds
  local b_port a_peer b_peer members
  a_port=$(free_port); b_port=$(free_port); a_peer=$(free_port); b_peer=$(free_port)
  # The replicas reach each other on their peer listeners, with a shared secret.
  head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$tmp/peer-secret"
  members='[{"name":"a","url":"http://127.0.0.1:'$a_peer'"},{"name":"b","url":"http://127.0.0.1:'$b_peer'"}]'
  cat > "$tmp/cfg.json" <<JSON
{"workers":[{"url":"http://127.0.0.1:$sim_port"}],"log_level":"warn",
 "program_scheduling":{"paused_retention_ttl_seconds":$1},"peers":{"members":$members}}
JSON
  local name port peer
  for name in a b; do
    port=$a_port; peer=$a_peer; [ "$name" = b ] && port=$b_port && peer=$b_peer
    "$target/release/program-router" --config "$tmp/cfg.json" --port "$port" \
      --prometheus-port "$(free_port)" --peer-name "$name" --peer-port "$peer" \
      --peer-secret-file "$tmp/peer-secret" >/dev/null 2>&1 & pair_pids+=($!)
    wait_up "http://127.0.0.1:$port/readiness"
  done
  sleep 0.5
}
stop_pair() {
  [ ${#pair_pids[@]} -gt 0 ] || return 0
  kill "${pair_pids[@]}" 2>/dev/null || true; wait "${pair_pids[@]}" 2>/dev/null || true; pair_pids=()
}
trap 'stop_pair; cleanup' EXIT

run() { # label conns retention
  start_pair "$3"
  wrk_line "$1" "$2" "http://127.0.0.1:$a_port/v1/chat/completions"
  stop_pair
}

for round in $(seq 1 "$ROUNDS"); do
  for conns in "$CONNS" 1; do
    run "silent (round $round)" "$conns" 0.05
    run "asking (round $round)" "$conns" 1800
  done
done
rm -rf "$tmp" "$lua"
