#!/usr/bin/env bash
# Exact on-CPU time per request of the backend, nginx and portico (pass-through, `workers = 1`;
# target `bridge`: portico's era bridge to the same backend in its `--legacy` mode) at one
# concurrency, from each process's /proc/<pid>/schedstat (nanoseconds run; not the
# 10 ms-tick sampling of /proc/<pid>/stat, which misattributes short runs). The layout is
# benches/run.sh's: backend, nginx and portico on SERVER_CPUS, wrk on LOADGEN_CPUS.
#
#   C=1 benches/cpu_per_request.sh     # the c=1 wake-up cost (README, "Latency at c = 1")
#   C=16 D=10 benches/cpu_per_request.sh
#   C=1 HALT_POLL_NS=200000 benches/cpu_per_request.sh   # with the guest's idle polling on
#   C=16 SYSCALLS=1 benches/cpu_per_request.sh   # + where the time goes (README, "Where a proxy's
#                                                # time goes on this host")
#   TARGETS="portico bridge" C=16 benches/cpu_per_request.sh   # some of: direct nginx portico bridge
#   C=1 SYSCALLS=1 EXTRA_EVENTS=timer:hrtimer_start,timer:hrtimer_cancel benches/cpu_per_request.sh
#   C=16 SCHED_BATCH=1 benches/cpu_per_request.sh   # both proxies' threads under SCHED_BATCH
#   C=16 NICE=-5 benches/cpu_per_request.sh   # both proxies' threads at nice -5 (more weight)
#   C=16 SCHED_TRACE=1 benches/cpu_per_request.sh   # who hands SERVER_CPUS to whom, per request
#
# Prints one line per target: req/s, p50, p99, and µs of CPU per request for the proxy and for
# the backend. SYSCALLS=1 adds, per request: the proxy's user and kernel µs (/proc/<pid>/stat
# ticks, so run D=5 or more), its system calls, epoll waits and context switches (`perf stat`
# tracepoints, which slow every call a little: read the counts, not that run's req/s), and the
# TCP segments the host sent (`nstat`, every process: the same for all three targets when no
# pure ACKs are sent); EXTRA_EVENTS (comma-separated `perf` events) adds lines of those per
# request. SCHED_BATCH=1 puts every thread of portico and of nginx's worker under SCHED_BATCH
# (`chrt -b`: a woken batch task does not preempt the one running), for both proxies alike.
# NICE=<n> renices every thread of portico and of nginx's worker (nginx's `worker_priority`):
# more weight keeps a proxy eligible under EEVDF when its backend wakes. SCHED_TRACE=1 records
# `sched:sched_switch` on SERVER_CPUS for 0.5 s of each target's run (`perf record`) and prints,
# per request, how often each process gave the CPU to another: preempted (still runnable) or
# going to sleep (SCHED_TRACE needs perf). Needs the release build (cargo build --release --bin portico --example
# bench_backend), wrk and nginx (SYSCALLS=1: perf and nstat too). Every process it starts is
# stopped when it exits.
set -euo pipefail
C=${C:-1}
D=${D:-5}
SYSCALLS=${SYSCALLS:-0}
SERVER_CPUS=${SERVER_CPUS:-0}
LOADGEN_CPUS=${LOADGEN_CPUS:-1}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${BIN:-$ROOT/target/release/portico}
BACKEND=$ROOT/target/release/examples/bench_backend
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
for need in "$BIN" "$BACKEND" "$NGINX"; do
    [[ -x $need ]] || { echo "missing $need (build or install it first)" >&2; exit 1; }
done
command -v wrk >/dev/null || { echo "missing wrk" >&2; exit 1; }
if [[ $SYSCALLS == 1 ]]; then
    for need in perf nstat; do
        command -v "$need" >/dev/null || { echo "missing $need (SYSCALLS=1)" >&2; exit 1; }
    done
fi
if [[ ${SCHED_TRACE:-0} == 1 ]]; then
    command -v perf >/dev/null || { echo "missing perf (SCHED_TRACE=1)" >&2; exit 1; }
fi

die() { echo "cpu_per_request.sh: $*" >&2; exit 1; }
# shellcheck source=benches/common.sh
source "$ROOT/benches/common.sh" # pick_port, wait_port, halt_poll_* (HALT_POLL_NS, as in run.sh)

TMP=$(mktemp -d)
chmod 755 "$TMP" # nginx workers (user nobody) reach their temp dirs
PIDS=()
# Its own trap, not common.sh's `cleanup` (run.sh's process table): a plain list of PIDs here.
stop_all() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    halt_poll_restore
    rm -rf "$TMP"
}
trap stop_all EXIT INT TERM
halt_poll_apply
echo "guest_halt_poll_ns: $(halt_poll_now)"

