#!/usr/bin/env bash
# bench/remote_bench.sh - the remote tier's benchmark (docs/cluster.md,
# "Benchmark"): TTFT of a cold prefill, a local-disk hit (page cache warm,
# and dropped) and a remote hit, restore bandwidth from disk and from Redis,
# and the aggregate tok/s of an 8-session trace through HAProxy with and
# without the remote tier (server B stopped halfway). A 3+3 Redis Cluster
# and the servers (KVKEEP_THREADS=1 each) run on loopback.
#
#   bash bench/remote_bench.sh --model DIR|FILE.gguf [--label NAME] [--reps 3]
#        [--prompt-tokens 17000] [--parts ttft,trace] [--sessions 8] [--turns 4]
#        [--cold-reps N] [--remote-timeout-ms MS] [--out FILE.json] [--keep]
#
# Needs build/kvkeep (or $KT_BIN), node, redis-server, redis-cli, haproxy.
set -eu
ROOT=$(cd "$(dirname "$0")/.." && pwd)
: "${KT_BIN:=$ROOT/build/kvkeep}"
export KT_BIN
for t in node redis-server redis-cli haproxy; do
	command -v "$t" >/dev/null || { echo "remote_bench: $t is not installed (bash scripts/deps.sh test)" >&2; exit 1; }
done
exec node "$ROOT/bench/remote_bench.mjs" "$@"
