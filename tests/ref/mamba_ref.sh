#!/usr/bin/env bash
# tests/ref/mamba_ref.sh - the Mamba-2 hybrids against the PyTorch reference
# (tests/ref/mamba_ref.py, Debian's /usr/bin/python3 with torch).
#
# For tiny-granite-h (Granite 4.0-H, MoE + shared expert), tiny-granite-h-dense
# (shared_mlp alone) and tiny-nemotron-h (Mamba-2 with 2 groups, attention and
# squared-ReLU MLP layers), f32 weights and f32 KV, 64 token ids:
#   logits      engine vs the reference's recurrent scan, every position,
#               max |engine - ref| / max |ref| <= 1e-4
#   state       every Mamba layer's conv state and SSM state after the prompt
#   ssd         the reference's chunked SSD form (chunks of 1, 5, 16, 64
#               tokens, outputs and final state) against its recurrent form
#               (1e-4), in every Mamba layer of the model
#   chunking    the engine's logits and snapshot with prefill chunks of 1, 3
#               (with pages of 7) and 64 tokens, and on the scalar and AVX2
#               paths: the same bytes as the whole-prompt run (cmp)
#   mlx         `kvkeep convert --mlx-bits` folders in mlx-lm's names
#               (tiny-granite-h 4-bit: block_sparse_moe.switch_mlp stacks;
#               tiny-granite-h-dense 8-bit: mlp.*; tiny-nemotron-h 4-bit;
#               groups of 32) run by the engine against the reference on the
#               same weights dequantized by mamba_ref.py --dequant-mlx (1e-4)
# One "ok NAME" / "FAIL NAME: why" line per check.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BIN=${KT_BIN:-$ROOT/build/kvkeep}
PY=/usr/bin/python3
REF="$ROOT/tests/ref/mamba_ref.py"
T=$(mktemp -d "${TMPDIR:-/tmp}/kvkeep-mref.XXXXXX")
trap 'rm -rf "$T"' EXIT
fails=0
ok() { echo "ok ref_mamba:$1"; }
fail() { echo "FAIL ref_mamba:$1: $2"; fails=$((fails + 1)); }

if ! "$PY" -c 'import torch, numpy' 2>/dev/null; then
	echo "skip ref_mamba:all: $PY cannot import torch and numpy (apt-get install python3-torch python3-numpy)"
	exit 0
fi
[ -x "$BIN" ] || { echo "FAIL ref_mamba:setup: no kvkeep binary at $BIN"; exit 1; }

gen() { # dir out-prefix extra-flags...
	local dir=$1 out=$2
	shift 2
	KVKEEP_LOG=warn "$BIN" generate --model "$dir" --tokens "$TOK" --max-tokens 0 --kv-f32 --quiet \
		--all-logits-out "$out.bin" --state-out "$out.st" "$@" >"$out.log" 2>&1
}

for p in tiny-granite-h tiny-granite-h-dense tiny-nemotron-h; do
	d=$T/$p
	if ! "$BIN" mkmodel --preset $p --dtype f32 --out "$d" --no-sync >"$T/mk.log" 2>&1; then
		fail "${p}_mkmodel" "$(tail -1 "$T/mk.log")"
		continue
	fi
	vocab=$("$PY" -c "import json,sys; print(json.load(open(sys.argv[1]))['vocab_size'])" "$d/config.json")
	TOK=$("$PY" -c "import random; r=random.Random(11); print(','.join(str(r.randrange($vocab)) for _ in range(64)))")
	if ! gen "$d" "$T/$p.c"; then
		fail "${p}_engine" "$(tail -1 "$T/$p.c.log")"
		continue
	fi
	if ! "$PY" "$REF" --model "$d" --tokens "$TOK" --logits-out "$T/$p.r.bin" --state-out "$T/$p.r.st" \
		--chunk-sizes 1,5,16,64 >"$T/$p.ref.log" 2>&1; then
		fail "${p}_ssd_chunked_vs_recurrent" "$(tail -3 "$T/$p.ref.log" | tr '\n' ' ')"
	else
		ok "${p}_ssd_chunked_vs_recurrent_chunks_1_5_16_64"
	fi
	sed 's/^/  /' "$T/$p.ref.log" >&2
	if out=$("$PY" "$REF" --compare "$T/$p.c.bin" "$T/$p.r.bin" --vocab "$vocab" --tol 1e-4); then
		ok "${p}_logits_64_positions"
	else
		fail "${p}_logits_64_positions" "$out"
	fi
	echo "  $p logits: $out" >&2
	if out=$("$PY" "$REF" --compare-state "$T/$p.c.st" "$T/$p.r.st" --tol 1e-4); then
		ok "${p}_conv_and_ssm_state"
	else
		fail "${p}_conv_and_ssm_state" "$out"
	fi
	echo "  $p state: $out" >&2
	same=1
	for v in "--chunk 1" "--chunk 64" "--chunk 3 --page-tokens 7"; do
		# shellcheck disable=SC2086
		gen "$d" "$T/$p.v" $v || { same=0; break; }
		cmp -s "$T/$p.v.bin" "$T/$p.c.bin" && cmp -s "$T/$p.v.st" "$T/$p.c.st" || { same=0; echo "  $p: $v differs" >&2; }
	done
	for isa in scalar avx2; do
		KVKEEP_ISA=$isa gen "$d" "$T/$p.v" --chunk 9 || { same=0; break; }
		cmp -s "$T/$p.v.bin" "$T/$p.c.bin" && cmp -s "$T/$p.v.st" "$T/$p.c.st" || { same=0; echo "  $p: $isa differs" >&2; }
	done
	if [ $same = 1 ]; then ok "${p}_engine_chunks_and_paths_bit_identical"; else fail "${p}_engine_chunks_and_paths_bit_identical" "logits or state differ"; fi
done
for pb in tiny-granite-h:4 tiny-granite-h-dense:8 tiny-nemotron-h:4; do
	p=${pb%:*} b=${pb#*:} d=$T/${pb%:*}
	[ -d "$d" ] || continue
	q=$T/$p-mlx$b
	vocab=$("$PY" -c "import json,sys; print(json.load(open(sys.argv[1]))['vocab_size'])" "$d/config.json")
	TOK=$("$PY" -c "import random; r=random.Random(11); print(','.join(str(r.randrange($vocab)) for _ in range(64)))")
	if ! "$BIN" convert --model "$d" --out "$q" --mlx-bits "$b" --group-size 32 --no-sync >"$T/mlx.log" 2>&1 ||
		! "$PY" "$REF" --dequant-mlx "$q" "$q-deq" >>"$T/mlx.log" 2>&1 || ! gen "$q" "$q.c" ||
		! "$PY" "$REF" --model "$q-deq" --tokens "$TOK" --logits-out "$q.r.bin" --state-out "$q.r.st" >>"$T/mlx.log" 2>&1; then
		fail "${p}_mlx${b}" "$(tail -2 "$T/mlx.log" "$q.c.log" 2>/dev/null | tr '\n' ' ')"
		continue
	fi
	if out=$("$PY" "$REF" --compare "$q.c.bin" "$q.r.bin" --vocab "$vocab" --tol 1e-4) &&
		out2=$("$PY" "$REF" --compare-state "$q.c.st" "$q.r.st" --tol 1e-4); then
		ok "${p}_mlx${b}_logits_and_state_vs_dequantized_reference"
	else
		fail "${p}_mlx${b}_logits_and_state_vs_dequantized_reference" "$out ${out2:-}"
	fi
	echo "  $p mlx$b: $out ${out2:-}" >&2
done
[ $fails = 0 ]
