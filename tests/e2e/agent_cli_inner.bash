#!/usr/bin/env bash
# agent_cli_inner.bash - the body of agent_cli.sh, run inside `unshare -n`
# (a network namespace of its own: only loopback exists, so the fixed
# port cannot collide with anything). Prints ok/FAIL lines.
set -u
ip link set lo up || { echo "FAIL $T:setup: cannot bring up loopback"; exit 1; }
PORT=18080
SRV=""
ok() { echo "ok $T:$1"; }
fail() { echo "FAIL $T:$1: $2"; }

start() { # log cache-dir extra-flags...
	local log=$1 dir=$2
	shift 2
	KVKEEP_LOG=info KVKEEP_CACHE_DIR=$dir "$KT_BIN" serve --model "$TMPD/model" --served-model-name tiny \
		--host 127.0.0.1 --port $PORT "$@" >"$log" 2>&1 &
	SRV=$!
	for _ in $(seq 100); do
		grep -q 'event=serve.ready' "$log" 2>/dev/null && return 0
		sleep 0.1
	done
	return 1
}
stop() { kill -TERM "$SRV" 2>/dev/null; wait "$SRV" 2>/dev/null; SRV=""; }
trap 'stop' EXIT

# cached_tokens of the request lines of a log after line $2: "first last"
cached() {
	tail -n +"$(($2 + 1))" "$1" | grep -a 'event=request route=/v1/messages\|event=request route=/v1/responses' |
		sed -n 's/.* cached_tokens=\([0-9]*\) .*/\1/p' | awk 'NR==1{f=$1} {l=$1} END{print (f==""?-1:f), (l==""?-1:l)}'
}
lines() { wc -l <"$1"; }
# every generation request of a log after line $2: "prompt cached gen" a line
reqs() {
	tail -n +"$(($2 + 1))" "$1" | grep -a 'event=request route=/v1/messages \|event=request route=/v1/responses ' |
		sed -n 's/.* prompt_tokens=\([0-9]*\) cached_tokens=\([0-9]*\) .* gen_tokens=\([0-9]*\) .*/\1 \2 \3/p'
}
# "ok" when the first request after line $3 reuses >= 95% of the last
# request before it (its prompt plus what it generated: the agent sends
# the answer back), else the numbers
turn_share() { # log lines-before-previous-turn lines-before-this-turn
	local prev cur
	prev=$(reqs "$1" "$2" | head -n "$(($(reqs "$1" "$2" | wc -l) - $(reqs "$1" "$3" | wc -l)))" | tail -n 1)
	cur=$(reqs "$1" "$3" | head -n 1)
	/usr/bin/python3 - "$prev" "$cur" <<'PY'
import sys
p, c = sys.argv[1].split(), sys.argv[2].split()
if len(p) < 3 or len(c) < 3:
    print("no requests (previous '%s', this '%s')" % (sys.argv[1], sys.argv[2]))
elif int(c[1]) >= 0.95 * (int(p[0]) + int(p[2])):
    print("ok")
else:
    print("cached %s < 95%% of %s + %s" % (c[1], p[0], p[2]))
PY
}
# "ok" when Claude Code's usage of a turn (its --output-format json: the
# sum over the turn's API calls) adds up to the prompts the server saw
usage_adds_up() { # json log lines-before-turn
	local sum
	sum=$(reqs "$2" "$3" | awk '{s += $1} END {print s + 0}')
	/usr/bin/python3 - "$1" "$sum" <<'PY'
import json, sys
try:
    u = json.load(open(sys.argv[1]))["usage"]
except Exception as e:
    print("no usage in %s: %s" % (sys.argv[1], e)); sys.exit()
got = u["input_tokens"] + u["cache_creation_input_tokens"] + u["cache_read_input_tokens"]
print("ok" if got == int(sys.argv[2]) else "Claude Code counts %d prompt tokens (input %d + creation %d + read %d), the server %s" % (
    got, u["input_tokens"], u["cache_creation_input_tokens"], u["cache_read_input_tokens"], sys.argv[2]))
PY
}

