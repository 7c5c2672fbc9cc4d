#!/usr/bin/env bash
# tests/peer/peer_smoke.sh - the llama.cpp oracle (build/peer/kvpeer) works
# on this machine, checked without any model file:
#   - it builds against the npm package's libraries and bundle headers;
#   - to_float decodes known bit patterns (f16, bf16, a q8_0 block) exactly;
#   - tofloat(fromfloat(x)) is close to x for every block type kvkeep reads,
#     and ggml_quantize_chunk equals the type's from_float_ref without an
#     importance matrix;
#   - garbage, truncated and hostile files get an error exit with a message,
#     never a crash (a signal); usage errors exit 2.
# Prints ok/FAIL lines (tests/run.sh); "skip" when the npm package is not
# installed (non-x86-64 hosts).
set -u
. "$(dirname "$0")/common.sh"
peer_setup peer_smoke
echo "ok peer_build"

# status of a kvpeer run that must fail cleanly: 1 or 2 with a "kvpeer:"
# line on stderr; a signal (>= 128) or success is a failure
expect_error() { # name want_status cmd...
	local name=$1 want=$2; shift 2
	"$@" >"$T/out" 2>"$T/err"
	local st=$?
	if [ $st -eq "$want" ] && grep -q '^kvpeer: ' "$T/err"; then
		echo "ok $name"
	else
		echo "FAIL $name: exit $st (want $want), stderr: $(head -c 300 "$T/err" | tr '\n' ' ')"
	fi
}

# ---- exact decoding of known bits ----
$PY - "$T" <<'EOF'
import numpy as np, struct, sys
d = sys.argv[1]
np.array([0x3c00, 0xc000, 0x7bff, 0x0001, 0x8000], np.uint16).tofile(d + "/k.f16")
np.array([0x3f80, 0xc040, 0x0001, 0x7f80], np.uint16).tofile(d + "/k.bf16")
# q8_0: f16 scale 0.5, then 32 int8 values -128..127 stepping by 8
qs = np.arange(-128, 128, 8, dtype=np.int8)
open(d + "/k.q8_0", "wb").write(struct.pack("<H", 0x3800) + qs.tobytes())
EOF
check_known() { # type expected-values...
	local t=$1; shift
	if ! "$K" tofloat "$t" "$T/k.$t" "$T/k.$t.out" >/dev/null 2>"$T/err"; then
		echo "FAIL known_$t: $(head -c 300 "$T/err")"
		return
	fi
	if $PY - "$T/k.$t.out" "$@" <<'EOF'; then echo "ok known_$t"; else echo "FAIL known_$t: wrong values"; fi
import numpy as np, sys
got = np.fromfile(sys.argv[1], np.float32)
want = np.array([float(x) for x in sys.argv[2:]], np.float32)
ok = got.shape == want.shape and np.array_equal(got.view(np.uint32), want.view(np.uint32))
if not ok:
    print("got", got.tolist(), "want", want.tolist(), file=sys.stderr)
sys.exit(0 if ok else 1)
EOF
}
check_known f16 1.0 -2.0 65504.0 5.960464477539063e-08 -0.0
check_known bf16 1.0 -3.0 9.183549615799121e-41 inf
check_known q8_0 $(seq -128 8 127 | awk '{printf "%s ", $1 * 0.5}')