# start_backend NAME ARGS...: the bench backend on SERVER_CPUS; sets STARTED_PID, STARTED_PORT.
start_backend() {
    local name=$1
    shift
    taskset -c "$SERVER_CPUS" "$BACKEND" --name "$name" "$@" >"$TMP/$name.out" 2>"$TMP/$name.err" &
    STARTED_PID=$!
    PIDS+=("$STARTED_PID")
    for _ in $(seq 50); do grep -q LISTENING "$TMP/$name.out" && break; sleep 0.1; done
    STARTED_PORT=$(awk '/LISTENING/ {print $2}' "$TMP/$name.out")
    [[ -n $STARTED_PORT ]] || die "backend $name did not start"
}
start_backend b1
BP=$STARTED_PID BPORT=$STARTED_PORT
# The same backend in its initialize-era mode, for the `bridge` target (portico's era bridge).
start_backend bl --legacy
BLP=$STARTED_PID BLPORT=$STARTED_PORT
pick_port
NPORT=$FREE_PORT
pick_port
PPORT=$FREE_PORT

mkdir -p "$TMP/n"
cat >"$TMP/n/nginx.conf" <<EOF
daemon off; master_process on; worker_processes 1;
pid $TMP/n/nginx.pid; error_log $TMP/n/error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path $TMP/n/cb; proxy_temp_path $TMP/n/p; fastcgi_temp_path $TMP/n/f;
    uwsgi_temp_path $TMP/n/u; scgi_temp_path $TMP/n/s;
    keepalive_timeout 75s; keepalive_requests 1000000;
    upstream mcp_backend { server 127.0.0.1:$BPORT; keepalive 64; keepalive_requests 1000000; }
    server {
        listen 127.0.0.1:$NPORT;
        location / {
            proxy_pass http://mcp_backend; proxy_http_version 1.1;
            proxy_set_header Connection ""; proxy_set_header Host \$http_host;
            proxy_buffering off;
        }
    }
}
EOF
taskset -c "$SERVER_CPUS" "$NGINX" -p "$TMP/n" -c "$TMP/n/nginx.conf" &
NP=$!
PIDS+=("$NP")

cat >"$TMP/p.toml" <<EOF
[server]
listen = "127.0.0.1:$PPORT"
workers = 1
[log]
access = false
level = "warn"
[sessions]
key = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
[cache]
enabled = false
[[backends]]
name = "b1"
url = "http://127.0.0.1:$BPORT/mcp"
protocol = "modern"
[[backends]]
name = "bl"
url = "http://127.0.0.1:$BLPORT/mcp"
protocol = "legacy"
EOF
taskset -c "$SERVER_CPUS" "$BIN" --config "$TMP/p.toml" >"$TMP/p.out" 2>"$TMP/p.err" &
PP=$!
PIDS+=("$PP")
wait_port "$NPORT" "$NP" || die "nginx does not listen on $NPORT"
wait_port "$PPORT" "$PP" || die "portico does not listen on $PPORT (see $TMP/p.err)"
sleep 0.3
NW=$(pgrep -P "$NP" | head -1)
if [[ ${SCHED_BATCH:-0} == 1 ]]; then
    chrt -b -a -p 0 "$PP" >/dev/null && chrt -b -a -p 0 "$NW" >/dev/null || die "chrt -b failed"
    echo "portico and nginx under SCHED_BATCH"
fi
if [[ -n ${NICE:-} ]]; then
    [[ $NICE =~ ^-?[0-9]+$ ]] || die "NICE must be a number (-20 to 19)"
    for t in /proc/"$PP"/task/* /proc/"$NW"/task/*; do
        renice -n "$NICE" -p "${t##*/}" >/dev/null || die "renice failed"
    done
    echo "portico and nginx at nice $NICE"
fi