mkdir -p "$TMPD/home" "$TMPD/work" "$TMPD/codex"
export HOME=$TMPD/home XDG_CONFIG_HOME=$TMPD/home/.config
claude_env=(ANTHROPIC_BASE_URL=http://127.0.0.1:$PORT ANTHROPIC_API_KEY=none ANTHROPIC_MODEL=tiny
	ANTHROPIC_SMALL_FAST_MODEL=tiny ANTHROPIC_DEFAULT_HAIKU_MODEL=tiny ANTHROPIC_DEFAULT_SONNET_MODEL=tiny
	ANTHROPIC_DEFAULT_OPUS_MODEL=tiny CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 DISABLE_AUTOUPDATER=1
	DISABLE_TELEMETRY=1 DISABLE_ERROR_REPORTING=1 CLAUDE_CODE_MAX_OUTPUT_TOKENS=64)
claude() { (cd "$TMPD/work" && env "${claude_env[@]}" timeout 180 "$CLAUDE" --model tiny "$@") >>"$TMPD/claude.out" 2>&1; }
# one turn with its JSON result in $1
claude_json() { local out=$1; shift; (cd "$TMPD/work" && env "${claude_env[@]}" timeout 180 "$CLAUDE" --model tiny --output-format json "$@") >"$out" 2>>"$TMPD/claude.out"; }

# --- Claude Code, three turns, then a second session (billing-header rule on)
LOG=$TMPD/serve1.log
if ! start "$LOG" "$TMPD/dc1"; then fail claude:start "server did not start: $(tail -3 "$LOG")"; exit 1; fi
n0=$(lines "$LOG")
claude_json "$TMPD/c1.json" -p "List the files in this folder."; r1=$?
read -r f1 l1 <<<"$(cached "$LOG" "$n0")"
n1=$(lines "$LOG")
claude_json "$TMPD/c2.json" -p -c "Now show me the largest one."; r2=$?
read -r f2 l2 <<<"$(cached "$LOG" "$n1")"
n2=$(lines "$LOG")
claude_json "$TMPD/c3.json" -p -c "Thanks, summarise what you did."; r3=$?
read -r f3 l3 <<<"$(cached "$LOG" "$n2")"
n2e=$(lines "$LOG")
if [ "$r1$r2$r3" = 000 ]; then ok claude:three_turns_complete
else fail claude:three_turns_complete "exit codes $r1 $r2 $r3: $(tail -c 300 "$TMPD/claude.out")"; fi
if [ "$f1" = 0 ] && [ "$f2" -gt 1000 ] && [ "$f3" -gt "$f2" ]; then ok claude:cached_tokens_grow
else fail claude:cached_tokens_grow "first request of each turn cached $f1 / $f2 / $f3 (last $l1 / $l2 / $l3)"; fi
s2=$(turn_share "$LOG" "$n0" "$n1"); s3=$(turn_share "$LOG" "$n1" "$n2")
if [ "$s2" = ok ] && [ "$s3" = ok ]; then ok claude:each_turn_reuses_the_last
else fail claude:each_turn_reuses_the_last "turn 2: $s2; turn 3: $s3"; fi
# turn 1's window ends where turn 2 starts: count only its own lines
u1=$(head -n "$n1" "$LOG" >"$TMPD/t1.log"; usage_adds_up "$TMPD/c1.json" "$TMPD/t1.log" "$n0")
u2=$(head -n "$n2" "$LOG" >"$TMPD/t2.log"; usage_adds_up "$TMPD/c2.json" "$TMPD/t2.log" "$n1")
u3=$(head -n "$n2e" "$LOG" >"$TMPD/t3.log"; usage_adds_up "$TMPD/c3.json" "$TMPD/t3.log" "$n2")
if [ "$u1$u2$u3" = okokok ]; then ok claude:context_usage_is_the_prompt
else fail claude:context_usage_is_the_prompt "turn 1: $u1; turn 2: $u2; turn 3: $u3"; fi
n3=$(lines "$LOG")
claude -p "Explain what this project does."; r4=$?
read -r f4 _ <<<"$(cached "$LOG" "$n3")"
if [ "$r4" = 0 ] && [ "$f4" -gt 5000 ] && grep -aq 'event=prompt.normalize route=/v1/messages rule=billing-header' "$LOG"; then
	ok claude:new_session_shares_system_and_tools
