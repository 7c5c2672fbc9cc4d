#!/usr/bin/env bash
# stream_stress.sh - every stream ends with its last event or an error
# event, under CPU load (see stream_stress.mjs). Needs $KT_BIN and node.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
: "${KT_BIN:=$ROOT/build/kvkeep}"
export KT_BIN
if [ ! -x "$KT_BIN" ]; then echo "FAIL stream_stress:setup: no kvkeep binary at $KT_BIN"; exit 1; fi
if ! command -v node >/dev/null; then echo "FAIL stream_stress:setup: node is not installed"; exit 1; fi
exec timeout 240 node "$ROOT/tests/e2e/stream_stress.mjs"
