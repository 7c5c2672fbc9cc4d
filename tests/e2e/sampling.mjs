// sampling.mjs - sampling defaults, penalties and stop tokens, end to end
// (docs/api.md "Sampling"):
//   - a folder with generation_config.json changes the server's defaults
//     (GET /v1/models shows them, the log line names them, a request with
//     no sampling field samples exactly like one that spells the file's
//     values out); a request's own values win; flags win over the file;
//     --generation-config none restores the OpenAI defaults;
//   - penalties are accepted, change greedy output, and out-of-range
//     values get 400 naming the field;
//   - a generation_config.json with a bad field is one warning and ignored;
//   - greedy and seeded (penalised) sampling give the same tokens with the
//     prefix cache on (cold and warm) and with --disable-prefix-cache;
//   - a stop string that straddles a token boundary ends the answer before it;
//   - `kvkeep generate` on a chat-rendered prompt stops at <|im_end|> on
//     the tiny-qwen35 preset (its config.json names only <|endoftext|>),
//     with the same result as the --ignore-eos run cut at that token, and
//     --stop TEXT stops in the text.
// Run by tests/e2e/sampling.sh; prints ok/FAIL lines.
import { execFileSync } from 'node:child_process';
import { readFileSync, writeFileSync, rmSync, mkdirSync } from 'node:fs';
import { join } from 'node:path';
import {
  check, assert, eq, mkModel, startServer, postJSON, until, KT_BIN, TMP,
} from './server_util.mjs';

const T = 'sampling';
const model = mkModel('tiny-qwen35', 'qwen35', false);
const cfg = JSON.parse(readFileSync(join(model, 'config.json'), 'utf8'));
const gcfg = JSON.parse(readFileSync(join(model, 'generation_config.json'), 'utf8'));
const ENDOFTEXT = cfg.text_config.eos_token_id;
const IM_END = gcfg.eos_token_id[0];

const A = await startServer(model, ['--served-model-name', 'm']);
const PROMPT = [3, 14, 15, 92, 65, 35, 89, 79];
async function complete(S, extra) {
  const r = await postJSON(S, '/v1/completions', { model: 'm', prompt: PROMPT, max_tokens: 24, ignore_eos: true, ...extra });
  eq(r.status, 200, `completion ${JSON.stringify(extra)}: ${r.text.slice(0, 200)}`);
  return r.json.choices[0].text;
}
const FILE_VALUES = { temperature: 0.6, top_k: 20, top_p: 0.95 };
const OPENAI = { temperature: 1, top_p: 1, top_k: 0, min_p: 0, presence_penalty: 0, frequency_penalty: 0, repetition_penalty: 1 };

await check(`${T}:models_show_the_generation_config_defaults`, async () => {
  const r = await fetch(A.url('/v1/models'));
  const d = (await r.json()).data[0].sampling_defaults;
  assert(d, 'no sampling_defaults in /v1/models');
  eq(d.temperature, 0.6, 'temperature');
  eq(d.top_k, 20, 'top_k');
  eq(d.top_p, 0.95, 'top_p');
  eq(d.min_p, 0, 'min_p');
  eq(d.source.temperature, 'generation_config', 'source of temperature');
  eq(d.source.min_p, 'openai', 'source of min_p');
  eq(d.generation_config, 'auto', 'mode');
  assert(d.stop_token_ids.includes(IM_END) && d.stop_token_ids.includes(ENDOFTEXT), `stop ids ${d.stop_token_ids}`);
  // the log file is written asynchronously: wait for the line
  assert(await until(() => /event=serve\.sampling [^\n]*temperature=0\.6\(generation_config\)/.test(A.log()), 5000),
    'no serve.sampling log line');
});

let fileSampled, openaiSampled, greedy;
await check(`${T}:the_defaults_are_the_files_and_requests_override_them`, async () => {
  fileSampled = await complete(A, { seed: 7 });
  eq(await complete(A, { seed: 7, ...FILE_VALUES }), fileSampled, 'no fields == the file spelled out');
  openaiSampled = await complete(A, { seed: 7, ...OPENAI });
  assert(openaiSampled !== fileSampled, 'the OpenAI values gave the same text as the file\'s');
  greedy = await complete(A, { temperature: 0 });
  eq(await complete(A, { temperature: 0, seed: 99 }), greedy, 'greedy ignores the seed');
});

await check(`${T}:generation_config_none_restores_the_openai_defaults`, async () => {
  const B = await startServer(model, ['--served-model-name', 'm', '--generation-config', 'none']);
  try {
    const d = (await (await fetch(B.url('/v1/models'))).json()).data[0].sampling_defaults;
    eq(d.temperature, 1, 'temperature');
    eq(d.top_k, 0, 'top_k');
    eq(d.source.top_p, 'openai', 'source');
    eq(d.generation_config, 'none', 'mode');
    assert(d.stop_token_ids.includes(IM_END), 'the file\'s eos ids still stop generation');
    eq(await complete(B, { seed: 7 }), openaiSampled, 'no fields on "none" == the OpenAI values on "auto"');
  } finally { await B.stop(); }
});

