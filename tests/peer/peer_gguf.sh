#!/usr/bin/env bash
# tests/peer/peer_gguf.sh - kvkeep running GGUF files against llama.cpp
# v0.5.0 running the same files (build/peer/kvpeer), tiny-dense (qwen3),
# tiny-hybrid (qwen35), tiny-moe (qwen35moe: stacked experts, shared expert)
# and tiny-next-moe (qwen3next: in_proj_qkvz split into attn_qkv/attn_gate,
# ssm_ba), 500 positions, F32 KV, flash attention off (and tiny-moe with
# its expert stacks fused into ffn_gate_up_exps, tests/peer/fuse_gate_up.py):
#   - kvkeep's F32 file: logits within 1e-4 relative (per row, max |diff| /
#     max |logit|), same top-1 everywhere;
#   - F16/BF16 files: within 1e-2 and >= 99% top-1: llama.cpp's CPU matmul
#     rounds the activations to the weight type (ggml's vec_dot_type), kvkeep
#     keeps them f32 (measured: 3e-4 for F16, 5e-3..9e-3 for BF16); the MoE
#     presets >= 99% top-1 only (a flipped near-tied expert moves a row);
#   - kvkeep's Q8_0/Q4_K_M files and llama.cpp's own Q4_K_M/Q6_K/Q4_0
#     (llama_model_quantize of kvkeep's F32 file) load in kvkeep; top-1
#     agreement >= 97%: both dequantize the same blocks bit for bit
#     (test_quant) and both quantize activations per row to int8 (kvkeep's
#     default --quant-act q8, engine/qdot.h; other rounding rules than
#     ggml's), and the tiny random models have near-tied logits (measured
#     97.2-99.0% in q8 mode, 97.8-99.2% with --quant-act f32; the MoE
#     presets 97.8-98.4%, where a near tie in the router also flips
#     experts; see docs/gguf.md). tiny-moe's floor was 98%, which is
#     inside the noise: its Q4_K_M file has one Q5_1 matrix, which went
#     from f32 to int8 activations with Q5_1 on the integer path
#     (2026-12-02), and these 500 positions went 98.6% -> 97.8% while
#     kvkeep's logits stayed as close to the exact f32 mode (rms 0.0186
#     both); over five other token seeds the old build gave 97.8-98.6%
#     (three below 98%), the new one 98.0-98.6%. So 97% like the others.
# ok/FAIL lines for tests/run.sh; "skip" without the npm package.
set -u
. "$(dirname "$0")/common.sh"
peer_setup peer_gguf
N=500

compare() { # name peer.f32 kv.f32 exact(1|0)
	$PY - "$2" "$3" "$N" "$4" <<'PYEOF'
import numpy as np, sys
a = np.fromfile(sys.argv[1], np.float32); b = np.fromfile(sys.argv[2], np.float32); n = int(sys.argv[3])
if a.size != b.size or a.size % n: print("sizes %d vs %d" % (a.size, b.size)); sys.exit(1)
a = a.reshape(n, -1); b = b.reshape(n, -1)
rel = float((np.abs(a - b).max(axis=1) / np.abs(a).max(axis=1)).max())
top1 = float((a.argmax(1) == b.argmax(1)).mean())
print("max rel %.3g, top-1 agreement %.3f" % (rel, top1))
m = sys.argv[4]
ok = (rel <= 1e-4 and top1 == 1.0) if m == "1" else (rel <= 1e-2 and top1 >= 0.99) if m == "2" \
    else top1 >= 0.99 if m == "3" else top1 >= 0.97
sys.exit(0 if ok else 1)
PYEOF
}

