#!/usr/bin/env bash
# portico's one-command benchmark: a fast in-repo MCP backend, nginx as a plain reverse proxy,
# and portico in several configurations, each driven by wrk at several concurrencies, rounds
# interleaved. Prints a markdown report and writes it to benches/results/latest.md.
#
#   benches/run.sh                      # default: 3 rounds x 5 s, c = 1 16 64 (~6 min max)
#   QUICK=1 benches/run.sh              # smoke test: 1 round x 2 s
#   TARGETS="direct nginx portico" CONCURRENCY=16 benches/run.sh
#   BASE_BIN=/path/to/old/portico TARGETS="direct nginx portico portico-base" benches/run.sh
#   BASE_BIN=... TARGETS="portico-legacy portico-legacy-base" benches/run.sh   # the bridge, before/after
#   BASE_BIN=... TARGETS="nginx-list portico-agg portico-agg-base" benches/run.sh   # aggregation, before/after
#   BASE_BIN=... TARGETS="nginx portico-agg-call portico-agg-call-base" benches/run.sh   # a call routed by an endpoint
#   BASE_BIN=... TARGETS="nginx portico-trace001 portico-trace001-base" benches/run.sh   # tracing, before/after
#   BASE_BIN=... TARGETS="nginx portico-verify portico-verify-base" benches/run.sh   # verify_body = "always", before/after
#   TARGETS="direct nginx-tls portico-tls nginx-h2 portico-h2" benches/run.sh   # TLS: wrk (h1), h2load (h2)
#   BASE_BIN=... TARGETS="nginx-tls portico-tls portico-tls-base nginx-h2 portico-h2 portico-h2-base" benches/run.sh   # TLS, before/after
#                                       # before/after: the same pass-through config on another build
#
# Every knob is an environment variable; see benches/README.md or the block below.
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BENCHES=$ROOT/benches

# ---------------------------------------------------------------- knobs
QUICK=${QUICK:-0}
if [[ $QUICK == 1 ]]; then _rounds=1 _duration=2; else _rounds=3 _duration=5; fi
ROUNDS=${ROUNDS:-$_rounds}                 # measured rounds per (target, concurrency)
DURATION=${DURATION:-$_duration}           # seconds per measurement
WARMUP=${WARMUP:-1}                        # seconds of unrecorded load before each measurement
CONCURRENCY=${CONCURRENCY:-"1 16 64"}      # wrk connections
DEFAULT_TARGETS="direct direct-list nginx nginx-list portico nginx-log portico-log nginx-tls portico-tls nginx-h2 portico-h2 direct-hyper nginx-hyper portico-hyper direct-py-call nginx-py-call portico-py-call portico-verify portico-cache portico-redis portico-agg portico-agg-cache portico-agg-call portico-legacy direct-py portico-py-cache"
ALL_TARGETS="direct direct-list nginx nginx-list portico portico-base portico-trace1 portico-trace001 portico-trace001-base portico-list portico-verify portico-verify-base portico-cache portico-redis portico-agg portico-agg-cache portico-agg-base portico-agg-call portico-agg-call-base portico-legacy portico-legacy-base nginx-log portico-log portico-log-base nginx-tls portico-tls portico-tls-base nginx-h2 portico-h2 portico-h2-base direct-hyper nginx-hyper portico-hyper direct-py-call nginx-py-call portico-py-call direct-py portico-py-cache"
TARGETS=${TARGETS:-$DEFAULT_TARGETS}
[[ $TARGETS == all ]] && TARGETS=$ALL_TARGETS
WORKERS=${WORKERS:-1}                      # portico [server] workers = nginx worker_processes
BACKEND_WORKERS=${BACKEND_WORKERS:-1}      # bench backend runtime threads (1 = current_thread)
PIN=${PIN:-1}                              # 0: no taskset at all
SERVER_CPUS=${SERVER_CPUS:-0}              # backend, nginx and portico run here
LOADGEN_CPUS=${LOADGEN_CPUS:-1}            # wrk runs here
LOADGEN_THREADS=${LOADGEN_THREADS:-}       # wrk -t (default: number of LOADGEN_CPUS; never > c)
ACCESS_LOG=${ACCESS_LOG:-0}                # 1: portico [log] access = true (to a file)
AGG_CACHE=${AGG_CACHE:-0}                  # 1: [cache] enabled in portico-agg too (portico-agg-cache always has it)
HALT_POLL_NS=${HALT_POLL_NS:-}             # guest_halt_poll_ns for the run (e.g. 200000); unset: the host's (common.sh)
WRK_TIMEOUT=${WRK_TIMEOUT:-2s}             # wrk --timeout: slower answers count as errors
BUSY_MARK=${BUSY_MARK:-10}                 # flag measurements where other processes used >= this % of a CPU
BUSY_RETRIES=${BUSY_RETRIES:-1}            # repeat such a measurement up to this many times...
MAX_RETRIES=${MAX_RETRIES:-12}             # ...and no more than this many repeats in the whole run
NO_BUILD=${NO_BUILD:-0}                    # 1: use existing binaries
RESULTS_DIR=${RESULTS_DIR:-$BENCHES/results}
KEEP_TMP=${KEEP_TMP:-0}                    # 1: keep configs and logs of the run
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
PORTICO_BIN=${PORTICO_BIN:-$TARGET_DIR/release/portico}
BACKEND_BIN=${BACKEND_BIN:-$TARGET_DIR/release/examples/bench_backend}
HYPER_BIN=${HYPER_BIN:-$TARGET_DIR/release/examples/hyper_backend}
BASE_BIN=${BASE_BIN:-}                     # target portico-base: another portico build (e.g. before a change)
# -tls / -h2 targets: nginx is pinned to this TLS 1.3 suite and group. It is what OpenSSL clients
# (wrk) ask for first and what portico (rustls, client's order) then picks; h2load (whose own
# default puts AES-128 first) is told to offer the same. run.sh checks what each server negotiates.
TLS_CIPHER=${TLS_CIPHER:-TLS_AES_256_GCM_SHA384}
TLS_GROUP=${TLS_GROUP:-X25519}

say() { printf '%s\n' "$*" >&2; }
die() { say "run.sh: $*"; exit 1; }
source "$BENCHES/common.sh"

