#!/usr/bin/env bash
# Router overhead, side by side in one run: wrk (c=64, 1-token chat completions, or streams of
# STREAM_TOKENS tokens) against
#   1. vllm-sim directly (--instant: steps take no time),
#   2. program-router in front of it (default: one I/O thread per core; also with one I/O
#      thread, and on the shared work-stealing runtime),
#   3. vllm-router 0.1.17 (PyPI) in front of it,
#   4. nginx in front of it (reverse proxy with upstream keep-alive, one worker per core, no
#      access log, as the routers run at --log-level warn): the physical anchor of a proxy on
#      this machine,
#   5. the hyper bound (router/examples/bare_proxy.rs): the router's HTTP stack and threading
#      with nothing of the router in it, served as the router serves (hyper-util's auto builder,
#      per-request header timer: `hyper-bound`) and with hyper's plain HTTP/1 server
#      (`hyper-bound-h1`). What program-router costs above the first is the router; what it
#      costs above nginx is the stack. `hyper-bound-json` adds the router's own JSON parsers
#      (the request's peek and the response's usage).
# Prints req/s, p50/p99 latency, ratios and the proxies' peak RSS. Loopback only; every process
# started here is stopped at the end.
#
# Every path runs ROUNDS times, the paths interleaved, and each figure is the median over the
# rounds: a stall of the (shared, virtual) machine lands in one round of one path instead of
# deciding a ratio.
#
# Env: DURATION (per path and round, default 4s), ROUNDS (3), CONNS (64), PROGSCHED_VENV (venv
# with vllm-router), CARGO_TARGET_DIR,
# PIN=1 (wrk and the simulator on CPU 0, every router on CPU 1: the router under test gets a core
# of its own instead of sharing two with the load generator and the backend; needs taskset),
# POLICY (round_robin; the same request-level policy for both routers, e.g. cache_aware, the
# default of both), STREAM_TOKENS (0: one-token completions; N: streamed completions of N tokens
# with their usage chunk, what each proxy costs per relayed event).
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-4s}
ROUNDS=${ROUNDS:-3}
CONNS=${CONNS:-64}
POLICY=${POLICY:-round_robin}
venv="${PROGSCHED_VENV:-$HOME/.cache/progsched/venv}"
target="${CARGO_TARGET_DIR:-target}"
command -v wrk >/dev/null || { echo "wrk is required (apt-get install wrk)" >&2; exit 1; }
load=() router=()
if [ "${PIN:-0}" = 1 ]; then
  command -v taskset >/dev/null || { echo "PIN=1 needs taskset (util-linux)" >&2; exit 1; }
  load=(taskset -c 0) router=(taskset -c 1)
fi
[ -x "$venv/bin/vllm-router" ] || { echo "vllm-router not found in $venv (pip install vllm-router==0.1.17)" >&2; exit 1; }
command -v nginx >/dev/null || { echo "nginx is required for the anchor row (apt-get install nginx-light)" >&2; exit 1; }
cargo build --release --locked -q -p vllm-sim -p program-router
cargo build --release --locked -q -p program-router --example bare_proxy

. scripts/bench-lib.sh
lua=$(chat_lua)

sim_port=$(free_port)
"${load[@]}" "$target/release/vllm-sim" --port "$sim_port" --instant --log-level warn >/dev/null 2>&1 & pids+=($!)
wait_up "http://127.0.0.1:$sim_port/health"

pr_port=$(free_port); pr_prom=$(free_port)
"${router[@]}" "$target/release/program-router" --port "$pr_port" --prometheus-port "$pr_prom" \
  --worker-urls "http://127.0.0.1:$sim_port" --policy "$POLICY" --log-level warn >/dev/null 2>&1 & pr_pid=$!; pids+=($pr_pid)
wait_up "http://127.0.0.1:$pr_port/readiness"

