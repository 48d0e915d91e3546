#!/usr/bin/env bash
# Runs every fixture client against every compatible fixture server directly (no gateway)
# and checks the scenario output. Needs ./setup.sh to have run. Loopback only; every server
# started here is killed on exit. Prints one line per combination and "N passed, N failed".
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

PY=.venv/bin/python
PASS=0
FAIL=0
PIDS=()
TMP=$(mktemp -d)
cleanup() {
  for p in "${PIDS[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]:-}"; do [ -n "$p" ] && wait "$p" 2>/dev/null || true; done
  rm -rf "$TMP"
}
trap cleanup EXIT

# start_server NAME CMD... -> sets PORT
start_server() {
  local name=$1; shift
  "$@" >"$TMP/$name.out" 2>"$TMP/$name.err" &
  PIDS+=($!)
  for _ in $(seq 1 150); do
    if grep -q '^LISTENING ' "$TMP/$name.out" 2>/dev/null; then
      PORT=$(awk '/^LISTENING /{print $2}' "$TMP/$name.out")
      return 0
    fi
    sleep 0.1
  done
  echo "server $name did not start:"; cat "$TMP/$name.err"; exit 1
}

# check LABEL EXPECT_ERA IMPL PROGRESS_EVENTS CLIENT_CMD...
check() {
  local label=$1 era=$2 impl=$3 events=$4; shift 4
  local out
  out=$("$@" 2>"$TMP/client.err") || true
  if "$PY" - "$out" "$era" "$impl" "$events" <<'EOF'
import json, sys
out, era, impl, events = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
d = json.loads(out)
want = {
    "ok": True, "era": era, "server_name": f"portico-interop-{impl}",
    "tools": ["add", "add_tool", "echo", "progress", "slow", "whoami"],
    "echo": "hi", "add": "5", "progress_result": "done 3", "progress_events": events,
    "resource": f"hello from {impl}", "prompt": "Hello, Ada!",
}
bad = {k: (d.get(k), v) for k, v in want.items() if d.get(k) != v}
if bad:
    print("   mismatch (got, want):", bad)
    sys.exit(1)
EOF
  then
    PASS=$((PASS + 1)); echo "ok   $label"
  else
    FAIL=$((FAIL + 1)); echo "FAIL $label"; echo "   output: $out"; tail -5 "$TMP/client.err" | sed 's/^/   stderr: /'
  fi
}

# --- HTTP ---
start_server py_sse "$PY" py_server.py
U=http://127.0.0.1:$PORT/mcp
check "py_client(auto)   -> py_server http sse"  modern python 3 "$PY" py_client.py --url "$U"
check "py_client(modern) -> py_server http sse"  modern python 3 "$PY" py_client.py --url "$U" --modern
check "py_client(legacy) -> py_server http sse"  legacy python 3 "$PY" py_client.py --url "$U" --legacy
check "ts_client         -> py_server http sse"  legacy python 3 node ts_client.mjs --url "$U"

start_server py_json "$PY" py_server.py --json-response
U=http://127.0.0.1:$PORT/mcp
check "py_client(auto)   -> py_server http json" modern python 0 "$PY" py_client.py --url "$U"
check "py_client(legacy) -> py_server http json" legacy python 0 "$PY" py_client.py --url "$U" --legacy
check "ts_client         -> py_server http json" legacy python 0 node ts_client.mjs --url "$U"

for mode in "" "--json" "--stateless" "--stateless --json"; do
  # shellcheck disable=SC2086
  start_server "ts$(echo "$mode" | tr -d ' -')" node ts_server.mjs $mode
  U=http://127.0.0.1:$PORT/mcp
  ev=3; [[ "$mode" == *--json* ]] && ev=0
  check "py_client(auto)   -> ts_server http ${mode:-sse}" legacy typescript $ev "$PY" py_client.py --url "$U"
  check "py_client(legacy) -> ts_server http ${mode:-sse}" legacy typescript $ev "$PY" py_client.py --url "$U" --legacy
  check "ts_client         -> ts_server http ${mode:-sse}" legacy typescript $ev node ts_client.mjs --url "$U"
done

# --- stdio ---
check "py_client(auto)   -> py_server stdio" modern python 3 "$PY" py_client.py --stdio -- "$PY" py_server.py --transport stdio
check "py_client(legacy) -> py_server stdio" legacy python 3 "$PY" py_client.py --legacy --stdio -- "$PY" py_server.py --transport stdio
check "ts_client         -> py_server stdio" legacy python 3 node ts_client.mjs --stdio -- "$PY" py_server.py --transport stdio
check "py_client(auto)   -> ts_server stdio" legacy typescript 3 "$PY" py_client.py --stdio -- node ts_server.mjs --transport stdio
check "py_client(legacy) -> ts_server stdio" legacy typescript 3 "$PY" py_client.py --legacy --stdio -- node ts_server.mjs --transport stdio
check "ts_client         -> ts_server stdio" legacy typescript 3 node ts_client.mjs --stdio -- node ts_server.mjs --transport stdio

echo "$PASS passed, $FAIL failed"
[ "$FAIL" -eq 0 ]
