#!/usr/bin/env bash
# portico at scale (issue #23 item 4): memory per idle initialize-era client session, memory per
# open subscriptions/listen stream, memory per idle keep-alive client connection, latency while
# they are held, and a soak whose RSS must stay flat. Uses the existing release binaries (it never builds), everything on 127.0.0.1. Prints a
# markdown report and writes it to benches/results/scale.md.
#
#   benches/scale.sh                # 10,000 sessions, 1,000 streams, 5,000 connections, 600 s soak
#   SESSIONS=300 STREAMS=50 CONNS=300 SOAK_S=40 WRK_S=3 benches/scale.sh   # a quick check
#   PART=streams STREAMS=2000 benches/scale.sh              # one part only
#
# Every knob is an environment variable; see benches/README.md ("Scale") or the block below.
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BENCHES=$ROOT/benches

# ---------------------------------------------------------------- knobs
SESSIONS=${SESSIONS:-10000}                # initialize-era client sessions per backend kind
STREAMS=${STREAMS:-1000}                   # subscriptions/listen streams held open
CONNS=${CONNS:-5000}                       # idle keep-alive client connections held open
CONN_BATCHES=${CONN_BATCHES:-5}            # opened in this many batches...
CONN_IDLE_S=${CONN_IDLE_S:-3}              # ...each followed by this many seconds of idling
SOAK_S=${SOAK_S:-600}                      # seconds of load in the soak
PART=${PART:-"sessions streams conns soak"} # which parts run, in this order
OPEN_CONCURRENCY=${OPEN_CONCURRENCY:-64}   # sessions/streams being opened at once
WRK_S=${WRK_S:-10}                         # the short wrk run (and its baseline before opening)
WRK_C=${WRK_C:-16}                         # wrk connections, every run
NOTIFY_MS=${NOTIFY_MS:-1000}               # each listen stream gets a notification this often
STREAM_WINDOW=${STREAM_WINDOW:-10}         # seconds over which notifications are counted
SAMPLE_S=${SAMPLE_S:-10}                   # soak: RSS sampling period
WORKERS=${WORKERS:-1}                      # portico [server] workers
PIN=${PIN:-1}                              # 0: no taskset at all
SERVER_CPUS=${SERVER_CPUS:-0}              # backends and portico run here
LOADGEN_CPUS=${LOADGEN_CPUS:-1}            # wrk and the Python client run here
LOADGEN_THREADS=${LOADGEN_THREADS:-}       # wrk -t (default: number of LOADGEN_CPUS; never > c)
WRK_TIMEOUT=${WRK_TIMEOUT:-2s}             # wrk --timeout: slower answers count as errors
OPEN_TIMEOUT=${OPEN_TIMEOUT:-}             # bound on opening all sessions/streams (default from the counts)
PYTHON=${PYTHON:-python3}
RESULTS_DIR=${RESULTS_DIR:-$BENCHES/results}
KEEP_TMP=${KEEP_TMP:-0}                    # 1: keep configs and logs of the run
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
PORTICO_BIN=${PORTICO_BIN:-$TARGET_DIR/release/portico}
BACKEND_BIN=${BACKEND_BIN:-$TARGET_DIR/release/examples/bench_backend}

say() { printf '%s\n' "$*" >&2; }
die() { say "scale.sh: $*"; exit 1; }
source "$BENCHES/common.sh"

posint() { [[ $2 =~ ^[1-9][0-9]*$ ]] || die "$1 must be a positive integer (got '$2')"; }
posint SESSIONS "$SESSIONS"; posint STREAMS "$STREAMS"; posint SOAK_S "$SOAK_S"
posint OPEN_CONCURRENCY "$OPEN_CONCURRENCY"; posint WRK_S "$WRK_S"; posint WRK_C "$WRK_C"
posint NOTIFY_MS "$NOTIFY_MS"; posint STREAM_WINDOW "$STREAM_WINDOW"; posint SAMPLE_S "$SAMPLE_S"
posint WORKERS "$WORKERS"; posint CONNS "$CONNS"; posint CONN_IDLE_S "$CONN_IDLE_S"
posint CONN_BATCHES "$CONN_BATCHES"
for p in $PART; do
    [[ $p == sessions || $p == streams || $p == conns || $p == soak ]] \
        || die "unknown PART '$p' (sessions streams conns soak)"
done
wants() { [[ " $PART " == *" $1 "* ]]; }

