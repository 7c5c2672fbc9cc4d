// mamba_restart.mjs - the Mamba-2 hybrids through the server and the disk
// tier: tiny-granite-h (Granite 4.0-H shape: Mamba-2 + attention, MoE +
// shared expert) and tiny-nemotron-h (Nemotron-H shape: Mamba-2, attention,
// squared-ReLU MLP layers), with the real Qwen3 tokenizer and template.
//
//   live     turn 1 (system + tools + user) cold, turn 2 resumes from the
//            RAM cache; both bit-identical (text and logprobs, greedy) to
//            a --disable-prefix-cache server given the same turns.
//   restart  SIGTERM, start again on the same cache folder: turn 1
//            replayed resumes from disk (the conv and SSM states come back
//            from the snapshot files), bit-identical to cold.
//   anchor   after the restart, a new session with the same system +
//            tools and another user message resumes exactly at the
//            protected anchor (end of system + tools), bit-identical.
//   corrupt  every snapshot sidecar with a flipped byte (granite) or cut
//            short (nemotron): the replay is a miss (a recurrent model
//            cannot resume without its state), the answer still exactly
//            cold, the files quarantined and counted by reason.
//   gguf     tiny-nemotron-h as a Q8_0 nemotron_h GGUF: live turn 2 and
//            turn 1 after a restart bit-identical to cold.
//   q8 kv    tiny-granite-h-q8kv (attention head_dim 32) with --kv-dtype
//            q8_0 and the default --speculative auto: live turn 2 and
//            turn 1 after a restart bit-identical to a cold q8_0 server
//            with --speculative off.
import { execFileSync } from 'node:child_process';
import { readdirSync, statSync, readFileSync, writeFileSync, openSync, writeSync, closeSync, truncateSync, existsSync } from 'node:fs';
import { join } from 'node:path';
import { KT_BIN, TMP, check, assert, eq, mkModel, startServer as start0, postJSON, metrics, until, failures_count } from './server_util.mjs';

const P = 'mamba_restart';
const startServer = (model, extra = []) => start0(model, ['--served-model-name', 'm', ...extra]);

const tools = Array.from({ length: 4 }, (_, i) => ({
  type: 'function',
  function: {
    name: `tool_${i}`,
    description: `Tool number ${i}: reads or writes project files and reports what changed.`,
    parameters: { type: 'object', properties: { path: { type: 'string' } }, required: ['path'] },
  },
}));
const system = 'You are a careful coding agent with a state space memory. '.repeat(20);
function turn1(user = 'List the files under src/ and explain them.') {
  return { model: 'm', temperature: 0, max_tokens: 6, logprobs: true, top_logprobs: 3, tools,
    messages: [{ role: 'system', content: system }, { role: 'user', content: user }] };
}
function turn2(reply) {
  const b = turn1();
  b.messages.push({ role: 'assistant', content: reply });
  b.messages.push({ role: 'user', content: 'Now open the Makefile and summarise its targets.' });
  return b;
}

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

async function chat(srv, body) {
  const r = await postJSON(srv, '/v1/chat/completions', body);
  assert(r.status === 200, `status ${r.status}: ${r.text.slice(0, 300)}`);
  const c = r.json.choices[0];
  return { text: c.message.content, lp: JSON.stringify(c.logprobs), usage: r.json.usage,
    cached: r.json.usage.prompt_tokens_details ? r.json.usage.prompt_tokens_details.cached_tokens : -1 };
}

function lastFetch(srv) {
  const m = [...srv.log().matchAll(/event=store\.fetch resumed_at=(\d+) anchor=(\d+) prompt=(\d+)/g)].pop();
  return m ? { at: Number(m[1]), anchor: Number(m[2]), prompt: Number(m[3]) } : null;
}

async function cold(model, ...bodies) {
  return coldWith(model, [], ...bodies);
}