# ---------------------------------------------------------------- targets
# target -> which server answers it, and which MCP method the load sends.
declare -A T_SERVER=(
    [direct]=b1 [direct-list]=b1 [nginx]=nginx [nginx-list]=nginx
    [portico]=pass [portico-base]=base [portico-trace1]=trace1 [portico-trace001]=trace001 [portico-trace001-base]=trace001base [portico-list]=pass [portico-verify]=verify [portico-verify-base]=verifybase [portico-cache]=cache
    [portico-redis]=redis
    [portico-agg]=agg [portico-agg-cache]=aggc [portico-agg-base]=aggbase [portico-agg-call]=agg [portico-agg-call-base]=aggbase [portico-legacy]=legacy [portico-legacy-base]=legacybase
    [direct-py]=py [portico-py-cache]=pycache
    [direct-hyper]=hb [nginx-hyper]=nginxh [portico-hyper]=passh
    [nginx-log]=nginxl [portico-log]=passlog [portico-log-base]=passlogbase
    [direct-py-call]=py [nginx-py-call]=nginxp [portico-py-call]=passp
    [nginx-tls]=nginxtls [nginx-h2]=nginxtls [portico-tls]=tls [portico-h2]=h2 [portico-tls-base]=tlsbase [portico-h2-base]=h2base
)
declare -A T_METHOD=(
    [direct]=tools/call [direct-list]=tools/list [nginx]=tools/call [nginx-list]=tools/list
    [portico]=tools/call [portico-base]=tools/call [portico-trace1]=tools/call [portico-trace001]=tools/call [portico-trace001-base]=tools/call [portico-list]=tools/list [portico-verify]=tools/call [portico-verify-base]=tools/call
    [portico-cache]=tools/list [portico-redis]=tools/list [portico-agg]=tools/list [portico-agg-cache]=tools/list [portico-agg-base]=tools/list
    [portico-agg-call]=tools/call [portico-agg-call-base]=tools/call
    [portico-legacy]=tools/call [portico-legacy-base]=tools/call [direct-py]=tools/list [portico-py-cache]=tools/list
    [direct-hyper]=tools/call [nginx-hyper]=tools/call [portico-hyper]=tools/call
    [nginx-log]=tools/call [portico-log]=tools/call [portico-log-base]=tools/call
    [direct-py-call]=tools/call [nginx-py-call]=tools/call [portico-py-call]=tools/call
    [nginx-tls]=tools/call [nginx-h2]=tools/call [portico-tls]=tools/call [portico-h2]=tools/call [portico-tls-base]=tools/call [portico-h2-base]=tools/call
)
declare -A T_PATH=(
    [direct]=/mcp [direct-list]=/mcp [nginx]=/mcp [nginx-list]=/mcp
    [portico]=/mcp/bench [portico-base]=/mcp/bench [portico-trace1]=/mcp/bench [portico-trace001]=/mcp/bench [portico-trace001-base]=/mcp/bench [portico-list]=/mcp/bench [portico-verify]=/mcp/bench [portico-verify-base]=/mcp/bench
    [portico-cache]=/mcp/bench [portico-redis]=/mcp/bench [portico-agg]=/mcp [portico-agg-cache]=/mcp [portico-agg-base]=/mcp
    [portico-agg-call]=/mcp [portico-agg-call-base]=/mcp
    [portico-legacy]=/mcp/legacy [portico-legacy-base]=/mcp/legacy [direct-py]=/mcp [portico-py-cache]=/mcp/py
    [direct-hyper]=/mcp [nginx-hyper]=/mcp [portico-hyper]=/mcp/hyper
    [nginx-log]=/mcp [portico-log]=/mcp/bench [portico-log-base]=/mcp/bench
    [direct-py-call]=/mcp [nginx-py-call]=/mcp [portico-py-call]=/mcp/py
    [nginx-tls]=/mcp [nginx-h2]=/mcp [portico-tls]=/mcp/bench [portico-h2]=/mcp/bench [portico-tls-base]=/mcp/bench [portico-h2-base]=/mcp/bench
)
# The backend whose /stats must move when the target is probed (cache: must not move).
declare -A T_BACKEND=(
    [direct]=b1 [direct-list]=b1 [nginx]=b1 [nginx-list]=b1 [portico]=b1 [portico-base]=b1 [portico-trace1]=b1 [portico-trace001]=b1 [portico-trace001-base]=b1 [portico-list]=b1
    [portico-verify]=b1 [portico-verify-base]=b1 [portico-cache]=b1 [portico-redis]=b1 [portico-agg]=b2 [portico-agg-cache]=b2 [portico-agg-base]=b2 [portico-agg-call]=b2 [portico-agg-call-base]=b2 [portico-legacy]=bl [portico-legacy-base]=bl
    [direct-py]=py [portico-py-cache]=py
    [direct-hyper]=hb [nginx-hyper]=hb [portico-hyper]=hb
    [nginx-log]=b1 [portico-log]=b1 [portico-log-base]=b1
    [direct-py-call]=py [nginx-py-call]=py [portico-py-call]=py
    [nginx-tls]=b1 [nginx-h2]=b1 [portico-tls]=b1 [portico-h2]=b1 [portico-tls-base]=b1 [portico-h2-base]=b1
)
# The tool a tools/call target calls: `echo` unless named here (an endpoint exposes each member's
# tools under its prefix; the call is routed to b2, which must see it).
declare -A T_TOOL=([portico-agg-call]=b2__echo [portico-agg-call-base]=b2__echo)
tool_of() { echo "${T_TOOL[$1]:-echo}"; }
# Every portico instance the script can start (one process per configuration).
INSTANCES="pass base trace1 trace001 trace001base verify verifybase cache redis agg aggc aggbase legacy legacybase passh passp passlog passlogbase tls h2 tlsbase h2base pycache"
for t in $TARGETS; do
    [[ -n ${T_SERVER[$t]:-} ]] || die "unknown target '$t' (known: $ALL_TARGETS, or TARGETS=all)"
done
[[ $ROUNDS =~ ^[1-9][0-9]*$ && $DURATION =~ ^[1-9][0-9]*$ && $WARMUP =~ ^[0-9]+$ ]] \
    || die "ROUNDS and DURATION must be positive integers, WARMUP an integer (seconds)"
for c in $CONCURRENCY; do [[ $c =~ ^[1-9][0-9]*$ ]] || die "bad CONCURRENCY value '$c'"; done
wants() { local s; for t in $TARGETS; do s=${T_SERVER[$t]}; [[ $s == "$1" ]] && return 0; done; return 1; }
# How a target is loaded: "http" (wrk, plain), "tls" (wrk, HTTP/1.1 over TLS), "h2" (h2load, h2 over TLS).
proto_of() { case $1 in *-tls | *-tls-base) echo tls ;; *-h2 | *-h2-base) echo h2 ;; *) echo http ;; esac; }
wants_proto() { local t; for t in $TARGETS; do [[ $(proto_of "$t") == "$1" ]] && return 0; done; return 1; }
WANTS_TLS=0; if wants_proto tls || wants_proto h2; then WANTS_TLS=1; fi

# ---------------------------------------------------------------- prerequisites
missing=()
command -v wrk >/dev/null || missing+=(wrk)
command -v curl >/dev/null || missing+=(curl)
command -v jq >/dev/null || missing+=(jq)
command -v taskset >/dev/null || missing+=(util-linux)
if { wants nginx || wants nginxh || wants nginxp || wants nginxl || wants nginxtls; } && ! command -v nginx >/dev/null && [[ ! -x /usr/sbin/nginx ]]; then missing+=(nginx); fi
if wants redis && ! command -v redis-server >/dev/null; then missing+=(redis-server); fi
if ((WANTS_TLS)) && ! command -v openssl >/dev/null; then missing+=(openssl); fi
if wants_proto h2 && ! command -v h2load >/dev/null; then missing+=(nghttp2-client); fi
if ((${#missing[@]})); then
    if [[ $(id -u) != 0 ]] || ! command -v apt-get >/dev/null; then
        die "missing: ${missing[*]} (install them, e.g. apt-get install -y ${missing[*]})"
    fi
    say "installing ${missing[*]} (apt-get)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null 2>&1 \
        || { apt-get update -qq >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null; } \
        || die "apt-get install ${missing[*]} failed"
fi
NGINX=$(command -v nginx || echo /usr/sbin/nginx)

NCPU=$(nproc)
if [[ $PIN == 1 ]] && ((NCPU < 2)); then say "only $NCPU CPU: not pinning"; PIN=0; fi
[[ -n $LOADGEN_THREADS ]] || LOADGEN_THREADS=$(cpu_count "$LOADGEN_CPUS")

# ---------------------------------------------------------------- build
if [[ $NO_BUILD != 1 ]]; then
    say "building portico and the bench backend (cargo build --release)..."
    (cd "$ROOT" && cargo build --release --quiet --bin portico --example bench_backend) \
        || die "cargo build failed (NO_BUILD=1 PORTICO_BIN=... BACKEND_BIN=... to use existing binaries)"
fi
[[ -x $PORTICO_BIN ]] || die "no portico binary at $PORTICO_BIN"
[[ -x $BACKEND_BIN ]] || die "no bench backend binary at $BACKEND_BIN"
if wants hb || wants passh; then [[ -x $HYPER_BIN ]] || die "no hyper backend binary at $HYPER_BIN"; fi
if wants base || wants passlogbase || wants legacybase || wants aggbase || wants trace001base || wants verifybase || wants tlsbase || wants h2base; then [[ -n $BASE_BIN && -x $BASE_BIN ]] || die "targets portico-base, portico-legacy-base, portico-agg-base, portico-trace001-base, portico-verify-base, portico-tls-base and portico-h2-base (and portico-log-base) need BASE_BIN=<another portico binary>"; fi

# ---------------------------------------------------------------- processes
TMP=$(mktemp -d /tmp/portico-bench.XXXXXX) || die "mktemp failed"
chmod 755 "$TMP"   # nginx workers (user nobody) must reach their temp dirs
declare -A PID=()  # server name -> pid
ALL_PIDS=()        # everything started, for cleanup
NGINX_MASTER=

before_cleanup() { [[ -n $NGINX_MASTER ]] && kill -QUIT "$NGINX_MASTER" 2>/dev/null; }
install_cleanup
halt_poll_apply

pin_loadgen() { if [[ $PIN == 1 ]]; then taskset -c "$LOADGEN_CPUS" "$@"; else "$@"; fi; }

# start NAME CMD... : background process pinned to the server CPUs, logs in $TMP/NAME.{out,err}
start() {
    local name=$1; shift
    local cmd=("$@")
    [[ $PIN == 1 ]] && cmd=(taskset -c "$SERVER_CPUS" "$@")
    # A plain command (not a function) in the background: $! is the server itself, since taskset
    # execs it.
    "${cmd[@]}" >"$TMP/$name.out" 2>"$TMP/$name.err" &
    PID[$name]=$!
    ALL_PIDS+=("$!")
}




# A fixed key, so portico does not warn about generating one (legacy sessions are not the topic).
SESSION_KEY=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
declare -A PORT=()      # server name -> port
declare -A DOWN=()      # server name -> why it is not usable
declare -A IDLE_RSS=()  # server name -> VmRSS (kB) right after start

start_backend() { # NAME ARGS...
    local name=$1 _; shift
    start "$name" "$BACKEND_BIN" --port 0 --workers "$BACKEND_WORKERS" "$@"
    for _ in $(seq 200); do
        if grep -q '^LISTENING ' "$TMP/$name.out" 2>/dev/null; then
            PORT[$name]=$(awk '/^LISTENING /{print $2; exit}' "$TMP/$name.out")
            IDLE_RSS[$name]=$(status_kb "${PID[$name]}" VmRSS)
            return 0
        fi
        alive "${PID[$name]}" || break
        sleep 0.05
    done
    DOWN[$name]="backend did not start: $(last_err "$TMP/$name.err")"
    return 1
}


# A generated portico config. $1 = instance name, $2 = port; the rest is per instance.
portico_conf() {
    local name=$1 port=$2 cache=false
    case $name in cache | redis | pycache) cache=true ;; agg) [[ $AGG_CACHE == 1 ]] && cache=true ;; aggc) cache=true ;; legacy | legacybase) cache=true ;; esac
    cat <<EOF