ns() { awk '{print $1}' "/proc/$1/schedstat"; }
ticks() { awk '{print $14, $15}' "/proc/$1/stat"; } # utime, stime
EVENTS=raw_syscalls:sys_enter,syscalls:sys_enter_recvfrom,syscalls:sys_enter_sendto
EVENTS+=,syscalls:sys_enter_writev,syscalls:sys_enter_epoll_wait,context-switches
[[ -n ${EXTRA_EVENTS:-} ]] && EVENTS+=,$EXTRA_EVENTS
# switch_table REQUESTS: the recorded sched_switch events as switches from one process to
# another (the idle task is "idle") per request; prev_state R: preempted, else gone to sleep.
switch_table() {
    perf script -i "$TMP/sched.data" -F trace 2>/dev/null | awk -v per="$1" '
        {
            from = $1; sub(/^prev_comm=/, "", from)
            to = $0; sub(/.*next_comm=/, "", to); sub(/ .*/, "", to)
            if (from ~ /^swapper/) from = "idle"
            if (to ~ /^swapper/) to = "idle"
            how = ($0 ~ /prev_state=R[ +]/) ? "preempted" : "sleeps"
            c[from " -> " to " (" how ")"]++
        }
        END { if (per < 1) per = 1; for (k in c) if (c[k] / per >= 0.01) printf "    %s: %.2f\n", k, c[k] / per }' | sort
}
field() { grep -o "\"$1\":[0-9]*" "$TMP/w.out" | cut -d: -f2; }
for target in ${TARGETS:-direct nginx portico bridge}; do
    backend=$BP
    case $target in
        direct) url=http://127.0.0.1:$BPORT/mcp proxy= ;;
        nginx) url=http://127.0.0.1:$NPORT/mcp proxy=$NW ;;
        portico) url=http://127.0.0.1:$PPORT/mcp/b1 proxy=$PP ;;
        bridge) url=http://127.0.0.1:$PPORT/mcp/bl proxy=$PP backend=$BLP ;;
        *) die "unknown target $target (direct, nginx, portico, bridge)" ;;
    esac
    taskset -c "$LOADGEN_CPUS" wrk -t1 -c"$C" -d1s -s "$ROOT/benches/mcp.lua" "$url" >/dev/null
    b0=$(ns "$backend")
    p0=0
    [[ -n $proxy ]] && p0=$(ns "$proxy")
    if [[ $SYSCALLS == 1 ]]; then
        watched=${proxy:-$backend}
        read -r u0 s0 < <(ticks "$watched")
        nstat -n >/dev/null
        perf stat -x, -e "$EVENTS" -p "$watched" -o "$TMP/perf.out" -- sleep "$D" &
        PERF=$!
    fi
    if [[ ${SCHED_TRACE:-0} == 1 ]]; then
        # 0.5 s from the middle of the run; its requests counted at the run's mean rate.
        (sleep 1 && perf record -q -e sched:sched_switch -C "$SERVER_CPUS" -o "$TMP/sched.data" \
            -- sleep 0.5 >/dev/null 2>"$TMP/sched.err") &
        TRACE=$!
    fi
    taskset -c "$LOADGEN_CPUS" wrk -t1 -c"$C" -d"${D}s" -s "$ROOT/benches/mcp.lua" "$url" >"$TMP/w.out"
    b1=$(ns "$backend")
    p1=0
    [[ -n $proxy ]] && p1=$(ns "$proxy")
    n=$(field requests)
    switches=
    if [[ ${SCHED_TRACE:-0} == 1 ]]; then
        wait "$TRACE"
        switches=$(switch_table $((n / D / 2)))
        [[ -n $switches ]] || switches="    (no sched_switch recorded: $(head -c 200 "$TMP/sched.err"))"
    fi
    echo "$target c=$C rps=$((n / D)) p50_us=$(field p50_us) p99_us=$(field p99_us)" \
        "proxy_cpu_us_per_req=$(((p1 - p0) / 1000 / n)) backend_cpu_us_per_req=$(((b1 - b0) / 1000 / n))"
    [[ -n $switches ]] && echo "  CPU handed over on $SERVER_CPUS, per request:" && echo "$switches"
    if [[ $SYSCALLS == 1 ]]; then
        wait "$PERF"
        read -r u1 s1 < <(ticks "$watched")
        segs=$(nstat -z | awk '$1 == "TcpOutSegs" {print $2}')
        who=proxy
        [[ -z $proxy ]] && who=backend
        # Ticks are 1/CLK_TCK s: µs per request with one decimal.
        hz=$(getconf CLK_TCK)
        awk -v n="$n" -v who="$who" -v hz="$hz" -v du=$((u1 - u0)) -v ds=$((s1 - s0)) -v segs="$segs" '
            BEGIN { FS = "," }
            /^[0-9]/ { v[$3] = $1 }
            END {
                printf "  %s per request: user %.1f µs, kernel %.1f µs, syscalls %.2f (recvfrom %.2f, sendto %.2f, writev %.2f, epoll_wait %.2f), context switches %.2f; TCP segments sent (host) %.2f\n",
                    who, du * 1e6 / hz / n, ds * 1e6 / hz / n, v["raw_syscalls:sys_enter"] / n,
                    v["syscalls:sys_enter_recvfrom"] / n, v["syscalls:sys_enter_sendto"] / n,
                    v["syscalls:sys_enter_writev"] / n, v["syscalls:sys_enter_epoll_wait"] / n,
                    v["context-switches"] / n, segs / n
            }' "$TMP/perf.out"
        if [[ -n ${EXTRA_EVENTS:-} ]]; then
            awk -v n="$n" -v want=",$EXTRA_EVENTS," 'BEGIN { FS = "," }
                /^[0-9]/ && index(want, "," $3 ",") { printf "  %s: %.2f per request\n", $3, $1 / n }' "$TMP/perf.out"
        fi
    fi
done