async function coldWith(model, extra, ...bodies) {
  const srv = await startServer(model, ['--disable-prefix-cache', ...extra]);
  try {
    let r = null;
    for (const b of bodies) r = await chat(srv, b);
    return r;
  } finally { await srv.stop(); }
}

async function session(name, model, corrupt) {
  const dir = join(TMP, `cache-${name}`);
  let t1 = null;
  await check(`${P}:${name}_live_turn2_cached_equals_cold`, async () => {
    const srv = await startServer(model, ['--cache-dir', dir]);
    t1 = await chat(srv, turn1());
    eq(t1.cached, 0, 'turn 1 is cold');
    const t2 = await chat(srv, turn2(t1.text));
    assert(t2.cached > 0, `live turn 2 cached ${t2.cached}`);
    const st = await srv.stop('SIGTERM', 15000);
    eq(st.code, 0, 'exit status after SIGTERM');
    const c1 = await cold(model, turn1());
    eq(t1.text, c1.text, 'turn 1 vs cold');
    eq(t1.lp, c1.lp, 'turn 1 logprobs vs cold');
    const c2 = await cold(model, turn1(), turn2(t1.text));
    eq(t2.text, c2.text, 'cached turn 2 text vs cold');
    eq(t2.lp, c2.lp, 'cached turn 2 logprobs vs cold');
  }, 180000);

  await check(`${P}:${name}_restart_replay_from_disk_bit_identical`, async () => {
    assert(t1, 'turn 1 did not run');
    const srv = await startServer(model, ['--cache-dir', dir]);
    const r = await chat(srv, turn1());
    const f = await until(() => lastFetch(srv), 5000);
    assert(f, 'no store.fetch line: nothing was loaded from disk');
    assert(f.anchor > 0, `no anchor: ${JSON.stringify(f)}`);
    eq(r.cached, f.at, 'cached tokens vs the disk load');
    assert(r.cached >= f.anchor, `resumed at ${r.cached}, below the anchor ${f.anchor}`);
    eq(r.text, t1.text, 'text after restart vs cold');
    eq(r.lp, t1.lp, 'logprobs after restart vs cold');
    await srv.stop();
  }, 180000);

  await check(`${P}:${name}_new_session_after_restart_resumes_at_the_anchor`, async () => {
    const other = turn1('Which tests cover the cache?');
    const c = await cold(model, other);
    const srv = await startServer(model, ['--cache-dir', dir]);
    const r = await chat(srv, other);
    const f = await until(() => lastFetch(srv), 5000);
    assert(f, 'no store.fetch line');
    assert(f.anchor > 0, 'no anchor persisted');
    eq(r.cached, f.anchor, 'the new session resumes exactly at the anchor');
    eq(r.text, c.text, 'text vs cold');
    eq(r.lp, c.lp, 'logprobs vs cold');
    const st = await srv.stop('SIGTERM', 15000);
    eq(st.code, 0, 'exit status');
  }, 180000);

  await check(`${P}:${name}_${corrupt}_sidecars_are_a_miss_answer_cold_exact`, async () => {
    const snaps = files(dir, (n) => n.endsWith('.snap.safetensors'));
    assert(snaps.length > 0, 'no snapshot sidecars in the cache');
    for (const f of snaps) {
      const size = statSync(f).size;
      if (corrupt === 'truncated') {
        truncateSync(f, size - 64);
      } else {
        const b = readFileSync(f);
        const fd = openSync(f, 'r+');
        writeSync(fd, Buffer.from([b[size - 9] ^ 0x10]), 0, 1, size - 9);
        closeSync(fd);
      }
    }
    const srv = await startServer(model, ['--cache-dir', dir]);
    const r = await chat(srv, turn1());
    eq(r.cached, 0, 'no valid state: a miss');
    eq(r.text, t1.text, 'text vs cold');
    eq(r.lp, t1.lp, 'logprobs vs cold');
    const m = await metrics(srv);
    // a cut file fails the size arithmetic or the header's offsets, a
    // flipped byte the data checksum
    const reasons = corrupt === 'truncated' ? ['size', 'header', 'arith'] : ['crc'];
    const n = reasons.reduce((a, x) => a + (m.get(`kvkeep_disk_refused_files_total{reason="${x}"}`) || 0), 0);
    assert(m.get('kvkeep_disk_quarantined_files_total') >= 1, 'nothing quarantined');
    assert(n >= 1, `no ${reasons.join('/')} refusal counted`);
    await srv.stop();
  }, 180000);
}