# generated by benches/run.sh: instance "$name"
[server]
listen = "127.0.0.1:$port"
workers = $WORKERS
drain_timeout_ms = 1000
$([[ $name == tls || $name == h2 || $name == tlsbase || $name == h2base ]] && printf 'tls_cert = "%s"\ntls_key = "%s"\n' "$TLS_CERT" "$TLS_KEY")

[log]
access = $([[ $ACCESS_LOG == 1 || $name == passlog || $name == passlogbase ]] && echo true || echo false)
level = "info"

[sessions]
key = "$SESSION_KEY"

[cache]
enabled = $cache
EOF
    # The Redis tier alone: no local tier, so every request is a Redis round trip.
    [[ $name == redis ]] && printf 'redis_url = "redis://127.0.0.1:%s"\nlocal = false\n' "${PORT[redisd]}"
    case $name in
    trace1) printf '\n[tracing]\notlp_endpoint = "http://127.0.0.1:%s/v1/traces"\nsampling_ratio = 1.0\n' "${PORT[sink]}" ;;
    trace001 | trace001base) printf '\n[tracing]\notlp_endpoint = "http://127.0.0.1:%s/v1/traces"\nsampling_ratio = 0.01\n' "${PORT[sink]}" ;;
    esac
    echo
    case $name in
    pass | base | trace1 | trace001 | trace001base | verify | verifybase | cache | redis | passlog | passlogbase | tls | h2 | tlsbase | h2base)
        cat <<EOF
[[backends]]
name = "bench"
url = "http://127.0.0.1:${PORT[b1]}/mcp"
protocol = "modern"
EOF
        [[ $name == verify || $name == verifybase ]] && echo 'verify_body = "always"'
        ;;
    agg | aggc | aggbase)
        local b
        for b in b1 b2 b3; do
            printf '[[backends]]\nname = "%s"\nurl = "http://127.0.0.1:%s/mcp"\nprotocol = "modern"\n\n' \
                "$b" "${PORT[$b]}"
        done
        printf '[[endpoints]]\npath = "/mcp"\nbackends = ["b1", "b2", "b3"]\n'
        ;;
    passh)
        cat <<EOF
[[backends]]
name = "hyper"
url = "http://127.0.0.1:${PORT[hb]}/mcp"
protocol = "modern"
EOF
        ;;
    pycache | passp)
        cat <<EOF
[[backends]]
name = "py"
url = "http://127.0.0.1:${PORT[py]}/mcp"
protocol = "modern"
EOF
        ;;
    legacy | legacybase)
        cat <<EOF
[[backends]]
name = "legacy"
url = "http://127.0.0.1:${PORT[bl]}/mcp"
protocol = "legacy"
EOF
        ;;
    esac
}

start_portico() { # instance name
    local name=$1 conf=$TMP/portico-$1.toml bin=$PORTICO_BIN
    [[ $name == base || $name == passlogbase || $name == legacybase || $name == aggbase || $name == trace001base || $name == verifybase || $name == tlsbase || $name == h2base ]] && bin=$BASE_BIN
    pick_port; PORT[$name]=$FREE_PORT
    portico_conf "$name" "$FREE_PORT" >"$conf"
    if ! "$bin" --check --config "$conf" >"$TMP/$name.check" 2>&1; then
        DOWN[$name]="config rejected: $(last_err "$TMP/$name.check")"
        return 1
    fi
    start "$name" "$bin" --config "$conf"
    if ! wait_port "$FREE_PORT" "${PID[$name]}" 15; then
        DOWN[$name]="portico did not start: $(last_err "$TMP/$name.err")"
        return 1
    fi
    IDLE_RSS[$name]=$(status_kb "${PID[$name]}" VmRSS)
}