for preset in ${KT_PEER_PRESETS:-tiny-dense tiny-hybrid tiny-moe tiny-next-moe}; do
	M=$T/$preset
	if ! "$KV" mkmodel --preset "$preset" --dtype f32 --out "$M" --no-sync >/dev/null 2>"$T/err"; then
		echo "FAIL mkmodel_$preset: $(head -c 300 "$T/err")"
		continue
	fi
	files=""
	for t in f32 f16 bf16 q8_0 q4_k_m; do
		if "$KV" convert --model "$M" --out "$M-$t.gguf" --type "$t" --no-sync >/dev/null 2>"$T/err"; then
			files="$files $t"
		else
			echo "FAIL convert_${preset}_$t: $(head -c 300 "$T/err")"
		fi
	done
	for q in Q4_K_M Q6_K Q4_0; do
		if "$K" quantize "$M-f32.gguf" "$M-llama-$q.gguf" "$q" >/dev/null 2>"$T/err"; then
			files="$files llama-$q"
		else
			echo "FAIL llama_quantize_${preset}_$q: $(head -c 300 "$T/err")"
		fi
	done
	V=$($PY -c "import json; c = json.load(open('$M/config.json')); print(c.get('text_config', c)['vocab_size'])")
	ids=$(awk -v v="$V" -v n="$N" 'BEGIN { s = 777; for (i = 0; i < n; i++) { s = (s * 1103515245 + 12345) % 2147483648; printf "%s%d", (i ? "," : ""), s % (v - 12) } }')
	for t in $files; do
		F=$M-$t.gguf
		exact=0
		case $t in f32) exact=1 ;; f16|bf16) exact=2 ;; esac
		# MoE: llama.cpp's f16/bf16-rounded activations can flip a near-tied
		# router choice, which moves a whole row (measured max rel 0.1-0.13
		# for BF16); top-1 only
		case $preset-$t in *moe-f16|*moe-bf16) exact=3 ;; esac
		if ! "$K" logits "$F" --tokens "$ids" --out "$T/lp.f32" >/dev/null 2>"$T/err"; then
			echo "FAIL peer_logits_${preset}_$t: $(grep -v '^kvpeer' "$T/err" | head -c 300)"
			continue
		fi
		if ! "$KV" generate --model "$F" --tokens "$ids" --max-tokens 0 --kv-f32 --all-logits-out "$T/lk.f32" \
			--quiet >/dev/null 2>"$T/err"; then
			echo "FAIL kvkeep_loads_${preset}_$t: $(grep -v 'level=info' "$T/err" | head -c 300)"
			continue
		fi
		if msg=$(compare "$t" "$T/lp.f32" "$T/lk.f32" $exact); then
			echo "ok logits_vs_llama_${preset}_$t ($msg)"
		else
			echo "FAIL logits_vs_llama_${preset}_$t: $msg"
		fi
	done
done

# llama.cpp's fused ffn_gate_up_exps (which its loader prefers, kvkeep reads
# as the stacked HF layout): tiny-moe's F32 file rewritten fused gives
# kvkeep's logits of the unfused file bit for bit, and llama.cpp agrees
M=$T/tiny-moe
if [ -f "$M-f32.gguf" ]; then
	if ! PYTHONPATH=$BUILD/peer/gguf-py $PY "$ROOT/tests/peer/fuse_gate_up.py" "$M-f32.gguf" "$M-fused.gguf" 2>"$T/err"; then
		echo "FAIL fused_gate_up_write: $(tail -c 300 "$T/err")"
	else
		V=$($PY -c "import json; c = json.load(open('$M/config.json')); print(c.get('text_config', c)['vocab_size'])")
		ids=$(awk -v v="$V" -v n="$N" 'BEGIN { s = 777; for (i = 0; i < n; i++) { s = (s * 1103515245 + 12345) % 2147483648; printf "%s%d", (i ? "," : ""), s % (v - 12) } }')
		for f in f32 fused; do
			"$KV" generate --model "$M-$f.gguf" --tokens "$ids" --max-tokens 0 --kv-f32 --all-logits-out "$T/lk-$f.f32" \
				--quiet >/dev/null 2>"$T/err" || echo "FAIL kvkeep_loads_tiny-moe_$f: $(grep -v 'level=info' "$T/err" | head -c 300)"
		done
		if cmp -s "$T/lk-f32.f32" "$T/lk-fused.f32"; then
			echo "ok fused_gate_up_exps_equals_split_bit_for_bit"
		else
			echo "FAIL fused_gate_up_exps_equals_split_bit_for_bit: logits differ"
		fi
		if "$K" logits "$M-fused.gguf" --tokens "$ids" --out "$T/lp-fused.f32" >/dev/null 2>"$T/err" &&
			msg=$(compare fused "$T/lp-fused.f32" "$T/lk-fused.f32" 1); then
			echo "ok logits_vs_llama_tiny-moe_fused_gate_up ($msg)"
		else
			echo "FAIL logits_vs_llama_tiny-moe_fused_gate_up: ${msg:-$(grep -v '^kvpeer' "$T/err" | head -c 300)}"
		fi
	fi
fi
