#!/usr/bin/env bash
# tests/peer/build.sh [BUILD] - builds BUILD/peer/kvpeer (default build/),
# the llama.cpp oracle and yardstick (tests/peer/README.md). `make peer`.
#
# Needs scripts/npm.sh to have installed tests/peer/node (node-llama-cpp
# 3.22.1 and @node-llama-cpp/linux-x64 3.22.1) and git. llama.cpp's headers
# are checked out of the release's source bundle (llama/gitRelease.bundle in
# the node-llama-cpp package) into BUILD/peer/include, and its Python GGUF
# reader into BUILD/peer/gguf-py, and GPT-OSS's chat template into
# BUILD/peer/templates: they are never copied into this repository. The driver links the package's prebuilt libraries
# with an rpath to their folder, where the CPU backend variants lie too.
#
# Exit status 3 (and a "skip" reason on stdout) when the npm package is not
# installed on this machine (non-x86-64 hosts have none); 1 on a build error.
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${1:-build}
case $BUILD in /*) ;; *) BUILD=$ROOT/$BUILD ;; esac
OUT=$BUILD/peer
PKG=$ROOT/tests/peer/node/node_modules
BUNDLE=$PKG/node-llama-cpp/llama/gitRelease.bundle
LIBDIR=$PKG/@node-llama-cpp/linux-x64/bins/linux-x64
CC=${CC:-gcc}

if [ ! -f "$BUNDLE" ] || [ ! -f "$LIBDIR/libllama.v0.5.0.so" ]; then
	echo "skip kvpeer: llama.cpp npm package not installed (run 'bash scripts/npm.sh'; x86-64 Linux only)"
	exit 3
fi
command -v git >/dev/null || { echo "kvpeer: git is missing (make deps-test)" >&2; exit 1; }

mkdir -p "$OUT"
INC=$OUT/include
# headers and gguf-py: once per bundle (the stamp is newer than the bundle)
if [ ! -f "$INC/.stamp" ] || [ "$BUNDLE" -nt "$INC/.stamp" ]; then
	rm -rf "$INC" "$OUT/gguf-py" "$OUT/bundle.git"
	git init -q --bare "$OUT/bundle.git"
	git -C "$OUT/bundle.git" fetch -q "$BUNDLE" HEAD
	mkdir -p "$INC"
	git -C "$OUT/bundle.git" archive FETCH_HEAD include ggml/include | tar -x -C "$INC"
	# llama.cpp's own GGUF reader (Python), for tests that compare files
	git -C "$OUT/bundle.git" archive FETCH_HEAD gguf-py | tar -x -C "$OUT"
	rm -rf "$OUT/bundle.git"
	touch "$INC/.stamp"
fi
# the chat templates llama.cpp keeps for models whose tokenizer packages
# carry none (GPT-OSS's harmony template): for tests/ref/template_window.sh
if [ ! -f "$OUT/templates/.stamp" ] || [ "$BUNDLE" -nt "$OUT/templates/.stamp" ]; then
	rm -rf "$OUT/templates" "$OUT/tbundle.git"
	git init -q --bare "$OUT/tbundle.git"
	git -C "$OUT/tbundle.git" fetch -q "$BUNDLE" HEAD
	mkdir -p "$OUT/templates"
	git -C "$OUT/tbundle.git" archive FETCH_HEAD models/templates/openai-gpt-oss-120b.jinja |
		tar -x -C "$OUT/templates" --strip-components=2
	rm -rf "$OUT/tbundle.git"
	touch "$OUT/templates/.stamp"
fi

SRC=$ROOT/tests/peer/kvpeer.c
BIN=$OUT/kvpeer
if [ -x "$BIN" ] && [ "$BIN" -nt "$SRC" ] && [ "$BIN" -nt "$INC/.stamp" ] && [ "$BIN" -nt "$0" ]; then
	exit 0
fi
$CC -std=gnu11 -O2 -g -Wall -Wextra -Werror -Wno-missing-field-initializers -D_GNU_SOURCE \
	-I"$INC/include" -I"$INC/ggml/include" -o "$BIN.tmp" "$SRC" \
	-L"$LIBDIR" -l:libllama.v0.5.0.so -l:libggml.v0.5.0.so -l:libggml-base.so \
	-Wl,-rpath,"$LIBDIR" -Wl,--disable-new-dtags -ldl -lm
mv "$BIN.tmp" "$BIN"
echo "built $BIN"
