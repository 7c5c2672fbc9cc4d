#!/usr/bin/env bash
# agent_session.sh - agent sessions stay cached across user turns in the three APIs
# (see agent_session.mjs). Needs $KT_BIN (set by tests/run.sh) and
# node with tests/node/node_modules (make npm). Prints ok/FAIL lines.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
: "${KT_BIN:=$ROOT/build/kvkeep}"
export KT_BIN
if [ ! -x "$KT_BIN" ]; then echo "FAIL agent_session:setup: no kvkeep binary at $KT_BIN"; exit 1; fi
if ! command -v node >/dev/null; then echo "FAIL agent_session:setup: node is not installed"; exit 1; fi
if [ ! -d "$ROOT/tests/node/node_modules/openai" ] || [ ! -d "$ROOT/tests/node/node_modules/@anthropic-ai/sdk" ]; then
	echo "FAIL agent_session:setup: tests/node/node_modules/openai or @anthropic-ai/sdk is missing (run make npm)"; exit 1
fi
exec timeout 300 node "$ROOT/tests/e2e/agent_session.mjs"
