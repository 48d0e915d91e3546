#!/usr/bin/env bash
# h2load driver for benches/run.sh (targets *-h2): the request benches/mcp.lua makes wrk send,
# over HTTP/2, and the same machine-readable line at the end:
#
#   MCP_METHOD=tools/call benches/h2load.sh URL CONNECTIONS THREADS SECONDS [latency]
#   BENCHJSON {"requests":..,"rps":..,"p50_us":..,"p99_us":..,"status":..,...}
#
# - SECONDS 0 sends one request per connection (run.sh's probe: what h2load negotiates, and that
#   it works).
# - One stream per connection (-m 1): CONNECTIONS concurrent requests, like wrk -c.
# - "latency": per-request times from h2load's --log-file (h2load itself only reports
#   min/max/mean/sd), as p50/p90/p99 (nearest rank), max and mean; without it they are 0.
# - Errors in wrk's terms: "status" = 4xx + 5xx answers (wrk: status > 399), "read" = requests
#   h2load counts as errored (stream reset, connection lost), "connect" = every client when none
#   got a TLS session (h2load does not say which clients failed), "timeout" = h2load's own timeouts plus answers slower than H2_TIMEOUT (wrk's
#   --timeout; only known with "latency").
# - The answer must be h2 (ALPN): a load that fell back to http/1.1 is a failure, not a result.
#
# Environment: MCP_METHOD (tools/call), MCP_TOOL (echo), TLS_CIPHER / TLS_GROUP (h2load
# --tls13-ciphers / --groups; default: h2load's own), H2_TIMEOUT (2s; wrk's syntax: 2s, 500ms, 1m).
set -uo pipefail

[[ $# -ge 4 ]] || { echo "usage: $0 URL CONNECTIONS THREADS SECONDS [latency]" >&2; exit 2; }
url=$1 conns=$2 threads=$3 secs=$4 latency=${5:-}
method=${MCP_METHOD:-tools/call}
tool=${MCP_TOOL:-echo}

to_us() { # wrk duration syntax -> microseconds
    local v=$1
    case $v in
    *ms) echo $((${v%ms} * 1000)) ;;
    *us) echo "${v%us}" ;;
    *s) echo $((${v%s} * 1000000)) ;;
    *m) echo $((${v%m} * 60000000)) ;;
    *h) echo $((${v%h} * 3600000000)) ;;
    *) echo $((v * 1000000)) ;;
    esac
}
timeout_us=$(to_us "${H2_TIMEOUT:-2s}")

dir=$(mktemp -d /tmp/portico-h2load.XXXXXX) || exit 1
trap 'rm -rf "$dir"' EXIT

# The body of benches/mcp.lua, byte for byte.
meta='"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}'
if [[ $method == tools/call ]]; then
    params="{\"name\":\"$tool\",\"arguments\":{\"text\":\"hello\"},$meta}"
else
    params="{$meta}"
fi
printf '{"jsonrpc":"2.0","id":1,"method":"%s","params":%s}' "$method" "$params" >"$dir/body.json"

# The headers of benches/mcp.lua (h2 sends names in lower case anyway).
headers=(-H 'content-type: application/json' -H 'accept: application/json, text/event-stream'
    -H 'mcp-protocol-version: 2026-07-28' -H "mcp-method: $method")
[[ $method == tools/call ]] && headers+=(-H "mcp-name: $tool")

opts=(-c "$conns" -m 1 -t "$threads" -d "$dir/body.json" --npn-list=h2)
if ((secs > 0)); then opts+=(-D "$secs"); else opts+=(-n "$conns"); fi
[[ -n ${TLS_CIPHER:-} ]] && opts+=("--tls13-ciphers=$TLS_CIPHER")
[[ -n ${TLS_GROUP:-} ]] && opts+=("--groups=$TLS_GROUP")
[[ -n $latency ]] && opts+=("--log-file=$dir/requests.tsv")

h2load "${opts[@]}" "${headers[@]}" "$url" >"$dir/out" 2>&1
rc=$?
cat "$dir/out"
if ! grep -q '^finished in ' "$dir/out"; then
    echo "h2load.sh: h2load gave no result (exit status $rc)"
    exit 1
fi
# No "Application protocol" line: no connection got through (counted as connect errors below);
# another protocol than h2: not an h2 result at all.
noconn=0
if ! grep -q '^Application protocol: ' "$dir/out"; then
    noconn=1
elif ! grep -q '^Application protocol: h2$' "$dir/out"; then
    echo "h2load.sh: h2 was not negotiated ($(grep -m1 '^Application protocol' "$dir/out"))"
    exit 1
fi

# Per-request times: column 3 of the log, in µs (only the measured phase is logged).
stats="0 0 0 0 0 0"
if [[ -n $latency && -s $dir/requests.tsv ]]; then
    stats=$(cut -f3 "$dir/requests.tsv" | sort -n | awk -v lim="$timeout_us" '
        { v[++n] = $1; sum += $1; if ($1 > lim) slow++ }
        function rank(p,    i) { i = int(n * p / 100); if (i < n * p / 100) i++; if (i < 1) i = 1; return v[i] }
        END { if (n == 0) { print "0 0 0 0 0 0"; exit }
              printf "%d %d %d %d %.1f %d\n", rank(50), rank(90), rank(99), v[n], sum / n, slow }')
fi

# "requests: 10 total, 10 started, 10 done, 10 succeeded, 0 failed, 0 errored, 0 timeout" and
# "status codes: 10 2xx, 0 3xx, 0 4xx, 0 5xx": each count precedes its label.
awk -v secs="$secs" -v stats="$stats" -v noconn="$noconn" -v conns="$conns" '
    function count(label,    i) { for (i = 2; i <= NF; i++) if ($i == label "," || $i == label) return $(i - 1) + 0; return 0 }
    /^finished in / { rps = $4; sub(/,$/, "", rps) }
    /^requests: / { done = count("done"); errored = count("errored"); timeouts = count("timeout") }
    /^status codes: / { s4 = count("4xx"); s5 = count("5xx") }
    /^traffic: / { bytes = $3; gsub(/[()]/, "", bytes) }
    END {
        split(stats, s, " ")
        connect = 0
        if (noconn && done == 0) { connect = conns; errored = 0 }   # the requests never went out
        printf "BENCHJSON {\"requests\":%d,\"duration_us\":%d,\"bytes\":%d,\"rps\":%.1f,", done, secs * 1000000, bytes, rps
        printf "\"p50_us\":%d,\"p90_us\":%d,\"p99_us\":%d,\"max_us\":%d,\"mean_us\":%.1f,", s[1], s[2], s[3], s[4], s[5]
        printf "\"connect\":%d,\"read\":%d,\"write\":0,\"status\":%d,\"timeout\":%d}\n", connect, errored, s4 + s5, timeouts + s[6]
    }' "$dir/out"
