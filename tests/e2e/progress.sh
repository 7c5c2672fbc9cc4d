#!/usr/bin/env bash
# progress.sh - nothing is silent while a long prompt is prefilled (issue 35
# item 1): loading, prompt_progress, keep-alives, log lines, the running
# request in the dashboard state, with the openai and @anthropic-ai/sdk npm
# clients and raw SSE (see progress.mjs). Needs $KT_BIN (set by
# tests/run.sh) and node with tests/node/node_modules (make npm). Prints
# ok/FAIL lines.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
: "${KT_BIN:=$ROOT/build/kvkeep}"
export KT_BIN
if [ ! -x "$KT_BIN" ]; then echo "FAIL progress:setup: no kvkeep binary at $KT_BIN"; exit 1; fi
if ! command -v node >/dev/null; then echo "FAIL progress:setup: node is not installed"; exit 1; fi
if [ ! -d "$ROOT/tests/node/node_modules/openai" ]; then
	echo "FAIL progress:setup: tests/node/node_modules/openai is missing (run make npm)"; exit 1
fi
exec timeout 800 node "$ROOT/tests/e2e/progress.mjs"
