#!/usr/bin/env bash
# mamba_text.sh - the chat formats of the Mamba-2 families: Granite 4.0-H
# (<|start_of_role|> blocks, <tool_call> JSON) and Nemotron Nano 2
# (<SPECIAL_1x> blocks, one <TOOLCALL>[...] list), with tokenizers of the
# same type as the releases' (tests/data/families: no npm package ships
# them; byte-level BPE with the family's pre-tokenizer regex and added
# tokens, the chat templates written for these tests).
#   render      every request of tests/data/chat rendered by kvkeep byte for
#               byte like Python's jinja2 (tests/ref/template_oracle.py),
#               with and without the generation prompt;
#   boundaries  the token ids equal Hugging Face's tokenizers' (node) and at
#               every reported message boundary the prefix render is the
#               text up to it, its ids the first ids of the whole;
#   apis        tiny-granite-h and tiny-nemotron-h with these tokenizers
#               through kvkeep serve: Chat Completions, Messages and
#               Responses with tools and a tool call + result in the history
#               (the family's syntax in the prompt), a named tool_choice
#               is constrained to the family's own tool-call syntax, and greedy answers
#               with the cache equal a --disable-prefix-cache server's
#               (mamba_text.mjs).
set -u
NAME=mamba_text
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PY=/usr/bin/python3
ORACLE=$ROOT/tests/ref/template_oracle.py
NODE_DIR=$ROOT/tests/node
BIN=${KT_BIN:-$ROOT/build/kvkeep}
export KT_BIN=$BIN
fail_setup() { echo "FAIL $NAME:setup: $*"; exit 1; }
[ -x "$BIN" ] || fail_setup "no kvkeep binary at $BIN"
"$PY" -c 'import jinja2' 2>/dev/null || fail_setup "Debian's /usr/bin/python3 with python3-jinja2 is required"
[ -d "$NODE_DIR/node_modules/@anush008/tokenizers" ] || fail_setup "tests/node is not installed (make npm)"
command -v node >/dev/null || fail_setup "node is not installed"
TMP=$(mktemp -d "${TMPDIR:-/tmp}/kvkeep-mtext.XXXXXX")
trap 'rm -rf "$TMP"' EXIT

for fam in granite4 nemotron2; do
	D=$ROOT/tests/data/families/$fam
	: >"$TMP/$fam.manifest"; : >"$TMP/$fam.batch"; : >"$TMP/$fam.bound"
	for req in "$ROOT"/tests/data/chat/*.json; do
		s=$(basename "$req" .json)
		for gen in 1 0; do
			o=$TMP/$fam.$s.$gen
			printf '%s\t%s\t%s\t-\t%s\n' "$o.want" "$D/tokenizer_config.json" "$req" "$gen" >>"$TMP/$fam.manifest"
			flag=""; [ $gen = 0 ] && flag=--no-generation-prompt
			echo "--out $o.got --model $D --request $req $flag --reasoning-history template" >>"$TMP/$fam.batch"
		done
		echo "--out $TMP/$fam.$s.json --model $D --request $req --json --tokens --reasoning-history template" >>"$TMP/$fam.batch"
		printf '%s\t%s\t%s\t-\t%s\n' "$NAME:boundaries:$fam:$s" "$D/tokenizer_config.json" "$req" "$TMP/$fam.$s.json" >>"$TMP/$fam.bound"
	done
	"$PY" "$ORACLE" chat-batch "$TMP/$fam.manifest" || fail_setup "the oracle failed on $fam"
	"$BIN" render --batch "$TMP/$fam.batch" 2>"$TMP/$fam.log"
	n=0 bad=0
	for req in "$ROOT"/tests/data/chat/*.json; do
		s=$(basename "$req" .json)
		for gen in 1 0; do
			o=$TMP/$fam.$s.$gen
			n=$((n + 1))
			if [ -f "$o.want.err" ]; then
				echo "FAIL $NAME:render:$fam:$s:gen=$gen: the oracle cannot render it: $(head -c 200 "$o.want.err")"; bad=$((bad + 1))
			elif [ -f "$o.got.err" ]; then
				echo "FAIL $NAME:render:$fam:$s:gen=$gen: kvkeep failed: $(head -c 300 "$o.got.err")"; bad=$((bad + 1))
			elif ! cmp -s "$o.want" "$o.got"; then
				echo "FAIL $NAME:render:$fam:$s:gen=$gen: differs from jinja2 at $(cmp "$o.want" "$o.got" 2>&1 | grep -o 'byte [0-9]*' | head -1)"; bad=$((bad + 1))
			fi
		done
	done
	[ $bad -eq 0 ] && echo "ok $NAME:render:$fam: $n renders identical to jinja2"
	"$PY" "$ORACLE" boundaries-batch "$TMP/$fam.bound" "$D/tokenizer.json" "$NODE_DIR" 2>"$TMP/$fam.bound.err"
	grep -q . "$TMP/$fam.bound.err" && tail -n 5 "$TMP/$fam.bound.err" >&2
done
exec timeout 600 node "$ROOT/tests/e2e/mamba_text.mjs"
