#!/usr/bin/env bash
# tests/run.sh BUILD [--unit-only]
#
# Runs every test program and script and ends with one line
# "N passed, N failed". A program reports one line per case:
#   ok <name>            a passed case
#   FAIL <name>: why     a failed case
#   skip <name>: why     not run here (never counted as passed)
# A program that exits non-zero without printing a FAIL line counts as one
# failure (a crash). Each program runs under a time limit.
set -u
BUILD=${1:-build}
MODE=${2:-all}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
export KT_BIN="$ROOT/$BUILD/kvkeep"
export KT_BUILD="$ROOT/$BUILD"
export KVKEEP_LOG=${KVKEEP_LOG:-warn}
# Each program's time limit. Under the sanitizers (make san-test) the
# kernels run ~40x slower, and an AVX-512 machine checks its AVX2 and
# AVX-512 paths both: test_kernels took 16 s plain and over 600 s under
# ASan + UBSan on a Sapphire Rapids, so sanitizer runs get 2400 s.
LIMIT=600
[ -n "${KVKEEP_SANITIZER:-}" ] && LIMIT=2400
# servers started by tests write their disk cache here, never to ~/.cache
export KVKEEP_CACHE_DIR=${KVKEEP_CACHE_DIR:-$ROOT/$BUILD/test-disk-cache}
rm -rf "$ROOT/$BUILD/test-disk-cache"
LOGDIR="$ROOT/$BUILD/test-logs"
mkdir -p "$LOGDIR"
pass=0; fail=0; skip=0
failed_names=()

run_one() { # name limit_s cmd...
	local name=$1 limit=$2; shift 2
	local log="$LOGDIR/$name.log" t0 t1 rc
	t0=$(date +%s)
	timeout --kill-after=10 "$limit" "$@" >"$log.out" 2>"$log.err"
	rc=$?
	t1=$(date +%s)
	local p f s
	p=$(grep -c '^ok ' "$log.out")
	f=$(grep -c '^FAIL ' "$log.out")
	s=$(grep -c '^skip ' "$log.out")
	grep -E '^(FAIL|skip) ' "$log.out" | sed 's/^/  /'
	if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
		if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
			echo "  FAIL $name: timed out after ${limit}s"
		else
			echo "  FAIL $name: exited with status $rc and no FAIL line"
		fi
		f=1
	fi
	pass=$((pass + p)); fail=$((fail + f)); skip=$((skip + s))
	if [ "$f" -gt 0 ]; then
		failed_names+=("$name")
		echo "  --- $name stderr (last 20 lines) ---"
		tail -n 20 "$log.err" | sed 's/^/  | /'
	fi
	printf '%-40s %3d ok %3d failed %3ds\n' "$name" "$p" "$f" "$((t1 - t0))"
}

for t in "$BUILD"/tests/test_*; do
	[ -x "$t" ] || continue
	run_one "$(basename "$t")" "$LIMIT" "$t"
done

for r in "$BUILD"/tests/replay_*; do
	[ -x "$r" ] || continue
	name=${r##*/replay_}
	run_one "replay_$name" "$LIMIT" "$r" "tests/fuzz/corpus/$name"
done

if [ "$MODE" != "--unit-only" ]; then
	for s in tests/arch/*.sh tests/e2e/*.sh tests/peer/peer_*.sh tests/ref/*.sh; do
		[ -f "$s" ] || continue
		n=$(basename "$(dirname "$s")")_$(basename "$s" .sh)
		run_one "$n" 900 bash "$s"
	done
fi

echo
if [ "$skip" -gt 0 ]; then echo "($skip skipped, not counted)"; fi
if [ "${#failed_names[@]}" -gt 0 ]; then echo "failed programs: ${failed_names[*]} (logs in $LOGDIR)"; fi
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