start_nginx() {
    local dir=$TMP/nginx
    mkdir -p "$dir"
    pick_port; PORT[nginx]=$FREE_PORT
    # One nginx, one worker, a server block per backend: the same proxy config in front of
    # each (only one target is loaded at a time).
    local extra=$dir/extra.conf b plain=$dir/plain.tmpl
    : >"$extra"
    # The template without its TLS server block: the copies for other backends never get it.
    sed '/# @TLS_SERVER@ begin/,/# @TLS_SERVER@ end/d' "$BENCHES/nginx.conf.tmpl" >"$plain"
    for b in hb py; do
        [[ -n ${PORT[$b]:-} ]] || continue
        pick_port; PORT[nginx$b]=$FREE_PORT
        sed -n '/^    upstream mcp_backend {/,/^    }/p; /^    server {/,/^    }/p' "$plain" \
            | sed -e "s|mcp_backend|mcp_$b|g" -e "s|@LISTEN_PORT@|${PORT[nginx$b]}|g" \
                -e "s|@BACKEND_PORT@|${PORT[$b]}|g" >>"$extra"
    done
    # nginx-log: the bench backend again, with a buffered access log of the same fields as
    # portico's access line (the MCP method from its header; nginx does not read bodies).
    pick_port; PORT[nginxl]=$FREE_PORT
    sed -n '/^    server {/,/^    }/p' "$plain" \
        | sed -e "s|@LISTEN_PORT@|${PORT[nginxl]}|g" \
            -e "s|^        location / {|        access_log $dir/access.log portico buffer=64k flush=1s;\n        location / {|" >>"$extra"
    [[ -n ${PORT[nginxhb]:-} ]] && PORT[nginxh]=${PORT[nginxhb]}
    [[ -n ${PORT[nginxpy]:-} ]] && PORT[nginxp]=${PORT[nginxpy]}
    # nginx-tls / nginx-h2: the template's TLS server block (h2 + http/1.1 by ALPN on one listener,
    # like portico's), with the run's certificate. "http2 on;" exists from nginx 1.25.1; older
    # versions take the "http2" parameter of "listen" instead.
    local tmpl=$plain tls_sed=()
    if ((WANTS_TLS)) && [[ -z ${DOWN[nginxtls]:-} ]]; then
        pick_port; PORT[nginxtls]=$FREE_PORT
        tmpl=$BENCHES/nginx.conf.tmpl
        local ver
        ver=$("$NGINX" -v 2>&1 | sed 's|^.*nginx/||; s| .*||')
        if [[ $(printf '%s\n' 1.25.1 "$ver" | sort -V | head -n 1) == 1.25.1 ]]; then
            tls_sed=(-e "s|@LISTEN_HTTP2@||")
        else
            tls_sed=(-e "s|@LISTEN_HTTP2@| http2|" -e '/^        http2 on;/d')
        fi
        tls_sed+=(-e "s|@TLS_PORT@|${PORT[nginxtls]}|g" -e "s|@TLS_CERT@|$TLS_CERT|g" -e "s|@TLS_KEY@|$TLS_KEY|g"
            -e "s|@TLS_CIPHER@|$TLS_CIPHER|g" -e "s|@TLS_GROUP@|$TLS_GROUP|g")
    fi
    sed -e "s|@WORKERS@|$WORKERS|g" -e "s|@PREFIX@|$dir|g" \
        -e "s|@LISTEN_PORT@|${PORT[nginx]}|g" -e "s|@BACKEND_PORT@|${PORT[b1]}|g" \
        "${tls_sed[@]}" -e "\|# @EXTRA_SERVERS@|r $extra" \
        "$tmpl" >"$dir/nginx.conf"
    [[ -n ${PORT[nginxh]:-} ]] || DOWN[nginxh]=${DOWN[hb]:-"no hyper backend"}
    [[ -n ${PORT[nginxp]:-} ]] || DOWN[nginxp]=${DOWN[py]:-"no Python SDK server"}
    if ! "$NGINX" -t -q -p "$dir" -e "$dir/error.log" -c "$dir/nginx.conf" >"$TMP/nginx.check" 2>&1; then
        DOWN[nginx]="nginx config rejected: $(last_err "$TMP/nginx.check")"
        DOWN[nginxh]=${DOWN[nginx]} DOWN[nginxp]=${DOWN[nginx]} DOWN[nginxl]=${DOWN[nginx]} DOWN[nginxtls]=${DOWN[nginx]}
        return 1
    fi
    start nginx "$NGINX" -p "$dir" -e "$dir/error.log" -c "$dir/nginx.conf"
    NGINX_MASTER=${PID[nginx]}
    PID[nginxh]=$NGINX_MASTER PID[nginxp]=$NGINX_MASTER PID[nginxl]=$NGINX_MASTER PID[nginxtls]=$NGINX_MASTER
    if ! wait_port "${PORT[nginx]}" "$NGINX_MASTER" 10; then
        DOWN[nginx]="nginx did not start: $(last_err "$TMP/nginx.err") $(last_err "$dir/error.log")"
        DOWN[nginxh]=${DOWN[nginx]} DOWN[nginxp]=${DOWN[nginx]} DOWN[nginxl]=${DOWN[nginx]} DOWN[nginxtls]=${DOWN[nginx]}
        return 1
    fi
    sleep 0.2
    local w
    for w in $(pgrep -P "$NGINX_MASTER"); do ALL_PIDS+=("$w"); done
    IDLE_RSS[nginx]=$(nginx_rss VmRSS)
}

nginx_rss() { # sum over the nginx worker processes
    local sum=0 w v
    for w in $(pgrep -P "$NGINX_MASTER" 2>/dev/null); do
        v=$(status_kb "$w" "$1"); sum=$((sum + ${v:-0}))
    done
    echo "$sum"
}

# ---------------------------------------------------------------- probes
mcp_body() { # METHOD [TOOL]: the exact body benches/mcp.lua sends
    local meta='"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}'
    if [[ $1 == tools/call ]]; then
        printf '{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"%s","arguments":{"text":"hello"},%s}}' "${2:-echo}" "$meta"
    else
        printf '{"jsonrpc":"2.0","id":1,"method":"%s","params":{%s}}' "$1" "$meta"
    fi
}

backend_count() { # SERVER METHOD -> how many METHOD requests that bench backend has answered
    local n
    n=$(curl -s -m 2 "http://127.0.0.1:${PORT[$1]}/stats" | jq -r --arg m "$2" '.[$m] // .requests[$m] // 0' 2>/dev/null)
    echo "${n:-0}"
}

PROBE_REASON=
PROBE_TOOLS=0
# probe URL METHOD [PROTO] [TOOL]: one request like wrk's; 0 if it is an HTTP 200 carrying a
# JSON-RPC result. PROTO tls: HTTP/1.1 over TLS (verified against the run's certificate); h2: h2
# by ALPN. TOOL: the tool a tools/call calls (echo).
probe() {
    local url=$1 method=$2 proto=${3:-http} tool=${4:-echo} code ctype json msg out version want=
    local extra=()
    [[ $method == tools/call ]] && extra=(-H "Mcp-Name: $tool")
    case $proto in
    tls) extra+=(--cacert "$TLS_CERT" --http1.1); want=1.1 ;;
    h2) extra+=(--cacert "$TLS_CERT" --http2); want=2 ;;
    esac
    out=$(curl -sS -m 5 -o "$TMP/probe.body" -D "$TMP/probe.head" -w '%{http_code} %{http_version}' \
        -H 'Content-Type: application/json' -H 'Accept: application/json, text/event-stream' \
        -H 'MCP-Protocol-Version: 2026-07-28' -H "Mcp-Method: $method" "${extra[@]}" \
        --data-binary "$(mcp_body "$method" "$tool")" "$url" 2>"$TMP/probe.err")
    read -r code version <<<"$out"
    if [[ -z $code || $code == 000 ]]; then
        PROBE_REASON="request failed: $(last_err "$TMP/probe.err")"; return 1
    fi
    if [[ -n $want && $version != "$want" ]]; then
        PROBE_REASON="answered over HTTP/$version, not HTTP/$want"; return 1
    fi
    ctype=$(awk -F': *' 'tolower($1) == "content-type" {print $2}' "$TMP/probe.head" | tr -d '\r')
    if [[ $ctype == text/event-stream* ]]; then
        json=$(sed -n 's/^data: *//p' "$TMP/probe.body" | tail -n 1)
    else
        json=$(cat "$TMP/probe.body")
    fi
    if [[ $code != 200 ]]; then
        msg=$(jq -r 'if .error then "\(.error.code): \(.error.message)" else empty end' <<<"$json" 2>/dev/null)
        [[ -n $msg ]] || msg=$(head -c 100 <<<"$json" | tr '\n' ' ')
        PROBE_REASON="HTTP $code${msg:+: $msg}"; return 1
    fi
    if ! jq -e . >/dev/null 2>&1 <<<"$json"; then
        PROBE_REASON="HTTP 200 but not JSON ($ctype): $(head -c 80 <<<"$json" | tr '\n' ' ')"; return 1
    fi
    msg=$(jq -r 'if .error then "\(.error.code): \(.error.message)" else empty end' <<<"$json")
    if [[ -n $msg ]]; then PROBE_REASON="JSON-RPC error $msg"; return 1; fi
    if ! jq -e '.jsonrpc == "2.0" and .id == 1 and (.result | type == "object")' >/dev/null <<<"$json"; then
        PROBE_REASON="HTTP 200 without a JSON-RPC result for id 1"; return 1
    fi
    if [[ $method == tools/list ]]; then
        PROBE_TOOLS=$(jq '.result.tools | length' <<<"$json" 2>/dev/null || echo 0)
        ((PROBE_TOOLS > 0)) || { PROBE_REASON="tools/list result has no tools"; return 1; }
    elif [[ $method == tools/call ]]; then
        jq -e '.result.content[0].text | type == "string"' >/dev/null <<<"$json" \
            || { PROBE_REASON="tools/call result has no text content"; return 1; }
    fi
    PROBE_REASON=
    return 0
}

target_url() {
    # TLS targets by name: wrk would send the IP address as SNI, which TLS does not allow (SNI names hosts only)
    # and which rustls logs a warning about on every connection. The certificate is for both.
    if [[ $(proto_of "$1") == http ]]; then
        echo "http://127.0.0.1:${PORT[${T_SERVER[$1]}]}${T_PATH[$1]}"
    else
        echo "https://localhost:${PORT[${T_SERVER[$1]}]}${T_PATH[$1]}"
    fi
}