await check(`${T}:a_bad_generation_config_is_a_warning_and_ignored`, async () => {
  const dir = join(TMP, 'qwen35-badgc');
  mkdirSync(dir, { recursive: true });
  execFileSync('cp', ['-r', `${model}/.`, dir]);
  writeFileSync(join(dir, 'generation_config.json'), '{"temperature": "warm", "top_k": 20}');
  const E = await startServer(dir, ['--served-model-name', 'm']);
  try {
    const d = (await (await fetch(E.url('/v1/models'))).json()).data[0].sampling_defaults;
    eq(d.source.top_k, 'openai', 'nothing of the file is used');
    eq(d.temperature, 1, 'temperature');
    assert(await until(() => /level=warn event=serve\.generation_config [^\n]*temperature/.test(E.log()), 5000),
      'no warning naming the field');
    eq(await complete(E, { seed: 7 }), openaiSampled, 'samples with the OpenAI defaults');
  } finally { await E.stop(); }
});

await check(`${T}:flags_beat_the_file_and_requests_beat_flags`, async () => {
  const C = await startServer(model, ['--served-model-name', 'm', '--default-temperature', '0', '--default-top-k', '5']);
  try {
    const d = (await (await fetch(C.url('/v1/models'))).json()).data[0].sampling_defaults;
    eq(d.source.temperature, 'flag', 'source');
    eq(d.top_k, 5, 'top_k');
    eq(d.top_p, 0.95, 'top_p still the file\'s');
    eq(await complete(C, { seed: 7 }), greedy, 'default temperature 0 is greedy');
    eq(await complete(C, { seed: 7, ...FILE_VALUES }), fileSampled, 'the request\'s values win over the flags');
  } finally { await C.stop(); }
  const bad = execFileSyncStatus(['serve', '--model', model, '--default-top-p', '0']);
  eq(bad.status, 2, '--default-top-p 0 refused');
  assert(/--default-top-p/.test(bad.stderr), `message names the flag: ${bad.stderr}`);
});

await check(`${T}:penalties_apply_and_bad_values_are_400`, async () => {
  // the greedy text of this model repeats nothing: a negative presence penalty makes it
  const pen = await complete(A, { temperature: 0, presence_penalty: -2 });
  assert(pen !== greedy, 'presence_penalty -2 did not change the greedy text');
  const rep = await complete(A, { temperature: 0, repetition_penalty: 1.8 });
  assert(rep !== greedy, 'repetition_penalty 1.8 did not change the greedy text');
  eq(await complete(A, { temperature: 0, presence_penalty: -2 }), pen, 'penalised greedy is deterministic');
  for (const [k, v] of [['presence_penalty', 2.5], ['frequency_penalty', -3], ['repetition_penalty', 0], ['min_p', 1.5],
    ['top_k', -2], ['presence_penalty', 'x']]) {
    const r = await postJSON(A, '/v1/chat/completions', { model: 'm', messages: [{ role: 'user', content: 'hi' }], [k]: v });
    eq(r.status, 400, `${k}=${v}`);
    eq(r.json.error.param, k, 'param');
  }
});

await check(`${T}:same_tokens_with_and_without_the_prefix_cache`, async () => {
  const D = await startServer(model, ['--served-model-name', 'm', '--disable-prefix-cache']);
  try {
    const messages = [{ role: 'system', content: 'You are terse. '.repeat(30) }, { role: 'user', content: 'Count to ten.' }];
    for (const extra of [{ temperature: 0 }, { temperature: 0.9, seed: 11, presence_penalty: 0.5, repetition_penalty: 1.1, top_k: 50 }]) {
      const body = { model: 'm', messages, max_tokens: 20, ignore_eos: true, logprobs: true, ...extra };
      const cold = await postJSON(A, '/v1/chat/completions', body);
      const warm = await postJSON(A, '/v1/chat/completions', body);
      const off = await postJSON(D, '/v1/chat/completions', body);
      for (const r of [cold, warm, off]) eq(r.status, 200, r.text.slice(0, 200));
      assert(warm.json.usage.prompt_tokens_details.cached_tokens > 0, 'the second request did not hit the cache');
      eq(off.json.usage.prompt_tokens_details.cached_tokens, 0, 'no cache on D');
      const toks = (r) => JSON.stringify(r.json.choices[0].logprobs.content.map((t) => [t.bytes, t.logprob]));
      eq(toks(warm), toks(cold), `cache hit vs cold ${JSON.stringify(extra)}`);
      eq(toks(off), toks(cold), `--disable-prefix-cache vs cache ${JSON.stringify(extra)}`);
    }
  } finally { await D.stop(); }
});

