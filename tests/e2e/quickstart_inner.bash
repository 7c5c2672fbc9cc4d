#!/usr/bin/env bash
# quickstart_inner.bash - the body of quickstart.sh, run inside `unshare
# -n` (only loopback exists: port 8000 is this test's). Prints ok/FAIL.
set -u
ip link set lo up || { echo "FAIL $T:setup: cannot bring up loopback"; exit 1; }
ok() { echo "ok $T:$1"; }
fail() { echo "FAIL $T:$1: $2"; }
B=$TMPD/blocks
export PATH=$TMPD/bin:$PATH HOME=$TMPD/home KVKEEP_CACHE_DIR=$TMPD/dc HF_HUB_CACHE=$TMPD/hub KVKEEP_LOG=info
cd "$W" || exit 1
SRV=""
trap '[ -n "$SRV" ] && kill "$SRV" 2>/dev/null' EXIT

# start LINE: run one README serve line; 0 once /health is 200
start() {
	LOG=$TMPD/serve.$RANDOM.log
	bash -c "exec $1" >"$LOG" 2>&1 &
	SRV=$!
	for _ in $(seq 300); do
		[ "$(curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:8000/health)" = 200 ] && return 0
		kill -0 "$SRV" 2>/dev/null || return 1
		sleep 0.1
	done
	return 1
}
stop() { kill -TERM "$SRV" 2>/dev/null; wait "$SRV" 2>/dev/null; SRV=""; }
models() { curl -s http://127.0.0.1:8000/v1/models | /usr/bin/python3 -c 'import json,sys; print(",".join(m["id"] for m in json.load(sys.stdin)["data"]))'; }

# --- every serve line of the README (comments dropped)
n=0
while IFS= read -r line; do
	cmd=${line%%#*}
	cmd=$(echo "$cmd" | sed 's/[[:space:]]*$//')
	[ -z "$cmd" ] && continue
	n=$((n + 1))
	if start "$cmd" && [ "$(models)" = qwen ]; then ok "serve_line_$n"
	else fail "serve_line_$n" "'$cmd': $(tail -c 400 "$LOG")"; fi
	stop
done <"$B/serve"
[ $n -eq 4 ] && ok serve_block_has_four_lines || fail serve_block_has_four_lines "$n lines"

# --- the clients, against the GGUF line
GGUF_LINE=$(grep -m1 '\.gguf' "$B/serve" | sed 's/#.*//')
if ! start "$GGUF_LINE"; then fail clients:start "$(tail -c 400 "$LOG")"; exit 1; fi
R=$(bash "$B/curl" 2>/dev/null)
if /usr/bin/python3 -c 'import json,sys; j=json.loads(sys.argv[1]); assert j["model"]=="qwen" and j["choices"][0]["message"]["role"]=="assistant", j' "$R"; then
	ok curl
else fail curl "$R"; fi
cp "$B/openai-node" "$W/sdk.mjs"
R=$(timeout 60 node "$W/sdk.mjs" 2>&1); rc=$?
if [ $rc -eq 0 ] && grep -q 'route=/v1/chat/completions stream=0' "$LOG"; then ok openai_node_sdk
else fail openai_node_sdk "exit $rc: $R"; fi
if /usr/bin/python3 -c 'import openai' 2>/dev/null; then
	R=$(timeout 60 /usr/bin/python3 "$B/openai-python" 2>&1); rc=$?
	[ $rc -eq 0 ] && ok openai_python_sdk || fail openai_python_sdk "exit $rc: $R"
else
	echo "skip $T:openai_python_sdk: the Python openai package is not installed here"
fi
# Claude Code: the block's command, one prompt (-p) added; output capped
# and updates off so it stays a short local run
n0=$(grep -c 'event=request route=/v1/messages' "$LOG")
CMD="$(tr -d '\\\n' <"$B/claude") -p 'Say hello.'"
R=$(CLAUDE_CODE_MAX_OUTPUT_TOKENS=64 DISABLE_AUTOUPDATER=1 DISABLE_TELEMETRY=1 DISABLE_ERROR_REPORTING=1 \
	timeout 180 bash -c "$CMD" 2>&1 </dev/null); rc=$?
n1=$(grep -c 'event=request route=/v1/messages' "$LOG")
if [ $rc -eq 0 ] && [ "$n1" -gt "$n0" ]; then ok claude_code
else fail claude_code "exit $rc, $((n1 - n0)) requests: ${R:0:400}"; fi
# Codex: the block's command with `exec` and one prompt added
n0=$(grep -c 'event=request route=/v1/responses' "$LOG")
CMD="$(tr -d '\\\n' <"$B/codex") exec --skip-git-repo-check 'Say hello.'"
R=$(CODEX_HOME=$TMPD/codex timeout 180 bash -c "$CMD" 2>&1 </dev/null); rc=$?
n1=$(grep -c 'event=request route=/v1/responses' "$LOG")
if [ $rc -eq 0 ] && [ "$n1" -gt "$n0" ]; then ok codex
else fail codex "exit $rc, $((n1 - n0)) requests: ${R: -400}"; fi
# opencode and qwen-code are not installed here: their configuration is
# checked against the server (the base URL and model answer a chat)
chat_at() { # base-url model
	curl -s "$1/chat/completions" -H 'Content-Type: application/json' \
		-d "{\"model\": \"$2\", \"messages\": [{\"role\": \"user\", \"content\": \"Hello\"}], \"max_tokens\": 8}" |
		/usr/bin/python3 -c 'import json,sys; j=json.load(sys.stdin); print(j["choices"][0]["message"]["role"])' 2>/dev/null
}
read -r OC_URL OC_MODEL <<<"$(/usr/bin/python3 -c '
import json, sys
c = json.load(open(sys.argv[1]))
prov, model = c["model"].split("/", 1)
p = c["provider"][prov]
assert p["npm"] == "@ai-sdk/openai-compatible" and model in p["models"], c
print(p["options"]["baseURL"], model)' "$B/opencode" 2>&1)"
if [ "$(chat_at "$OC_URL" "$OC_MODEL")" = assistant ]; then ok opencode_config_answers
else fail opencode_config_answers "baseURL '$OC_URL' model '$OC_MODEL'"; fi
command -v opencode >/dev/null || echo "skip $T:opencode_cli: opencode is not installed here"
eval "$(grep -o 'OPENAI_[A-Z_]*=[^ ]*' "$B/qwen-code" | sed 's/^/export /')"
if [ "$(chat_at "$OPENAI_BASE_URL" "$OPENAI_MODEL")" = assistant ] && grep -q ' qwen$' "$B/qwen-code"; then ok qwen_code_env_answers
else fail qwen_code_env_answers "OPENAI_BASE_URL '$OPENAI_BASE_URL' OPENAI_MODEL '$OPENAI_MODEL'"; fi
command -v qwen >/dev/null || echo "skip $T:qwen_code_cli: qwen-code is not installed here"
stop

# --- serve --help has the same quick start
H=$(kvkeep serve --help)
miss=""
while IFS= read -r line; do
	cmd=$(echo "${line%%#*}" | sed 's/[[:space:]]*$//')
	[ -z "$cmd" ] && continue
	grep -qF -- "$cmd" <<<"$H" || miss="$miss '$cmd'"
done <"$B/serve"
for c in "Claude Code" Codex opencode qwen-code "OpenAI SDK" curl; do grep -q "^  $c " <<<"$H" || miss="$miss '$c'"; done
if [ -z "$miss" ]; then ok serve_help_has_the_quick_start; else fail serve_help_has_the_quick_start "missing:$miss"; fi

# --- what `make demo` prints last serves its model
OUT=$(bash "$ROOT/scripts/demo_next.sh" "$(dirname "$KT_BIN")" "$W/Qwen3-8B")
LINE=$(grep -m1 'kvkeep serve ' <<<"$OUT")
if [ -n "$LINE" ] && start "$LINE" && [ "$(models)" = qwen ]; then ok demo_prints_a_serve_command_that_works
else fail demo_prints_a_serve_command_that_works "'$LINE': $OUT"; fi
stop
