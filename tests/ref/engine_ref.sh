#!/usr/bin/env bash
# tests/ref/engine_ref.sh - the C engine against the PyTorch reference.
#
# Builds synthetic models with `$KT_BIN mkmodel` (f32 weights), runs
# tests/ref/reference_model.py (Debian's /usr/bin/python3 with torch) and
# `kvkeep generate --kv-f32 --all-logits-out --state-out` on the same 64
# token ids, and compares:
#   logits   every one of the 64 positions: max|engine - ref| / max|ref| <= 1e-4
#   state    DeltaNet conv state and S after the prompt: same bound
# for tiny-dense (qwen3), tiny-hybrid (qwen3_5), tiny-hybrid regrouped into
# qwen3_next's fused in_proj_qkvz / in_proj_ba layout (dense-next, which
# must also give logits bit-identical to tiny-hybrid's), and the MoE
# presets tiny-moe (qwen3_5_moe, stacked experts.gate_up_proj / down_proj)
# and tiny-next (qwen3_next, fused DeltaNet, per-expert tensors, one dense
# layer, norm_topk_prob false); tiny-moe's experts are also rewritten per
# expert (moe-split) and as mlx-lm's switch_mlp stacks (moe-switch), which
# must both give bit-identical logits.
#
# F16 matrices (reference_model.py --to-f16) and MLX quantized folders
# (kvkeep convert-mlx: 4 and 8 bits, groups of 64 and 32, and a mixed
# folder with per-module overrides; tiny-moe and tiny-next as mlx-lm's
# quantized switch_mlp expert stacks) run by the engine against the
# reference on the same weights, dequantized independently by
# reference_model.py --dequant-mlx; 1e-4 like the f32 folders.
# dense-yarn, dense-linear and hybrid-yarn are the same f32 models with
# RoPE scaling added to config.json (checked the same way, 1e-4). The
# bf16-weight presets with the default bf16 KV are checked against the
# reference with a looser 2e-2 bound (bf16 KV rounding). The reference also
# checks its own recurrent delta rule against Hugging Face's chunked form.
# The MTP head (mkmodel --mtp) is checked the same way (its logits at 63
# positions, 1e-4), and its GGUF nextn tensors give the folder's numbers.
# One "ok NAME" / "FAIL NAME: why" line per check.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BIN=${KT_BIN:-$ROOT/build/kvkeep}
PY=/usr/bin/python3
REF="$ROOT/tests/ref/reference_model.py"
T=$(mktemp -d "${TMPDIR:-/tmp}/kvkeep-ref.XXXXXX")
trap 'rm -rf "$T"' EXIT
fails=0

ok() { echo "ok ref_engine:$1"; }
fail() { echo "FAIL ref_engine:$1: $2"; fails=$((fails + 1)); }

if ! "$PY" -c 'import torch, numpy' 2>/dev/null; then
	echo "skip ref_engine:all: $PY cannot import torch and numpy (apt-get install python3-torch python3-numpy)"
	exit 0
fi
if [ ! -x "$BIN" ]; then
	echo "FAIL ref_engine:setup: no kvkeep binary at $BIN"
	exit 1
fi

# 64 fixed pseudo-random ids below the vocabulary of the built-in tokenizer.
mk() { # preset dtype dir
	"$BIN" mkmodel --preset "$1" --dtype "$2" --out "$3" --no-sync >"$T/mk.log" 2>&1 ||
		{ fail "mkmodel_$1_$2" "$(tail -1 "$T/mk.log")"; return 1; }
}