await check(`${T}:stop_strings_match_across_token_boundaries`, async () => {
  const body = { model: 'm', messages: [{ role: 'user', content: 'Tell a story.' }], max_tokens: 40, ignore_eos: true,
    temperature: 0, logprobs: true };
  const r = await postJSON(A, '/v1/chat/completions', body);
  eq(r.status, 200, r.text.slice(0, 200));
  const toks = r.json.choices[0].logprobs.content.map((t) => Buffer.from(t.bytes));
  const all = Buffer.concat(toks);
  // a 4-byte stop string straddling a token boundary, valid UTF-8
  let stop = null;
  for (let i = 0, at = 0; i < toks.length - 1 && !stop; i++) {
    at += toks[i].length;
    if (at < 2 || at + 2 > all.length) continue;
    const w = all.subarray(at - 2, at + 2);
    const str = w.toString('utf8');
    if (Buffer.from(str, 'utf8').equals(w) && !str.includes('<')) stop = str;
  }
  assert(stop, 'no boundary to test');
  const cut = all.subarray(0, all.indexOf(Buffer.from(stop, 'utf8'))).toString('utf8');
  const s2 = await postJSON(A, '/v1/chat/completions', { ...body, stop: [stop], logprobs: false });
  eq(s2.status, 200, s2.text.slice(0, 200));
  eq(s2.json.choices[0].finish_reason, 'stop', 'finish_reason');
  eq((s2.json.choices[0].message.reasoning_content || '') + (s2.json.choices[0].message.content || ''), cut,
    `text before ${JSON.stringify(stop)}`);
});

function execFileSyncStatus(args) {
  try {
    const out = execFileSync(KT_BIN, args, { stdio: ['ignore', 'pipe', 'pipe'], timeout: 60000 });
    return { status: 0, stdout: out.toString(), stderr: '' };
  } catch (e) {
    return { status: e.status, stdout: String(e.stdout || ''), stderr: String(e.stderr || '') };
  }
}
function ids(out) { return out.match(/^ids:(.*)$/m)[1].trim().split(/\s+/).filter(Boolean).map(Number); }

await check(`${T}:generate_stops_at_im_end_on_a_chat_prompt`, async () => {
  // only the template says <|im_end|>: config.json names <|endoftext|>, and
  // generation_config.json (which lists both) is taken away
  const dir = join(TMP, 'qwen35-bare');
  mkdirSync(dir, { recursive: true });
  execFileSync('cp', ['-r', `${model}/.`, dir]);
  rmSync(join(dir, 'generation_config.json'));
  eq(JSON.parse(readFileSync(join(dir, 'config.json'), 'utf8')).text_config.eos_token_id, ENDOFTEXT, 'config eos');
  const req = join(TMP, 'req.json');
  writeFileSync(req, JSON.stringify({ messages: [{ role: 'user', content: 'Say hi.' }] }));
  const prompt = execFileSyncStatus(['render', '--model', dir, '--request', req]).stdout;
  assert(prompt.endsWith('<|im_start|>assistant\n'), `rendered prompt: ${JSON.stringify(prompt)}`);
  // a repetition penalty < 1 favours the prompt's own tokens, <|im_end|> among them
  let tested = 0;
  for (let seed = 1; seed <= 8 && tested < 3; seed++) {
    const base = ['generate', '--model', dir, '--prompt', prompt, '--temperature', '1', '--repetition-penalty', '0.05',
      '--seed', String(seed), '--max-tokens', '60', '--quiet'];
    const all = ids(execFileSyncStatus([...base, '--ignore-eos']).stdout);
    const first = all.findIndex((t) => t === IM_END || t === ENDOFTEXT);
    if (first < 0 || all[first] !== IM_END) continue;
    const r = execFileSyncStatus(base);
    eq(r.status, 0, 'generate');
    eq(JSON.stringify(ids(r.stdout)), JSON.stringify(all.slice(0, first + 1)), `seed ${seed}: stopped where <|im_end|> came`);
    assert(/^finish: eos$/m.test(r.stdout), 'finish: eos');
    tested++;
  }
  assert(tested > 0, 'no seed drew <|im_end|> before <|endoftext|> within 60 tokens');
  const s = execFileSyncStatus(['generate', '--model', dir, '--prompt', prompt, '--temperature', '1', '--seed', '1',
    '--max-tokens', '200', '--ignore-eos', '--stop', 'a', '--quiet']);
  assert(/^finish: stop$/m.test(s.stdout), `--stop: ${s.stdout.slice(-200)}`);
  assert(ids(s.stdout).length < 200, '--stop ended early');
});

await A.stop();
process.exit(0);
