#!/usr/bin/env bash
# server_chat.sh - `kvkeep chat` end to end, with piped input:
#   --model DIR spawns `kvkeep serve` on a free loopback port, answers two
#   turns (the second resumes from the cache), understands /system, /reset,
#   /quit, and stops the server when it exits;
#   --disable-prefix-cache reaches the spawned server (it caches nothing);
#   --base-url talks to a server that is already running.
# Prints ok/FAIL lines; bounded by timeouts.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
: "${KT_BIN:=$ROOT/build/kvkeep}"
T=server_chat
if [ ! -x "$KT_BIN" ]; then echo "FAIL $T:setup: no kvkeep binary at $KT_BIN"; exit 1; fi
TMP=$(mktemp -d "${TMPDIR:-/tmp}/kvkeep-chat.XXXXXX")
SRV=""
cleanup() { [ -n "$SRV" ] && kill -9 "$SRV" 2>/dev/null; rm -rf "$TMP"; }
trap cleanup EXIT
export TMPDIR="$TMP" KVKEEP_LOG=info
fail=0
ok() { echo "ok $T:$1"; }
bad() { echo "FAIL $T:$1: $2"; fail=1; }

"$KT_BIN" mkmodel --preset tiny-dense --out "$TMP/m" >/dev/null 2>&1 || { echo "FAIL $T:setup: mkmodel failed"; exit 1; }

# --- spawned server, cache on ---
printf 'hello there\nand a second turn\n/system be brief\n/reset\nthird\n/quit\nnever sent\n' |
	timeout 120 "$KT_BIN" chat --model "$TMP/m" --max-tokens 4 --temperature 0 >"$TMP/out1" 2>"$TMP/err1"
rc=$?
log=$(ls "$TMP"/kvkeep-chat-serve.*.log 2>/dev/null | head -1)
url=$(sed -n 's/^server ready at \(.*\)$/\1/p' "$TMP/err1")
if [ $rc -eq 0 ] && [ -n "$url" ] && [ -f "$log" ]; then ok spawn_and_exit_0; else bad spawn_and_exit_0 "rc=$rc url='$url' log='$log' $(tail -3 "$TMP/err1")"; fi
if grep -q '(system prompt set, conversation reset)' "$TMP/out1" && grep -q '(conversation reset)' "$TMP/out1"; then
	ok commands; else bad commands "$(head -c 300 "$TMP/out1")"; fi
n=$(grep -c 'event=request ' "$log" 2>/dev/null || echo 0)
if [ "$n" -eq 3 ]; then ok three_turns_sent; else bad three_turns_sent "$n request lines in the server log"; fi
c2=$(grep 'event=request ' "$log" | sed -n '2s/.*cached_tokens=\([0-9]*\).*/\1/p')
if [ -n "$c2" ] && [ "$c2" -gt 0 ]; then ok turn2_cached; else bad turn2_cached "cached_tokens='$c2'"; fi
if [ -n "$url" ] && curl -s -m 2 "${url%/v1}/health" >/dev/null 2>&1; then bad server_stopped "still answering at $url"
else ok server_stopped; fi

# --- the spawned server logs at info in its file, whatever KVKEEP_LOG the chat had ---
rm -f "$TMP"/kvkeep-chat-serve.*.log
printf 'hello\n' | env -u KVKEEP_LOG timeout 120 "$KT_BIN" chat --model "$TMP/m" --max-tokens 2 >"$TMP/out4" 2>"$TMP/err4"
log=$(ls "$TMP"/kvkeep-chat-serve.*.log 2>/dev/null | head -1)
if grep -q 'level=info event=serve.ready' "$log" 2>/dev/null && grep -q 'level=info event=request ' "$log"; then
	ok spawned_log_at_info; else bad spawned_log_at_info "$(head -c 300 "$log" 2>/dev/null)"; fi

# --- KVKEEP_API_KEY: the spawned server requires it, the chat sends it ---
printf 'hello\n' | KVKEEP_API_KEY=chat-key timeout 120 "$KT_BIN" chat --model "$TMP/m" --max-tokens 2 >"$TMP/out5" 2>"$TMP/err5"
rc=$?
if [ $rc -eq 0 ] && [ -s "$TMP/out5" ]; then ok api_key_round_trip; else bad api_key_round_trip "rc=$rc $(tail -2 "$TMP/err5")"; fi

# --- spawned server, cache off ---
rm -f "$TMP"/kvkeep-chat-serve.*.log
printf 'hello there\nand a second turn\n' |
	timeout 120 "$KT_BIN" chat --model "$TMP/m" --disable-prefix-cache --max-tokens 4 >"$TMP/out2" 2>"$TMP/err2"
log=$(ls "$TMP"/kvkeep-chat-serve.*.log 2>/dev/null | head -1)
if grep -q 'event=serve.ready.*prefix_cache=0' "$log" 2>/dev/null && ! grep 'event=request ' "$log" | grep -qv 'cached_tokens=0 '; then
	ok disable_prefix_cache_reaches_server; else bad disable_prefix_cache_reaches_server "$(grep -E 'serve.ready|event=request' "$log" | cut -c1-200)"; fi

# --- --base-url against a running server ---
"$KT_BIN" serve --model "$TMP/m" --host 127.0.0.1 --port 0 --served-model-name tinychat 2>"$TMP/srv.log" &
SRV=$!
port=""
for _ in $(seq 1 100); do
	port=$(sed -n 's/.*event=serve.ready .*port=\([0-9]*\).*/\1/p' "$TMP/srv.log")
	[ -n "$port" ] && break
	sleep 0.1
done
printf 'ping\n' | timeout 60 "$KT_BIN" chat --base-url "http://127.0.0.1:$port/v1" --max-tokens 3 >"$TMP/out3" 2>"$TMP/err3"
rc=$?
# the server writes its request line after the reply's last byte: wait for it
for _ in $(seq 1 50); do grep -q 'event=request ' "$TMP/srv.log" && break; sleep 0.1; done
if [ $rc -eq 0 ] && grep -q 'model tinychat' "$TMP/err3" && grep -q 'event=request ' "$TMP/srv.log"; then
	ok base_url; else bad base_url "rc=$rc $(cat "$TMP/err3" | head -3)"; fi
# client errors leave a line at info: route, status, message
curl -s -m 5 -o /dev/null -H 'Content-Type: application/json' -d '{"messages":[]}' "http://127.0.0.1:$port/v1/chat/completions"
curl -s -m 5 -o /dev/null "http://127.0.0.1:$port/v1/nowhere"
sleep 0.2
if grep -q 'level=info event=http.error route=/v1/chat/completions status=400 param="messages" msg="messages: ' "$TMP/srv.log" &&
	grep -q 'level=info event=http.error route=.* status=404 ' "$TMP/srv.log"; then
	ok client_errors_logged; else bad client_errors_logged "$(grep -E 'http.error' "$TMP/srv.log" | head -3)"; fi
kill -TERM "$SRV"; wait "$SRV" 2>/dev/null; SRV=""
# bad usage
if "$KT_BIN" chat >/dev/null 2>&1; then bad usage_error "no flags accepted"; else ok usage_error; fi
exit $fail