run_pair() { # name dir kvflag tol check_state [reference_dir]
	local name=$1 dir=$2 kvflag=$3 tol=$4 check_state=$5 rdir=${6:-$2} vocab
	vocab=$("$PY" -c "import json,sys; j=json.load(open(sys.argv[1])); print(j.get('text_config', j)['vocab_size'])" "$dir/config.json")
	TOK=$("$PY" -c "import random; r=random.Random(7); print(','.join(str(r.randrange($vocab)) for _ in range(64)))")
	if ! KVKEEP_LOG=warn "$BIN" generate --model "$dir" --tokens "$TOK" --max-tokens 0 $kvflag --quiet \
		--all-logits-out "$T/$name.c.bin" --state-out "$T/$name.c.st" >"$T/$name.gen.log" 2>&1; then
		fail "${name}_logits" "engine: $(tail -1 "$T/$name.gen.log")"
		return
	fi
	if ! "$PY" "$REF" --model "$rdir" --tokens "$TOK" --logits-out "$T/$name.r.bin" --state-out "$T/$name.r.st" \
		--check-chunked >"$T/$name.ref.log" 2>&1; then
		fail "${name}_reference" "$(tail -1 "$T/$name.ref.log")"
		return
	fi
	if grep -q chunked "$T/$name.ref.log"; then ok "${name}_reference_chunked_vs_recurrent"; fi
	if out=$("$PY" "$REF" --compare "$T/$name.c.bin" "$T/$name.r.bin" --vocab "$vocab" --tol "$tol"); then
		ok "${name}_logits_64_positions"
	else
		fail "${name}_logits_64_positions" "$out"
	fi
	echo "  $name: $out" >&2
	if [ "$check_state" = 1 ]; then
		if out=$("$PY" "$REF" --compare-state "$T/$name.c.st" "$T/$name.r.st" --tol "$tol"); then
			ok "${name}_deltanet_state"
		else
			fail "${name}_deltanet_state" "$out"
		fi
		echo "  $name: $out" >&2
	fi
}

mk tiny-dense f32 "$T/tiny-dense" && run_pair tiny-dense "$T/tiny-dense" --kv-f32 1e-4 0
mk tiny-hybrid f32 "$T/tiny-hybrid" && run_pair tiny-hybrid "$T/tiny-hybrid" --kv-f32 1e-4 1
if [ -d "$T/tiny-hybrid" ]; then
	if "$PY" "$REF" --make-next "$T/tiny-hybrid" "$T/dense-next" >"$T/next.log" 2>&1; then
		run_pair dense-next "$T/dense-next" --kv-f32 1e-4 1
		if [ -f "$T/dense-next.c.bin" ] && cmp -s "$T/dense-next.c.bin" "$T/tiny-hybrid.c.bin"; then
			ok "qwen3_next_fused_layout_bit_identical_to_qwen3_5"
		else
			fail "qwen3_next_fused_layout_bit_identical_to_qwen3_5" "logits differ"
		fi
	else
		fail "make_next" "$(tail -1 "$T/next.log")"
	fi
fi
mk tiny-moe f32 "$T/tiny-moe" && run_pair tiny-moe "$T/tiny-moe" --kv-f32 1e-4 1
mk tiny-next f32 "$T/tiny-next" && run_pair tiny-next "$T/tiny-next" --kv-f32 1e-4 1
if [ -d "$T/tiny-moe" ]; then
	if "$PY" "$REF" --split-experts "$T/tiny-moe" "$T/moe-split" >"$T/split.log" 2>&1; then
		run_pair moe-split "$T/moe-split" --kv-f32 1e-4 0
		if [ -f "$T/moe-split.c.bin" ] && cmp -s "$T/moe-split.c.bin" "$T/tiny-moe.c.bin"; then
			ok "moe_per_expert_layout_bit_identical_to_stacked"
		else
			fail "moe_per_expert_layout_bit_identical_to_stacked" "logits differ"
		fi
	else
		fail "split_experts" "$(tail -1 "$T/split.log")"
	fi
	if "$PY" "$REF" --switch-experts "$T/tiny-moe" "$T/moe-switch" >"$T/switch.log" 2>&1; then
		run_pair moe-switch "$T/moe-switch" --kv-f32 1e-4 0
		if [ -f "$T/moe-switch.c.bin" ] && cmp -s "$T/moe-switch.c.bin" "$T/tiny-moe.c.bin"; then
			ok "moe_switch_mlp_layout_bit_identical_to_stacked"
		else
			fail "moe_switch_mlp_layout_bit_identical_to_stacked" "logits differ"
		fi
	else
		fail "switch_experts" "$(tail -1 "$T/switch.log")"
	fi