const granite = mkModel('tiny-granite-h', 'granite', true);
await session('granite', granite, 'flipped');
const nemotron = mkModel('tiny-nemotron-h', 'nemotron', true);
await session('nemotron', nemotron, 'truncated');

await check(`${P}:nemotron_gguf_q8_0_restart_bit_identical_to_cold`, async () => {
  const gguf = join(TMP, 'nemotron-q8_0.gguf'), gdir = join(TMP, 'cache-nemotron-gguf');
  execFileSync(KT_BIN, ['convert', '--model', nemotron, '--out', gguf, '--type', 'q8_0', '--no-sync'],
    { stdio: ['ignore', 'ignore', 'inherit'] });
  let srv = await startServer(gguf, ['--cache-dir', gdir]);
  const g1 = await chat(srv, turn1());
  const g2 = await chat(srv, turn2(g1.text));
  assert(g2.cached > 0, `live turn 2 cached ${g2.cached}`);
  eq((await srv.stop('SIGTERM', 15000)).code, 0, 'exit status after SIGTERM');
  const c2 = await cold(gguf, turn1(), turn2(g1.text));
  eq(g2.text, c2.text, 'cached turn 2 text vs cold');
  eq(g2.lp, c2.lp, 'cached turn 2 logprobs vs cold');
  srv = await startServer(gguf, ['--cache-dir', gdir]);
  const r = await chat(srv, turn1());
  assert(await until(() => lastFetch(srv), 5000), 'nothing was loaded from disk');
  assert(r.cached > 0, `after restart cached ${r.cached}`);
  eq(r.text, g1.text, 'text after restart vs cold');
  eq(r.lp, g1.lp, 'logprobs after restart vs cold');
  await srv.stop();
}, 180000);

await check(`${P}:granite_q8_0_kv_speculative_cached_equals_cold_plain`, async () => {
  const model = mkModel('tiny-granite-h-q8kv', 'granite-q8kv', true), dir = join(TMP, 'cache-granite-q8kv');
  const q8 = ['--kv-dtype', 'q8_0'];
  let srv = await startServer(model, ['--cache-dir', dir, ...q8]);
  assert(/event=serve\.scheduler .*speculative=auto/.test(srv.log()), 'speculation not on');
  const g1 = await chat(srv, turn1());
  const g2 = await chat(srv, turn2(g1.text));
  assert(g2.cached > 0, `live turn 2 cached ${g2.cached}`);
  eq((await srv.stop('SIGTERM', 15000)).code, 0, 'exit status after SIGTERM');
  const plain = [...q8, '--speculative', 'off'];
  const c1 = await coldWith(model, plain, turn1());
  eq(g1.text, c1.text, 'turn 1 vs cold');
  eq(g1.lp, c1.lp, 'turn 1 logprobs vs cold');
  const c2 = await coldWith(model, plain, turn1(), turn2(g1.text));
  eq(g2.text, c2.text, 'cached turn 2 text vs cold');
  eq(g2.lp, c2.lp, 'cached turn 2 logprobs vs cold');
  srv = await startServer(model, ['--cache-dir', dir, ...q8]);
  const r = await chat(srv, turn1());
  assert(await until(() => lastFetch(srv), 5000), 'nothing was loaded from disk');
  assert(r.cached > 0, `after restart cached ${r.cached}`);
  eq(r.text, g1.text, 'text after restart vs cold');
  eq(r.lp, g1.lp, 'logprobs after restart vs cold');
  await srv.stop();
}, 180000);

process.exit(failures_count() ? 1 : 0);
