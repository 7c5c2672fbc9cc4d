// moe_restart.mjs - a mixture-of-experts hybrid through the server: the
// tiny-moe preset (qwen3_5_moe) with the real Qwen3 tokenizer and template.
//
//   live     turn 1 cold, turn 2 resumes from the RAM cache; turn 2's text
//            and logprobs are bit-identical to a --disable-prefix-cache
//            server's given the same two turns (greedy).
//   restart  SIGTERM, start again on the same cache folder: turn 1
//            replayed resumes from disk and is bit-identical to cold.
//   gguf     the same model as a Q4_K_M qwen35moe GGUF (quantized expert
//            stacks viewed in the mapping), and tiny-next-moe as a Q8_0
//            qwen3next GGUF: live turn 2 and turn 1 after a restart are
//            bit-identical to a --disable-prefix-cache server.
import { execFileSync } from 'node:child_process';
import { join } from 'node:path';
import { KT_BIN, TMP, check, assert, eq, mkModel, startServer as start0, postJSON, failures_count, until } from './server_util.mjs';

const P = 'moe_restart';
const startServer = (model, extra = []) => start0(model, ['--served-model-name', 'm', ...extra]);
const moe = mkModel('tiny-moe', 'moe', true);

const system = 'You are a careful coding agent that routes work to experts. '.repeat(12);
function turn1() {
  return { model: 'm', temperature: 0, max_tokens: 6, logprobs: true, top_logprobs: 3,
    messages: [{ role: 'system', content: system }, { role: 'user', content: 'Which experts handle the build?' }] };
}
function turn2(reply) {
  const b = turn1();
  b.messages.push({ role: 'assistant', content: reply });
  b.messages.push({ role: 'user', content: 'And which ones handle the tests?' });
  return b;
}

async function chat(srv, body) {
  const r = await postJSON(srv, '/v1/chat/completions', body);
  assert(r.status === 200, `status ${r.status}: ${r.text.slice(0, 300)}`);
  const c = r.json.choices[0];
  return { text: c.message.content, lp: JSON.stringify(c.logprobs), usage: r.json.usage,
    cached: r.json.usage.prompt_tokens_details ? r.json.usage.prompt_tokens_details.cached_tokens : -1 };
}

// A --disable-prefix-cache server given the same requests in order (the
// earlier ones first): an answer the client sends back renders as the
// model generated it on both servers (session/echo.h), so the two see the
// same prompt and the last answers compare.
async function cold(...bodies) {
  const srv = await startServer(moe, ['--disable-prefix-cache']);
  try {
    let r = null;
    for (const b of bodies) r = await chat(srv, b);
    return r;
  } finally { await srv.stop(); }
}

const dir = join(TMP, 'cache-moe');
let t1 = null;
await check(`${P}:live_turn2_cached_equals_cold`, async () => {
  const srv = await startServer(moe, ['--cache-dir', dir]);
  t1 = await chat(srv, turn1());
  eq(t1.cached, 0, 'turn 1 is cold');
  const t2 = await chat(srv, turn2(t1.text));
  assert(t2.cached > 0, `live turn 2 cached ${t2.cached}`);
  const st = await srv.stop('SIGTERM', 15000);
  eq(st.code, 0, 'exit status after SIGTERM');
  const c1 = await cold(turn1());
  eq(t1.text, c1.text, 'turn 1 vs cold');
  eq(t1.lp, c1.lp, 'turn 1 logprobs vs cold');
  const c2 = await cold(turn1(), turn2(t1.text));
  eq(t2.text, c2.text, 'cached turn 2 text vs cold');
  eq(t2.lp, c2.lp, 'cached turn 2 logprobs vs cold');
}, 180000);

await check(`${P}:restart_resumes_from_disk_bit_identical`, async () => {
  assert(t1, 'turn 1 did not run');
  const srv = await startServer(moe, ['--cache-dir', dir]);
  const r = await chat(srv, turn1());
  assert(r.cached > 0, `after the restart turn 1 cached ${r.cached}: nothing came from disk`);
  assert(await until(() => /event=store\.fetch /.test(srv.log()), 5000), 'no store.fetch log line');
  eq(r.text, t1.text, 'text after restart vs cold');
  eq(r.lp, t1.lp, 'logprobs after restart vs cold');
  await srv.stop();
}, 180000);

async function ggufRestart(hf, gguf, type, gdir) {
  execFileSync(KT_BIN, ['convert', '--model', hf, '--out', gguf, '--type', type, '--no-sync'],
    { stdio: ['ignore', 'ignore', 'inherit'] });
  let srv = await startServer(gguf, ['--cache-dir', gdir]);
  const g1 = await chat(srv, turn1());
  eq(g1.cached, 0, 'turn 1 is cold');
  const g2 = await chat(srv, turn2(g1.text));
  assert(g2.cached > 0, `live turn 2 cached ${g2.cached}`);
  const st = await srv.stop('SIGTERM', 15000);
  eq(st.code, 0, 'exit status after SIGTERM');
  const coldSrv = await startServer(gguf, ['--disable-prefix-cache']);
  const c1 = await chat(coldSrv, turn1());
  const c2 = await chat(coldSrv, turn2(g1.text));
  await coldSrv.stop();
  eq(g1.lp, c1.lp, 'turn 1 logprobs vs cold');
  eq(g2.text, c2.text, 'cached turn 2 text vs cold');
  eq(g2.lp, c2.lp, 'cached turn 2 logprobs vs cold');
  srv = await startServer(gguf, ['--cache-dir', gdir]);
  const r = await chat(srv, turn1());
  assert(await until(() => /event=store\.fetch /.test(srv.log()), 5000), 'nothing was loaded from disk');
  assert(r.cached > 0, `after restart cached ${r.cached}`);
  eq(r.text, c1.text, 'text after restart vs cold');
  eq(r.lp, c1.lp, 'logprobs after restart vs cold');
  await srv.stop();
}

await check(`${P}:gguf_q4_k_m_restart_bit_identical_to_cold`,
  () => ggufRestart(moe, join(TMP, 'moe-q4_k_m.gguf'), 'q4_k_m', join(TMP, 'cache-moe-gguf')), 180000);
// qwen3next: attn_qkv / attn_gate and the split ssm_ba through the server
const next = mkModel('tiny-next-moe', 'next', true);
await check(`${P}:gguf_qwen3next_q8_0_restart_bit_identical_to_cold`,
  () => ggufRestart(next, join(TMP, 'next-q8_0.gguf'), 'q8_0', join(TMP, 'cache-next-gguf')), 180000);

process.exit(failures_count() ? 1 : 0);