fi
mk tiny-moe bf16 "$T/tiny-moe-bf16" && run_pair tiny-moe-bf16 "$T/tiny-moe-bf16" "" 2e-2 1
# RoPE scaling: a copy of a folder with a rope_scaling (dense, the older
# key) or rope_parameters (hybrid, the newer one) block; original contexts
# of 16 and 8 tokens so that the 64 positions run far past them.
rope_variant() { # src dst key json
	rm -rf "$2" && cp -r "$1" "$2" &&
		"$PY" -c "import json,sys; p=sys.argv[1]+'/config.json'; j=json.load(open(p)); t=j.get('text_config', j); t.setdefault(sys.argv[2], {}); t[sys.argv[2]] = dict(t[sys.argv[2]] or {}, **json.loads(sys.argv[3])); json.dump(j, open(p, 'w'))" "$2" "$3" "$4"
}
if [ -d "$T/tiny-dense" ]; then
	rope_variant "$T/tiny-dense" "$T/dense-yarn" rope_scaling \
		'{"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}' &&
		run_pair dense-yarn "$T/dense-yarn" --kv-f32 1e-4 0
	rope_variant "$T/tiny-dense" "$T/dense-linear" rope_scaling '{"type": "linear", "factor": 2.5}' &&
		run_pair dense-linear "$T/dense-linear" --kv-f32 1e-4 0
fi
if [ -d "$T/tiny-hybrid" ]; then
	rope_variant "$T/tiny-hybrid" "$T/hybrid-yarn" rope_parameters \
		'{"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 8, "beta_fast": 16, "mscale": 2, "mscale_all_dim": 1, "truncate": false}' &&
		run_pair hybrid-yarn "$T/hybrid-yarn" --kv-f32 1e-4 1
fi
mk tiny-dense bf16 "$T/tiny-dense-bf16" && run_pair tiny-dense-bf16 "$T/tiny-dense-bf16" "" 2e-2 0
mk tiny-hybrid bf16 "$T/tiny-hybrid-bf16" && run_pair tiny-hybrid-bf16 "$T/tiny-hybrid-bf16" "" 2e-2 1
mlx_pair() { # preset bits group check_state [overrides]
	local src="$T/$1" out="$T/$1-mlx$2g$3${5:+mixed}"
	if ! "$BIN" convert-mlx --model "$src" --out "$out" --mlx-bits "$2" --group-size "$3" --no-sync \
		${5:+--mlx-overrides "$5"} >"$T/cv.log" 2>&1; then
		fail "convert_mlx_$1_$2" "$(tail -1 "$T/cv.log")"
		return
	fi
	if ! "$PY" "$REF" --dequant-mlx "$out" "$out-deq" >"$T/dq.log" 2>&1; then
		fail "dequant_mlx_$1_$2" "$(tail -1 "$T/dq.log")"
		return
	fi
	run_pair "$1-mlx$2g$3${5:+mixed}" "$out" --kv-f32 1e-4 "$4" "$out-deq"
}
[ -d "$T/tiny-dense" ] && { mlx_pair tiny-dense 4 64 0; mlx_pair tiny-dense 8 32 0; }
[ -d "$T/tiny-hybrid" ] && { mlx_pair tiny-hybrid 4 64 1; mlx_pair tiny-hybrid 8 64 1; }
[ -d "$T/dense-next" ] && mlx_pair dense-next 4 64 1
# MoE: mlx-lm's quantized switch_mlp stacks (from tiny-moe's stacked
# gate_up_proj and tiny-next's per-expert tensors), routers at 8 bits
[ -d "$T/tiny-moe" ] && { mlx_pair tiny-moe 4 64 1; mlx_pair tiny-moe 8 32 1; }
[ -d "$T/tiny-next" ] && mlx_pair tiny-next 4 32 1
# a mixed recipe: per-module overrides (8-bit groups of 32, a float matrix)
[ -d "$T/tiny-hybrid" ] && mlx_pair tiny-hybrid 4 64 1 \
	"language_model.model.layers.0.mlp.down_proj=8:32,language_model.model.layers.3.self_attn.q_proj=float,language_model.model.embed_tokens=8:64"