# The same router with one I/O thread (`--io-threads 1`): on a machine this small the default
# (one per core) competes with wrk and the simulator for the same two cores.
p1_port=$(free_port); p1_prom=$(free_port)
"${router[@]}" "$target/release/program-router" --port "$p1_port" --prometheus-port "$p1_prom" --io-threads 1 \
  --worker-urls "http://127.0.0.1:$sim_port" --policy "$POLICY" --log-level warn >/dev/null 2>&1 & p1_pid=$!; pids+=($p1_pid)
wait_up "http://127.0.0.1:$p1_port/readiness"

# And on the shared work-stealing runtime (`--io-threads 0`, the default before I/O threads).
p0_port=$(free_port); p0_prom=$(free_port)
"${router[@]}" "$target/release/program-router" --port "$p0_port" --prometheus-port "$p0_prom" --io-threads 0 \
  --worker-urls "http://127.0.0.1:$sim_port" --policy "$POLICY" --log-level warn >/dev/null 2>&1 & p0_pid=$!; pids+=($p0_pid)
wait_up "http://127.0.0.1:$p0_port/readiness"

vr_port=$(free_port); vr_prom=$(free_port)
"${router[@]}" "$venv/bin/vllm-router" --host 127.0.0.1 --port "$vr_port" --worker-urls "http://127.0.0.1:$sim_port" \
  --policy "$POLICY" --prometheus-host 127.0.0.1 --prometheus-port "$vr_prom" --log-level warning >/dev/null 2>&1 & vr_pid=$!; pids+=($vr_pid)
wait_up "http://127.0.0.1:$vr_port/health"

hb_port=$(free_port)
"${router[@]}" "$target/release/examples/bare_proxy" "127.0.0.1:$hb_port" "127.0.0.1:$sim_port" --auto --header-timeout >/dev/null 2>&1 & hb_pid=$!; pids+=($hb_pid)
wait_up "http://127.0.0.1:$hb_port/health"
hj_port=$(free_port)
"${router[@]}" "$target/release/examples/bare_proxy" "127.0.0.1:$hj_port" "127.0.0.1:$sim_port" --auto --header-timeout --json >/dev/null 2>&1 & hj_pid=$!; pids+=($hj_pid)
wait_up "http://127.0.0.1:$hj_port/health"
h1_port=$(free_port)
"${router[@]}" "$target/release/examples/bare_proxy" "127.0.0.1:$h1_port" "127.0.0.1:$sim_port" >/dev/null 2>&1 & h1_pid=$!; pids+=($h1_pid)
wait_up "http://127.0.0.1:$h1_port/health"

# nginx: a master and one worker per core, in a scratch prefix.
ng_port=$(free_port); ng_dir=$(mktemp -d)
cat > "$ng_dir/nginx.conf" <<NGINX
worker_processes auto;
daemon off;
pid $ng_dir/nginx.pid;
error_log stderr warn;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $ng_dir/body;
  proxy_temp_path $ng_dir/proxy;
  fastcgi_temp_path $ng_dir/fastcgi;
  uwsgi_temp_path $ng_dir/uwsgi;
  scgi_temp_path $ng_dir/scgi;
  upstream sim { server 127.0.0.1:$sim_port; keepalive 256; }
  server {
    listen 127.0.0.1:$ng_port;
    location / {
      proxy_pass http://sim;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
    }
  }
}
NGINX
"${router[@]}" nginx -p "$ng_dir" -c "$ng_dir/nginx.conf" -e stderr >/dev/null 2>&1 & ng_pid=$!; pids+=($ng_pid)
wait_up "http://127.0.0.1:$ng_port/health"
ng_pids="$ng_pid $(pgrep -P "$ng_pid" | tr '\n' ' ')"

cpu_ticks() { local t=0 p; for p in $1; do t=$((t + $(awk '{print $14+$15}' "/proc/$p/stat"))); done; echo "$t"; }
peak_rss() { local k=0 p; for p in $1; do k=$((k + $(awk '/VmHWM/ {print $2}' "/proc/$p/status"))); done; awk -v k="$k" 'BEGIN {printf "%.0f MiB", k/1024}'; }

