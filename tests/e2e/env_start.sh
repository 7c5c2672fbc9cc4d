#!/usr/bin/env bash
# env_start.sh - an invalid KVKEEP_* value never hangs a start (issue 37):
#   - `KVKEEP_LOG=bogus kvkeep serve` listens, answers /health, says once
#     which value was wrong and that it logs at info, and stops on SIGTERM
#     (it used to hang before its first log line: the logger's one-time
#     initialisation logged, and so waited on itself);
#   - `kvkeep generate` with KVKEEP_LOG=bogus, KVKEEP_ISA=bogus or
#     KVKEEP_THREADS=bogus finishes, warning once for the first two
#     (KVKEEP_THREADS' documented fallback, one thread per core, is silent);
#   - the variables read when a server starts (cache, checkpoints, disk
#     cap, shutdown budget) each give one warning naming the variable (from
#     start to the end of the shutdown) and a server that answers.
# Prints ok/FAIL lines; every start is bounded by a timeout.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
: "${KT_BIN:=$ROOT/build/kvkeep}"
T=env_start
if [ ! -x "$KT_BIN" ]; then echo "FAIL $T:setup: no kvkeep binary at $KT_BIN"; exit 1; fi
TMP=$(mktemp -d "${TMPDIR:-/tmp}/kvkeep-env.XXXXXX")
SRV=""
cleanup() { [ -n "$SRV" ] && kill -9 "$SRV" 2>/dev/null; rm -rf "$TMP"; }
trap cleanup EXIT
export KVKEEP_CACHE_DIR="$TMP/cache"
unset KVKEEP_LOG KVKEEP_ISA KVKEEP_THREADS
fail=0
ok() { echo "ok $T:$1"; }
bad() { echo "FAIL $T:$1: $2"; fail=1; }

"$KT_BIN" mkmodel --preset tiny-dense --no-sync --out "$TMP/m" >/dev/null 2>&1 ||
	{ echo "FAIL $T:setup: mkmodel failed"; exit 1; }

# serve NAME VAR=VALUE: start a server with that variable, wait up to 20 s
# for serve.ready, check /health, stop it with SIGTERM (10 s). Sets PORT
# and leaves the log in $TMP/NAME.log; returns 1 if it never became ready.
serve() {
	local name=$1 kv=$2 log=$TMP/$1.log i
	PORT=""
	env "$kv" "$KT_BIN" serve --model "$TMP/m" --port 0 >"$log" 2>&1 &
	SRV=$!
	for i in $(seq 200); do
		PORT=$(sed -n 's/.*event=serve.ready .*port=\([0-9]*\).*/\1/p' "$log" | head -1)
		[ -n "$PORT" ] && break
		kill -0 "$SRV" 2>/dev/null || break
		sleep 0.1
	done
	if [ -z "$PORT" ]; then
		bad "$name:ready" "no serve.ready within 20 s (a hang?): $(tail -c 300 "$log")"
		kill -9 "$SRV" 2>/dev/null; wait "$SRV" 2>/dev/null; SRV=""
		return 1
	fi
	if curl -sf -m 5 "http://127.0.0.1:$PORT/health" >/dev/null; then ok "$name:health"
	else bad "$name:health" "no answer on port $PORT"; fi
	kill -TERM "$SRV"
	for i in $(seq 100); do kill -0 "$SRV" 2>/dev/null || break; sleep 0.1; done
	if kill -0 "$SRV" 2>/dev/null; then bad "$name:stops" "still running 10 s after SIGTERM"; kill -9 "$SRV"
	else ok "$name:stops"; fi
	wait "$SRV" 2>/dev/null
	SRV=""
	return 0
}

# --- KVKEEP_LOG=bogus: the server starts, warns once, logs at info ---
if serve log "KVKEEP_LOG=bo gus"; then
	log=$TMP/log.log
	n=$(grep -c 'event=log.level_invalid' "$log")
	if [ "$n" -eq 1 ] && grep -q 'level=warn event=log.level_invalid value="bo gus" using=info' "$log"; then
		ok log:warns_once; else bad log:warns_once "$n warnings: $(head -c 300 "$log")"; fi
	if grep -q 'level=info event=serve.ready' "$log"; then ok log:default_level_info
	else bad log:default_level_info "$(head -c 300 "$log")"; fi
fi

# --- one-shot commands: they finish, and say what was wrong ---
gen() { # NAME VAR=VALUE
	timeout 60 env "$2" "$KT_BIN" generate --model "$TMP/m" --tokens 1,2,3 --max-tokens 2 >"$TMP/$1.out" 2>"$TMP/$1.err"
}
gen glog KVKEEP_LOG=bogus; rc=$?
n=$(grep -c 'event=log.level_invalid' "$TMP/glog.err")
if [ $rc -eq 0 ] && [ "$n" -eq 1 ]; then ok generate_log_bogus
else bad generate_log_bogus "rc=$rc (124: hung) warnings=$n $(tail -c 300 "$TMP/glog.err")"; fi
gen gisa KVKEEP_ISA=bogus; rc=$?
n=$(grep -c 'unknown KVKEEP_ISA ignored' "$TMP/gisa.err")
if [ $rc -eq 0 ] && [ "$n" -eq 1 ]; then ok generate_isa_bogus
else bad generate_isa_bogus "rc=$rc warnings=$n $(tail -c 300 "$TMP/gisa.err")"; fi
gen gthr KVKEEP_THREADS=bogus; rc=$?
if [ $rc -eq 0 ] && [ -s "$TMP/gthr.out" ]; then ok generate_threads_bogus
else bad generate_threads_bogus "rc=$rc $(tail -c 300 "$TMP/gthr.err")"; fi

# --- the variables a server reads at start ---
for v in KVKEEP_PREFIX_CACHE_MAX_BYTES KVKEEP_HYBRID_CHECKPOINT_STRIDE KVKEEP_HYBRID_CHECKPOINT_MAX \
	KVKEEP_KV_CHECKPOINT_MAX_BYTES KVKEEP_SHUTDOWN_BUDGET; do
	if serve "$v" "$v=bogus"; then
		# once: the value is read at every store open, scan and shutdown step
		n=$(grep 'level=warn' "$TMP/$v.log" | grep -c "$v")
		if [ "$n" -eq 1 ]; then ok "$v:warns_once"
		else bad "$v:warns_once" "$n warnings naming $v: $(grep 'level=warn' "$TMP/$v.log" | head -c 400)"; fi
	fi
done

exit $fail
