#!/usr/bin/env bash
# dashboard.sh - end-to-end tests of `kvkeep serve` with the headless Chromium (playwright-core)
# npm client (see dashboard.mjs). Needs $KT_BIN (set by tests/run.sh) and
# node with tests/node/node_modules (make npm). Prints ok/FAIL lines.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
: "${KT_BIN:=$ROOT/build/kvkeep}"
export KT_BIN
if [ ! -x "$KT_BIN" ]; then echo "FAIL dashboard:setup: no kvkeep binary at $KT_BIN"; exit 1; fi
if ! command -v node >/dev/null; then echo "FAIL dashboard:setup: node is not installed"; exit 1; fi
if [ ! -d "$ROOT/tests/node/node_modules/playwright-core" ]; then
	echo "FAIL dashboard:setup: tests/node/node_modules/playwright-core is missing (run make npm)"; exit 1
fi
exec timeout 800 node "$ROOT/tests/e2e/dashboard.mjs"