run() { # name url "pid..." (the proxy's processes)
  local out rps p50 p99 rss n c0 c1 cpu
  [ -n "$3" ] && c0=$(cpu_ticks "$3")
  out=$("${load[@]}" wrk -t1 -c"$CONNS" -d"$DURATION" --latency -s "$lua" "$2/v1/chat/completions")
  echo "$out" | grep -qE "Non-2xx|Socket errors" && { echo "$1: errors during the run:" >&2; echo "$out" >&2; exit 1; }
  rps=$(echo "$out" | awk '/Requests\/sec/ {print $2}')
  p50=$(echo "$out" | awk '$1=="50%" {print $2}')
  p99=$(echo "$out" | awk '$1=="99%" {print $2}')
  rss="-"; cpu="-"
  n=$(echo "$out" | awk '/requests in/ {print $1}')
  if [ -n "$3" ]; then
    rss=$(peak_rss "$3")
    c1=$(cpu_ticks "$3")
    cpu=$(awk -v t=$((c1 - c0)) -v n="$n" -v hz="$(getconf CLK_TCK)" 'BEGIN {printf "%.1f", t / hz * 1e6 / n}')
  fi
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$1" "$rps" "$(to_ms "$p50")" "$(to_ms "$p99")" "$cpu" "$rss"
}

to_ms() { awk -v v="$1" 'BEGIN { if (v ~ /us$/) { sub(/us$/,"",v); print v/1000 } else if (v ~ /ms$/) { sub(/ms$/,"",v); print v } else { sub(/s$/,"",v); print v*1000 } }'; }

# Warm up each path, then measure.
for u in "http://127.0.0.1:$sim_port" "http://127.0.0.1:$pr_port" "http://127.0.0.1:$p1_port" "http://127.0.0.1:$p0_port" "http://127.0.0.1:$vr_port" "http://127.0.0.1:$ng_port" "http://127.0.0.1:$hb_port" "http://127.0.0.1:$hj_port" "http://127.0.0.1:$h1_port"; do
  "${load[@]}" wrk -t1 -c"$CONNS" -d2s -s "$lua" "$u/v1/chat/completions" >/dev/null
done
rounds=""
for r in $(seq 1 "$ROUNDS"); do
  rounds+=$( { run direct "http://127.0.0.1:$sim_port" ""; run program-router "http://127.0.0.1:$pr_port" "$pr_pid"; run program-router-1-thread "http://127.0.0.1:$p1_port" "$p1_pid"; run program-router-shared-rt "http://127.0.0.1:$p0_port" "$p0_pid"; run vllm-router "http://127.0.0.1:$vr_port" "$vr_pid"; run nginx "http://127.0.0.1:$ng_port" "$ng_pids"; run hyper-bound "http://127.0.0.1:$hb_port" "$hb_pid"; run hyper-bound-json "http://127.0.0.1:$hj_port" "$hj_pid"; run hyper-bound-h1 "http://127.0.0.1:$h1_port" "$h1_pid"; } | sed "s/^/$r\t/")$'\n'
done
# Per path, the median of each column over the rounds (peak RSS: the last round's).
results=$(echo "$rounds" | awk -F'\t' 'NF > 1 {
    if (!($2 in seen)) { seen[$2] = 1; order[++n] = $2 }
    for (c = 3; c <= 6; c++) v[$2, c] = v[$2, c] " " $c; rss[$2] = $7; k[$2]++ }
  function median(list,   a, m, i, j, t) {
    m = split(list, a, " "); if (a[1] == "-") return "-"
    for (i = 2; i <= m; i++) for (j = i; j > 1 && a[j - 1] + 0 > a[j] + 0; j--) { t = a[j]; a[j] = a[j - 1]; a[j - 1] = t }
    return (m % 2) ? a[(m + 1) / 2] : (a[m / 2] + a[m / 2 + 1]) / 2 }
  END { for (i = 1; i <= n; i++) { p = order[i]
    printf "%s\t%.0f\t%.2f\t%.2f\t%s\t%s\n", p, median(v[p, 3]), median(v[p, 4]), median(v[p, 5]), median(v[p, 6]), rss[p] } }')