# ---------------------------------------------------------------- prerequisites
missing=()
for c in wrk curl jq taskset "$PYTHON" timeout; do command -v "$c" >/dev/null || missing+=("$c"); done
((${#missing[@]} == 0)) || die "missing: ${missing[*]} (e.g. apt-get install -y wrk curl jq util-linux python3)"
[[ -x $PORTICO_BIN ]] || die "no portico binary at $PORTICO_BIN (cargo build --release, or PORTICO_BIN=...)"
[[ -x $BACKEND_BIN ]] || die "no bench backend at $BACKEND_BIN (cargo build --release --example bench_backend)"
if wants streams && ! grep -q -- --listen-every-ms <<<"$("$BACKEND_BIN" --help 2>&1)"; then
    die "$BACKEND_BIN has no --listen-every-ms (rebuild it: cargo build --release --example bench_backend)"
fi
NCPU=$(nproc)
if [[ $PIN == 1 ]] && ((NCPU < 2)); then say "only $NCPU CPU: not pinning"; PIN=0; fi
[[ -n $LOADGEN_THREADS ]] || LOADGEN_THREADS=$(cpu_count "$LOADGEN_CPUS")
((LOADGEN_THREADS > WRK_C)) && LOADGEN_THREADS=$WRK_C
[[ -n $OPEN_TIMEOUT ]] || OPEN_TIMEOUT=$((120 + SESSIONS / 20 + STREAMS / 10 + CONNS / 50))

# File descriptors: portico holds a client and an upstream connection per stream, the Python
# client one per stream (and one per idle connection); the backends one per upstream
# connection. Raised to what is needed.
FD_NEED=$((2 * STREAMS + 4 * OPEN_CONCURRENCY + 512))
wants conns && ((CONNS + 4 * OPEN_CONCURRENCY + 512 > FD_NEED)) && FD_NEED=$((CONNS + 4 * OPEN_CONCURRENCY + 512))
if (($(ulimit -n) < FD_NEED)); then
    ulimit -n "$FD_NEED" 2>/dev/null \
        || die "need $FD_NEED file descriptors, ulimit -n is $(ulimit -n) (hard limit $(ulimit -Hn)): lower STREAMS or raise the limit"
fi
FD_LIMIT=$(ulimit -n)

# ---------------------------------------------------------------- processes
TMP=$(mktemp -d /tmp/portico-scale.XXXXXX) || die "mktemp failed"
declare -A PID=()  # name -> pid
ALL_PIDS=()        # everything started and not yet stopped, for cleanup


forget() { # PID: no longer ours to stop (it was stopped and reaped)
    local p keep=()
    for p in "${ALL_PIDS[@]}"; do [[ $p == "$1" ]] || keep+=("$p"); done
    ALL_PIDS=("${keep[@]}")
}

stop() { # NAME: TERM, up to 5 s, then KILL; reaped
    local pid=${PID[$1]:-}
    [[ -n $pid ]] || return 0
    kill -TERM "$pid" 2>/dev/null
    for _ in $(seq 50); do alive "$pid" || break; sleep 0.1; done
    alive "$pid" && kill -KILL "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    forget "$pid"
    unset "PID[$1]"
}

install_cleanup

on_servers() { if [[ $PIN == 1 ]]; then taskset -c "$SERVER_CPUS" "$@"; else "$@"; fi; }
on_loadgen() { if [[ $PIN == 1 ]]; then taskset -c "$LOADGEN_CPUS" "$@"; else "$@"; fi; }

# bg NAME CPUS CMD... : a background process (taskset execs it, so $! is the command itself),
# output in $TMP/NAME.{out,err}.
bg() {
    local name=$1 cpus=$2; shift 2
    local cmd=("$@")
    [[ $PIN == 1 ]] && cmd=(taskset -c "$cpus" "$@")
    "${cmd[@]}" >"$TMP/$name.out" 2>"$TMP/$name.err" &
    PID[$name]=$!
    ALL_PIDS+=("$!")
}




wait_file() { # FILE PID SECONDS: until FILE exists; fails if PID dies first or time runs out
    local end=$((SECONDS + $3))
    while [[ ! -s $1 ]]; do
        alive "$2" || { [[ -s $1 ]]; return; }
        ((SECONDS < end)) || return 1
        sleep 0.1
    done
}

wait_exit() { # PID SECONDS: until PID exits (then reaped; its status in WAIT_RC), else killed
    local end=$((SECONDS + $2))
    while alive "$1"; do
        if ((SECONDS >= end)); then kill -TERM "$1" 2>/dev/null; sleep 1; kill -KILL "$1" 2>/dev/null; break; fi
        sleep 0.1
    done
    wait "$1" 2>/dev/null
    WAIT_RC=$?
    forget "$1"
}

fds() { find "/proc/$1/fd" -mindepth 1 -maxdepth 1 2>/dev/null | wc -l; }
kib() { awk -v k="${1:-}" 'BEGIN { if (k == "") print "–"; else printf "%.1f MiB", k / 1024 }'; }

declare -A PORT=()
SESSION_KEY=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
MAX_UPSTREAM=$((SESSIONS + OPEN_CONCURRENCY + 100))
UPSTREAM_IDLE_MS=86400000
HEADER_READ_TIMEOUT_MS=10000  # the default; the conns part raises it so its connections stay open
SESSION_TTL_MS=86400000

start_backend() { # NAME ARGS...
    local name=$1; shift
    bg "$name" "$SERVER_CPUS" "$BACKEND_BIN" --port 0 --name "scale-$name" "$@"
    for _ in $(seq 200); do
        if grep -q '^LISTENING ' "$TMP/$name.out" 2>/dev/null; then
            PORT[$name]=$(awk '/^LISTENING /{print $2; exit}' "$TMP/$name.out")
            return 0
        fi
        alive "${PID[$name]}" || break
        sleep 0.05
    done
    die "bench backend $name did not start: $(last_err "$TMP/$name.err")"
}

backend_count() { # NAME METHOD -> how many METHOD requests that bench backend has answered
    local n
    n=$(curl -s -m 2 "http://127.0.0.1:${PORT[$1]}/stats" | jq -r --arg m "$2" '.[$m] // 0' 2>/dev/null)
    echo "${n:-0}"
}

portico_conf() { # PORT METRICS-PORT
    cat <<EOF
# generated by benches/scale.sh
[server]
listen = "127.0.0.1:$1"
workers = $WORKERS
drain_timeout_ms = 1000
header_read_timeout_ms = $HEADER_READ_TIMEOUT_MS

[log]
access = false
level = "info"

[sessions]
key = "$SESSION_KEY"
ttl_ms = $SESSION_TTL_MS

[metrics]
listen = "127.0.0.1:$2"

[cache]
enabled = false

[[backends]]
name = "bench"
url = "http://127.0.0.1:${PORT[b1]}/mcp"
protocol = "modern"

[[backends]]
name = "legacy"
url = "http://127.0.0.1:${PORT[bl]}/mcp"
protocol = "legacy"
max_upstream_sessions = $MAX_UPSTREAM
upstream_idle_ms = $UPSTREAM_IDLE_MS
EOF
}

PORTICO=   # the running instance's name
start_portico() { # NAME: a fresh portico for one measurement
    local name=$1 conf=$TMP/$1.toml
    pick_port; PORT[$name]=$FREE_PORT
    pick_port; PORT[$name-metrics]=$FREE_PORT
    portico_conf "${PORT[$name]}" "${PORT[$name-metrics]}" >"$conf"
    "$PORTICO_BIN" --check --config "$conf" >"$TMP/$name.check" 2>&1 \
        || die "config rejected: $(last_err "$TMP/$name.check")"
    bg "$name" "$SERVER_CPUS" "$PORTICO_BIN" --config "$conf"
    wait_port "${PORT[$name]}" "${PID[$name]}" 15 || die "portico did not start: $(last_err "$TMP/$name.err")"
    wait_port "${PORT[$name-metrics]}" "${PID[$name]}" 5 || die "portico's metrics listener did not start"
    PORTICO=$name
    probe "$name" || die "portico ($name) fails the pass-through probe: $PROBE_REASON"
}

metric() { # SERIES (e.g. 'portico_listen_streams{endpoint="bench"}') of the running portico
    curl -s -m 5 "http://127.0.0.1:${PORT[$PORTICO-metrics]}/metrics" \
        | awk -v s="$1" 'index($0, s " ") == 1 { printf "%d", $2; found = 1 } END { if (!found) printf "0" }'
}

MCP_BODY='{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"text":"hello"},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}'
PROBE_REASON=
probe() { # NAME: one tools/call like wrk's through the pass-through path
    local code
    code=$(curl -sS -m 5 -o "$TMP/probe.body" -w '%{http_code}' \
        -H 'Content-Type: application/json' -H 'Accept: application/json, text/event-stream' \
        -H 'MCP-Protocol-Version: 2026-07-28' -H 'Mcp-Method: tools/call' -H 'Mcp-Name: echo' \
        --data-binary "$MCP_BODY" "http://127.0.0.1:${PORT[$1]}/mcp/bench" 2>"$TMP/probe.err")
    if [[ $code != 200 ]]; then PROBE_REASON="HTTP ${code:-000} $(head -c 120 "$TMP/probe.body" 2>/dev/null) $(last_err "$TMP/probe.err")"; return 1; fi
    jq -e '.id == 1 and (.result.content[0].text | type == "string")' "$TMP/probe.body" >/dev/null 2>&1 \
        || { PROBE_REASON="no tools/call result: $(head -c 120 "$TMP/probe.body")"; return 1; }
}

wrk_cmd() { # SECONDS -> the wrk command line (pinned), in WRK
    # --foreground: wrk stays in the script's process group, so Ctrl-C reaches it at once.
    WRK=(timeout --foreground $(($1 + 30)) wrk -t "$LOADGEN_THREADS" -c "$WRK_C" -d "${1}s" --timeout "$WRK_TIMEOUT"
        --latency -s "$BENCHES/mcp.lua" "http://127.0.0.1:${PORT[$PORTICO]}/mcp/bench")
    [[ $PIN == 1 ]] && WRK=(taskset -c "$LOADGEN_CPUS" "${WRK[@]}")
}
run_wrk() { # SECONDS -> the BENCHJSON object on stdout ({} if wrk gave none)
    local out
    wrk_cmd "$1"
    out=$(MCP_METHOD=tools/call "${WRK[@]}" 2>&1)
    out=$(sed -n 's/^BENCHJSON //p' <<<"$out")
    echo "${out:-"{}"}"
}
wrk_errors() { jq '(.connect // 0) + (.read // 0) + (.write // 0) + (.status // 0) + (.timeout // 0)' <<<"$1"; }
lat() { # BENCHJSON -> "req/s | p50 | p99 | errors" table cells
    jq -r 'if .requests == null then "n/a | n/a | n/a | wrk gave no result"
        else "\(.rps | floor) | \(.p50_us / 1000 * 100 | round / 100) ms | \(.p99_us / 1000 * 100 | round / 100) ms | \(.connect + .read + .write + .status + .timeout)" end' <<<"$1"
}

# ---------------------------------------------------------------- host
CLK_TCK=$(getconf CLK_TCK 2>/dev/null || echo 100)
other_ticks() { # CPU ticks of processes that are neither ours nor kernel threads
    cat /proc/[0-9]*/stat 2>/dev/null | awk -v ours=" $$ ${ALL_PIDS[*]} " '
        { pid = $1; s = $0; sub(/^.*\) /, "", s); split(s, f, " ")
          if (pid == 2 || f[2] == 2 || index(ours, " " pid " ")) next
          t += f[12] + f[13] + f[14] + f[15] }
        END { printf "%d", t }'
}
t0=$(other_ticks); sleep 2; t1=$(other_ticks)
PRE_LOAD=$(((t1 > t0 ? t1 - t0 : 0) * 100 / (2 * CLK_TCK)))
((PRE_LOAD >= 10)) && say "WARNING: other processes use ${PRE_LOAD}% of a CPU right now; the numbers will be noisy"

# ---------------------------------------------------------------- start the backends
say "temp dir: $TMP"
start_backend b1 --listen-every-ms "$NOTIFY_MS"
start_backend bl --legacy
: >"$TMP/notes.txt"

# ---------------------------------------------------------------- part 1: sessions
declare -A S=()   # "<kind>.<field>" -> value
sessions_part() { # KIND (modern | legacy)
    local kind=$1 name=sess-$1 path=/mcp/bench call=() pid before ready
    [[ $kind == legacy ]] && path=/mcp/legacy call=(--call)
    say "sessions ($kind): fresh portico, baseline wrk ${WRK_S} s"
    start_portico "$name"
    S[$kind.base]=$(run_wrk "$WRK_S")
    sleep 1
    pid=${PID[$name]}
    S[$kind.rss0]=$(status_kb "$pid" VmRSS) S[$kind.fd0]=$(fds "$pid")
    S[$kind.gauge0]=$(metric "portico_legacy_sessions{backend=\"legacy\"}")
    before=$(backend_count bl initialize)
    S[$kind.disc0]=$(backend_count b1 server/discover)
    ready=$TMP/$name.ready
    say "sessions ($kind): opening $SESSIONS initialize-era sessions on $path, $OPEN_CONCURRENCY at a time"
    bg "$name-client" "$LOADGEN_CPUS" timeout $((OPEN_TIMEOUT + WRK_S + 300)) "$PYTHON" "$BENCHES/scale.py" sessions \
        --port "${PORT[$name]}" --path "$path" --n "$SESSIONS" --concurrency "$OPEN_CONCURRENCY" "${call[@]}" \
        --ready "$ready" --release "$TMP/$name.release" --hold-timeout $((WRK_S + 240))
    if ! wait_file "$ready" "${PID[$name-client]}" "$OPEN_TIMEOUT"; then
        echo "sessions ($kind): the client did not finish opening within ${OPEN_TIMEOUT} s: $(last_err "$TMP/$name-client.err")" >>"$TMP/notes.txt"
        stop "$name-client"; stop "$name"; S[$kind.failed]=1
        return
    fi
    sleep 1
    S[$kind.open]=$(cat "$ready")
    S[$kind.rss1]=$(status_kb "$pid" VmRSS) S[$kind.fd1]=$(fds "$pid")
    S[$kind.gauge1]=$(metric "portico_legacy_sessions{backend=\"legacy\"}")
    S[$kind.upinit]=$(($(backend_count bl initialize) - before))
    S[$kind.disc]=$(($(backend_count b1 server/discover) - ${S[$kind.disc0]}))
    say "sessions ($kind): $(jq -r '"\(.opened) opened, \(.failed) failed in \(.seconds) s"' <<<"${S[$kind.open]}"); wrk ${WRK_S} s with them held"
    S[$kind.held]=$(run_wrk "$WRK_S")
    S[$kind.rss2]=$(status_kb "$pid" VmRSS) S[$kind.hwm]=$(status_kb "$pid" VmHWM)
    S[$kind.gauge2]=$(metric "portico_legacy_sessions{backend=\"legacy\"}")
    touch "$TMP/$name.release"
    wait_exit "${PID[$name-client]}" 120
    S[$kind.final]=$(tail -n 1 "$TMP/$name-client.out")
    jq -e . >/dev/null 2>&1 <<<"${S[$kind.final]}" || S[$kind.final]='{}'
    unset "PID[$name-client]"
    portico_warnings "$name"
    stop "$name"
}

portico_warnings() { # NAME: WARN/ERROR lines portico logged, into the notes
    local n
    sed 's/\x1b\[[0-9;]*m//g' "$TMP/$1.err" | grep -E '^[^ ]+ +(WARN|ERROR) ' >"$TMP/$1.warn"
    n=$(wc -l <"$TMP/$1.warn")
    if ((n > 0)); then
        echo "portico ($1) logged $n warning/error line(s); most frequent (timestamps dropped):" >>"$TMP/notes.txt"
        cut -d' ' -f2- "$TMP/$1.warn" | sed 's/^ *//' | cut -c1-240 | sort | uniq -c | sort -rn | head -n 5 \
            | sed 's/^/    /' >>"$TMP/notes.txt"
    fi
}

# ---------------------------------------------------------------- part 2: streams
declare -A L=()
streams_part() {
    local name=streams pid ready before
    say "streams: fresh portico, baseline wrk ${WRK_S} s"
    start_portico "$name"
    L[base]=$(run_wrk "$WRK_S")
    sleep 1
    pid=${PID[$name]}
    L[rss0]=$(status_kb "$pid" VmRSS) L[fd0]=$(fds "$pid")
    L[gauge0]=$(metric 'portico_listen_streams{endpoint="bench"}')
    before=$(backend_count b1 subscriptions/listen)
    ready=$TMP/$name.ready
    say "streams: opening $STREAMS subscriptions/listen streams (a notification every ${NOTIFY_MS} ms each), counting for ${STREAM_WINDOW} s"
    bg "$name-client" "$LOADGEN_CPUS" timeout $((OPEN_TIMEOUT + STREAM_WINDOW + WRK_S + 300)) "$PYTHON" "$BENCHES/scale.py" streams \
        --port "${PORT[$name]}" --path /mcp/bench --n "$STREAMS" --concurrency "$OPEN_CONCURRENCY" \
        --window "$STREAM_WINDOW" --ready "$ready" --release "$TMP/$name.release" --hold-timeout $((WRK_S + 240))
    if ! wait_file "$ready" "${PID[$name-client]}" $((OPEN_TIMEOUT + STREAM_WINDOW + 5)); then
        echo "streams: the client did not finish opening and counting in time: $(last_err "$TMP/$name-client.err")" >>"$TMP/notes.txt"
        stop "$name-client"; stop "$name"; L[failed]=1
        return
    fi
    L[open]=$(cat "$ready")
    L[rss1]=$(status_kb "$pid" VmRSS) L[fd1]=$(fds "$pid")
    L[gauge1]=$(metric 'portico_listen_streams{endpoint="bench"}')
    L[upstream]=$(($(backend_count b1 subscriptions/listen) - before))
    say "streams: $(jq -r '"\(.opened) open, \(.notes_per_s) notifications/s"' <<<"${L[open]}"); wrk ${WRK_S} s with them open"
    L[held]=$(run_wrk "$WRK_S")
    L[rss2]=$(status_kb "$pid" VmRSS) L[hwm]=$(status_kb "$pid" VmHWM)
    L[gauge2]=$(metric 'portico_listen_streams{endpoint="bench"}')
    touch "$TMP/$name.release"
    wait_exit "${PID[$name-client]}" 60
    L[final]=$(tail -n 1 "$TMP/$name-client.out")
    jq -e . >/dev/null 2>&1 <<<"${L[final]}" || L[final]='{}'
    unset "PID[$name-client]"
    # The client is gone: portico must have let go of every stream, upstream too.
    for _ in $(seq 50); do
        L[gauge3]=$(metric 'portico_listen_streams{endpoint="bench"}')
        ((${L[gauge3]:-1} == 0)) && break
        sleep 0.2
    done
    portico_warnings "$name"
    stop "$name"
}

# ---------------------------------------------------------------- part 3: idle connections
declare -A N=()
conns_part() {
    local name=conns pid ready
    say "conns: fresh portico (header_read_timeout_ms = 600000), baseline wrk ${WRK_S} s"
    HEADER_READ_TIMEOUT_MS=600000 start_portico "$name"
    N[base]=$(run_wrk "$WRK_S")
    sleep 1
    pid=${PID[$name]}
    N[rss0]=$(status_kb "$pid" VmRSS) N[fd0]=$(fds "$pid")
    ready=$TMP/$name.ready
    say "conns: opening $CONNS keep-alive connections (one tools/call each) in $CONN_BATCHES batches, idle ${CONN_IDLE_S} s after each"
    bg "$name-client" "$LOADGEN_CPUS" timeout $((OPEN_TIMEOUT + CONN_BATCHES * CONN_IDLE_S + WRK_S + 300)) "$PYTHON" "$BENCHES/scale.py" conns \
        --port "${PORT[$name]}" --path /mcp/bench --n "$CONNS" --concurrency "$OPEN_CONCURRENCY" \
        --idle "$CONN_IDLE_S" --batches "$CONN_BATCHES" --ready "$ready" --release "$TMP/$name.release" --hold-timeout $((WRK_S + 240))
    if ! wait_file "$ready" "${PID[$name-client]}" $((OPEN_TIMEOUT + CONN_BATCHES * CONN_IDLE_S + 5)); then
        echo "conns: the client did not finish opening in time: $(last_err "$TMP/$name-client.err")" >>"$TMP/notes.txt"
        stop "$name-client"; stop "$name"; N[failed]=1
        return
    fi
    N[open]=$(cat "$ready")
    N[rss1]=$(status_kb "$pid" VmRSS) N[fd1]=$(fds "$pid")
    say "conns: $(jq -r '"\(.opened) open, \(.failed) failed"' <<<"${N[open]}"); wrk ${WRK_S} s with them open"
    N[held]=$(run_wrk "$WRK_S")
    N[rss2]=$(status_kb "$pid" VmRSS) N[hwm]=$(status_kb "$pid" VmHWM)
    touch "$TMP/$name.release"
    wait_exit "${PID[$name-client]}" 120
    N[final]=$(tail -n 1 "$TMP/$name-client.out")
    jq -e . >/dev/null 2>&1 <<<"${N[final]}" || N[final]='{}'
    unset "PID[$name-client]"
    portico_warnings "$name"
    stop "$name"
}

# ---------------------------------------------------------------- part 4: soak
declare -A K=()
: >"$TMP/soak.tsv"
soak_part() {
    local name=soak pid wpid start k target
    say "soak: fresh portico, wrk c=$WRK_C for ${SOAK_S} s, RSS every ${SAMPLE_S} s"
    start_portico "$name"
    pid=${PID[$name]}
    wrk_cmd "$SOAK_S"
    MCP_METHOD=tools/call "${WRK[@]}" >"$TMP/soak.wrk" 2>&1 &
    wpid=$!
    ALL_PIDS+=("$wpid")
    start=$EPOCHREALTIME
    for ((k = 0; k * SAMPLE_S <= SOAK_S; k++)); do
        target=$((k * SAMPLE_S))
        sleep "$(awk -v a="$start" -v b="$EPOCHREALTIME" -v t="$target" 'BEGIN { d = t - (b - a); printf "%.3f", (d > 0 ? d : 0) }')"
        alive "$pid" || { echo "soak: portico exited during the soak: $(last_err "$TMP/$name.err")" >>"$TMP/notes.txt"; break; }
        printf '%d\t%s\t%s\t%s\n' "$target" "$(status_kb "$pid" VmRSS)" "$(fds "$pid")" "$(alive "$wpid" && echo load || echo done)" >>"$TMP/soak.tsv"
        ((k % 6 == 0 && k > 0)) && say "soak: ${target} s, RSS $(kib "$(status_kb "$pid" VmRSS)")"
    done
    wait_exit "$wpid" 60
    K[wrk]=$(sed -n 's/^BENCHJSON //p' "$TMP/soak.wrk")
    [[ -n ${K[wrk]} ]] || { K[wrk]='{}'; echo "soak: wrk gave no result: $(last_err "$TMP/soak.wrk")" >>"$TMP/notes.txt"; }
    K[hwm]=$(status_kb "$pid" VmHWM)
    portico_warnings "$name"
    stop "$name"
}

# ---------------------------------------------------------------- run
est=0
wants sessions && est=$((est + 2 * (2 * WRK_S + 10) + SESSIONS / 500))
wants streams && est=$((est + 2 * WRK_S + STREAM_WINDOW + 10 + STREAMS / 200))
wants conns && est=$((est + 2 * WRK_S + CONN_BATCHES * CONN_IDLE_S + 5 + CONNS / 500))
wants soak && est=$((est + SOAK_S + 5))
say "parts: $PART; about $((est / 60)) min $((est % 60)) s"
for p in $PART; do
    case $p in
    sessions) sessions_part modern; sessions_part legacy ;;
    streams) streams_part ;;
    conns) conns_part ;;
    soak) soak_part ;;
    esac
