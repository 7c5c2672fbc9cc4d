#!/usr/bin/env bash
# tests/e2e/replay_fake.sh - `kvkeep bench replay` against the fake
# OpenAI-compatible server (tests/e2e/replay_fake_server.js): a malformed
# line and a rejected body in the middle of a trace are reported on their
# rows and the rest still runs; bodies go out unchanged except the
# documented fields; --base-url, --dir, --repeat, --restart-after and
# --compare-cold do what they say; the JSON output parses.
# Prints one "ok NAME" / "FAIL NAME: why" line per case.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BIN=${KT_BIN:-$ROOT/build/kvkeep}
FAKE="$ROOT/tests/e2e/replay_fake_server.js"
NODE=$(command -v node || true)
T=$(mktemp -d "${TMPDIR:-/tmp}/kt-replay-fake.XXXXXX")
trap 'rm -rf "$T"' EXIT

ok() { echo "ok replay_fake:$1"; }
fail() { echo "FAIL replay_fake:$1: $2"; }

if [ -z "$NODE" ]; then
	echo "FAIL replay_fake:setup: node is not installed (make deps-test)"
	exit 1
fi
# jcheck FILE JS: evaluate JS with `lines` = parsed JSON lines of FILE; it
# prints nothing on success, else the reason
jcheck() {
	"$NODE" -e '
const fs = require("fs");
let lines;
try { lines = fs.readFileSync(process.argv[1], "utf8").split("\n").filter(Boolean).map((l) => JSON.parse(l)); }
catch (e) { console.log("output is not JSON lines: " + e.message); process.exit(0); }
const req = lines.filter((o) => o.type === "request"), sum = lines.filter((o) => o.type === "summary");
const check = new Function("lines", "req", "sum", process.argv[2]);
const why = check(lines, req, sum);
if (why) console.log(why);
' "$1" "$2"
}

"$BIN" bench mktrace --tools 8 --system-tokens 600 --turns 6 --seed 7 --out "$T/t.jsonl" --quiet || {
	echo "FAIL replay_fake:setup: mktrace failed"
	exit 1
}

# --- 1. malformed line and rejected body in the middle -----------------------
{
	sed -n 1,2p "$T/t.jsonl"
	echo '{"model": "x", "messages": [ this is not json'
	echo
	sed -n 3p "$T/t.jsonl" | sed 's/"role":"user"/"role":"bogus"/'
	sed -n 4,6p "$T/t.jsonl"
} >"$T/bad.jsonl"
mkdir -p "$T/dump"
"$BIN" bench replay --spawn "$NODE $FAKE --dump $T/dump" --trace "$T/bad.jsonl" --json \
	>"$T/bad.out" 2>"$T/bad.err"