# What a TLS server negotiates with the load generator. wrk is an OpenSSL client with OpenSSL's
# defaults (no ALPN), as is openssl s_client: so s_client sees what wrk gets. h2load sets its own
# suites/groups (run.sh passes TLS_CIPHER/TLS_GROUP) and prints what it negotiated: a one-request
# h2load run shows that, and that the request succeeds over h2 (the curl probe checked the answer).
declare -A TLS_INFO=()   # target -> "TLSv1.3 TLS_AES_256_GCM_SHA384 X25519 (ALPN ...)"
tls_check() { # TARGET
    local t=$1 port=${PORT[${T_SERVER[$1]}]} out p c k a
    if [[ $(proto_of "$t") == tls ]]; then
        out=$(timeout 10 openssl s_client -connect "localhost:$port" -CAfile "$TLS_CERT" </dev/null 2>&1)
        p=$(sed -n 's/^New, \([^,]*\), Cipher is .*/\1/p' <<<"$out" | head -n 1)
        c=$(sed -n 's/^New, [^,]*, Cipher is //p' <<<"$out" | head -n 1)
        k=$(sed -n 's/^Server Temp Key: \([^,]*\),.*/\1/p' <<<"$out" | head -n 1)
        a=$(sed -n 's/^ALPN protocol: //p' <<<"$out" | head -n 1)
        [[ -n $c && $c != "(NONE)" ]] || { PROBE_REASON="openssl s_client: no TLS session: $(grep -m1 -i error <<<"$out")"; return 1; }
        grep -q 'Verify return code: 0 (ok)' <<<"$out" || { PROBE_REASON="openssl s_client: certificate not verified: $(grep -m1 'Verify return code' <<<"$out")"; return 1; }
        TLS_INFO[$t]="$p $c ${k:-?} (openssl s_client like wrk: no ALPN offered${a:+, got $a})"
    else
        out=$(MCP_METHOD=${T_METHOD[$t]} TLS_CIPHER=$TLS_CIPHER TLS_GROUP=$TLS_GROUP H2_TIMEOUT=$WRK_TIMEOUT \
            timeout 20 "$BENCHES/h2load.sh" "$(target_url "$t")" 1 1 0 2>&1)
        local json
        json=$(sed -n 's/^BENCHJSON //p' <<<"$out")
        if [[ -z $json ]]; then PROBE_REASON="h2load: $(tail -n 1 <<<"$out")"; return 1; fi
        if ! jq -e '.requests > 0 and (.connect + .read + .write + .status + .timeout) == 0' >/dev/null <<<"$json"; then
            PROBE_REASON="h2load: errors: $json"; return 1
        fi
        p=$(sed -n 's/^TLS Protocol: //p' <<<"$out" | head -n 1)
        c=$(sed -n 's/^Cipher: //p' <<<"$out" | head -n 1)
        k=$(sed -n 's/^Server Temp Key: \([^ ]*\).*/\1/p' <<<"$out" | head -n 1)
        a=$(sed -n 's/^Application protocol: //p' <<<"$out" | head -n 1)
        TLS_INFO[$t]="$p $c ${k:-?} (h2load, ALPN $a)"
    fi
    return 0
}

declare -A NA=()   # target -> reason it is not measured
BASE_TOOLS=0       # tools in one backend's list

check_target() { # TARGET: probes it; on failure records NA[TARGET]
    local t=$1 s=${T_SERVER[$1]} m=${T_METHOD[$1]} be=${T_BACKEND[$1]} before after
    if [[ -n ${DOWN[$s]:-} ]]; then NA[$t]=${DOWN[$s]}; return 1; fi
    if [[ $t == portico-cache || $t == portico-redis || $t == portico-py-cache || $t == portico-agg-cache ]]; then
        # Fill the cache, then the repeat must not reach the backend.
        probe "$(target_url "$t")" "$m" || { NA[$t]=$PROBE_REASON; return 1; }
        before=$(backend_count "$be" "$m")
        probe "$(target_url "$t")" "$m" || { NA[$t]=$PROBE_REASON; return 1; }
        after=$(backend_count "$be" "$m")
        if ((after > before)); then
            NA[$t]="not a cache hit: the repeated tools/list reached the backend"; return 1
        fi
        if [[ $t == portico-agg-cache ]] && ((PROBE_TOOLS != 3 * BASE_TOOLS)); then
            NA[$t]="aggregated list has $PROBE_TOOLS tools, want 3 x $BASE_TOOLS"; return 1
        fi
        return 0
    fi
    before=$(backend_count "$be" "$m")
    probe "$(target_url "$t")" "$m" "$(proto_of "$t")" "$(tool_of "$t")" || { NA[$t]=$PROBE_REASON; return 1; }
    after=$(backend_count "$be" "$m")
    if ((after <= before)) && [[ $t != portico-agg || $AGG_CACHE != 1 ]]; then
        NA[$t]="answered, but the request never reached backend $be"; return 1
    fi
    if [[ $t == portico-agg* && $m == tools/list ]] && ((PROBE_TOOLS != 3 * BASE_TOOLS)); then
        NA[$t]="aggregated list has $PROBE_TOOLS tools, want 3 x $BASE_TOOLS"; return 1
    fi
    if [[ $(proto_of "$t") != http ]]; then
        tls_check "$t" || { NA[$t]=$PROBE_REASON; return 1; }
    fi
    return 0
}

# ---------------------------------------------------------------- start everything
say "temp dir: $TMP"
# TLS targets: one self-signed certificate per run (ECDSA P-256, for 127.0.0.1 and localhost),
# served by nginx and portico alike.
TLS_CERT=$TMP/tls/cert.pem TLS_KEY=$TMP/tls/key.pem
if ((WANTS_TLS)); then
    mkdir -p "$TMP/tls"
    if ! openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
        -keyout "$TLS_KEY" -out "$TLS_CERT" -subj /CN=127.0.0.1 \
        -addext 'subjectAltName=IP:127.0.0.1,DNS:localhost' >"$TMP/tls/openssl.log" 2>&1; then
        DOWN[tls]="no certificate: openssl req failed: $(last_err "$TMP/tls/openssl.log")"
        DOWN[h2]=${DOWN[tls]} DOWN[nginxtls]=${DOWN[tls]} DOWN[tlsbase]=${DOWN[tls]} DOWN[h2base]=${DOWN[tls]}
    fi
fi
start_backend b1 --name bench-b1 || die "${DOWN[b1]}"
if wants agg || wants aggc || wants aggbase; then start_backend b2 --name bench-b2; start_backend b3 --name bench-b3; fi
# The span sink of the traced instances: another bench backend (it answers any POST with 200).
if wants trace1 || wants trace001 || wants trace001base; then start_backend sink --name bench-sink; fi
if wants legacy || wants legacybase; then start_backend bl --legacy --name bench-legacy; fi
if wants hb || wants nginxh || wants passh; then
    # The second Rust backend: a plain hyper server (examples/hyper_backend.rs), untuned.
    start hb "$HYPER_BIN" --port 0
    for _ in $(seq 200); do
        if grep -q '^LISTENING ' "$TMP/hb.out" 2>/dev/null; then
            PORT[hb]=$(awk '/^LISTENING /{print $2; exit}' "$TMP/hb.out")
            IDLE_RSS[hb]=$(status_kb "${PID[hb]}" VmRSS)
            break
        fi
        alive "${PID[hb]}" || break
        sleep 0.05
    done
    [[ -n ${PORT[hb]:-} ]] || DOWN[hb]="hyper backend did not start: $(last_err "$TMP/hb.err")"
fi
if wants py || wants pycache || wants nginxp || wants passp; then
    # The official Python SDK server (tests/interop), a realistic backend: ttlMs 60 s, public.
    if "$ROOT/tests/interop/setup.sh" >"$TMP/py-setup.log" 2>&1; then
        start py "$ROOT/tests/interop/.venv/bin/python" "$ROOT/tests/interop/py_server.py" \
            --port 0 --ttl-ms 60000 --cache-scope public
        for _ in $(seq 300); do
            if grep -q '^LISTENING ' "$TMP/py.out" 2>/dev/null; then
                PORT[py]=$(awk '/^LISTENING /{print $2; exit}' "$TMP/py.out"); break
            fi
            alive "${PID[py]}" || break
            sleep 0.05
        done
        [[ -n ${PORT[py]:-} ]] || DOWN[py]="python server did not start: $(last_err "$TMP/py.err")"
    else
        DOWN[py]="tests/interop/setup.sh failed: $(last_err "$TMP/py-setup.log")"
    fi