echo "both routers --policy $POLICY; PIN=${PIN:-0}; STREAM_TOKENS=${STREAM_TOKENS:-0}; wrk -c$CONNS for $DURATION per path, $ROUNDS rounds interleaved, medians"
printf 'path\treq/s\tp50 ms\tp99 ms\trouter CPU us/req\tpeak RSS\n%s\n' "$results" | column -t -s $'\t'
d=$(echo "$results" | awk -F'\t' '$1=="direct" {print $2}')
p=$(echo "$results" | awk -F'\t' '$1=="program-router" {print $2}')
v=$(echo "$results" | awk -F'\t' '$1=="vllm-router" {print $2}')
pp99=$(echo "$results" | awk -F'\t' '$1=="program-router" {print $4}')
vp99=$(echo "$results" | awk -F'\t' '$1=="vllm-router" {print $4}')
pc=$(echo "$results" | awk -F'\t' '$1=="program-router" {print $5}')
vc=$(echo "$results" | awk -F'\t' '$1=="vllm-router" {print $5}')
p1=$(echo "$results" | awk -F'\t' '$1=="program-router-1-thread" {print $2}')
p1p99=$(echo "$results" | awk -F'\t' '$1=="program-router-1-thread" {print $4}')
n=$(echo "$results" | awk -F'\t' '$1=="nginx" {print $2}')
np99=$(echo "$results" | awk -F'\t' '$1=="nginx" {print $4}')
hb=$(echo "$results" | awk -F'\t' '$1=="hyper-bound" {print $2}')
hbp99=$(echo "$results" | awk -F'\t' '$1=="hyper-bound" {print $4}')
h1=$(echo "$results" | awk -F'\t' '$1=="hyper-bound-h1" {print $2}')
hj=$(echo "$results" | awk -F'\t' '$1=="hyper-bound-json" {print $2}')
hjp99=$(echo "$results" | awk -F'\t' '$1=="hyper-bound-json" {print $4}')
awk -v d="$d" -v p="$p" -v v="$v" -v pp="$pp99" -v vp="$vp99" -v pc="$pc" -v vc="$vc" -v p1="$p1" -v p1p="$p1p99" -v n="$n" -v np="$np99" -v hb="$hb" -v hbp="$hbp99" -v h1="$h1" -v hj="$hj" -v hjp="$hjp99" 'BEGIN {
  printf "\nprogram-router / vllm-router CPU per request: %.2fx\n", pc/vc;
  printf "program-router / vllm-router throughput: %.2fx (1 thread: %.2fx)\n", p/v, p1/v;
  printf "program-router / direct throughput:      %.2fx (1 thread: %.2fx)\n", p/d, p1/d;
  printf "program-router / vllm-router p99:        %.2fx (1 thread: %.2fx)\n", pp/vp, p1p/vp;
  printf "program-router / nginx throughput:       %.2fx (1 thread: %.2fx)\n", p/n, p1/n;
  printf "program-router / nginx p99:              %.2fx (1 thread: %.2fx)\n", pp/np, p1p/np;
  printf "hyper bound / nginx throughput:          %.2fx (plain HTTP/1 server: %.2fx)\n", hb/n, h1/n;
  printf "hyper bound / nginx p99:                 %.2fx\n", hbp/np;
  printf "hyper bound with JSON / nginx:           %.2fx throughput, %.2fx p99\n", hj/n, hjp/np;
  printf "program-router / hyper bound throughput: %.2fx\n", p/hb }'
echo "$rounds" | awk -F'\t' 'NF > 1 { r[$1, $2] = $3; n = ($1 > n) ? $1 : n }
  END { printf "program-router / nginx throughput by round:"; for (i = 1; i <= n; i++) printf " %.2fx", r[i, "program-router"] / r[i, "nginx"]; print "" }'
rm -rf "$lua" "$ng_dir"
