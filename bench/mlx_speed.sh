#!/usr/bin/env bash
# bench/mlx_speed.sh [BUILD] [REPEAT] [CONTEXTS] - prefill and decode speed
# of MLX 4-bit and 8-bit folders against the BF16 folder they were made
# from, for bench-dense and bench-hybrid, in one run, alternating the three
# formats REPEAT times (default 3), and the median and spread of each cell.
# A benchmark, not a test: it prints numbers and asserts nothing. Run it on
# a quiet machine (the numbers of a loaded one are noise).
#
# Each cell is `kvkeep bench engine --json --contexts CONTEXTS` (default
# 1024,8192): prefill tok/s at each context, decode tok/s at that context,
# and the decode bound (weight bytes read per token, scales and biases
# included, over the measured memcpy bandwidth).
set -eu
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-build}
REPEAT=${2:-3}
CONTEXTS=${3:-1024,8192}
BIN=$ROOT/$BUILD/kvkeep
[ -x "$BIN" ] || { echo "mlx_speed: $BIN not built (make BUILD=$BUILD)" >&2; exit 1; }
TMP=$(mktemp -d "${TMPDIR:-/tmp}/kvkeep-mlxbench.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
echo "$(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg), contexts $CONTEXTS, $REPEAT repetitions"

for preset in bench-dense bench-hybrid; do
	"$BIN" mkmodel --preset "$preset" --out "$TMP/$preset" --no-sync >/dev/null
	"$BIN" convert-mlx --model "$TMP/$preset" --out "$TMP/$preset-mlx4" --mlx-bits 4 --no-sync >/dev/null
	"$BIN" convert-mlx --model "$TMP/$preset" --out "$TMP/$preset-mlx8" --mlx-bits 8 --no-sync >/dev/null
	for r in $(seq "$REPEAT"); do
		for f in "" -mlx4 -mlx8; do
			KVKEEP_LOG=warn "$BIN" bench engine --model "$TMP/$preset$f" --contexts "$CONTEXTS" --json \
				>"$TMP/$preset$f.$r.json" 2>/dev/null
		done
	done
	python3 - "$TMP" "$preset" "$REPEAT" <<'EOF'
import json, statistics, sys
tmp, preset, rep = sys.argv[1], sys.argv[2], int(sys.argv[3])
for f, name in (("", "BF16"), ("-mlx4", "MLX4 g64"), ("-mlx8", "MLX8 g64")):
    runs = [json.load(open(f"{tmp}/{preset}{f}.{r}.json")) for r in range(1, rep + 1)]
    for i, c in enumerate(runs[0]["contexts"]):
        def cell(key):
            v = [run["contexts"][i][key] for run in runs]
            return f"{statistics.median(v):8.1f} ({min(v):.1f}-{max(v):.1f})"
        vb = statistics.median(run["contexts"][i]["decode_vs_bound"] for run in runs)
        print(f"{preset:12s} {name:9s} ctx {c['context']:5}: prefill {cell('prefill_tokens_per_s')} tok/s, "
              f"decode {cell('decode_tokens_per_s')} tok/s ({vb:.0%} of the weights bound, "
              f"{runs[0]['decode_weight_bytes'] / 1e6:.1f} MB/token)")
EOF
done