fi
if wants nginx || wants nginxh || wants nginxp || wants nginxl || wants nginxtls; then start_nginx; fi
if wants redis; then
    pick_port; PORT[redisd]=$FREE_PORT
    start redisd redis-server --port "$FREE_PORT" --bind 127.0.0.1 --save '' --appendonly no
    wait_port "$FREE_PORT" "${PID[redisd]}" 10 \
        || DOWN[redis]="redis-server did not start: $(last_err "$TMP/redisd.out")"
fi
for inst in $INSTANCES; do
    if wants "$inst"; then
        [[ -n ${DOWN[$inst]:-} ]] && continue
        if [[ ( $inst == agg* && ( -n ${DOWN[b2]:-} || -n ${DOWN[b3]:-} ) ) ]]; then
            DOWN[$inst]="${DOWN[b2]:-${DOWN[b3]}}"; continue
        fi
        if [[ $inst == legacy* && -n ${DOWN[bl]:-} ]]; then DOWN[$inst]=${DOWN[bl]}; continue; fi
        if [[ ( $inst == pycache || $inst == passp ) && -n ${DOWN[py]:-} ]]; then DOWN[$inst]=${DOWN[py]}; continue; fi
        if [[ $inst == passh && -n ${DOWN[hb]:-} ]]; then DOWN[passh]=${DOWN[hb]}; continue; fi
        start_portico "$inst"
    fi
done

probe "http://127.0.0.1:${PORT[b1]}/mcp" tools/list || die "the bench backend fails its own probe: $PROBE_REASON"
BASE_TOOLS=$PROBE_TOOLS
LIVE=()
for t in $TARGETS; do
    if check_target "$t"; then LIVE+=("$t"); say "probe ok   $t"; else say "probe FAIL $t: ${NA[$t]}"; fi
done
# Where each portico log stood before the load, to tell startup messages from load-time ones.
declare -A LOG_MARK=()
for s in $INSTANCES; do
    [[ -f $TMP/$s.err ]] && LOG_MARK[$s]=$(wc -l <"$TMP/$s.err")
done

# ---------------------------------------------------------------- header
CLK_TCK=$(getconf CLK_TCK 2>/dev/null || echo 100)
cpu_snapshot() { # "<CPU ticks of processes outside the benchmark> <steal ticks>"
    # utime+stime+cutime+cstime of every process that is neither ours nor a kernel thread; a
    # short-lived process shows up in its parent's cutime once reaped. wrk and the script's
    # helpers are reaped into this shell ($$), which is excluded.
    cat /proc/[0-9]*/stat 2>/dev/null | awk -v ours=" $$ ${ALL_PIDS[*]} " '
        { pid = $1; s = $0; sub(/^.*\) /, "", s); split(s, f, " ")
          if (pid == 2 || f[2] == 2 || index(ours, " " pid " ")) next
          t += f[12] + f[13] + f[14] + f[15] }
        END { printf "%d ", t }'
    awk '$1 == "cpu" { print $9 }' /proc/stat
}
read -r f0 _ < <(cpu_snapshot); sleep 2; read -r f1 _ < <(cpu_snapshot)
PRE_LOAD=$(( (f1 > f0 ? f1 - f0 : 0) * 100 / (2 * CLK_TCK) ))
if ((PRE_LOAD >= BUSY_MARK)); then
    say "WARNING: other processes use ${PRE_LOAD}% of a CPU right now; the numbers will be noisy"
