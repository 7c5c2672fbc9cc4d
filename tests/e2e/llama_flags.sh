#!/usr/bin/env bash
# llama_flags.sh - the flags llama-server users type work on `kvkeep
# serve` (issue 35 item 3): -m, a positional model, -c / --ctx-size,
# -t / --threads, -np / --parallel, --host, --port, -a / --alias, each
# checked in what the server then does (its log lines and /v1/models);
# the thread count is logged at start with its source; an unknown flag
# names the nearest known spelling, and llama.cpp flags with no kvkeep
# equivalent get a sentence instead. Prints ok/FAIL lines.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
: "${KT_BIN:=$ROOT/build/kvkeep}"
T=llama_flags
ok() { echo "ok $T:$1"; }
fail() { echo "FAIL $T:$1: $2"; }
if [ ! -x "$KT_BIN" ]; then fail setup "no kvkeep binary at $KT_BIN"; exit 1; fi
TMPD=$(mktemp -d "${TMPDIR:-/tmp}/kvkeep-flags-XXXXXX")
SRV=""
trap '[ -n "$SRV" ] && kill "$SRV" 2>/dev/null; rm -rf "$TMPD"' EXIT
"$KT_BIN" mkmodel --preset tiny-dense --out "$TMPD/model" --no-sync >/dev/null || { fail setup mkmodel; exit 1; }
"$KT_BIN" convert --model "$TMPD/model" --out "$TMPD/tiny-f16.gguf" --type f16 --no-sync >/dev/null || { fail setup convert; exit 1; }
export KVKEEP_CACHE_DIR=$TMPD/dc KVKEEP_LOG=info

# start ARGS...: the server on a free port; LOG and PORT set, MODELS its /v1/models
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
	MODELS=$(curl -s "http://127.0.0.1:$PORT/v1/models")
}
stop() { kill -TERM "$SRV" 2>/dev/null; wait "$SRV" 2>/dev/null; SRV=""; }
field() { /usr/bin/python3 -c 'import json,sys; d=json.loads(sys.argv[1])["data"]; print(",".join(str(m[sys.argv[2]]) for m in d))' "$MODELS" "$1" 2>/dev/null; }

start -m "$TMPD/model" -c 4096 -t 1 -np 2 --host 127.0.0.1 --port 0 -a qwen
if [ -n "$PORT" ] && grep -q "event=serve.context ctx=4096 source=flag" "$LOG" &&
	grep -q "event=serve.threads threads=1 source=--threads" "$LOG" &&
	grep -q "event=serve.scheduler max_running=2 " "$LOG" && [ "$(field id)" = qwen ] && [ "$(field max_model_len)" = 4096 ]; then
	ok short_spellings
else fail short_spellings "port '$PORT', models '$MODELS', log: $(grep -a 'serve\.' "$LOG" | cut -c1-200 | head -8)"; fi
stop

start "$TMPD/tiny-f16.gguf" --ctx-size 2048 --threads 2 --parallel 3 --alias a,b --port 0
if [ -n "$PORT" ] && grep -q "event=serve.context ctx=2048 source=flag" "$LOG" &&
	grep -q "event=serve.threads threads=2 source=--threads" "$LOG" &&
	grep -q "event=serve.scheduler max_running=3 " "$LOG" && [ "$(field id)" = a,b ]; then
	ok long_spellings_and_a_positional_gguf
else fail long_spellings_and_a_positional_gguf "port '$PORT', models '$MODELS'"; fi
stop

# no -t: the count and where it came from are still logged; the default
# served name of a GGUF file is its name without .gguf
KVKEEP_THREADS=1 start "$TMPD/tiny-f16.gguf" --port 0
if grep -q "event=serve.threads threads=1 source=KVKEEP_THREADS cores=" "$LOG" && [ "$(field id)" = tiny-f16 ]; then
	ok threads_logged_from_the_environment
else fail threads_logged_from_the_environment "models '$MODELS', $(grep -a serve.threads "$LOG")"; fi
stop
start "$TMPD/model" --port 0
if grep -q "event=serve.threads threads=[0-9]* source=cores cores=[0-9]* isa=" "$LOG"; then ok threads_logged_by_default
else fail threads_logged_by_default "$(grep -a serve.threads "$LOG")"; fi
stop

# refusals: each names what to do
say() { OUT=$(timeout 30 "$KT_BIN" serve "$@" 2>&1); RC=$?; }
expect() { # name pattern
	if [ "$RC" -eq 2 ] && grep -qF -- "$2" <<<"$OUT"; then ok "$1"; else fail "$1" "exit $RC: $OUT"; fi
}
say "$TMPD/model" --ctx 4096; expect unknown_ctx_suggests_ctx_size "unknown flag '--ctx': did you mean --ctx-size?"
say "$TMPD/model" --thread 4; expect unknown_thread_suggests_threads "did you mean --threads?"
say "$TMPD/model" --paralel 4; expect misspelt_parallel "did you mean --parallel?"
say "$TMPD/model" --prot 8000; expect misspelt_port "did you mean --port?"
say "$TMPD/model" --max-model 4096; expect prefix_of_a_flag "did you mean --max-model-len?"
say "$TMPD/model" --frobnicate; expect far_from_everything "unknown flag '--frobnicate' (see --help)"
say "$TMPD/model" -ngl 99; expect gpu_layers_hint "-ngl: kvkeep runs on the CPU"
say -hf Qwen/Qwen3-8B-GGUF; expect hf_download_hint "kvkeep never downloads"
say "$TMPD/model" --jinja; expect jinja_hint "always renders the model's own Jinja chat template"
say "$TMPD/model" -md draft.gguf; expect draft_model_hint "-md: kvkeep needs no draft model"
say "$TMPD/model" --draft-max 16; expect draft_max_hint "--draft-max: use --speculative-draft N"
say "$TMPD/model" -m "$TMPD/model"; expect two_models "two models"
say; expect no_model "which model? kvkeep serve MODEL"
OUT=$("$KT_BIN" serve --help); RC=$?
if [ $RC -eq 0 ] && grep -q -- "-c, --ctx-size, --max-model-len N" <<<"$OUT" && grep -q -- "-t, --threads N" <<<"$OUT" &&
	grep -q -- "-np, --parallel, --max-running N" <<<"$OUT" && grep -q -- "-a, --alias, --served-model-name" <<<"$OUT" &&
	grep -q -- "-m, --model MODEL" <<<"$OUT"; then ok help_lists_the_aliases
else fail help_lists_the_aliases "$(grep -- '-c\|-t,\|-np\|-a,\|-m,' <<<"$OUT")"; fi
