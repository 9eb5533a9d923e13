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