fi
ncs=$(wc -w <<<"$CONCURRENCY")
est=$(( ${#LIVE[@]} * ncs * ROUNDS * (WARMUP + DURATION) ))
commit=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)
if [[ $commit != unknown ]] && [[ -n $(git -C "$ROOT" status --porcelain --untracked-files=no 2>/dev/null) ]]; then
    commit="$commit (uncommitted changes)"
fi
cpu_model=$(awk -F': *' '/^model name/ {print $2; exit}' /proc/cpuinfo)
nginx_ver=$("$NGINX" -v 2>&1 | sed 's/^nginx version: //')
wrk_ver=$(wrk -v 2>&1 | head -n 1 | awk '{print $2}')
if [[ $PIN == 1 ]]; then
    layout="backend, nginx and portico on CPU $SERVER_CPUS; wrk on CPU $LOADGEN_CPUS ($LOADGEN_THREADS thread(s), never more than c)"
else
    layout="no CPU pinning (PIN=0); wrk with $LOADGEN_THREADS thread(s)"
fi
{
    echo "# portico benchmark"
    echo
    echo "- date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
    echo "- portico commit: $commit"
    echo "- host: $(uname -r), $cpu_model, $NCPU CPU(s); before the run, other processes used ${PRE_LOAD}% of a CPU$( ((PRE_LOAD >= BUSY_MARK)) && echo " (**busy machine: expect noise**)")"
    echo "- tools: $nginx_ver, wrk $wrk_ver, $("$PORTICO_BIN" --version 2>/dev/null)$(wants_proto h2 && echo ", $(h2load --version 2>/dev/null | head -n 1)")$( ((WANTS_TLS)) && echo ", $(openssl version 2>/dev/null | awk '{print $1, $2}')")"
    echo "- layout: $layout"
    echo "- guest halt polling (\`guest_halt_poll_ns\`): $(halt_poll_now)$([[ -n ${HALT_POLL_NS:-} ]] && echo " for this run (\`HALT_POLL_NS\`; the host's value, $HALT_POLL_WAS, restored after)" || echo " (the host's own setting)")"
    echo "- threads: portico \`workers = $WORKERS\`, nginx \`worker_processes $WORKERS\`, backend $BACKEND_WORKERS ($([[ $BACKEND_WORKERS -le 1 ]] && echo current_thread || echo multi_thread) runtime)"
    echo "- load: $ROUNDS round(s) x ${DURATION} s per target and concurrency, each after ${WARMUP} s of warm-up; rounds interleaved (round → concurrency → target); median of rounds; wrk --timeout $WRK_TIMEOUT"
    if [[ $ACCESS_LOG == 1 ]]; then
        echo "- portico access log: **on** (\`[log] access = true\`, stderr to a file)"
    else
        echo "- portico access log: off (\`[log] access = false\`; \`ACCESS_LOG=1\` measures with it on), except \`portico-log\` (on, stderr to a file) against \`nginx-log\` (\`access_log ... buffer=64k flush=1s\`, the same fields)"
    fi
    echo "- nginx: upstream keepalive 64, proxy_buffering off, request buffering on (default), keepalive_requests 1000000, access_log off"
    if ((WANTS_TLS)); then
        echo "- TLS (\`-tls\`, \`-h2\`): one self-signed ECDSA P-256 certificate made for this run, served by both; nginx \`ssl_protocols TLSv1.3\`, \`Ciphersuites $TLS_CIPHER\`, \`ssl_ecdh_curve $TLS_GROUP\`; portico \`[server] tls_cert/tls_key\` (rustls defaults); both offer h2 and http/1.1 by ALPN on one listener; keep-alive, upstream plain HTTP/1.1 to the same bench backend. \`-tls\`: wrk, HTTP/1.1 (wrk offers no ALPN). \`-h2\`: h2load \`-c c -m 1\` (one stream per connection: c requests in flight, like wrk), \`--tls13-ciphers $TLS_CIPHER --groups $TLS_GROUP\`, p50/p99 from its per-request log. What each server negotiated: under the TLS and HTTP/2 table"
    fi
    echo "- backends: examples/bench_backend.rs (targets without a suffix), JSON answers, tools/list result $(grep -o 'tools/list result [0-9]* bytes' "$TMP/b1.err" | awk '{print $3}') bytes; examples/hyper_backend.rs (\`-hyper\`: plain hyper 1.x, defaults, no TCP_NODELAY, 109-byte tools/call answer); the official Python SDK server tests/interop/py_server.py (\`-py-call\`, \`-py\`)"
} >"$TMP/header.md"
cat "$TMP/header.md" >&2
say ""
say "measuring ${#LIVE[@]} target(s): ${LIVE[*]:-none}; about $((est / 60)) min $((est % 60)) s"

# ---------------------------------------------------------------- measure
: >"$TMP/raw.tsv"
RETRIES_USED=0
: >"$TMP/notes.txt"
run_wrk() { # TARGET C SECONDS [latency] -> BENCHJSON on stdout
    local t=$1 c=$2 d=$3 th=$LOADGEN_THREADS
    ((th > c)) && th=$c
    if [[ $(proto_of "$t") == h2 ]]; then
        # h2load: c connections with one stream each (-m 1), so c requests in flight like wrk -c c;
        # the same request as mcp.lua; the same BENCHJSON line (benches/h2load.sh).
        MCP_METHOD=${T_METHOD[$t]} TLS_CIPHER=$TLS_CIPHER TLS_GROUP=$TLS_GROUP H2_TIMEOUT=$WRK_TIMEOUT \
            pin_loadgen "$BENCHES/h2load.sh" "$(target_url "$t")" "$c" "$th" "$d" ${4:+latency} 2>&1
        return
    fi
    MCP_METHOD=${T_METHOD[$t]} MCP_TOOL=$(tool_of "$t") pin_loadgen wrk -t "$th" -c "$c" -d "${d}s" --timeout "$WRK_TIMEOUT" \
        ${4:+--latency} -s "$BENCHES/mcp.lua" "$(target_url "$t")" 2>&1
}
server_alive() { # TARGET: its server process still runs
    local s=${T_SERVER[$1]}
    alive "${PID[$s]}"
}

for ((round = 1; round <= ROUNDS; round++)); do
    for c in $CONCURRENCY; do
        for t in "${LIVE[@]}"; do
            [[ -n ${NA[$t]:-} ]] && continue
            say "round $round/$ROUNDS  c=$c  $t"
            attempt=0 best_busy=
            while :; do
                ((WARMUP > 0)) && run_wrk "$t" "$c" "$WARMUP" >/dev/null
                read -r f0 st0 < <(cpu_snapshot)
                try=$(run_wrk "$t" "$c" "$DURATION" latency)
                read -r f1 st1 < <(cpu_snapshot)
                # CPU used by processes that are not part of the benchmark, and steal time, in %
                # of one CPU over the measurement.
                o=$(( (f1 > f0 ? f1 - f0 : 0) * 100 / (DURATION * CLK_TCK) ))
                st=$(( (st1 > st0 ? st1 - st0 : 0) * 100 / (DURATION * CLK_TCK) ))
                busy=$((o > st ? o : st))
                if [[ -z $best_busy ]] || ((busy < best_busy)); then
                    out=$try other=$o steal=$st best_busy=$busy
                fi
                # A measurement taken while something else loaded the machine is repeated (the
                # quietest attempt is kept), within a budget so a busy machine cannot stall the run.
                if ((best_busy >= BUSY_MARK && attempt < BUSY_RETRIES && RETRIES_USED < MAX_RETRIES)); then
                    attempt=$((attempt + 1)) RETRIES_USED=$((RETRIES_USED + 1))
                    say "    host busy (other processes ${o}% of a CPU, steal ${st}%): measuring again"
                    sleep 1
                    continue
                fi
                break
            done
            json=$(sed -n 's/^BENCHJSON //p' <<<"$out")
            if [[ -z $json ]]; then
                echo "$t c=$c round $round: $([[ $(proto_of "$t") == h2 ]] && echo h2load || echo wrk) gave no result: $(tail -n 2 <<<"$out" | tr '\n' ' ')" >>"$TMP/notes.txt"
            else
                jq -r --arg t "$t" --arg m "${T_METHOD[$t]}" --arg c "$c" --arg r "$round" \
                    --arg o "$other" --arg st "$steal" \
                    '[$t, $m, $c, $r, .rps, .p50_us, .p99_us, (.connect + .read + .write + .status + .timeout), .requests, $o, $st] | @tsv' \
                    <<<"$json" >>"$TMP/raw.tsv"
                if ((other >= BUSY_MARK || steal >= BUSY_MARK)); then
                    echo "$t c=$c round $round: host busy: other processes used ${other}% of a CPU, steal ${steal}% (after $attempt retry(s))" >>"$TMP/notes.txt"
                    say "    kept a busy measurement: other processes ${other}% of a CPU, steal ${steal}%"
                fi
                errs=$(jq '.connect + .read + .write + .status + .timeout' <<<"$json")
                if ((errs > 0)); then
                    echo "$t c=$c round $round: $(jq -r '"\(.status) non-2xx, \(.timeout) timeouts, \(.connect) connect, \(.read) read, \(.write) write errors out of \(.requests) requests"' <<<"$json")" >>"$TMP/notes.txt"
                fi
            fi
            if ! server_alive "$t"; then
                s=${T_SERVER[$t]}
                wait "${PID[$s]}" 2>/dev/null
                NA[$t]="server exited (status $?) during the run: $(last_err "$TMP/$s.err")"
                echo "$t: ${NA[$t]}" >>"$TMP/notes.txt"
            fi
        done
    done
done

# ---------------------------------------------------------------- memory (before anything stops)
declare -A PEAK_RSS=()
for s in $INSTANCES; do
    [[ -n ${PID[$s]:-} ]] && alive "${PID[$s]}" && PEAK_RSS[$s]=$(status_kb "${PID[$s]}" VmHWM)
done
[[ -n $NGINX_MASTER ]] && alive "$NGINX_MASTER" && PEAK_RSS[nginx]=$(nginx_rss VmHWM)
PEAK_RSS[b1]=$(status_kb "${PID[b1]}" VmHWM)
IDLE_RSS[b1]=${IDLE_RSS[b1]:-}

# Portico's own complaints (warnings and errors; access lines are INFO), at startup and under load.
warnings() { # FILE PHASE-LABEL INSTANCE
    # tracing's text format: "<timestamp> <LEVEL> <target>: ..." (colour codes stripped).
    sed 's/\x1b\[[0-9;]*m//g' "$1" | grep -E '^[^ ]+ +(WARN|ERROR) ' >"$1.warn"
    local n
    n=$(wc -l <"$1.warn")
    if ((n > 0)); then
        echo "portico instance '$3' logged $n warning/error line(s) $2; most frequent (timestamps dropped):" >>"$TMP/notes.txt"
        cut -d' ' -f2- "$1.warn" | sed 's/^ *//' | cut -c1-240 | sort | uniq -c | sort -rn | head -n 5 \
            | sed 's/^/    /' >>"$TMP/notes.txt"
    fi
}
for s in $INSTANCES; do
    [[ -f $TMP/$s.err ]] || continue
    mark=${LOG_MARK[$s]:-0}
    head -n "$mark" "$TMP/$s.err" >"$TMP/$s.startup"
    tail -n +"$((mark + 1))" "$TMP/$s.err" >"$TMP/$s.load"
    warnings "$TMP/$s.startup" "at startup and probe" "$s"
    warnings "$TMP/$s.load" "during the load" "$s"
done

# ---------------------------------------------------------------- report
for t in $TARGETS; do printf '%s\t%s\n' "$t" "${T_METHOD[$t]}"; done >"$TMP/methods.tsv"
: >"$TMP/na.tsv"
for t in $TARGETS; do
    [[ -n ${NA[$t]:-} ]] || continue
    r=${NA[$t]//|/\\|}
    ((${#r} > 150)) && r="${r:0:147}..."
    printf '%s\t%s\n' "$t" "$r" >>"$TMP/na.tsv"
done
# A target that failed mid-run keeps its measured rounds; only targets with none are n/a rows.
for t in $TARGETS; do
    if [[ -n ${NA[$t]:-} ]] && grep -q "^$t"$'\t' "$TMP/raw.tsv"; then
        sed -i "/^$t"$'\t'"/d" "$TMP/na.tsv"
    fi
done

kb() { [[ -n ${1:-} ]] && awk -v k="$1" 'BEGIN { printf "%.1f MiB", k / 1024 }' || echo "–"; }
inst_desc() {
    case $1 in
    pass) echo "portico (pass-through; targets portico, portico-list)" ;;
    base) echo "portico-base (pass-through, BASE_BIN)" ;;
    trace1) echo "portico-trace1 (pass-through, [tracing] sampling 1.0)" ;;
    trace001) echo "portico-trace001 (pass-through, [tracing] sampling 0.01)" ;;
    trace001base) echo "portico-trace001-base ([tracing] sampling 0.01, BASE_BIN)" ;;
    verify) echo "portico-verify (verify_body = always)" ;;
    verifybase) echo "portico-verify-base (verify_body = always, BASE_BIN)" ;;
    cache) echo "portico-cache ([cache] enabled)" ;;
    redis) echo "portico-redis ([cache] redis_url, local = false)" ;;
    agg) echo "portico-agg (3 backends, one endpoint; targets portico-agg, portico-agg-call)" ;;
    aggc) echo "portico-agg-cache (3 backends, one endpoint, [cache] enabled)" ;;
    aggbase) echo "portico-agg-base (3 backends, one endpoint, BASE_BIN; portico-agg-base, portico-agg-call-base)" ;;
    legacy) echo "portico-legacy (legacy backend)" ;;
    legacybase) echo "portico-legacy-base (legacy backend, BASE_BIN)" ;;
    pycache) echo "portico-py-cache ([cache] enabled, Python SDK backend)" ;;
    passh) echo "portico-hyper (pass-through to the plain hyper backend)" ;;
    passp) echo "portico-py-call (pass-through to the Python SDK server)" ;;
    passlog) echo "portico-log (pass-through, access log on)" ;;
    passlogbase) echo "portico-log-base (pass-through, access log on, BASE_BIN)" ;;
    tls) echo "portico-tls (pass-through, TLS, HTTP/1.1 load)" ;;
    h2) echo "portico-h2 (pass-through, TLS, h2 load)" ;;
    tlsbase) echo "portico-tls-base (pass-through, TLS, HTTP/1.1 load, BASE_BIN)" ;;
    h2base) echo "portico-h2-base (pass-through, TLS, h2 load, BASE_BIN)" ;;
    hb) echo "plain hyper backend (hb)" ;;
    py) echo "Python SDK server (mcp 2.3.0)" ;;
    nginx) echo "nginx (worker processes, summed)" ;;
    b1) echo "bench backend (b1)" ;;
    esac
}
{
    cat "$TMP/header.md"
    echo
    echo "## Throughput and latency (median of rounds)"
    echo
    awk -F'\t' -v conc="$CONCURRENCY" -v rounds="$ROUNDS" -v busy="$BUSY_MARK" -v section=main -f "$BENCHES/stats.awk" -f "$BENCHES/report.awk" \
        "$TMP/methods.tsv" "$TMP/na.tsv" "$TMP/raw.tsv"
    echo
    if grep -q $'^portico-hyper\t\|^portico-py-call\t\|^portico-log\t' "$TMP/raw.tsv"; then
        echo
        echo "### Pass-through by backend"
        echo
        awk -F'\t' -v conc="$CONCURRENCY" -v rounds="$ROUNDS" -v busy="$BUSY_MARK" -v section=backends -f "$BENCHES/stats.awk" -f "$BENCHES/report.awk" \
            "$TMP/methods.tsv" "$TMP/na.tsv" "$TMP/raw.tsv"
    fi
    if grep -q $'^portico-tls\t\|^nginx-tls\t\|^portico-h2\t\|^nginx-h2\t' "$TMP/raw.tsv"; then
        echo
        echo "### TLS and HTTP/2"
        echo
        awk -F'\t' -v conc="$CONCURRENCY" -v rounds="$ROUNDS" -v busy="$BUSY_MARK" -v section=tls -f "$BENCHES/stats.awk" -f "$BENCHES/report.awk" \
            "$TMP/methods.tsv" "$TMP/na.tsv" "$TMP/raw.tsv"
        echo
        echo "× its plain HTTP: req/s over the same server's plain-HTTP \`tools/call\` target (\`portico\`, \`nginx\`) at the same c in this run (– when not measured)."
        echo "Negotiated at the start of the run (HTTP/1.1 targets: \`openssl s_client\` with OpenSSL's client defaults, as wrk; h2 targets: h2load's own report):"
        echo
        for t in $TARGETS; do
            [[ -n ${TLS_INFO[$t]:-} ]] && echo "- \`$t\`: ${TLS_INFO[$t]}"
        done
        for pr in tls h2; do
            a=${TLS_INFO[portico-$pr]:-} b=${TLS_INFO[nginx-$pr]:-}
            [[ -n $a && -n $b ]] || continue
            if [[ $(cut -d' ' -f1-3 <<<"$a") == "$(cut -d' ' -f1-3 <<<"$b")" ]]; then
                echo "- $pr: portico and nginx negotiated the same protocol version, cipher suite and group"
            else
                echo "- **$pr: portico and nginx negotiated different TLS parameters: the comparison is not like for like**"
            fi
        done
    fi
    echo
    echo "× direct / × nginx: req/s relative to the direct (or nginx) target at the same concurrency and MCP method in this run;"
    echo "† = no same-method baseline was measured, compared with the tools/call one (add direct-list / nginx-list to TARGETS)."
    echo "spread = (max − min) / median of req/s over rounds. errors = non-2xx answers + socket errors + timeouts, summed over rounds."
    echo "host load = the worst round's CPU use by processes outside the benchmark (or steal time), in % of one CPU; bold from ${BUSY_MARK}% — such rows measured a shared machine."
    echo "Measurements repeated because the host was busy: $RETRIES_USED (up to $BUSY_RETRIES per measurement, $MAX_RETRIES per run; the quietest attempt is kept)."
    echo
    echo "## Memory"
    echo
    echo "| process | RSS right after start | peak RSS (VmHWM) at the end |"
    echo "|---|---:|---:|"
    for s in $INSTANCES nginx b1 hb; do
        [[ -n ${PID[$s]:-} || -n ${DOWN[$s]:-} ]] || continue
        if [[ -n ${DOWN[$s]:-} && -z ${IDLE_RSS[$s]:-} ]]; then
            echo "| $(inst_desc "$s") | n/a | n/a |"
        else
            echo "| $(inst_desc "$s") | $(kb "${IDLE_RSS[$s]:-}") | $(kb "${PEAK_RSS[$s]:-}") |"
        fi
    done
    if ((ROUNDS > 1)); then
        {
            echo "## req/s per round"
            echo
            awk -F'\t' -v conc="$CONCURRENCY" -v rounds="$ROUNDS" -v busy="$BUSY_MARK" -v section=rounds -f "$BENCHES/stats.awk" -f "$BENCHES/report.awk" \
                "$TMP/methods.tsv" "$TMP/na.tsv" "$TMP/raw.tsv"
        } >"$TMP/rounds.md"
        echo
        cat "$TMP/rounds.md"
        # The same rounds as ratios within each round (benches/paired.awk), where the host's
        # drift over minutes cancels out.
        awk -f "$BENCHES/stats.awk" -f "$BENCHES/paired.awk" "$TMP/rounds.md" >"$TMP/paired.md"
        if (($(wc -l <"$TMP/paired.md") > 2)); then
            echo
            echo "## Against the reference, round by round"
            echo
            cat "$TMP/paired.md"
            echo
            echo "Each round's ratio of the two targets' req/s (measured seconds apart in that round); the bound is the issue's for that path (– none)."
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
awk -F'\t' -v conc="$CONCURRENCY" -v title="portico benchmark, $(date -u '+%Y-%m-%d') ($commit)" \
    -f "$BENCHES/stats.awk" -f "$BENCHES/chart.awk" "$TMP/methods.tsv" "$TMP/raw.tsv" >"$RESULTS_DIR/latest.svg"
cp "$TMP/report.md" "$RESULTS_DIR/latest.md"
cp "$TMP/raw.tsv" "$RESULTS_DIR/latest.tsv"
stamp=$(date -u +%Y%m%d-%H%M%S)
cp "$TMP/report.md" "$RESULTS_DIR/$stamp.md"
echo
cat "$TMP/report.md"
say ""
say "written: $RESULTS_DIR/latest.md (raw rounds: latest.tsv; chart: latest.svg; this run also as $stamp.md)"
