# tests/peer/common.sh - the preamble the llama.cpp comparison scripts share.
# Source it, then call `peer_setup NAME`: it sets ROOT, BUILD, KV (kvkeep),
# PY (the reference python), K (kvpeer), T (a temp folder removed at exit)
# and PYTHONPATH (llama.cpp's gguf-py); it builds kvpeer, prints "skip NAME"
# and exits 0 without the npm package, prints FAIL and exits 1 when the
# build fails.
peer_setup() {
	ROOT=$(cd "$(dirname "$0")/../.." && pwd)
	BUILD=${KT_BUILD:-$ROOT/build}
	KV=${KT_BIN:-$BUILD/kvkeep}
	PY=/usr/bin/python3
	local out rc
	out=$(bash "$ROOT/tests/peer/build.sh" "$BUILD" 2>&1)
	rc=$?
	if [ $rc -eq 3 ]; then
		echo "$out" | grep '^skip' || echo "skip $1: llama.cpp package missing"
		exit 0
	fi
	[ $rc -eq 0 ] || { echo "FAIL peer_build: $out" | head -20; exit 1; }
	K=$BUILD/peer/kvpeer
	export PYTHONPATH=$BUILD/peer/gguf-py
	T=$(mktemp -d)
	trap 'chmod -R u+w "$T" 2>/dev/null; rm -rf "$T"' EXIT
}
