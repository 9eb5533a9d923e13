# Shared by the router benchmarks (sourced): free loopback ports, waiting for a URL, an instant
# simulator, the wrk bodies (1-token chat completions, or streamed ones), one wrk run as one
# line, and stopping every process a script started.
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_up() { for _ in $(seq 1 100); do curl -fs "$1" >/dev/null 2>&1 && return 0; sleep 0.1; done; echo "not up: $1" >&2; exit 1; }

# Starts vllm-sim from "$target/release" with --instant (steps take no time) on a free port,
# sets $sim_port and waits for its /health; it stops with the script.
start_instant_sim() {
  sim_port=$(free_port)
  "$target/release/vllm-sim" --port "$sim_port" --instant --log-level warn >/dev/null 2>&1 & pids+=($!)
  wait_up "http://127.0.0.1:$sim_port/health"
}

# One wrk run (one thread, $DURATION, the script $lua) printed as one line: label, connections,
# requests/s, p50, p99. A run with errors stops the script with wrk's output.
wrk_line() { # label conns url
  local out
  out=$(wrk -t1 -c"$2" -d"$DURATION" --latency -s "$lua" "$3")
  echo "$out" | grep -qE "Non-2xx|Socket errors" && { echo "$1: errors during the run:" >&2; echo "$out" >&2; exit 1; }
  printf '%s\tc=%s\t%s req/s\tp50 %s\tp99 %s\n' "$1" "$2" \
    "$(echo "$out" | awk '/Requests\/sec/ {print $2}')" \
    "$(echo "$out" | awk '$1=="50%" {print $2}')" "$(echo "$out" | awk '$1=="99%" {print $2}')"
}

# The wrk script: POST a 1-token chat completion or, with STREAM_TOKENS=N, a streamed one of N
# tokens with its usage chunk (removed by the caller's end of run).
chat_lua() {
  local lua body='{"model":"sim-model","messages":[{"role":"user","content":"hello"}],"max_tokens":1}'
  [[ "${STREAM_TOKENS:-0}" =~ ^[0-9]+$ ]] || { echo "STREAM_TOKENS must be a number of tokens, not '$STREAM_TOKENS'" >&2; return 1; }
  lua=$(mktemp)
  if [ "${STREAM_TOKENS:-0}" -gt 0 ]; then
    body='{"model":"sim-model","messages":[{"role":"user","content":"hello"}],"max_tokens":'"$STREAM_TOKENS"',"stream":true,"stream_options":{"include_usage":true}}'
  fi
  cat > "$lua" <<LUA
wrk.method = "POST"
wrk.body = '$body'
wrk.headers["Content-Type"] = "application/json"
LUA
  echo "$lua"
}

# The wrk script for Program requests: a 1-token chat completion whose agentic_context names the
# Program id given as a Lua expression over the request count `n` and a per-run tag `run`
# (removed by the caller's end of run).
program_lua() { # lua-id-expression
  local lua
  lua=$(mktemp)
  cat > "$lua" <<LUA
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local n = 0
local run = tostring(os.time()) .. "-" .. tostring(math.random(1000000))
request = function()
  n = n + 1
  local body = '{"model":"sim-model","messages":[{"role":"user","content":"hello"}],"max_tokens":1,' ..
    '"vllm_xargs":{"agentic_context":{"program_id":"' .. ($1) .. '"}}}'
  return wrk.format(nil, nil, nil, body)
end
LUA
  echo "$lua"
}
