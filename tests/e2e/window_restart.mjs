// window_restart.mjs - sliding-window models through the server (issue 32):
// tiny-gemma3 (5 sliding : 1 global), tiny-gpt-oss (sliding / full, sinks,
// MXFP4 experts), tiny-gemma4 (5 sliding : 1 global with other head sizes
// and KV heads in each), tiny-gemma4-e (its last 3 layers read earlier
// layers' KV, per-layer embeddings) with a window of 16 keys, and
// tiny-llama3 (no window) as the control. For each, three system prompts whose end (the anchor, the
// first message boundary) lies before the window (< 16 tokens), exactly at
// it (16) and far past it (~300):
//
//   live     turn 1 cold, turn 2 resumes from the RAM cache: both turns'
//            text and logprobs bit-identical to a --disable-prefix-cache
//            server given the same turns.
//   restart  SIGTERM, start again on the same folder: turn 1 replayed
//            resumes exactly at its last message boundary, and a new user
//            message after the same system prompt exactly at the anchor;
//            both answers bit-identical to cold.
//   kill -9  (gpt-oss, gemma4-e) and window snapshots with a flipped byte
//            (gpt-oss, gemma4): the answer after the
//            restart is cold's, bit for bit (a miss or a shorter hit, never
//            a wrong one), the bad files are quarantined.
//   q8_0     --kv-dtype q8_0 (gemma3, gpt-oss, gemma4): the restart resumes at the
//            last boundary from q8_0 window snapshots, equal to q8_0 cold.
import { execFileSync, spawnSync } from 'node:child_process';
import { readdirSync, existsSync, statSync, openSync, writeSync, closeSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { KT_BIN, TMP, check, assert, eq, mkModel, startServer as start0, postJSON, metrics, failures_count, until }
  from './server_util.mjs';

const P = 'window_restart';
const W = 16;
const startServer = (model, extra = []) => start0(model, ['--served-model-name', 'm', ...extra]);

function files(dir, pred = () => true) {
  const out = [];
  if (!existsSync(dir)) return out;
  for (const e of readdirSync(dir, { withFileTypes: true })) {
    const p = join(dir, e.name);
    if (e.isDirectory()) out.push(...files(p, pred));
    else if (pred(e.name)) out.push(p);
  }
  return out;
}

function body(system, user, extra = []) {
  const messages = [];
  if (system) messages.push({ role: 'system', content: system });
  messages.push({ role: 'user', content: user }, ...extra);
  return { model: 'm', temperature: 0, max_tokens: 6, logprobs: true, top_logprobs: 3, messages };
}

async function chat(srv, b) {
  const r = await postJSON(srv, '/v1/chat/completions', b);
  assert(r.status === 200, `status ${r.status}: ${r.text.slice(0, 300)}`);
  const c = r.json.choices[0];
  return { text: c.message.content, lp: JSON.stringify(c.logprobs), n: r.json.usage.prompt_tokens,
    cached: r.json.usage.prompt_tokens_details ? r.json.usage.prompt_tokens_details.cached_tokens : -1 };
}

// The message boundaries the server will see (kvkeep render: same template,
// same tokenizer).
let nreq = 0;
function bounds(model, b) {
  const f = join(TMP, `req-${nreq++}.json`);
  writeFileSync(f, JSON.stringify(b));
  return JSON.parse(execFileSync(KT_BIN, ['render', '--model', model, '--request', f, '--json']).toString()).boundaries;
}

// A system prompt whose anchor lands exactly at `want` tokens (the built-in
// tokenizer and ChatML template: one more short word moves it by one or two).
function systemAt(model, want) {
  for (const tail of ['', '!', ' a', ' ok!', '?!']) {
    for (let k = 0; k < 20; k++) {
      const s = 'Be brief.' + ' ok'.repeat(k) + tail;
      const b = bounds(model, body(s, 'Hello there.'));
      if (b[0] === want) return s;
      if (b[0] > want) break;
    }
  }
  throw new Error(`no system prompt ends at ${want}`);
}

async function info(srv) {
  const r = await fetch(srv.url('/v1/cache/info'));
  return r.json();
}

// A dense model's resume points are found by the startup scan (a lookup
// before it ends tries only the prompt's named points)
async function scanned(srv) {
  assert(await until(async () => (await info(srv)).disk.scan_done, 20000), 'the startup scan did not end');
}

async function cold(model, ...bodies) {
  const srv = await startServer(model, ['--disable-prefix-cache']);
  try {
    const out = [];
    for (const b of bodies) out.push(await chat(srv, b));
    return out;
  } finally { await srv.stop(); }
}

const models = [['tiny-gemma3', 'gemma3'], ['tiny-gpt-oss', 'gptoss'], ['tiny-llama3', 'llama3'],
  ['tiny-gemma4', 'gemma4'], ['tiny-gemma4-e', 'gemma4e']];
for (const [preset, name] of models) {
  const model = mkModel(preset, name, false);
  const prompts = {
    before: 'Be brief.',
    at: systemAt(model, W),
    after: 'You are a careful coding agent with a long list of rules to follow. '.repeat(20),
  };
  for (const [where, system] of Object.entries(prompts)) {
    const dir = join(TMP, `cache-${name}-${where}`);
    const u1 = 'Which file holds the build rules?', u2 = 'And where are the tests?';
    let t1 = null;
    await check(`${P}:${name}_${where}_window_live_cached_equals_cold`, async () => {
      const b1 = body(system, u1);
      const anchor = bounds(model, b1)[0];
      if (where === 'before') assert(anchor < W, `anchor ${anchor} is not before the window`);
      if (where === 'at') eq(anchor, W, 'anchor at the window');
      if (where === 'after') assert(anchor > 10 * W, `anchor ${anchor} is not past the window`);
      const srv = await startServer(model, ['--cache-dir', dir]);
      t1 = await chat(srv, b1);
      eq(t1.cached, 0, 'turn 1 is cold');
      const b2 = body(system, u1, [{ role: 'assistant', content: t1.text }, { role: 'user', content: u2 }]);
      const t2 = await chat(srv, b2);
      assert(t2.cached > 0, `live turn 2 cached ${t2.cached}`);
      const st = await srv.stop('SIGTERM', 15000);
      eq(st.code, 0, 'exit status after SIGTERM');
      const [c1, c2] = await cold(model, b1, b2);
      eq(t1.lp, c1.lp, 'turn 1 logprobs vs cold');
      eq(t2.text, c2.text, 'cached turn 2 text vs cold');
      eq(t2.lp, c2.lp, `cached turn 2 (resumed at ${t2.cached}) logprobs vs cold`);
    }, 120000);

    await check(`${P}:${name}_${where}_window_restart_hits_boundary_and_anchor`, async () => {
      assert(t1, 'turn 1 did not run');
      const b1 = body(system, u1), b3 = body(system, 'Something else entirely: list the folders.');
      const last = bounds(model, b1).at(-1), anchor = bounds(model, b3)[0];
      const srv = await startServer(model, ['--cache-dir', dir]);
      // every model waits for the startup scan: before it ends, a lookup
      // may find only the snapshots probed by name (the anchor), a shorter
      // hit that is right but not the one this check asks for
      await scanned(srv);
      const r = await chat(srv, b1);
      if (name === 'llama3') // no window: a dense model resumes anywhere (the prompt less its last token)
        eq(r.cached, r.n - 1, 'dense turn 1 replayed after the restart resumes at the prompt - 1');
      else
        eq(r.cached, last, 'turn 1 replayed after the restart resumes at its last message boundary');
      eq(r.lp, t1.lp, 'turn 1 replay logprobs vs cold');
      await srv.stop();
      // a new user turn after the same system prompt: exactly the anchor
      const srv2 = await startServer(model, ['--cache-dir', dir]);
      await scanned(srv2);
      const r3 = await chat(srv2, b3);
      await srv2.stop();
      if (name === 'llama3')
        assert(r3.cached >= anchor, `dense: a new turn resumes at ${r3.cached}, below the anchor ${anchor}`);
      else
        eq(r3.cached, anchor, 'a new turn after the restart resumes exactly at the anchor');
      const [c3] = await cold(model, b3);
      eq(r3.text, c3.text, 'new turn text vs cold');
      eq(r3.lp, c3.lp, 'new turn logprobs vs cold');
    }, 120000);
  }
}

// --- kill -9 and corrupt window snapshots (gpt-oss: windows and sinks) ----
const sys = 'You are a careful coding agent with a long list of rules to follow. '.repeat(20);
const kb = body(sys, 'Which file holds the build rules?');
for (const name of ['gptoss', 'gemma4e'])
await check(`${P}:${name}_sigkill_then_hit_or_miss_equals_cold`, async () => {
  const oss = join(TMP, name), [kcold] = await cold(oss, kb);
  const dir = join(TMP, `cache-kill-${name}`);
  for (let k = 0; k < 3; k++) {
    const srv = await startServer(oss, ['--cache-dir', dir]);
    const p = chat(srv, kb).then((r) => r, (e) => ({ error: e }));
    if (k === 0) {
      const r = await p;
      assert(!r.error, `the request before the kill failed: ${r.error}`);
    } else {
      await new Promise((res) => setTimeout(res, 20 + 60 * k));
    }
    await srv.stop('SIGKILL');
    await p;
  }
  const srv = await startServer(oss, ['--cache-dir', dir]);
  const r = await chat(srv, kb);
  await srv.stop();
  eq(r.text, kcold.text, 'text after kill -9 + restart vs cold');
  eq(r.lp, kcold.lp, 'logprobs after kill -9 + restart vs cold');
}, 180000);

// gemma4's window rows have their own geometry (2 heads of 32 beside the
// pages' 1 head of 64): the same flipped byte in them
for (const name of ['gptoss', 'gemma4'])
await check(`${P}:${name}_corrupt_window_snapshots_quarantined_answer_cold`, async () => {
  const oss = join(TMP, name), [kcold] = await cold(oss, kb);
  const dir = join(TMP, `cache-corrupt-${name}`);
  let srv = await startServer(oss, ['--cache-dir', dir]);
  await chat(srv, kb);
  await srv.stop();
  const snaps = files(dir, (n) => n.endsWith('.snap.safetensors'));
  assert(snaps.length > 0, 'no snapshot files');
  // the windows are the last tensors of a snapshot: flip a byte there
  for (const f of snaps) {
    const size = statSync(f).size, data = readFileSync(f);
    const fd = openSync(f, 'r+');
    writeSync(fd, Buffer.from([data[size - 7] ^ 0x5a]), 0, 1, size - 7);
    closeSync(fd);
  }
  const v = spawnSync(KT_BIN, ['cache', 'verify', '--dir', dir]);
  eq(v.status, 1, `cache verify on a corrupt folder exits 1 (stdout: ${v.stdout})`);
  srv = await startServer(oss, ['--cache-dir', dir]);
  const r = await chat(srv, kb);
  eq(r.text, kcold.text, 'text with corrupt window snapshots vs cold');
  eq(r.lp, kcold.lp, 'logprobs with corrupt window snapshots vs cold');
  await until(async () => (await metrics(srv)).get('kvkeep_disk_quarantined_files_total') >= 1, 20000);
  await srv.stop();
  assert(files(join(dir, 'quarantine')).length >= 1, 'quarantine/ is empty');
}, 120000);

// --- 8-bit KV (--kv-dtype q8_0): the window pages and the snapshots' window
// rows are q8_0 rows (U8 tensors named by kv_dtype, disk-format.md) -------
for (const name of ['gemma3', 'gptoss', 'gemma4']) {
  await check(`${P}:${name}_q8_kv_restart_resumes_at_boundary_equals_cold`, async () => {
    const model = join(TMP, name), dir = join(TMP, `cache-q8-${name}`), q8 = ['--kv-dtype', 'q8_0'];
    const b1 = body(sys, 'Which file holds the build rules?'), last = bounds(model, b1).at(-1);
    let srv = await startServer(model, [...q8, '--disable-prefix-cache']);
    const c1 = await chat(srv, b1);
    await srv.stop();
    srv = await startServer(model, [...q8, '--cache-dir', dir]);
    const t1 = await chat(srv, b1);
    eq(t1.lp, c1.lp, 'q8_0 turn 1 vs q8_0 cold');
    eq((await srv.stop('SIGTERM', 15000)).code, 0, 'exit status after SIGTERM');
    const v = spawnSync(KT_BIN, ['cache', 'verify', '--dir', dir]);
    eq(v.status, 0, `cache verify on the q8_0 folder (stdout: ${v.stdout})`);
    srv = await startServer(model, [...q8, '--cache-dir', dir]);
    try {
      await scanned(srv);
      const r = await chat(srv, b1);
      eq(r.cached, last, 'q8_0: turn 1 replayed after the restart resumes at its last message boundary');
      eq(r.text, c1.text, 'q8_0 replay text vs cold');
      eq(r.lp, c1.lp, 'q8_0 replay logprobs vs cold');
    } finally { await srv.stop(); }
  }, 120000);
}

process.exit(failures_count() ? 1 : 0);
