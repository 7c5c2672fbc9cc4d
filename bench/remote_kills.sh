#!/usr/bin/env bash
# bench/remote_kills.sh - no wrong answer while Redis masters die: --kills
# (default 50) SIGKILLs of a random master of a 3+3 Redis Cluster, with two
# kvkeep servers sharing it and every answer compared with a server without
# cache (bench/remote_kills.mjs). Minutes; not in make test.
#
#   bash bench/remote_kills.sh [--kills 50] [--model DIR]
set -eu
ROOT=$(cd "$(dirname "$0")/.." && pwd)
: "${KT_BIN:=$ROOT/build/kvkeep}"
export KT_BIN
for t in node redis-server redis-cli; do
	command -v "$t" >/dev/null || { echo "remote_kills: $t is not installed (bash scripts/deps.sh test)" >&2; exit 1; }
done
exec node "$ROOT/bench/remote_kills.mjs" "$@"
