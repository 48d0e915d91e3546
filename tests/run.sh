#!/usr/bin/env bash
# The one test command (README "Quick start"): installs the official-SDK interop fixtures
# (idempotent, pinned) and runs every test — unit, hermetic and interop — in one go.
# Extra arguments go to `cargo test` (e.g. `tests/run.sh legacy::` to filter).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
tests/interop/setup.sh
cargo test --locked "$@"
