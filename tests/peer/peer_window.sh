#!/usr/bin/env bash
# tests/peer/peer_window.sh - the sliding-window families against llama.cpp
# v0.5.0 (build/peer/kvpeer) on kvkeep-converted GGUF files of tiny-llama3
# (llama: rope_freqs, q/k rows permuted), tiny-gemma3 (gemma3: 5 sliding :
# 1 global, window 16, norms stored + 1) and tiny-gpt-oss (gpt-oss: window 16,
# sinks, biases, YaRN, MXFP4 experts), 500 positions (31 windows), F32 KV,
# flash attention off:
#   - F32 files: within 1e-4 relative (per row, max |diff| / max |logit|),
#     top-1 equal everywhere. gemma3 is held to 1e-3: llama.cpp's CPU GELU
#     (ggml_vec_geglu_f32) looks its values up in an fp16 table, which
#     rounds the MLP's gate input and output to fp16 (measured 3.7e-4;
#     kvkeep computes gelu_pytorch_tanh in f32 like transformers, and agrees
#     with the PyTorch reference within 1.1e-6, tests/ref/engine_ref.sh).
#     tiny-gemma4 (dense: 5 sliding heads of 32 : 1 global head of 64, K = V,
#     proportional RoPE, layer scalars, softcap 30) and tiny-gemma4-moe (8
#     experts top-2 beside the dense MLP) and tiny-gemma4-e (E2B's shape:
#     the last 3 of 9 layers read earlier layers' KV, per-layer embeddings,
#     double-wide MLPs) likewise (measured 4.1e-4, 5.5e-4 and 9.2e-4; within
#     2e-6 of the PyTorch reference);
#   - Q8_0 and Q4_K_M files (gpt-oss's experts stay MXFP4, as llama.cpp's
#     converter keeps them): top-1 >= 98% with --quant-act f32 (kvkeep's
#     exact dequantization against llama.cpp's int8 activations), and >= 96%
#     in the default q8 mode (both sides round activations, each its own way:
#     the noise floor of these near-tied random models, docs/gguf.md);
#   - kvkeep reads its own F32 GGUF of each as the folder it came from:
#     gemma3 bit for bit, llama within 1e-6 (the rope_freqs factors and the
#     permuted rows), gpt-oss bit for bit once the folder's YaRN rounds its
#     correction range as llama.cpp always does ("truncate": true).
# ok/FAIL lines for tests/run.sh; "skip" without the npm package.
set -u
. "$(dirname "$0")/common.sh"
peer_setup peer_window
N=500

compare() { # peer.f32 kv.f32 rel_max top1_min [decidable]
	$PY - "$1" "$2" "$N" "$3" "$4" "${5:-0}" <<'PYEOF'
import numpy as np, sys
a = np.fromfile(sys.argv[1], np.float32); b = np.fromfile(sys.argv[2], np.float32); n = int(sys.argv[3])
if a.size != b.size or a.size % n: print("sizes %d vs %d" % (a.size, b.size)); sys.exit(1)
a = a.reshape(n, -1); b = b.reshape(n, -1)
d = np.abs(a - b).max(axis=1)
rel = float((d / np.abs(a).max(axis=1)).max())
agree = a.argmax(1) == b.argmax(1)
top1 = float(agree.mean())
msg = "max rel %.3g, top-1 agreement %.3f" % (rel, top1)
ok = rel <= float(sys.argv[4]) and top1 >= float(sys.argv[5])
if sys.argv[6] == "1":
    # rows whose top-2 gap (llama.cpp's) exceeds the two sides' largest
    # logit difference in that row cannot flip by noise: all must agree
    s = np.sort(a, 1)
    dec = (s[:, -1] - s[:, -2]) > 2 * d
    msg += ", decidable rows %d/%d agree %d" % (dec.sum(), n, (agree & dec).sum())
    ok = ok and bool(agree[dec].all())
print(msg)
sys.exit(0 if ok else 1)
PYEOF
}

kv_logits() { # file out flags...
	local f=$1 o=$2
	shift 2
	"$KV" generate --model "$f" --tokens "$ids" --max-tokens 0 --kv-f32 --all-logits-out "$o" --quiet "$@" \
		>/dev/null 2>"$T/err"
}