else fail claude:new_session_shares_system_and_tools "exit $r4, cached $f4 of the new session's first request"; fi
stop

# --- the same two sessions without the rule: they part at the header
LOG=$TMPD/serve2.log
if ! start "$LOG" "$TMPD/dc2" --prompt-normalize none; then fail claude:start2 "server did not start"; exit 1; fi
claude -p "List the files in this folder."
n4=$(lines "$LOG")
claude -p "Explain what this project does."
read -r f5 _ <<<"$(cached "$LOG" "$n4")"
reason=$(tail -n +"$((n4 + 1))" "$LOG" | grep -a -m1 'event=cache.miss_reason')
if [ "$f5" -ge 0 ] && [ "$f5" -lt 100 ] && echo "$reason" | grep -q 'message=0 role=system'; then
	ok claude:without_rule_miss_explainer_names_system_turn
else fail claude:without_rule_miss_explainer_names_system_turn "cached $f5; reason: ${reason:0:300}"; fi
stop

# --- Codex: exec, then resume --last twice, over the Responses API
cat >"$TMPD/codex/config.toml" <<EOF
model = "tiny"
model_provider = "kvkeep"
approval_policy = "never"
sandbox_mode = "read-only"
model_context_window = 32768
check_for_update_on_startup = false

[model_providers.kvkeep]
name = "kvkeep"
base_url = "http://127.0.0.1:$PORT/v1"
wire_api = "responses"
env_key = "KVKEEP_TEST_KEY"
request_max_retries = 0
stream_max_retries = 0

[analytics]
enabled = false

[otel]
exporter = "none"
EOF
codex() { (cd "$TMPD/work" && CODEX_HOME=$TMPD/codex KVKEEP_TEST_KEY=none timeout 180 "$CODEX" exec --skip-git-repo-check "$@") >>"$TMPD/codex.out" 2>&1; }
LOG=$TMPD/serve3.log
if ! start "$LOG" "$TMPD/dc3" --default-max-tokens 64; then fail codex:start "server did not start"; exit 1; fi
m0=$(lines "$LOG")
codex "List the files in this folder."; c1=$?
read -r g1 _ <<<"$(cached "$LOG" "$m0")"
m1=$(lines "$LOG")
codex resume --last "Now show me the largest one."; c2=$?
read -r g2 _ <<<"$(cached "$LOG" "$m1")"
m2=$(lines "$LOG")
codex resume --last "Thanks, summarise."; c3=$?
read -r g3 _ <<<"$(cached "$LOG" "$m2")"
if [ "$c1$c2$c3" = 000 ]; then ok codex:three_turns_complete
else fail codex:three_turns_complete "exit codes $c1 $c2 $c3: $(tail -c 300 "$TMPD/codex.out")"; fi
if [ "$g1" = 0 ] && [ "$g2" -gt 1000 ] && [ "$g3" -gt "$g2" ]; then ok codex:cached_tokens_grow
else fail codex:cached_tokens_grow "first request of each turn cached $g1 / $g2 / $g3"; fi
t2=$(turn_share "$LOG" "$m0" "$m1"); t3=$(turn_share "$LOG" "$m1" "$m2")
if [ "$t2" = ok ] && [ "$t3" = ok ]; then ok codex:each_turn_reuses_the_last
else fail codex:each_turn_reuses_the_last "turn 2: $t2; turn 3: $t3"; fi
stop
