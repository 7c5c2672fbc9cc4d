// gguf_restart.mjs - a Q4_K_M GGUF of tiny-hybrid (with the real Qwen3
// tokenizer and template, read from the file) served by `kvkeep serve
// --model FILE.gguf`: turn 1 cold, a live turn 2, SIGTERM, restart on the
// same --cache-dir, turn 1 again resumes from disk and gives the text and
// logprobs of a --disable-prefix-cache server, bit for bit; with bf16 KV
// and again with --kv-dtype q8_0.
import { execFileSync } from 'node:child_process';
import { join } from 'node:path';
import { KT_BIN, TMP, check, assert, eq, mkModel, startServer as start0, postJSON, until } from './server_util.mjs';

const startServer = (model, extra = []) => start0(model, ['--served-model-name', 'm', ...extra]);
const P = 'gguf_restart';
const hf = mkModel('tiny-hybrid', 'hybrid-hf', true);
const gguf = join(TMP, 'hybrid-q4_k_m.gguf');
execFileSync(KT_BIN, ['convert', '--model', hf, '--out', gguf, '--type', 'q4_k_m', '--no-sync'],
  { stdio: ['ignore', 'ignore', 'inherit'] });

const system = 'You are a careful coding agent. '.repeat(30) + 'Follow the repository conventions.';
const turn1 = () => ({ model: 'm', temperature: 0, max_tokens: 6, logprobs: true, top_logprobs: 3,
  messages: [{ role: 'system', content: system }, { role: 'user', content: 'List the files under src/.' }] });
function turn2(reply) {
  const b = turn1();
  b.messages.push({ role: 'assistant', content: reply });
  b.messages.push({ role: 'user', content: 'Now open the Makefile.' });
  return b;
}
async function chat(srv, body) {
  const r = await postJSON(srv, '/v1/chat/completions', body);
  assert(r.status === 200, `status ${r.status}: ${r.text.slice(0, 300)}`);
  const c = r.json.choices[0];
  return { text: c.message.content, lp: JSON.stringify(c.logprobs),
    cached: r.json.usage.prompt_tokens_details ? r.json.usage.prompt_tokens_details.cached_tokens : -1 };
}

// bf16 KV (the default), then 8-bit KV (--kv-dtype q8_0): the same rules
for (const [tag, kv] of [['', []], ['_q8_kv', ['--kv-dtype', 'q8_0']]]) {
const dir = join(TMP, `cache-gguf${tag}`);
let t1 = null;
await check(`${P}:q4_k_m_hybrid${tag}_restart_bit_identical_to_cold`, async () => {
  let srv = await startServer(gguf, [...kv, '--cache-dir', dir]);
  t1 = await chat(srv, turn1());
  eq(t1.cached, 0, 'turn 1 is cold');
  const t2 = await chat(srv, turn2(t1.text));
  assert(t2.cached > 0, `live turn 2 cached ${t2.cached}`);
  const st = await srv.stop('SIGTERM', 15000);
  eq(st.code, 0, 'exit status after SIGTERM');
  const coldSrv = await startServer(gguf, [...kv, '--disable-prefix-cache']);
  const cold = await chat(coldSrv, turn1());
  await coldSrv.stop();
  eq(t1.text, cold.text, 'turn 1 vs the --disable-prefix-cache run');
  eq(t1.lp, cold.lp, 'turn 1 logprobs vs the --disable-prefix-cache run');
  srv = await startServer(gguf, [...kv, '--cache-dir', dir]);
  const r = await chat(srv, turn1());
  assert(await until(() => /event=store\.fetch /.test(srv.log()), 5000), 'nothing was loaded from disk');
  assert(r.cached > 0, `after restart cached ${r.cached}`);
  eq(r.text, cold.text, 'text after restart vs cold');
  eq(r.lp, cold.lp, 'logprobs after restart vs cold');
  await srv.stop();
}, 180000);
}