for preset in tiny-llama3 tiny-gemma3 tiny-gpt-oss tiny-gemma4 tiny-gemma4-moe tiny-gemma4-e; do
	M=$T/$preset
	if ! "$KV" mkmodel --preset "$preset" --dtype f32 --out "$M" --no-sync >/dev/null 2>"$T/err"; then
		echo "FAIL mkmodel_$preset: $(head -c 300 "$T/err")"
		continue
	fi
	V=$($PY -c "import json; print(json.load(open('$M/config.json'))['vocab_size'])")
	ids=$(awk -v v="$V" -v n="$N" 'BEGIN { s = 777; for (i = 0; i < n; i++) { s = (s * 1103515245 + 12345) % 2147483648; printf "%s%d", (i ? "," : ""), s % (v - 12) } }')
	for t in f32 q8_0 q4_k_m; do
		F=$M-$t.gguf
		if ! "$KV" convert --model "$M" --out "$F" --type "$t" --no-sync >/dev/null 2>"$T/err"; then
			echo "FAIL convert_${preset}_$t: $(head -c 300 "$T/err")"
			continue
		fi
		if ! "$K" logits "$F" --tokens "$ids" --out "$T/lp.f32" >/dev/null 2>"$T/err"; then
			echo "FAIL peer_logits_${preset}_$t: $(grep -v '^kvpeer' "$T/err" | head -c 300)"
			continue
		fi
		if [ "$t" = f32 ]; then
			tol=1e-4
			[ "$preset" = tiny-gemma3 ] && tol=1e-3
			case $preset in tiny-gemma4*) tol=1e-3 ;; esac
			if ! kv_logits "$F" "$T/lk.f32"; then
				echo "FAIL kvkeep_loads_${preset}_$t: $(grep -v 'level=info' "$T/err" | head -c 300)"
				continue
			fi
			if msg=$(compare "$T/lp.f32" "$T/lk.f32" $tol 1.0); then
				echo "ok logits_vs_llama_${preset}_f32 ($msg)"
			else
				echo "FAIL logits_vs_llama_${preset}_f32: $msg"
			fi
			continue
		fi
		for qa in f32 q8; do
			min=0.98 dec=0
			[ $qa = q8 ] && min=0.96
			# tiny-gemma4-e's logits are flatter (median top-2 gap 14% of the
			# largest logit against 37% for the others; 5.4% of rows within 1%):
			# its Q8_0 file measured 97.8% (f32 activations) with every flip at
			# a row whose gap is below the two sides' difference; held to 97%
			# plus no flip where the gap exceeds twice the row's difference
			[ $preset = tiny-gemma4-e ] && min=0.97 dec=1
			if ! kv_logits "$F" "$T/lk.f32" --quant-act $qa; then
				echo "FAIL kvkeep_loads_${preset}_$t: $(grep -v 'level=info' "$T/err" | head -c 300)"
				continue
			fi
			if msg=$(compare "$T/lp.f32" "$T/lk.f32" 1e9 $min $dec); then
				echo "ok top1_vs_llama_${preset}_${t}_act_$qa ($msg)"
			else
				echo "FAIL top1_vs_llama_${preset}_${t}_act_$qa: $msg"
			fi
		done
	done
	# the F32 file read back as the folder it came from
	if [ -f "$M-f32.gguf" ]; then
		H=$M
		if [ "$preset" = tiny-gpt-oss ]; then
			H=$T/oss-truncate
			cp -r "$M" "$H"
			$PY -c "import json,sys; p=sys.argv[1]+'/config.json'; j=json.load(open(p)); j['rope_scaling']['truncate']=True; json.dump(j, open(p, 'w'))" "$H"
		fi
		# exact numerics on both sides: GPT-OSS's folder keeps the release's
		# MXFP4 experts, whose default (q8) products differ from the F32
		# file's dequantized experts
		if kv_logits "$H" "$T/hf.f32" --quant-act f32 && kv_logits "$M-f32.gguf" "$T/gg.f32" &&
			msg=$(compare "$T/hf.f32" "$T/gg.f32" $([ "$preset" = tiny-llama3 ] && echo 1e-6 || echo 0) 1.0); then
			echo "ok gguf_f32_equals_folder_${preset} ($msg)"
		else
			echo "FAIL gguf_f32_equals_folder_${preset}: ${msg:-$(grep -v 'level=info' "$T/err" | head -c 300)}"
		fi
	fi
done