# F16 matrices (the reference widens them exactly, as the engine does).
f16_pair() { # preset check_state
	if ! "$PY" "$REF" --to-f16 "$T/$1" "$T/$1-f16" >"$T/f16.log" 2>&1; then
		fail "to_f16_$1" "$(tail -1 "$T/f16.log")"
		return
	fi
	run_pair "$1-f16" "$T/$1-f16" --kv-f32 1e-4 "$2"
}
[ -d "$T/tiny-dense" ] && f16_pair tiny-dense 0
[ -d "$T/tiny-hybrid" ] && f16_pair tiny-hybrid 1
# The sliding-window families against tests/ref/reference_window.py (its own
# PyTorch code: explicit window masks, sinks, MXFP4 dequantized on its own):
# 64 positions, windows of 16 keys, so most queries attend a window.
win_pair() { # name dir kvflag tol
	local name=$1 dir=$2 kvflag=$3 tol=$4 vocab TOK
	vocab=$("$PY" -c "import json,sys; j=json.load(open(sys.argv[1])); print(j.get('text_config', j)['vocab_size'])" "$dir/config.json")
	TOK=$("$PY" -c "import random; r=random.Random(11); print(','.join(str(r.randrange($vocab)) for _ in range(64)))")
	if ! KVKEEP_LOG=warn "$BIN" generate --model "$dir" --tokens "$TOK" --max-tokens 0 $kvflag --quiet \
		--all-logits-out "$T/$name.c.bin" >"$T/$name.gen.log" 2>&1; then
		fail "${name}_logits" "engine: $(tail -1 "$T/$name.gen.log")"
		return
	fi
	if ! "$PY" "$ROOT/tests/ref/reference_window.py" --model "$dir" --tokens "$TOK" --logits-out "$T/$name.r.bin" \
		>"$T/$name.ref.log" 2>&1; then
		fail "${name}_reference" "$(tail -1 "$T/$name.ref.log")"
		return
	fi
	if out=$("$PY" "$REF" --compare "$T/$name.c.bin" "$T/$name.r.bin" --vocab "$vocab" --tol "$tol"); then
		ok "${name}_logits_64_positions"
	else
		fail "${name}_logits_64_positions" "$out"
	fi
	echo "  $name: $out" >&2
}
# f32: exact numerics (--quant-act f32: GPT-OSS's MXFP4 experts dequantized,
# as the reference does); bf16: the defaults, so GPT-OSS's experts take the
# q8 integer products (engine/qdot.h) there.
# tiny-gemma4-moe has no bf16 leg: its random routers (8 experts, logits
# ~ N(0, 1)) change a token's top 2 under bf16 KV rounding in ~5 of 64 rows
# (measured: max 0.28, mean 2.5e-2; 1e-6 with F32 KV), which measures the
# routers' near-ties, not the engine; the bf16 KV path is tiny-gemma4's.
for p in tiny-llama3 tiny-gemma3 tiny-gpt-oss tiny-gemma4 tiny-gemma4-moe tiny-gemma4-e; do
	mk $p f32 "$T/$p" && win_pair $p "$T/$p" "--kv-f32 --quant-act f32" 1e-4
	[ $p = tiny-gemma4-moe ] && continue
	mk $p bf16 "$T/$p-bf16" && win_pair $p-bf16 "$T/$p-bf16" "" 2e-2