done

# ---------------------------------------------------------------- report
commit=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)
if [[ $commit != unknown ]] && [[ -n $(git -C "$ROOT" status --porcelain --untracked-files=no 2>/dev/null) ]]; then
    commit="$commit (uncommitted changes)"
fi
cpu_model=$(awk -F': *' '/^model name/ {print $2; exit}' /proc/cpuinfo)
if [[ $PIN == 1 ]]; then
    layout="backends and portico on CPU $SERVER_CPUS; wrk ($LOADGEN_THREADS thread(s)) and the Python client on CPU $LOADGEN_CPUS"
else
    layout="no CPU pinning (PIN=0); wrk with $LOADGEN_THREADS thread(s)"
fi
per() { # KIB-BEFORE KIB-AFTER COUNT -> "x.xx KiB"
    awk -v a="${1:-}" -v b="${2:-}" -v n="${3:-0}" 'BEGIN { if (a == "" || b == "" || n <= 0) print "–"; else printf "%.2f KiB", (b - a) / n }'
}
jf() { jq -r "$1 // \"–\"" <<<"${2:-"{}"}"; }   # FILTER JSON -> a field, "–" if absent

{
    echo "# portico at scale"
    echo
    echo "- date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
    echo "- portico commit: $commit; $("$PORTICO_BIN" --version 2>/dev/null)"
    echo "- host: $(uname -r), $cpu_model, $NCPU CPU(s); before the run, other processes used ${PRE_LOAD}% of a CPU$( ((PRE_LOAD >= 10)) && echo " (**busy machine: expect noise**)")"
    echo "- layout: $layout; portico \`workers = $WORKERS\`, bench backends current-thread; file descriptors: \`ulimit -n\` $FD_LIMIT"
    echo "- portico config (a fresh process per part, same file): \`[log] access = false\`, \`[cache] enabled = false\`,"
    echo "  \`[sessions] ttl_ms = $SESSION_TTL_MS\` (the default, 24 h: no session expires during the run),"
    echo "  backend \`legacy\`: \`max_upstream_sessions = $MAX_UPSTREAM\` (default 64: beyond it the least recently used upstream session is closed)"
    echo "  and \`upstream_idle_ms = $UPSTREAM_IDLE_MS\` (default 600000), so all $SESSIONS fit and stay open; \`sse_keepalive_ms\` and \`max_stream_ms\` default (15 s, unlimited)"
    echo "- latency: wrk -c $WRK_C, \`benches/mcp.lua\` \`tools/call\` on \`/mcp/bench\` (2026-07-28 backend, pass-through), --timeout $WRK_TIMEOUT"
    echo "- RSS: \`VmRSS\` of portico from \`/proc/<pid>/status\`; KiB = 1024 bytes"
    if wants sessions; then
        echo
        echo "## Idle initialize-era client sessions"
        echo
        echo "Each session: \`initialize\` (protocolVersion 2025-06-18) → \`Mcp-Session-Id\` → \`notifications/initialized\`;"
        echo "behind the initialize-era backend also one \`tools/call\` (portico then opens the client's own upstream session)."
        echo "$OPEN_CONCURRENCY sessions opened at a time, each worker on one keep-alive connection, closed once all are open (a session is its id, not a connection)."
        echo "RSS before = after a ${WRK_S} s wrk run (the baseline below, also the warm-up); after = 1 s after the last session opened and the client's connections closed."
        echo
        echo "| path (backend) | opened | failed | open time | sessions/s | per session p50 / p99 | RSS before | RSS after | **RSS per session** | RSS after wrk | portico open fds before → after |"
        echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
        for kind in modern legacy; do
            label="\`/mcp/bench\` (2026-07-28)"
            [[ $kind == legacy ]] && label="\`/mcp/legacy\` (initialize-era, + tools/call)"
            if [[ -n ${S[$kind.failed]:-} || -z ${S[$kind.open]:-} ]]; then
                echo "| $label | n/a (see notes) | | | | | | | | | |"; continue
            fi
            o=${S[$kind.open]}
            echo "| $label | $(jf .opened "$o") | $(jf .failed "$o") | $(jf .seconds "$o") s | $(jf .per_s "$o") | $(jf .open_p50_ms "$o") / $(jf .open_p99_ms "$o") ms | $(kib "${S[$kind.rss0]}") | $(kib "${S[$kind.rss1]}") | **$(per "${S[$kind.rss0]}" "${S[$kind.rss1]}" "$(jf .opened "$o")")** | $(kib "${S[$kind.rss2]}") | ${S[$kind.fd0]} → ${S[$kind.fd1]} |"
        done
        echo
        echo "Latency with the sessions held (same portico process, before and after opening them):"
        echo
        echo "| path the sessions are on | state | req/s | p50 | p99 | wrk errors |"
        echo "|---|---|---:|---:|---:|---:|"
        for kind in modern legacy; do
            [[ -n ${S[$kind.base]:-} ]] || continue
            echo "| \`/mcp/$([[ $kind == legacy ]] && echo legacy || echo bench)\` | no sessions (baseline) | $(lat "${S[$kind.base]}") |"
            [[ -n ${S[$kind.held]:-} ]] && echo "| | $(jf .opened "${S[$kind.open]}") sessions held | $(lat "${S[$kind.held]}") |"
        done
        echo
        echo "Cross-checks:"
        echo
        for kind in modern legacy; do
            [[ -n ${S[$kind.open]:-} ]] || continue
            f=${S[$kind.final]:-"{}"}
            if [[ $kind == modern ]]; then
                echo "- \`/mcp/bench\`: sessions are stateless (sealed ids, no server-side store; \`portico_legacy_sessions{backend=\"legacy\"}\` ${S[$kind.gauge0]} → ${S[$kind.gauge1]}); the bench backend saw ${S[$kind.disc]} \`server/discover\` while they opened; after the wrk run $(jf .verified "$f") of $(jf .verify_sample "$f") sampled sessions still answered a \`tools/call\`$(v=$(jq -c '.verify_errors // {}' <<<"$f"); [[ $v != "{}" ]] && echo " (errors: $v)")."
            else
                echo "- \`/mcp/legacy\`: \`portico_legacy_sessions{backend=\"legacy\"}\` ${S[$kind.gauge0]} before, ${S[$kind.gauge1]} after opening, ${S[$kind.gauge2]} after the wrk run (want $(jf .opened "${S[$kind.open]}") each time); the legacy backend saw ${S[$kind.upinit]} upstream \`initialize\`; after the wrk run $(jf .verified "$f") of $(jf .verify_sample "$f") sampled sessions still answered a \`tools/call\`$(v=$(jq -c '.verify_errors // {}' <<<"$f"); [[ $v != "{}" ]] && echo " (errors: $v)")."
            fi
            e=$(jq -c '.errors // {}' <<<"${S[$kind.open]}")
            [[ $e != "{}" ]] && echo "  Failures while opening: $e"
            echo "  Peak RSS (VmHWM) of that portico: $(kib "${S[$kind.hwm]:-}")."
        done
    fi
    if wants streams; then
        echo
        echo "## Open subscriptions/listen streams"
        echo
        echo "Each stream: a 2026-07-28 \`subscriptions/listen\` (\`toolsListChanged\`) on \`/mcp/bench\`, its own client connection (and portico's own upstream connection);"
        echo "the bench backend (\`--listen-every-ms $NOTIFY_MS\`) sends a \`notifications/tools/list_changed\` on each every $NOTIFY_MS ms. Notifications counted over ${STREAM_WINDOW} s once all were acknowledged,"
        echo "then from there to the end of the wrk run (\"during the wrk run\": lower when the load delays delivery; the client shares CPU $LOADGEN_CPUS with wrk)."
        echo
        if [[ -n ${L[failed]:-} || -z ${L[open]:-} ]]; then
            echo "n/a (see notes)"
        else
            o=${L[open]} f=${L[final]:-"{}"}
            expect=$(awk -v n="$(jf .opened "$o")" -v ms="$NOTIFY_MS" 'BEGIN { printf "%.1f", n * 1000 / ms }')
            echo "| streams open | failed | open time | RSS before | RSS after | **RSS per stream** | RSS after wrk | notifications/s (expected $expect) | during the wrk run | portico open fds before → after |"
            echo "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
            echo "| $(jf .opened "$o") | $(jf .failed "$o") | $(jf .open_seconds "$o") s | $(kib "${L[rss0]}") | $(kib "${L[rss1]}") | **$(per "${L[rss0]}" "${L[rss1]}" "$(jf .opened "$o")")** | $(kib "${L[rss2]}") | $(jf .notes_per_s "$o") | $(jf .hold_notes_per_s "$f") | ${L[fd0]} → ${L[fd1]} |"
            echo
            echo "| state | req/s | p50 | p99 | wrk errors |"
            echo "|---|---:|---:|---:|---:|"
            echo "| no streams (baseline) | $(lat "${L[base]}") |"
            echo "| $(jf .opened "$o") streams open | $(lat "${L[held]}") |"
            echo
            echo "Cross-checks: \`portico_listen_streams{endpoint=\"bench\"}\` ${L[gauge0]} before, ${L[gauge1]} with the streams open, ${L[gauge2]} after the wrk run, ${L[gauge3]:-–} once the client left;"
            echo "the backend saw ${L[upstream]} upstream \`subscriptions/listen\`; streams that ended early: $(jf .ended "$f")$(v=$(jq -c '.end_reasons // {}' <<<"$f"); [[ $v != "{}" ]] && echo " ($v)");"
            echo "notifications with a wrong \`subscriptionId\`: $(jf .bad_subscription_id "$f"); peak RSS (VmHWM): $(kib "${L[hwm]:-}")."
            e=$(jq -c '.errors // {}' <<<"$o")
            [[ $e != "{}" ]] && echo "Failures while opening: $e"
        fi
    fi
    if wants conns; then
        echo
        echo "## Idle keep-alive client connections"
        echo
        echo "Each connection: one 2026-07-28 \`tools/call\` on \`/mcp/bench\` (pass-through), then kept open and idle ($OPEN_CONCURRENCY opened at a time),"
        echo "in $CONN_BATCHES batches, each followed by ${CONN_IDLE_S} s of idling (connections that arrive over time rather than in one burst); RSS after = once the last batch has idled ${CONN_IDLE_S} s. This portico has \`header_read_timeout_ms = 600000\` (default 10000, which closes an idle keep-alive connection after 10 s)."
        echo
        if [[ -n ${N[failed]:-} || -z ${N[open]:-} ]]; then
            echo "n/a (see notes)"
        else
            o=${N[open]} f=${N[final]:-"{}"}
            echo "| connections | failed | open time | call p50 / p99 | RSS before | RSS after | **RSS per idle connection** | RSS after wrk | portico open fds before → after |"
            echo "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
            echo "| $(jf .opened "$o") | $(jf .failed "$o") | $(jf .open_seconds "$o") s | $(jf .call_p50_ms "$o") / $(jf .call_p99_ms "$o") ms | $(kib "${N[rss0]}") | $(kib "${N[rss1]}") | **$(per "${N[rss0]}" "${N[rss1]}" "$(jf .opened "$o")")** | $(kib "${N[rss2]}") | ${N[fd0]} → ${N[fd1]} |"
            echo
            echo "| state | req/s | p50 | p99 | wrk errors |"
            echo "|---|---:|---:|---:|---:|"
            echo "| no idle connections (baseline) | $(lat "${N[base]}") |"
            echo "| $(jf .opened "$o") idle connections | $(lat "${N[held]}") |"
            echo
            echo "Cross-checks: after the wrk run $(jf .verified "$f") of $(jf .verify_sample "$f") sampled idle connections answered a second \`tools/call\` on the same connection$(v=$(jq -c '.verify_errors // {}' <<<"$f"); [[ $v != "{}" ]] && echo " (errors: $v)"); peak RSS (VmHWM): $(kib "${N[hwm]:-}")."
            e=$(jq -c '.errors // {}' <<<"$o")
            [[ $e != "{}" ]] && echo "Failures while opening: $e"
        fi
    fi
    if wants soak; then
        echo
        echo "## Soak"
        echo
        if [[ ! -s $TMP/soak.tsv ]]; then
            echo "n/a (see notes)"
        else
            w=wrk
            echo "wrk -c $WRK_C for $SOAK_S s against \`/mcp/bench\`; portico's RSS every $SAMPLE_S s."
            echo
            echo "| whole soak | req/s | p50 | p99 | wrk errors |"
            echo "|---|---:|---:|---:|---:|"
            echo "| $SOAK_S s | $(lat "${K[wrk]}") |"
            errs=$(wrk_errors "${K[wrk]}")
            if [[ ${errs:-0} != 0 ]]; then
                echo
                echo "**wrk errors: $(jq -r '"\(.status) non-2xx, \(.timeout) timeouts, \(.connect) connect, \(.read) read, \(.write) write errors out of \(.requests) requests"' <<<"${K[wrk]}") (there must be none)**"
            fi
            # "Flat": the mean RSS of the last minute within 10 % of the mean of the second minute
            # (a shorter soak scales the minute down to a third of it).
            echo
            awk -F'\t' -v dur="$SOAK_S" '
                { t[NR] = $1; r[NR] = $2 }
                END {
                    w = dur >= 180 ? 60 : int(dur / 3)
                    for (i = 1; i <= NR; i++) {
                        if (t[i] >= w && t[i] < 2 * w) { a += r[i]; na++ }
                        if (t[i] > dur - w) { b += r[i]; nb++ }
                    }
                    what = w == 60 ? "the second minute" : sprintf("%d–%d s", w, 2 * w)
                    last = w == 60 ? "the last minute" : sprintf("the last %d s", w)
                    if (w < 1 || !na || !nb) { printf "Flat: n/a (too few samples; SOAK_S >= 180 gives the minute-based check)\n"; exit }
                    ma = a / na; mb = b / nb; d = (mb - ma) / ma * 100
                    printf "Flat: **%s** — mean RSS over %s %.1f MiB (%d sample(s)), over %s %.1f MiB (%d sample(s)): %+.1f %% (limit ±10 %%)%s\n",
                        (d <= 10 && d >= -10) ? "yes" : "NO", last, mb / 1024, nb, what, ma / 1024, na, d,
                        w == 60 ? "" : sprintf("; SOAK_S = %d < 180, so the windows are %d s instead of a minute", dur, w)
                }' "$TMP/soak.tsv"
            echo
            echo "| t (s) | RSS | open fds | wrk |"
            echo "|---:|---:|---:|---|"
            while IFS=$'\t' read -r t r f s; do
                echo "| $t | $(kib "$r") | $f | $s |"
            done <"$TMP/soak.tsv"
            echo
            echo "Peak RSS (VmHWM) at the end: $(kib "${K[hwm]:-}")."
        fi
    fi
    if [[ -s $TMP/notes.txt ]]; then
        echo
        echo "## Notes from the run"
        echo
        echo '```'
        cat "$TMP/notes.txt"
        echo '```'
    fi
} >"$TMP/report.md"

mkdir -p "$RESULTS_DIR"
cp "$TMP/report.md" "$RESULTS_DIR/scale.md"
echo
cat "$TMP/report.md"
say ""
say "written: $RESULTS_DIR/scale.md"