# ---- round trips: every block type kvkeep reads, and more ----
$PY -c "
import numpy as np
rng = np.random.default_rng(11)
x = rng.standard_normal(8 * 4096).astype(np.float32)
x[:256] = 0                      # an all-zero super-block (zero scales)
x[256:512] *= 1e3                # extreme values
x[512:768] = np.abs(x[512:768])  # all positive (min = 0 for K types)
x.tofile('$T/x.f32')
"
# type: bound on rms(error)/rms(x)
for spec in f32:0 f16:1e-3 bf16:1e-2 q8_0:1e-2 q4_0:0.15 q4_1:0.15 q5_0:0.08 q5_1:0.08 \
	q2_K:0.5 q3_K:0.3 q4_K:0.12 q5_K:0.06 q6_K:0.03 iq4_nl:0.15 iq4_xs:0.15; do
	t=${spec%%:*} bound=${spec#*:}
	if ! "$K" fromfloat "$t" "$T/x.f32" "$T/x.$t" --row 4096 >/dev/null 2>"$T/err" ||
		! "$K" tofloat "$t" "$T/x.$t" "$T/y.$t" >/dev/null 2>>"$T/err"; then
		echo "FAIL roundtrip_$t: $(head -c 300 "$T/err")"
		continue
	fi
	msg=$($PY -c "
import numpy as np
x = np.fromfile('$T/x.f32', np.float32); y = np.fromfile('$T/y.$t', np.float32)
if x.shape != y.shape: print('shape', y.shape); raise SystemExit(1)
r = np.sqrt(np.mean((x - y) ** 2) / np.mean(x ** 2))
z = np.abs(y[:256]).max()
if not (r <= $bound) or z != 0: print('rel rms %.3g (bound $bound), zero block max %g' % (r, z)); raise SystemExit(1)
print('rel rms %.3g' % r)
")
	if [ $? -eq 0 ]; then echo "ok roundtrip_$t ($msg)"; else echo "FAIL roundtrip_$t: $msg"; fi
done
for t in q4_0 q8_0 q4_K q6_K; do
	"$K" fromfloat "$t" "$T/x.f32" "$T/r.$t" --row 4096 --ref >/dev/null 2>"$T/err"
	if cmp -s "$T/r.$t" "$T/x.$t"; then echo "ok chunk_is_ref_$t"; else echo "FAIL chunk_is_ref_$t: quantize_chunk and from_float_ref differ"; fi
done

# ---- bad inputs: error exits, not crashes ----
head -c 1000 "$T/x.q4_K" >"$T/trunc.q4_K"
expect_error tofloat_truncated 1 "$K" tofloat q4_K "$T/trunc.q4_K" "$T/o"
expect_error tofloat_missing 1 "$K" tofloat q4_K "$T/nope" "$T/o"
expect_error tofloat_unknown_type 2 "$K" tofloat q9_9 "$T/x.f32" "$T/o"
expect_error tofloat_no_to_float 1 "$K" tofloat i32 "$T/x.f32" "$T/o"
head -c 1234 "$T/x.f32" >"$T/odd.f32"
expect_error fromfloat_odd_bytes 1 "$K" fromfloat q8_0 "$T/odd.f32" "$T/o"
expect_error fromfloat_row_not_block 1 "$K" fromfloat q4_K "$T/x.f32" "$T/o" --row 100
expect_error fromfloat_needs_imatrix 1 "$K" fromfloat iq2_xxs "$T/x.f32" "$T/o" --row 4096
expect_error usage 2 "$K" nosuchcommand

$PY - "$T" <<'EOF'
import struct, sys, os, random
d = sys.argv[1]
def s(x): return struct.pack("<Q", len(x)) + x
hdr = b"GGUF" + struct.pack("<I", 3)
open(d + "/garbage.gguf", "wb").write(os.urandom(4096))
open(d + "/empty.gguf", "wb").write(b"")
open(d + "/badver.gguf", "wb").write(b"GGUF" + struct.pack("<IQQ", 99, 0, 0))
# a header promising one kv and one tensor, cut after the key
open(d + "/trunc.gguf", "wb").write(hdr + struct.pack("<QQ", 1, 1) + s(b"general.architecture"))
# a string length of 2^62
open(d + "/hugestr.gguf", "wb").write(hdr + struct.pack("<QQ", 0, 1) + struct.pack("<Q", 1 << 62) + b"x")
# a metadata array of 2^60 u64 values
open(d + "/bomb.gguf", "wb").write(hdr + struct.pack("<QQ", 0, 1) + s(b"a") + struct.pack("<IIQ", 9, 10, 1 << 60))
# a well-formed file with no tensors and an unknown architecture
kv = s(b"general.architecture") + struct.pack("<I", 8) + s(b"nosucharch")
open(d + "/noarch.gguf", "wb").write(hdr + struct.pack("<QQ", 0, 1) + kv)
# a 64x64 f32 tensor (16 KiB) in a file with 64 bytes of data
ti = s(b"token_embd.weight") + struct.pack("<I", 2) + struct.pack("<QQ", 64, 64) + struct.pack("<IQ", 0, 0)
body = hdr + struct.pack("<QQ", 1, 1) + s(b"general.architecture") + struct.pack("<I", 8) + s(b"qwen3") + ti
body += b"\0" * (-len(body) % 32)
open(d + "/pastend.gguf", "wb").write(body + b"\0" * 64)
random.seed(5)
for i in range(8):
    b = bytearray(body)
    for _ in range(6):
        b[random.randrange(8, len(b))] = random.randrange(256)
    open(d + "/fuzz%d.gguf" % i, "wb").write(bytes(b))
EOF
for f in garbage empty badver trunc hugestr bomb noarch pastend; do
	expect_error "info_$f" 1 "$K" info "$T/$f.gguf"
done
expect_error logits_garbage 1 "$K" logits "$T/garbage.gguf" --tokens 1,2 --out "$T/o"
expect_error logits_pastend 1 "$K" logits "$T/pastend.gguf" --tokens 1,2 --out "$T/o"
expect_error tokenize_trunc 1 "$K" tokenize "$T/trunc.gguf" --text hi
expect_error quantize_bomb 1 "$K" quantize "$T/bomb.gguf" "$T/q.gguf" Q4_K_M
expect_error quantize_pastend 1 "$K" quantize "$T/pastend.gguf" "$T/q.gguf" Q8_0
expect_error bench_hugestr 1 "$K" bench "$T/hugestr.gguf" --prefill 8
expect_error logits_usage 2 "$K" logits "$T/pastend.gguf" --out "$T/o"
crash=""
for i in 0 1 2 3 4 5 6 7; do
	"$K" info "$T/fuzz$i.gguf" >/dev/null 2>&1
	st=$?
	[ $st -ge 128 ] && crash="$crash fuzz$i(status $st)"
done
if [ -z "$crash" ]; then echo "ok info_mutated_headers"; else echo "FAIL info_mutated_headers:$crash"; fi
exit 0
