#!/usr/bin/env bash
# window_restart.sh - the sliding-window families (tiny-gemma3, tiny-gpt-oss,
# and tiny-llama3 as the plain-attention control) through the real
# `kvkeep serve`: cached == cold before, at and after the window, a restart
# resumes exactly at the last message boundary (and at the anchor for a new
# user turn), kill -9 and corrupted window snapshots give a miss or a
# shorter hit, never a wrong answer (see window_restart.mjs).
# Needs $KT_BIN (set by tests/run.sh) and node. Prints ok/FAIL lines.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
: "${KT_BIN:=$ROOT/build/kvkeep}"
export KT_BIN
if [ ! -x "$KT_BIN" ]; then echo "FAIL window_restart:setup: no kvkeep binary at $KT_BIN"; exit 1; fi
if ! command -v node >/dev/null; then echo "FAIL window_restart:setup: node is not installed"; exit 1; fi
exec timeout 600 node "$ROOT/tests/e2e/window_restart.mjs"