done
# gemma3 with what its larger releases add: linear RoPE scaling on the global
# layers only, the sliding ones keeping rope_local_base_freq; and a final
# logit softcap (Gemma 2's, still read)
if [ -d "$T/tiny-gemma3" ]; then
	rope_variant "$T/tiny-gemma3" "$T/gemma3-scaled" rope_scaling '{"rope_type": "linear", "factor": 8.0}' &&
		"$PY" -c "import json,sys; p=sys.argv[1]+'/config.json'; j=json.load(open(p)); j['final_logit_softcapping']=3.0; json.dump(j, open(p, 'w'))" "$T/gemma3-scaled" &&
		win_pair gemma3-scaled-softcap "$T/gemma3-scaled" --kv-f32 1e-4
fi
# The MTP head (mkmodel --mtp: the mtp.* tensors; dense MLP, stacked and
# per-expert MoE): `kvkeep generate --mtp-logits-out` against the
# reference's mtp() on the first 64 positions (row t: hidden state t and
# token t + 1), and a GGUF's nextn tensors (kvkeep convert --type f32)
# giving the folder's head logits bit for bit.
mtp_pair() { # preset
	local d="$T/$1-mtp" vocab TOK
	"$BIN" mkmodel --preset "$1" --mtp --dtype f32 --out "$d" --no-sync >"$T/mk.log" 2>&1 ||
		{ fail "mkmodel_$1_mtp" "$(tail -1 "$T/mk.log")"; return; }
	vocab=$("$PY" -c "import json,sys; j=json.load(open(sys.argv[1])); print(j.get('text_config', j)['vocab_size'])" "$d/config.json")
	TOK=$("$PY" -c "import random; r=random.Random(7); print(','.join(str(r.randrange($vocab)) for _ in range(64)))")
	if ! KVKEEP_LOG=warn "$BIN" generate --model "$d" --tokens "$TOK" --max-tokens 0 --kv-f32 --quiet \
		--mtp-logits-out "$T/$1.mtp.c" >"$T/mtp.log" 2>&1; then
		fail "mtp_$1" "engine: $(tail -1 "$T/mtp.log")"
		return
	fi
	if ! "$PY" "$REF" --model "$d" --tokens "$TOK" --logits-out "$T/$1.mtp.l" --mtp-logits-out "$T/$1.mtp.r" \
		>"$T/mtp.log" 2>&1; then
		fail "mtp_$1" "reference: $(tail -1 "$T/mtp.log")"
		return
	fi
	if out=$("$PY" "$REF" --compare "$T/$1.mtp.c" "$T/$1.mtp.r" --vocab "$vocab" --tol 1e-4); then
		ok "mtp_head_$1_63_positions"
	else
		fail "mtp_head_$1_63_positions" "$out"
	fi
	echo "  mtp $1: $out" >&2
	[ "$1" = tiny-next ] && return # a dense layer: no llama.cpp qwen3next GGUF
	if ! "$BIN" convert --model "$d" --out "$T/$1-mtp.gguf" --type f32 --no-sync >"$T/mtp.log" 2>&1 ||
		! KVKEEP_LOG=warn "$BIN" generate --model "$T/$1-mtp.gguf" --tokens "$TOK" --max-tokens 0 --kv-f32 --quiet \
			--mtp-logits-out "$T/$1.mtp.g" >>"$T/mtp.log" 2>&1; then
		fail "mtp_gguf_$1" "$(tail -1 "$T/mtp.log")"
	elif cmp -s "$T/$1.mtp.g" "$T/$1.mtp.c"; then
		ok "mtp_gguf_nextn_equals_folder_$1"
	else
		fail "mtp_gguf_nextn_equals_folder_$1" "the GGUF's head logits differ from the folder's"
	fi
}
mtp_pair tiny-hybrid
mtp_pair tiny-moe
mtp_pair tiny-next
mtp_pair tiny-next-moe
[ "$fails" -eq 0 ]
