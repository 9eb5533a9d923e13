# Shared by the router benchmarks (sourced): free loopback ports, waiting for a URL, the wrk body
# (a 1-token chat completion) and stopping every process a script started.
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_up() { for _ in $(seq 1 100); do curl -fs "$1" >/dev/null 2>&1 && return 0; sleep 0.1; done; echo "not up: $1" >&2; exit 1; }

# The wrk script: POST a 1-token chat completion (removed by the caller's end of run).
chat_lua() {
  local lua
  lua=$(mktemp)
  cat > "$lua" <<'LUA'
wrk.method = "POST"
wrk.body = '{"model":"sim-model","messages":[{"role":"user","content":"hello"}],"max_tokens":1}'
wrk.headers["Content-Type"] = "application/json"
LUA
  echo "$lua"
}
