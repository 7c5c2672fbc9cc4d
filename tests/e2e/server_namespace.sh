#!/usr/bin/env bash
# server_namespace.sh - the cache namespace follows every weight byte
# (server/fingerprint.h), with the real `kvkeep serve`:
#   - two models with the same config, tensor table, size and mtime but
#     one weight byte changed (a "fine-tune") get different namespaces on
#     one cache root;
#   - the same model started again gets the same namespace and reads no
#     weight byte (the memo in <root>/weights/);
#   - a copy of the model (new inode, same bytes) gets the same namespace
#     after hashing it once.
# Prints ok/FAIL lines; bounded by timeouts.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
: "${KT_BIN:=$ROOT/build/kvkeep}"
T=server_namespace
if [ ! -x "$KT_BIN" ]; then echo "FAIL $T:setup: no kvkeep binary at $KT_BIN"; exit 1; fi
TMP=$(mktemp -d "${TMPDIR:-/tmp}/kvkeep-ns.XXXXXX")
SRV=""
cleanup() { [ -n "$SRV" ] && kill -9 "$SRV" 2>/dev/null; rm -rf "$TMP"; }
trap cleanup EXIT
fail=0
ok() { echo "ok $T:$1"; }
bad() { echo "FAIL $T:$1: $2"; fail=1; }

"$KT_BIN" mkmodel --preset tiny-dense --seed 1 --no-sync --out "$TMP/m1" >/dev/null 2>&1 ||
	{ echo "FAIL $T:setup: mkmodel failed"; exit 1; }
cp -r "$TMP/m1" "$TMP/copy"
# m2: m1 with one weight byte changed (past the safetensors header), same
# size and mtime: the tensor table and config are identical
cp -r "$TMP/m1" "$TMP/m2"
f=$TMP/m2/model.safetensors
hdr=$(od -An -t u8 -N 8 "$f" | tr -d ' ')
off=$((8 + hdr + 1000))
b=$(od -An -t u1 -j $off -N 1 "$f" | tr -d ' ')
printf "$(printf '\\%03o' $(( (b + 1) % 256 )))" | dd of="$f" bs=1 seek=$off conv=notrunc 2>/dev/null
touch -r "$TMP/m1/model.safetensors" "$f"
cmp -s "$TMP/m1/model.safetensors" "$f" && { echo "FAIL $T:setup: the weight byte did not change"; exit 1; }
cmp -s <(head -c $((8 + hdr)) "$TMP/m1/model.safetensors") <(head -c $((8 + hdr)) "$f") ||
	{ echo "FAIL $T:setup: the header changed"; exit 1; }

# start a server on model $1 with log $2, wait for ready, stop it
run() {
	KVKEEP_LOG=info "$KT_BIN" serve --model "$1" --host 127.0.0.1 --port 0 --cache-dir "$TMP/cache" 2>"$2" &
	SRV=$!
	for _ in $(seq 1 200); do
		grep -q 'event=serve.ready' "$2" && break
		sleep 0.1
	done
	kill -TERM "$SRV" 2>/dev/null
	wait "$SRV" 2>/dev/null
	SRV=""
}
ns_of() { sed -n 's/.*event=serve.ready .*namespace=\([0-9a-f]*\).*/\1/p' "$1"; }
field() { sed -n "s/.*event=serve.fingerprint .*$2=\([0-9.]*\).*/\1/p" "$1"; }

run "$TMP/m1" "$TMP/a.log"
run "$TMP/m2" "$TMP/b.log"
run "$TMP/m1" "$TMP/c.log"
run "$TMP/copy" "$TMP/d.log"
a=$(ns_of "$TMP/a.log"); b=$(ns_of "$TMP/b.log"); c=$(ns_of "$TMP/c.log"); d=$(ns_of "$TMP/d.log")
if [ -n "$a" ] && [ -n "$b" ] && [ "$a" != "$b" ]; then ok other_weights_other_namespace
else bad other_weights_other_namespace "model: '$a', one byte changed: '$b'"; fi
if [ -n "$c" ] && [ "$a" = "$c" ] && [ "$(field "$TMP/c.log" memo_hits)" = 1 ] && [ "$(field "$TMP/c.log" hashed_mb)" = 0.0 ]; then
	ok restart_same_namespace_from_memo
else bad restart_same_namespace_from_memo "'$a' vs '$c', $(grep serve.fingerprint "$TMP/c.log")"; fi
if [ "$(field "$TMP/a.log" memo_hits)" = 0 ] && [ "$(field "$TMP/d.log" memo_hits)" = 0 ] && [ "$a" = "$d" ]; then
	ok copy_hashed_once_same_namespace
else bad copy_hashed_once_same_namespace "'$a' vs '$d', $(grep serve.fingerprint "$TMP/d.log")"; fi
exit $fail
