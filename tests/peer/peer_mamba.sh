#!/usr/bin/env bash
# tests/peer/peer_mamba.sh - the Mamba-2 hybrids against llama.cpp v0.5.0
# (build/peer/kvpeer) on kvkeep-converted GGUF files: tiny-granite-h
# (granitehybrid, MoE + shared expert), tiny-granite-h-dense (granitehybrid,
# dense) and tiny-nemotron-h (nemotron_h: Mamba-2 with 2 groups, attention,
# squared-ReLU MLP layers), 500 positions, F32 KV, flash attention off:
#   - the F32 file: logits within 1e-4 relative (per row, max |diff| /
#     max |logit|) and the same top-1 at every position;
#   - kvkeep's Q8_0 and Q4_K_M files: top-1 agreement >= 98% (both sides
#     quantize activations, with different rounding rules, and the random
#     tiny models have near-tied logits);
#   - those files hold the tensors llama_model_quantize makes from kvkeep's
#     F32 file: same names, types and bytes (the type mix and the encoders
#     are llama.cpp's).
# ok/FAIL lines for tests/run.sh; "skip" without the npm package.
set -u
. "$(dirname "$0")/common.sh"
peer_setup peer_mamba
N=500

compare() { # peer.f32 kv.f32 mode(1 exact | 0 top-1 >= 98%)
	$PY - "$1" "$2" "$N" "$3" <<'PYEOF'
import numpy as np, sys
a = np.fromfile(sys.argv[1], np.float32); b = np.fromfile(sys.argv[2], np.float32); n = int(sys.argv[3])
if a.size != b.size or a.size % n: print("sizes %d vs %d" % (a.size, b.size)); sys.exit(1)
a = a.reshape(n, -1); b = b.reshape(n, -1)
rel = float((np.abs(a - b).max(axis=1) / np.abs(a).max(axis=1)).max())
top1 = float((a.argmax(1) == b.argmax(1)).mean())
print("max rel %.3g, top-1 agreement %.3f" % (rel, top1))
ok = (rel <= 1e-4 and top1 == 1.0) if sys.argv[4] == "1" else top1 >= 0.98
sys.exit(0 if ok else 1)
PYEOF
}

same_tensors() { # kvkeep.gguf llama.gguf: names, types and bytes
	$PY - "$1" "$2" <<'PYEOF'
import sys, gguf
def load(p):
    return {t.name: (t.tensor_type.name, bytes(t.data.tobytes())) for t in gguf.GGUFReader(p).tensors}
a, b = load(sys.argv[1]), load(sys.argv[2])
bad = [n for n in sorted(set(a) | set(b)) if a.get(n) != b.get(n)]
print("%d tensors, %d differ%s" % (len(b), len(bad), (": " + ", ".join(bad[:4])) if bad else ""))
sys.exit(1 if bad else 0)
PYEOF
}

for preset in ${KT_PEER_PRESETS:-tiny-granite-h tiny-granite-h-dense tiny-nemotron-h}; do
	M=$T/$preset
	if ! "$KV" mkmodel --preset "$preset" --dtype f32 --out "$M" --no-sync >/dev/null 2>"$T/err"; then
		echo "FAIL mkmodel_$preset: $(head -c 300 "$T/err")"
		continue
	fi
	files=""
	for t in f32 q8_0 q4_k_m; do
		if "$KV" convert --model "$M" --out "$M-$t.gguf" --type "$t" --no-sync >/dev/null 2>"$T/err"; then
			files="$files $t"
		else
			echo "FAIL convert_${preset}_$t: $(head -c 300 "$T/err")"
		fi
	done
	for q in Q8_0 Q4_K_M; do
		lq=$(echo $q | tr 'A-Z' 'a-z')
		[ -f "$M-$lq.gguf" ] || continue
		if ! "$K" quantize "$M-f32.gguf" "$M-llama-$q.gguf" "$q" >/dev/null 2>"$T/err"; then
			echo "FAIL llama_quantize_${preset}_$q: $(head -c 300 "$T/err")"
		elif msg=$(same_tensors "$M-$lq.gguf" "$M-llama-$q.gguf"); then
			echo "ok same_tensors_as_llama_quantize_${preset}_$q ($msg)"
		else
			echo "FAIL same_tensors_as_llama_quantize_${preset}_$q: $msg"
		fi
	done
	V=$($PY -c "import json; print(json.load(open('$M/config.json'))['vocab_size'])")
	ids=$(awk -v v="$V" -v n="$N" 'BEGIN { s = 777; for (i = 0; i < n; i++) { s = (s * 1103515245 + 12345) % 2147483648; printf "%s%d", (i ? "," : ""), s % (v - 12) } }')
	for t in $files; do
		F=$M-$t.gguf
		exact=0
		[ "$t" = f32 ] && exact=1
		if ! "$K" logits "$F" --tokens "$ids" --out "$T/lp.f32" >/dev/null 2>"$T/err"; then
			echo "FAIL peer_logits_${preset}_$t: $(grep -v '^kvpeer' "$T/err" | head -c 300)"
			continue
		fi
		if ! "$KV" generate --model "$F" --tokens "$ids" --max-tokens 0 --kv-f32 --all-logits-out "$T/lk.f32" \
			--quiet >/dev/null 2>"$T/err"; then
			echo "FAIL kvkeep_loads_${preset}_$t: $(grep -v 'level=info' "$T/err" | head -c 300)"
			continue
		fi
		if msg=$(compare "$T/lp.f32" "$T/lk.f32" $exact); then
			echo "ok logits_vs_llama_${preset}_$t ($msg)"
		else
			echo "FAIL logits_vs_llama_${preset}_$t: $msg"
		fi
	done
done
