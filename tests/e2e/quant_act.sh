#!/usr/bin/env bash
# quant_act.sh - the --quant-act flag end to end (kvkeep generate on a
# Q4_K_M and a Q8_0 GGUF of tiny-dense): q8 (the default) and f32 give
# different logits (int8 activations vs f32), each mode repeats itself bit
# for bit with another prefill chunk, a BF16 file is the same in both modes
# (nothing to quantize), and a bad value is refused with a clear error.
# Prints ok/FAIL lines.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
KV=${KT_BIN:-$ROOT/build/kvkeep}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL quant_act:$1: $2"; }

if ! "$KV" mkmodel --preset tiny-dense --dtype f32 --out "$T/m" --no-sync >/dev/null 2>"$T/err"; then
	fail setup "mkmodel: $(head -c 300 "$T/err")"
	exit 1
fi
IDS=3,14,15,92,65,35,89,79,32,38,46,26,43,38,32,79,50,28,84,19,71,69,39,93,75,10,58,20,97,49,44,59,23,7
logits() { # file mode chunk out
	KVKEEP_LOG=warn "$KV" generate --model "$1" --tokens "$IDS" --max-tokens 0 --kv-f32 --quant-act "$2" \
		--chunk "$3" --all-logits-out "$4" --quiet >/dev/null 2>"$T/err"
}
for t in q4_k_m q8_0 bf16; do
	F=$T/m-$t.gguf
	if ! "$KV" convert --model "$T/m" --out "$F" --type $t --no-sync >/dev/null 2>"$T/err"; then
		fail "convert_$t" "$(head -c 300 "$T/err")"
		continue
	fi
	ok=1
	for mode in q8 f32; do
		if ! logits "$F" $mode 256 "$T/$t-$mode.a" || ! logits "$F" $mode 5 "$T/$t-$mode.b"; then
			fail "${t}_$mode" "generate: $(grep -v level=info "$T/err" | head -c 300)"
			ok=0
			continue
		fi
		cmp -s "$T/$t-$mode.a" "$T/$t-$mode.b" || { fail "${t}_${mode}_chunked" "logits depend on the chunk"; ok=0; }
	done
	[ $ok = 1 ] || continue
	if [ $t = bf16 ]; then
		cmp -s "$T/$t-q8.a" "$T/$t-f32.a" && echo "ok quant_act:${t}_modes_equal" ||
			fail "${t}_modes_equal" "a BF16 file changed with --quant-act"
	else
		cmp -s "$T/$t-q8.a" "$T/$t-f32.a" && fail "${t}_modes_differ" "q8 and f32 gave the same logits" ||
			echo "ok quant_act:${t}_modes_differ_each_invariant"
	fi
done

out=$("$KV" generate --model "$T/m-q8_0.gguf" --tokens 1,2,3 --max-tokens 0 --quant-act int4 2>&1)
rc=$?
if [ $rc -ne 0 ] && echo "$out" | grep -q "quant-act must be q8 or f32"; then
	echo "ok quant_act:bad_value_refused"
else
	fail bad_value_refused "rc $rc: $(echo "$out" | tail -1 | head -c 200)"
fi