rc=$?
why=$(jcheck "$T/bad.out" '
if (req.length !== 7) return "want 7 request rows, got " + req.length;
if (sum.length !== 1) return "want one summary";
const r = req[2];
if (r.source.indexOf("bad.jsonl:3") < 0 || !r.bad_line || r.ok || !/bad trace line/.test(r.error)) return "row 3 is not the bad line: " + JSON.stringify(r);
const j = req[3];
if (j.source.indexOf("bad.jsonl:5") < 0 || j.status !== 400 || j.ok || !/unknown role/.test(j.error)) return "row 4 is not the rejected body: " + JSON.stringify(j);
for (const k of [0, 1, 4, 5, 6]) if (!req[k].ok || req[k].status !== 200) return "row " + (k + 1) + " failed: " + JSON.stringify(req[k]);
for (const k of [1, 4, 5, 6]) if (!(req[k].cached_tokens > 0)) return "row " + (k + 1) + " has no cached tokens";
const s = sum[0];
if (s.requests !== 7 || s.ok !== 5 || s.failed !== 2 || s.bad_lines !== 1) return "summary counts wrong: " + JSON.stringify(s);
const p = req.filter((x) => x.ok).reduce((a, x) => a + x.prompt_tokens, 0), c = req.filter((x) => x.ok).reduce((a, x) => a + x.cached_tokens, 0);
if (s.prompt_tokens !== p || s.cached_tokens !== c) return "summary totals do not add up";
if (Math.abs(s.reuse_ratio - c / p) > 1e-9) return "reuse_ratio " + s.reuse_ratio + " != " + c / p;
if (!(s.ttft_p50_ms > 0) || !(s.ttft_p90_ms >= s.ttft_p50_ms)) return "bad ttft percentiles";
')
if [ "$rc" -ne 3 ]; then
	fail malformed_line_reported_rest_runs "exit status $rc, want 3 (some requests failed); stderr: $(tail -3 "$T/bad.err")"
elif [ -n "$why" ]; then
	fail malformed_line_reported_rest_runs "$why"
elif ! grep -q 'bad trace line' "$T/bad.err" || ! grep -q "HTTP 400: unknown role 'bogus'" "$T/bad.err"; then
	fail malformed_line_reported_rest_runs "the table (stderr with --json) does not show both problems"
else
	ok malformed_line_reported_rest_runs
fi

# --- 2. bodies are sent unchanged except the documented fields ----------------
why=$("$NODE" -e '
const fs = require("fs");
const trace = fs.readFileSync(process.argv[1], "utf8").split("\n").filter(Boolean).map((l) => JSON.parse(l));
const sent = [1, 2, 3, 4, 5].map((k) => JSON.parse(fs.readFileSync(`${process.argv[2]}/${k}.json`, "utf8")));
const want = [trace[0], trace[1], trace[3], trace[4], trace[5]];
for (let i = 0; i < 5; i++) {
  const a = want[i], b = sent[i];
  if (b.stream !== true || b.stream_options.include_usage !== true || b.temperature !== 0 || b.max_tokens !== 16) { console.log("request " + i + ": replayer fields not set"); process.exit(0); }
  const strip = (o) => { const c = Object.assign({}, o); for (const k of ["stream", "stream_options", "temperature", "max_tokens"]) delete c[k]; return c; };
  if (JSON.stringify(strip(a)) !== JSON.stringify(strip(b))) { console.log("request " + i + ": body changed beyond the documented fields"); process.exit(0); }
  if (JSON.stringify(Object.keys(a)) !== JSON.stringify(Object.keys(b).filter((k) => k !== "temperature"))) { console.log("request " + i + ": key order changed"); process.exit(0); }
}
' "$T/t.jsonl" "$T/dump" 2>&1)
if [ -n "$why" ]; then fail bodies_unchanged "$why"; else ok bodies_unchanged; fi

# --- 3. --base-url, --repeat, --model, table output --------------------------------
PORT=$("$NODE" -e 'const s=require("net").createServer().listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close();})')
mkdir -p "$T/dump3"
"$NODE" "$FAKE" --port "$PORT" --dump "$T/dump3" &
FPID=$!
for _ in $(seq 100); do
	"$NODE" -e 'require("http").get(process.argv[1],(r)=>process.exit(r.statusCode===200?0:1)).on("error",()=>process.exit(1))' \
		"http://127.0.0.1:$PORT/health" && break
	sleep 0.05
done
"$BIN" bench replay --base-url "http://127.0.0.1:$PORT/v1" --trace "$T/t.jsonl" --repeat 2 --model other-model \
	>"$T/base.out" 2>"$T/base.err"
rc=$?
kill "$FPID" 2>/dev/null
wait "$FPID" 2>/dev/null
rows=$(grep -cE '^ +[0-9]+ +[12] +t\.jsonl:[0-9]+ +200 ' "$T/base.out")
# in pass 2 every request was seen before: reuse is (prompt-1)/prompt
pass2_cached=$(awk '$2 == 2 && $4 == 200 && $6 == $5 - 1 { n++ } END { print n + 0 }' "$T/base.out")
if [ "$rc" -ne 0 ]; then
	fail base_url_and_repeat "exit status $rc: $(tail -3 "$T/base.err")"
elif [ "$rows" -ne 12 ]; then
	fail base_url_and_repeat "want 12 table rows with status 200, got $rows"
elif [ "$pass2_cached" -ne 6 ]; then
	fail base_url_and_repeat "pass 2 should be fully cached on every row, $pass2_cached of 6 were"
elif ! grep -q '^summary: 12 requests (12 ok, 0 failed)' "$T/base.out"; then
	fail base_url_and_repeat "summary line missing or wrong"
elif ! grep -q '^{"model":"other-model","messages":' "$T/dump3/12.json"; then
	fail base_url_and_repeat "--model did not replace the model field in place"
else
	ok base_url_and_repeat
fi

# --- 3b. --concurrency: requests overlap, rows stay in trace order --------------
PORT=$("$NODE" -e 'const s=require("net").createServer().listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})')
"$NODE" "$FAKE" --port "$PORT" --delay-ms 300 &
FPID=$!
for _ in $(seq 100); do
	"$NODE" -e 'require("http").get(process.argv[1],(r)=>process.exit(r.statusCode===200?0:1)).on("error",()=>process.exit(1))' \
		"http://127.0.0.1:$PORT/health" && break
	sleep 0.05
done
t0=$(date +%s%N)
"$BIN" bench replay --base-url "http://127.0.0.1:$PORT/v1" --trace "$T/t.jsonl" --concurrency 3 >"$T/conc.out" 2>"$T/conc.err"
rc=$?
ms=$(( ($(date +%s%N) - t0) / 1000000 ))
maxin=$("$NODE" -e 'require("http").get(process.argv[1],(r)=>{let b="";r.on("data",(d)=>b+=d);r.on("end",()=>console.log(JSON.parse(b).max_in_flight))})' \
	"http://127.0.0.1:$PORT/v1/cache/info")
kill "$FPID" 2>/dev/null
wait "$FPID" 2>/dev/null
order=$(grep -oE 't\.jsonl:[0-9]+ +200' "$T/conc.out" | grep -oE ':[0-9]+' | tr -d ':' | tr '\n' ' ')
if [ "$rc" -ne 0 ]; then
	fail concurrency_overlaps_requests "exit status $rc: $(tail -3 "$T/conc.err")"
elif [ "$maxin" != 3 ]; then
	fail concurrency_overlaps_requests "the server saw at most $maxin requests at once, want 3"
elif [ "$order" != "1 2 3 4 5 6 " ]; then
	fail concurrency_overlaps_requests "rows are not in trace order: $order"
elif [ "$ms" -gt 1700 ]; then
	fail concurrency_overlaps_requests "6 requests of 300 ms at 3 at once took $ms ms (one at a time: 1800+)"
elif "$BIN" bench replay --base-url "http://127.0.0.1:1/v1" --trace "$T/t.jsonl" --concurrency 2 --restart-after 1 \
	>/dev/null 2>&1; then
	fail concurrency_overlaps_requests "--concurrency 2 with --restart-after was accepted"
else
	ok concurrency_overlaps_requests
fi

# --- 4. folder mode, spawn, restart with a persisted cache, compare-cold -----------
mkdir -p "$T/dir"
i=0
while IFS= read -r line; do
	i=$((i + 1))
	printf '%s' "$line" >"$T/dir/turn-$i.json" # not zero-padded on purpose
done <"$T/t.jsonl"
# make turn-10.json exist so name order and number order differ
cp "$T/dir/turn-6.json" "$T/dir/turn-10.json"
"$BIN" bench replay --spawn "$NODE $FAKE --state $T/state.json" --dir "$T/dir" --restart-after 3 --compare-cold \
	--json >"$T/sp.out" 2>"$T/sp.err"
rc=$?
why=$(jcheck "$T/sp.out" '
if (req.length !== 7) return "want 7 rows, got " + req.length;
const names = req.map((r) => r.source.replace(/.*\//, ""));
const want = ["turn-1.json", "turn-2.json", "turn-3.json", "turn-4.json", "turn-5.json", "turn-6.json", "turn-10.json"];
if (JSON.stringify(names) !== JSON.stringify(want)) return "folder order " + names.join(",");
const rs = lines.filter((o) => o.type === "restart");
if (rs.length !== 1 || rs[0].after_request !== 3 || rs[0].exit !== "exited 0") return "restart event wrong: " + JSON.stringify(rs);
if (lines.indexOf(rs[0]) !== 3) return "restart event is not right after request 3";
if (!req[3].first_after_restart || req[3].server_start !== 2 || req[2].server_start !== 1) return "after-restart marking wrong";
const s = sum[0];
if (!s.server_starts || s.server_starts.length !== 2 || s.server_starts[1].cache_info.disk_tier !== true) return "server_starts/cache_info missing";
if (!s.first_after_restart || !(s.first_after_restart.cached_tokens > 0)) return "the state file did not carry the cache over the restart";
for (let k = 1; k < 7; k++) if (!(req[k].cached_tokens > 0)) return "row " + (k + 1) + " has no cached tokens";
if (!s.cold || s.cold.cached_tokens !== 0 || s.cold.ok !== 7) return "cold run wrong: " + JSON.stringify(s.cold);
for (const r of req) if (!r.cold || r.cold.cached_tokens !== 0 || !(r.speedup_total > 0)) return "row without cold result: " + JSON.stringify(r);
if (!(s.cold.speedup_total_p50 > 0)) return "no speedup summary";
')
if [ "$rc" -ne 0 ]; then
	fail dir_spawn_restart_cold "exit status $rc: $(tail -3 "$T/sp.err")"
elif [ -n "$why" ]; then
	fail dir_spawn_restart_cold "$why"
elif ! grep -q '^---- restart after request 3: SIGTERM, server exited 0' "$T/sp.err"; then
	fail dir_spawn_restart_cold "table has no restart line"
else
	ok dir_spawn_restart_cold
fi

# --- 5. flag and input errors are clear, never a crash -------------------------
"$BIN" bench replay --trace "$T/t.jsonl" >/dev/null 2>"$T/e1"
r1=$?
"$BIN" bench replay --base-url http://127.0.0.1:1/v1 --trace "$T/t.jsonl" --restart-after 2 >/dev/null 2>"$T/e2"
r2=$?
"$BIN" bench replay --base-url http://127.0.0.1:1/v1 --trace "$T/missing.jsonl" >/dev/null 2>"$T/e3"
r3=$?
"$BIN" bench replay --spawn "sh -c 'exit 5'" --trace "$T/t.jsonl" >/dev/null 2>"$T/e4"
r4=$?
# nobody listens on port 1: every request fails, the replay still finishes
"$BIN" bench replay --base-url http://127.0.0.1:1/v1 --trace "$T/t.jsonl" --json >"$T/o5" 2>/dev/null
r5=$?
if [ "$r1" -ne 2 ] || ! grep -q 'exactly one of --base-url' "$T/e1"; then
	fail errors_are_clear "missing server: status $r1: $(cat "$T/e1")"
elif [ "$r2" -ne 2 ] || ! grep -q 'needs --spawn' "$T/e2"; then
	fail errors_are_clear "restart without spawn: status $r2"
elif [ "$r3" -ne 1 ] || ! grep -q 'missing.jsonl' "$T/e3"; then
	fail errors_are_clear "missing trace: status $r3: $(cat "$T/e3")"
elif [ "$r4" -ne 1 ] || ! grep -q 'exited 5 before it was ready' "$T/e4"; then
	fail errors_are_clear "dying server: status $r4: $(cat "$T/e4")"
elif [ "$r5" -ne 3 ] || [ -n "$(jcheck "$T/o5" 'if (req.length !== 6 || req.some((r) => r.ok || r.status !== 0) || sum[0].failed !== 6) return "x";')" ]; then
	fail errors_are_clear "unreachable server: status $r5"
else
	ok errors_are_clear
fi
