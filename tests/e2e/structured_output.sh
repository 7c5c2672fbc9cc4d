#!/usr/bin/env bash
# structured_output.sh - structured output through the three APIs
# (see structured_output.mjs). Needs $KT_BIN and node.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
: "${KT_BIN:=$ROOT/build/kvkeep}"
export KT_BIN
if [ ! -x "$KT_BIN" ]; then echo "FAIL structured_output:setup: no kvkeep binary at $KT_BIN"; exit 1; fi
if ! command -v node >/dev/null; then echo "FAIL structured_output:setup: node is not installed"; exit 1; fi
exec timeout 300 node "$ROOT/tests/e2e/structured_output.mjs"
