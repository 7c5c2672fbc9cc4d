#!/usr/bin/env bash
# agent_turns.sh - per user turn: time to first token and cached share of an
# agent session replayed through `kvkeep bench replay`, for two kvkeep
# builds alternating (this one and an older one), so the effect of keeping
# the reasoning history (--reasoning-history keep) is measured in one run.
#
#   bash bench/agent_turns.sh --model DIR|FILE --new BIN --old BIN [--reps N]
#        [--trace FILE] [--turns T] [--system-tokens N] [--write-lines N]
#        [--max-tokens N] [--serve-args "..."] [--out DIR]
#
# The trace (bench mktrace --reasoning --write-lines N unless --trace is
# given) has reasoning_content on every assistant message and file writes
# through tool-call arguments. Each repetition replays it once on a fresh
# server of each build (old and new alternate, a fresh disk-cache folder
# each time), greedy, KVKEEP_THREADS as set by the caller.
#
# Report, per request that starts a user turn (its last message is the
# user's) and per build, medians over the repetitions: TTFT, cached tokens,
# and the share of the previous request's prompt they cover. The reference
# for "a turn whose whole prefix hits": the prefill rate the same build
# reached on the requests whose prefix did hit (tool steps whose cached
# tokens cover >= 95% of the previous prompt), turned into the TTFT such a
# hit would have had for this turn's new tokens; the ratio TTFT / that is
# printed (the issue's goal: <= 1.5). Needs Debian's /usr/bin/python3.
set -eu
ROOT=$(cd "$(dirname "$0")/.." && pwd)
MODEL="" NEW="$ROOT/build/kvkeep" OLD="" REPS=3 TRACE="" TURNS=30 SYS=8000 WRITE=200 MAXTOK=16 SARGS="" OUT=""
while [ $# -gt 0 ]; do
	case $1 in
	--model) MODEL=$2; shift 2 ;;
	--new) NEW=$2; shift 2 ;;
	--old) OLD=$2; shift 2 ;;
	--reps) REPS=$2; shift 2 ;;
	--trace) TRACE=$2; shift 2 ;;
	--turns) TURNS=$2; shift 2 ;;
	--system-tokens) SYS=$2; shift 2 ;;
	--write-lines) WRITE=$2; shift 2 ;;
	--max-tokens) MAXTOK=$2; shift 2 ;;
	--serve-args) SARGS=$2; shift 2 ;;
	--out) OUT=$2; shift 2 ;;
	-h|--help) sed -n '2,26p' "$0"; exit 0 ;;
	*) echo "agent_turns.sh: unknown flag $1 (see --help)" >&2; exit 2 ;;
	esac
done
[ -n "$MODEL" ] && [ -n "$OLD" ] || { echo "agent_turns.sh: --model and --old are required (see --help)" >&2; exit 2; }
[ -x "$NEW" ] && [ -x "$OLD" ] || { echo "agent_turns.sh: --new and --old must be kvkeep binaries" >&2; exit 2; }
OUT=${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/agent-turns.XXXXXX")}
mkdir -p "$OUT"
if [ -z "$TRACE" ]; then
	TRACE=$OUT/trace.jsonl
	"$NEW" bench mktrace --turns "$TURNS" --system-tokens "$SYS" --reasoning --write-lines "$WRITE" --quiet --out "$TRACE"
fi
run() { # build-name binary rep
	local dc=$OUT/cache-$1-$3
	rm -rf "$dc"
	KVKEEP_CACHE_DIR=$dc "$2" bench replay --spawn "$2 serve --model $MODEL --served-model-name kvkeep $SARGS" \
		--trace "$TRACE" --max-tokens "$MAXTOK" --json --server-log "$OUT/serve-$1-$3.log" \
		>"$OUT/replay-$1-$3.jsonl" 2>"$OUT/replay-$1-$3.err"
	rm -rf "$dc"
}
for rep in $(seq "$REPS"); do
	if [ $((rep % 2)) = 1 ]; then run old "$OLD" "$rep"; run new "$NEW" "$rep"
	else run new "$NEW" "$rep"; run old "$OLD" "$rep"; fi
	echo "repetition $rep done" >&2
done
/usr/bin/python3 - "$TRACE" "$OUT" "$REPS" <<'PY'
import json, statistics, sys
trace, out, reps = sys.argv[1], sys.argv[2], int(sys.argv[3])
bodies = [json.loads(l) for l in open(trace) if l.strip()]
user_turn = [b["messages"][-1]["role"] == "user" for b in bodies]

def rows(build, rep):
    return [r for r in map(json.loads, open(f"{out}/replay-{build}-{rep}.jsonl")) if r.get("type") == "request"]

def med(v):
    v = [x for x in v if x is not None]
    return statistics.median(v) if v else None

res = {}
for build in ("old", "new"):
    runs = [rows(build, k) for k in range(1, reps + 1)]
    n = len(bodies)
    per = []
    for i in range(n):
        rs = [r[i] for r in runs if len(r) > i and r[i]["ok"]]
        per.append({
            "ttft": med([r["ttft_ms"] for r in rs]),
            "ttft_all": [r["ttft_ms"] for r in rs],
            "prompt": med([r["prompt_tokens"] for r in rs]),
            "cached": med([r["cached_tokens"] for r in rs]),
        })
    # the prefill rate of requests whose prefix hit (tool steps)
    rates = []
    for i in range(1, n):
        p, c = per[i - 1], per[i]
        if user_turn[i] or None in (p["prompt"], c["prompt"], c["cached"], c["ttft"]):
            continue
        if c["cached"] >= 0.95 * p["prompt"] and c["ttft"] > 0:
            rates.append((c["prompt"] - c["cached"]) / (c["ttft"] / 1e3))
    res[build] = (per, med(rates))

print(f"trace: {trace} ({len(bodies)} requests, {sum(user_turn)} start a user turn), {reps} repetitions each")
for build in ("old", "new"):
    print(f"{build}: prefill rate on prefix hits {res[build][1] or 0:.0f} tok/s")
print("turn  req  prompt | old: cached  share   ttft_ms | new: cached  share   ttft_ms (min-max)  ideal_ms  new/ideal")
turn = 0
for i in range(len(bodies)):
    if not user_turn[i] or i == 0:
        continue
    turn += 1
    line = f"{turn:4d} {i + 1:4d} {res['new'][0][i]['prompt'] or 0:7.0f} |"
    ratio = None
    for build in ("old", "new"):
        per, rate = res[build]
        c, p = per[i], per[i - 1]
        share = c["cached"] / p["prompt"] if c["cached"] is not None and p["prompt"] else 0
        line += f" {c['cached'] or 0:10.0f} {100 * share:5.1f}% {c['ttft'] or 0:9.1f}"
        if build == "new":
            lo, hi = min(c["ttft_all"] or [0]), max(c["ttft_all"] or [0])
            ideal = (c["prompt"] - p["prompt"]) / rate * 1e3 if rate and c["prompt"] and p["prompt"] else None
            ratio = c["ttft"] / ideal if ideal else None
            line += f" ({lo:.0f}-{hi:.0f}) {ideal or 0:9.1f} {ratio or 0:9.2f}"
        else:
            line += " |"
    print(line)
PY
echo "raw results: $OUT" >&2
