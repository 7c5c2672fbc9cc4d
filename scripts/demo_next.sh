#!/usr/bin/env bash
# scripts/demo_next.sh BUILD MODEL - what `make demo` prints last: the
# command that serves the demo's model yourself, and a client to try on
# it (README.md "Quick start" has the agent clients). tests/e2e/quickstart.sh
# runs the printed command.
set -euo pipefail
BUILD=${1:-build}
MODEL=${2:?usage: demo_next.sh BUILD MODEL}
echo
echo "== now serve it yourself (README.md \"Quick start\" connects Claude Code, Codex, opencode, qwen-code, the SDKs):"
echo "$BUILD/kvkeep serve $MODEL -a qwen"
echo "   then: curl http://127.0.0.1:8000/v1/chat/completions -H 'Content-Type: application/json' \\"
echo "           -d '{\"model\": \"qwen\", \"messages\": [{\"role\": \"user\", \"content\": \"Hello\"}]}'"
echo "   or open http://127.0.0.1:8000/dashboard"
