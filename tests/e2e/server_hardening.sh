#!/usr/bin/env bash
# server_hardening.sh - the hardening checks of issue 37 (see
# server_hardening.mjs). Needs $KT_BIN and node.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
: "${KT_BIN:=$ROOT/build/kvkeep}"
export KT_BIN
if [ ! -x "$KT_BIN" ]; then echo "FAIL server_hardening:setup: no kvkeep binary at $KT_BIN"; exit 1; fi
if ! command -v node >/dev/null; then echo "FAIL server_hardening:setup: node is not installed"; exit 1; fi
exec timeout 300 node "$ROOT/tests/e2e/server_hardening.mjs"
