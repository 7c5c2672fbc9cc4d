#!/usr/bin/env bash
# server_batch.sh - end-to-end tests of continuous batching in `kvkeep serve` (see
# server_batch.mjs). Needs $KT_BIN (set by tests/run.sh) and
# node with tests/node/node_modules (make npm). Prints ok/FAIL lines.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
: "${KT_BIN:=$ROOT/build/kvkeep}"
export KT_BIN
if [ ! -x "$KT_BIN" ]; then echo "FAIL server_batch:setup: no kvkeep binary at $KT_BIN"; exit 1; fi
if ! command -v node >/dev/null; then echo "FAIL server_batch:setup: node is not installed"; exit 1; fi
if [ ! -d "$ROOT/tests/node/node_modules/openai" ]; then
	echo "FAIL server_batch:setup: tests/node/node_modules/openai is missing (run make npm)"; exit 1
fi
exec timeout 300 node "$ROOT/tests/e2e/server_batch.mjs"
