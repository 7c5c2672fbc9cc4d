#!/usr/bin/env bash
# constrain_decode.sh - decode speed with and without a constraint (issue
# 30's goal: constrained >= 0.95x unconstrained), in one run, alternating.
#
#   bash bench/constrain_decode.sh --model DIR|FILE [--reps N] [--tokens N]
#        [--tools FILE] [--bin BUILD/kvkeep]
#
# Each repetition runs `kvkeep generate` twice on the same prompt and seed,
# once plain and once with every call constrained to the agent's tools
# (--tools FILE --tool-choice required, Claude Code's by default: 18 real
# tool schemas; both sample at most --tokens tokens, the constrained one
# may stop sooner at an end the grammar allows), and reads the decode
# tok/s of its timing line. The
# constrained run also reports its mask cost (mean and max per token).
# Prints the median and spread of both and their ratio.
set -eu
ROOT=$(cd "$(dirname "$0")/.." && pwd)
MODEL="" REPS=5 TOKENS=128 TOOLS="$ROOT/tests/data/schemas/tools/claude_code.json" BIN="$ROOT/build/kvkeep"
while [ $# -gt 0 ]; do
	case $1 in
	--model) MODEL=$2; shift 2 ;;
	--reps) REPS=$2; shift 2 ;;
	--tokens) TOKENS=$2; shift 2 ;;
	--tools) TOOLS=$2; shift 2 ;;
	--bin) BIN=$2; shift 2 ;;
	-h|--help) sed -n '2,15p' "$0"; exit 0 ;;
	*) echo "constrain_decode.sh: unknown flag $1 (see --help)" >&2; exit 2 ;;
	esac
done
[ -n "$MODEL" ] || { echo "constrain_decode.sh: --model is required (see --help)" >&2; exit 2; }
OUT=$(mktemp -d "${TMPDIR:-/tmp}/constrain-decode.XXXXXX")
trap 'rm -rf "$OUT"' EXIT
PROMPT="You are a coding agent. Read the file src/main.c and then fix the bug in the parser; call a tool."
rate() { sed -n 's/.* generated in [0-9.]* s (\([0-9.]*\) tok\/s).*/\1/p' "$1" | tail -1; }
for r in $(seq 1 "$REPS"); do
	"$BIN" generate --model "$MODEL" --prompt "$PROMPT" --max-tokens "$TOKENS" --temperature 1 --seed "$r" \
		--ignore-eos >/dev/null 2>"$OUT/plain-$r.err"
	"$BIN" generate --model "$MODEL" --prompt "$PROMPT" --max-tokens "$TOKENS" --temperature 1 --seed "$r" \
		--tools "$TOOLS" --tool-choice required --parallel-tool-calls \
		>/dev/null 2>"$OUT/cons-$r.err"
	echo "rep $r: plain $(rate "$OUT/plain-$r.err") tok/s, constrained $(rate "$OUT/cons-$r.err") tok/s;" \
		"$(grep -o 'constraint: [0-9]* masks, mean [0-9.]* us, max [0-9.]* us' "$OUT/cons-$r.err" | tail -1)"
done
/usr/bin/python3 - "$OUT" "$REPS" <<'PY'
import re, statistics, sys
out, reps = sys.argv[1], int(sys.argv[2])
def rate(p):
    m = re.findall(r"generated in [0-9.]+ s \(([0-9.]+) tok/s\)", open(p).read())
    return float(m[-1]) if m else None
pl = [rate(f"{out}/plain-{r}.err") for r in range(1, reps + 1)]
co = [rate(f"{out}/cons-{r}.err") for r in range(1, reps + 1)]
pl = [x for x in pl if x]; co = [x for x in co if x]
if not pl or not co:
    sys.exit("no timing lines (see the generate errors)")
mp, mc = statistics.median(pl), statistics.median(co)
print(f"decode tok/s: plain {mp:.1f} ({min(pl):.1f}-{max(pl):.1f}), constrained {mc:.1f} ({min(co):.1f}-{max(co):.1f}), "
      f"ratio {mc / mp:.3f}")
PY
