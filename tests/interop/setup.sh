#!/usr/bin/env bash
# Installs the interop fixtures' dependencies:
#   .venv/                 Python venv with requirements.txt (mcp==2.3.0 + pinned closure)
#   node/node_modules/     npm ci from node/package-lock.json (@modelcontextprotocol/sdk 1.32.2, zod)
# Idempotent: a stamp file records the pins (and tool versions); a re-run with nothing
# changed returns at once. Works from any cwd. Override the interpreter with PYTHON=...
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

PYTHON=${PYTHON:-python3}
STAMP=.setup-stamp

stamp_text() {
  echo "python: $("$PYTHON" --version 2>&1)"
  echo "node: $(node --version)"
  echo "npm: $(npm --version)"
  grep -v '^#' requirements.txt
  echo "package.json+lock sha256: $(cat node/package.json node/package-lock.json 2>/dev/null | sha256sum | cut -d' ' -f1)"
}

command -v "$PYTHON" >/dev/null || { echo "setup.sh: $PYTHON not found" >&2; exit 1; }
command -v node >/dev/null || { echo "setup.sh: node not found" >&2; exit 1; }
command -v npm >/dev/null || { echo "setup.sh: npm not found" >&2; exit 1; }

want=$(stamp_text)
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] \
  && [ -x .venv/bin/python ] && [ -d node/node_modules/@modelcontextprotocol/sdk ]; then
  echo "interop fixtures: up to date"
  exit 0
fi
rm -f "$STAMP"

# --- Python ---
if ! .venv/bin/python -c 'import sys' >/dev/null 2>&1; then
  rm -rf .venv
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check --no-input -r requirements.txt
.venv/bin/python - <<'EOF'
from importlib.metadata import version
v = version("mcp")
assert v == "2.3.0", f"expected mcp 2.3.0, got {v}"
import mcp, mcp.server.mcpserver, uvicorn  # noqa: F401  (import check)
EOF

# --- Node ---
(
  cd node
  if [ -f package-lock.json ]; then
    npm ci --no-audit --no-fund --loglevel=error
  else
    npm install --no-audit --no-fund --loglevel=error
  fi
  node -e '
    const v = require("./node_modules/@modelcontextprotocol/sdk/package.json").version;
    if (v !== "1.32.2") { console.error("expected @modelcontextprotocol/sdk 1.32.2, got " + v); process.exit(1); }
  '
)

stamp_text >"$STAMP"
echo "interop fixtures: installed (mcp 2.3.0, @modelcontextprotocol/sdk 1.32.2)"
