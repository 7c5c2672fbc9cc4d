#!/usr/bin/env bash
# sampling.sh - sampling defaults, penalties and stop tokens end to end
# (see sampling.mjs). Needs $KT_BIN (set by tests/run.sh) and
# node (no npm packages). Prints ok/FAIL lines.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
: "${KT_BIN:=$ROOT/build/kvkeep}"
export KT_BIN
if [ ! -x "$KT_BIN" ]; then echo "FAIL sampling:setup: no kvkeep binary at $KT_BIN"; exit 1; fi
if ! command -v node >/dev/null; then echo "FAIL sampling:setup: node is not installed"; exit 1; fi
exec timeout 300 node "$ROOT/tests/e2e/sampling.mjs"
