// agent_session.mjs - agent sessions stay cached across user turns, in all
// three APIs, through the official clients (openai, @anthropic-ai/sdk).
//
// Each session is 4 user turns x 2 tool steps, as coding agents send them:
// the history comes back on every request with the reasoning of earlier
// turns (reasoning_content, Anthropic thinking blocks with signatures,
// Responses reasoning items sent back as encrypted_content only) or
// without it, and the server's own answers sent back exactly as the API
// returned them. Every session runs twice in lockstep: on server A (cache
// on) and on server B (--disable-prefix-cache), greedy. Checks:
//   - every request on A reuses >= 95% of the previous request's prompt,
//     plus the tokens it generated when the client sent that answer back;
//   - A's answers equal B's (cached == cold; OpenAI: the logprobs too);
//   - usage adds up: Anthropic input + cache_creation + cache_read is the
//     prompt (count_tokens), OpenAI and Responses cached <= prompt;
//   - the request log says which messages were restored as generated.
// Run by tests/e2e/agent_session.sh; prints ok/FAIL lines.
import { copyFileSync, existsSync } from 'node:fs';
import { join } from 'node:path';
import { createRequire } from 'node:module';

import {
  ROOT, loadOpenAI, check, assert, eq, mkModel, startServer, fail,
} from './server_util.mjs';

const T = 'agent_session';
const require = createRequire(import.meta.url);
const OpenAI = loadOpenAI();
const sdkPath = join(ROOT, 'tests/node/node_modules/@anthropic-ai/sdk');
if (!OpenAI || !existsSync(sdkPath)) {
  fail(`${T}:npm`, 'tests/node/node_modules/openai or @anthropic-ai/sdk is missing (run make npm)');
  process.exit(1);
}
const AnthropicMod = require(sdkPath);
const Anthropic = AnthropicMod.default || AnthropicMod.Anthropic || AnthropicMod;

// tiny-hybrid with the real Qwen3 tokenizer and template (it drops the
// reasoning of earlier turns), and a copy with the Qwen3.5-style test
// template (its generation prompt opens a think block)
const model = mkModel('tiny-hybrid', 'hybrid-qwen3', true);
const model35 = mkModel('tiny-hybrid', 'hybrid-qwen35', true);
copyFileSync(join(ROOT, 'tests/data/templates/qwen35_style.jinja'), join(model35, 'chat_template.jinja'));


const NAME = 'tiny';
const common = ['--served-model-name', NAME, '--page-tokens', '16'];
const servers = {
  qwen3: [await startServer(model, common), await startServer(model, [...common, '--disable-prefix-cache'])],
  qwen35: [await startServer(model35, common), await startServer(model35, [...common, '--disable-prefix-cache'])],
};
const oai = (srv) => new OpenAI({ baseURL: `${srv.base}/v1`, apiKey: 'none', maxRetries: 0, timeout: 60000 });
const anth = (srv) => new Anthropic({ baseURL: srv.base, apiKey: 'none', maxRetries: 0, timeout: 60000 });

const SYSTEM = 'You are a careful coding agent working in a C repository. '.repeat(12);
const TOOLS = [
  { name: 'read_file', description: 'Read a file.', schema: { type: 'object', properties: { path: { type: 'string' } }, required: ['path'] } },
  { name: 'run', description: 'Run a shell command.', schema: { type: 'object', properties: { command: { type: 'string' } }, required: ['command'] } },
];
const TASKS = ['Why does make test fail?', 'Fix the leak in src/base/buf.c.', 'Add a test for it.', 'Update the docs.'];
const step = (t, s) => ({
  reasoning: `Step ${s} of task ${t}: I need to look at the failing part first, then decide.`,
  text: s ? 'Let me read the file.' : '',
  call: { id: `call_${t}${s}`, name: s ? 'read_file' : 'run', args: s ? { path: 'src/base/buf.c' } : { command: 'make test 2>&1 | tail -5' } },
  result: s ? 'char *kv_buf_take(struct kv_buf *b) { return b->p; }' : 'FAIL test_base: 64 bytes leaked\n1 failed',
});

// The cache check of request i on A: it reuses >= 95% of what the previous
// request left in the cache that this request also holds.
function coverage(name, hist, i) {
  const p = hist[i - 1], c = hist[i];
  const want = 0.95 * (p.prompt + (c.echoed ? p.gen : 0));
  assert(c.cached >= want, `${name}: request ${i}: cached ${c.cached} < 95% of ${p.prompt}${c.echoed ? ` + ${p.gen}` : ''} (previous prompt${c.echoed ? ' + its answer, sent back' : ''})`);
  // an answer sent back is itself served from the cache: the hit goes
  // past the previous prompt into the generated tokens
  if (c.echoed)
    assert(c.cached > p.prompt, `${name}: request ${i}: cached ${c.cached} does not reach into the answer sent back (previous prompt ${p.prompt})`);
}

// --- OpenAI chat --------------------------------------------------------------

const oaiTools = TOOLS.map((t) => ({ type: 'function', function: { name: t.name, description: t.description, parameters: t.schema } }));

async function chatSession(name, srvs, { withReasoning }) {
  const hist = [];
  const msgs = [[{ role: 'system', content: SYSTEM }], [{ role: 'system', content: SYSTEM }]];
  let echoed = false;
  const ask = async () => {
    const rs = [];
    for (let k = 0; k < 2; k++) {
      rs.push(await oai(srvs[k]).chat.completions.create({
        model: NAME, messages: msgs[k], tools: oaiTools, max_tokens: 48, temperature: 0, logprobs: true,
      }));
    }
    const [a, b] = rs;
    eq(JSON.stringify(a.choices[0].message), JSON.stringify(b.choices[0].message), `${name}: request ${hist.length}: cached == cold (message)`);
    const la = a.choices[0].logprobs.content.map((x) => x.logprob), lb = b.choices[0].logprobs.content.map((x) => x.logprob);
    eq(JSON.stringify(la), JSON.stringify(lb), `${name}: request ${hist.length}: cached == cold (logprobs)`);
    const u = a.usage;
    assert(u.prompt_tokens_details.cached_tokens <= u.prompt_tokens, 'cached <= prompt');
    eq(b.usage.prompt_tokens, u.prompt_tokens, `${name}: the same prompt on both servers`);
    hist.push({ prompt: u.prompt_tokens, cached: u.prompt_tokens_details.cached_tokens, gen: u.completion_tokens, echoed });
    if (hist.length > 1) coverage(name, hist, hist.length - 1);
    return rs;
  };
  for (let t = 0; t < TASKS.length; t++) {
    for (const m of msgs) m.push({ role: 'user', content: TASKS[t] });
    await ask(); // the previous answer, if any, was sent back: echoed stays
    for (let s = 0; s < 2; s++) {
      const st = step(t, s);
      for (const m of msgs) {
        const a = { role: 'assistant', content: st.text, tool_calls: [{ id: st.call.id, type: 'function', function: { name: st.call.name, arguments: JSON.stringify(st.call.args) } }] };
        if (withReasoning) a.reasoning_content = st.reasoning;
        m.push(a, { role: 'tool', tool_call_id: st.call.id, content: st.result });
      }
      echoed = false;
      const rs = await ask();
      if (s === 1) {
        // the final answer goes back exactly as returned (its reasoning
        // dropped when the client drops reasoning)
        for (let k = 0; k < 2; k++) {
          const m = { ...rs[k].choices[0].message };
          if (!withReasoning) delete m.reasoning_content;
          msgs[k].push(m);
        }
        echoed = true;
      }
    }
  }
  return hist;
}

await check(`${T}:chat_reasoning_sent_back`, async () => {
  const h = await chatSession('chat+reasoning', servers.qwen3, { withReasoning: true });
  eq(h.length, 12, 'requests');
}, 180000);

await check(`${T}:chat_reasoning_dropped`, async () => {
  const h = await chatSession('chat-reasoning', servers.qwen3, { withReasoning: false });
  eq(h.length, 12, 'requests');
}, 180000);

await check(`${T}:chat_qwen35_template`, async () => {
  const h = await chatSession('chat+reasoning qwen3.5', servers.qwen35, { withReasoning: true });
  eq(h.length, 12, 'requests');
}, 180000);

// --- Anthropic Messages --------------------------------------------------------

const anthTools = TOOLS.map((t) => ({ name: t.name, description: t.description, input_schema: t.schema }));

await check(`${T}:anthropic_thinking_blocks`, async () => {
  const name = 'anthropic';
  const srvs = servers.qwen3;
  const hist = [];
  const msgs = [[], []];
  let echoed = false;
  const ask = async () => {
    const rs = [];
    const body = (k) => ({ model: NAME, system: SYSTEM, tools: anthTools, messages: msgs[k], thinking: { type: 'enabled', budget_tokens: 1024 } });
    for (let k = 0; k < 2; k++) {
      // streamed on A, whole on B: the two shapes give the same answer
      if (k === 0) {
        const st = anth(srvs[k]).messages.stream({ ...body(k), max_tokens: 48, temperature: 0 });
        let start = null;
        st.on('streamEvent', (e) => { if (e.type === 'message_start') start = e.message.usage; });
        const fin = await st.finalMessage();
        const u = fin.usage;
        eq(start.input_tokens + start.cache_creation_input_tokens + start.cache_read_input_tokens,
          u.input_tokens + u.cache_creation_input_tokens + u.cache_read_input_tokens, `${name}: message_start and the end agree`);
        eq(start.cache_read_input_tokens, u.cache_read_input_tokens, `${name}: message_start carries the final split`);
        rs.push(fin);
      } else {
        rs.push(await anth(srvs[k]).messages.create({ ...body(k), max_tokens: 48, temperature: 0 }));
      }
    }
    const [a, b] = rs;
    eq(JSON.stringify(a.content.map((x) => ({ ...x, id: undefined }))), JSON.stringify(b.content.map((x) => ({ ...x, id: undefined }))),
      `${name}: request ${hist.length}: cached == cold`);
    const u = a.usage;
    const count = await anth(srvs[0]).messages.countTokens({ model: NAME, system: SYSTEM, tools: anthTools, messages: msgs[0], thinking: { type: 'enabled', budget_tokens: 1024 } });
    const prompt = u.input_tokens + u.cache_creation_input_tokens + u.cache_read_input_tokens;
    eq(prompt, count.input_tokens, `${name}: request ${hist.length}: input + cache_creation + cache_read == the prompt`);
    hist.push({ prompt, cached: u.cache_read_input_tokens, gen: u.output_tokens, echoed });
    if (hist.length > 1) coverage(name, hist, hist.length - 1);
    return rs;
  };
  for (let t = 0; t < TASKS.length; t++) {
    for (const m of msgs) m.push({ role: 'user', content: [{ type: 'text', text: TASKS[t] }] });
    await ask(); // the previous answer, if any, was sent back: echoed stays
    for (let s = 0; s < 2; s++) {
      const st = step(t, s);
      for (const m of msgs) {
        const content = [{ type: 'thinking', thinking: st.reasoning, signature: `sig-${t}${s}` }];
        if (st.text) content.push({ type: 'text', text: st.text });
        content.push({ type: 'tool_use', id: `toolu_${t}${s}`, name: st.call.name, input: st.call.args });
        m.push({ role: 'assistant', content });
        m.push({ role: 'user', content: [{ type: 'tool_result', tool_use_id: `toolu_${t}${s}`, content: st.result }] });
      }
      echoed = false;
      const rs = await ask();
      if (s === 1) {
        for (let k = 0; k < 2; k++)
          msgs[k].push({ role: 'assistant', content: rs[k].content.map((x) => (x.type === 'thinking' ? { ...x, signature: 'client-kept-signature' } : x)) });
        echoed = true;
      }
    }
  }
  eq(hist.length, 12, 'requests');
  const restored = (srvs[0].log().match(/restored_messages=([1-9]\d*)/g) || []).length;
  assert(restored >= 3, `the request log names restored messages (${restored} lines)`);
}, 240000);

// --- OpenAI Responses --------------------------------------------------------------

const respTools = TOOLS.map((t) => ({ type: 'function', name: t.name, description: t.description, parameters: t.schema }));
const seal = (s) => `kvk1:${Buffer.from(s, 'utf8').toString('base64')}`;

await check(`${T}:responses_reasoning_items`, async () => {
  const name = 'responses';
  const srvs = servers.qwen35; // its answers are reasoning: reasoning items come back
  const hist = [];
  const input = [[], []];
  let echoed = false;
  let sealed = 0;
  const ask = async () => {
    const rs = [];
    for (let k = 0; k < 2; k++) {
      rs.push(await oai(srvs[k]).responses.create({
        model: NAME, instructions: SYSTEM, input: input[k], tools: respTools, max_output_tokens: 48, temperature: 0,
        store: false, include: ['reasoning.encrypted_content'], reasoning: { effort: 'medium' },
      }));
    }
    const [a, b] = rs;
    const strip = (o) => o.output.map((x) => ({ ...x, id: undefined, call_id: undefined }));
    eq(JSON.stringify(strip(a)), JSON.stringify(strip(b)), `${name}: request ${hist.length}: cached == cold`);
    const u = a.usage;
    assert(u.input_tokens_details.cached_tokens <= u.input_tokens, 'cached <= input');
    hist.push({ prompt: u.input_tokens, cached: u.input_tokens_details.cached_tokens, gen: u.output_tokens, echoed });
    if (hist.length > 1) coverage(name, hist, hist.length - 1);
    return rs;
  };
  for (let t = 0; t < TASKS.length; t++) {
    for (const m of input) m.push({ type: 'message', role: 'user', content: [{ type: 'input_text', text: TASKS[t] }] });
    await ask(); // the previous answer, if any, was sent back: echoed stays
    for (let s = 0; s < 2; s++) {
      const st = step(t, s);
      for (const m of input) {
        // the reasoning comes back only as encrypted_content, as Codex keeps it
        m.push({ type: 'reasoning', id: `rs_${t}${s}`, summary: [], encrypted_content: seal(st.reasoning) });
        if (st.text) m.push({ type: 'message', role: 'assistant', content: [{ type: 'output_text', text: st.text }] });
        m.push({ type: 'function_call', call_id: `call_${t}${s}`, name: st.call.name, arguments: JSON.stringify(st.call.args) });
        m.push({ type: 'function_call_output', call_id: `call_${t}${s}`, output: st.result });
      }
      echoed = false;
      const rs = await ask();
      if (s === 1) {
        for (let k = 0; k < 2; k++)
          for (const item of rs[k].output) {
            if (item.type === 'reasoning') {
              assert(typeof item.encrypted_content === 'string' && item.encrypted_content.startsWith('kvk1:'), 'encrypted_content returned');
              sealed++;
              const { content, ...rest } = item; // sent back without its text
              void content;
              input[k].push(rest);
            } else {
              input[k].push(item);
            }
          }
        echoed = true;
      }
    }
  }
  eq(hist.length, 12, 'requests');
  assert(sealed >= 2, `reasoning items with encrypted_content came back (${sealed})`);
}, 240000);

// --- the server's own answers, every one sent back -------------------------------------

await check(`${T}:own_answers_echoed`, async () => {
  const name = 'echo';
  const srvs = servers.qwen35;
  const hist = [];
  const msgs = [[{ role: 'system', content: SYSTEM }], [{ role: 'system', content: SYSTEM }]];
  for (let t = 0; t < TASKS.length; t++) {
    for (const m of msgs) m.push({ role: 'user', content: TASKS[t] });
    for (let s = 0; s < 3; s++) {
      const rs = [];
      for (let k = 0; k < 2; k++) {
        rs.push(await oai(srvs[k]).chat.completions.create({
          model: NAME, messages: msgs[k], tools: oaiTools, max_tokens: 48, temperature: 0, logprobs: true,
          // two tool steps: the answer must open a call of this tool
          tool_choice: s < 2 ? { type: 'function', function: { name: s ? 'read_file' : 'run' } } : 'auto',
        }));
      }
      eq(JSON.stringify(rs[0].choices[0].logprobs.content.map((x) => x.logprob)),
        JSON.stringify(rs[1].choices[0].logprobs.content.map((x) => x.logprob)), `${name}: cached == cold (logprobs)`);
      const u = rs[0].usage;
      hist.push({ prompt: u.prompt_tokens, cached: u.prompt_tokens_details.cached_tokens, gen: u.completion_tokens, echoed: hist.length > 0 });
      if (hist.length > 1) coverage(name, hist, hist.length - 1);
      for (let k = 0; k < 2; k++) {
        const m = rs[k].choices[0].message;
        msgs[k].push(m);
        for (const c of m.tool_calls || []) msgs[k].push({ role: 'tool', tool_call_id: c.id, content: 'ok' });
        if (!(m.tool_calls || []).length && s < 2) msgs[k].push({ role: 'user', content: 'continue' });
      }
    }
  }
  eq(hist.length, 12, 'requests');
  const total = hist.slice(1).reduce((a, h) => a + h.cached, 0), want = hist.slice(0, -1).reduce((a, h) => a + h.prompt + h.gen, 0);
  assert(total >= 0.95 * want, `the session reused ${total} of ${want} tokens`);
}, 240000);

// --- answers remembered across a restart ------------------------------------------

await check(`${T}:answers_survive_a_restart`, async () => {
  const dir = join(model, '..', 'restart-cache');
  let srv = await startServer(model, [...common, '--cache-dir', dir]);
  const msgs = [{ role: 'system', content: SYSTEM }, { role: 'user', content: TASKS[0] }];
  const a = await oai(srv).chat.completions.create({ model: NAME, messages: msgs, max_tokens: 48, temperature: 0 });
  msgs.push(a.choices[0].message, { role: 'user', content: TASKS[1] });
  const st = await srv.stop('SIGTERM', 15000);
  eq(st.code, 0, 'exit status after SIGTERM');
  srv = await startServer(model, [...common, '--cache-dir', dir]);
  assert(/event=store\.echo_load [^\n]*loaded=1/.test(srv.log()), 'the answer record was loaded at start');
  const b = await oai(srv).chat.completions.create({ model: NAME, messages: msgs, max_tokens: 4, temperature: 0 });
  const u = b.usage, prev = a.usage.prompt_tokens + a.usage.completion_tokens;
  eq(JSON.stringify(u.kvkeep.restored_messages), '[2]', 'the answer renders as generated after the restart');
  assert(u.prompt_tokens_details.cached_tokens > a.usage.prompt_tokens,
    `after the restart cached ${u.prompt_tokens_details.cached_tokens}: it does not reach into the answer (${a.usage.prompt_tokens} + ${a.usage.completion_tokens} = ${prev})`);
  await srv.stop();
}, 120000);

// --- several served names; the tools-order rule ------------------------------------

await check(`${T}:served_names_and_tools_order`, async () => {
  const C = await startServer(model, ['--served-model-name', 'tiny,claude-haiku-4-5', '--page-tokens', '16',
    '--prompt-normalize', 'billing-header,tools-order']);
  const list = await (await fetch(C.url('/v1/models'))).json();
  eq(JSON.stringify(list.data.map((m) => m.id)), JSON.stringify(['tiny', 'claude-haiku-4-5']), '/v1/models lists every name');
  // Claude Code's small/fast model name reaches the same model, and the answer names it
  const r = await anth(C).messages.create({ model: 'claude-haiku-4-5', max_tokens: 4, system: SYSTEM, messages: [{ role: 'user', content: 'hi' }] });
  eq(r.model, 'claude-haiku-4-5', 'the answer reports the name the request used');
  const c = await oai(C).chat.completions.create({ model: 'tiny', max_tokens: 4, messages: [{ role: 'user', content: 'hi' }] });
  eq(c.model, 'tiny', 'the first name works too');
  let err = null;
  try {
    await oai(C).chat.completions.create({ model: 'gpt-x', max_tokens: 4, messages: [{ role: 'user', content: 'hi' }] });
  } catch (e) { err = e; }
  eq(err && err.status, 404, 'an unknown model is a 404');
  assert(/'tiny', 'claude-haiku-4-5'/.test(err.message), `the 404 lists the served names: ${err.message}`);
  let cerr = null;
  try {
    await anth(C).messages.countTokens({ model: 'gpt-x', messages: [{ role: 'user', content: 'hi' }] });
  } catch (e) { cerr = e; }
  eq(cerr && cerr.status, 404, 'count_tokens checks the model too');
  // MCP clients reorder tools: with tools-order the prompt is the same
  const msgs = [{ role: 'system', content: SYSTEM }, { role: 'user', content: 'List the files.' }];
  const a = await oai(C).chat.completions.create({ model: 'tiny', max_tokens: 4, messages: msgs, tools: oaiTools });
  const b = await oai(C).chat.completions.create({ model: 'tiny', max_tokens: 4, messages: msgs, tools: [...oaiTools].reverse() });
  eq(b.usage.prompt_tokens, a.usage.prompt_tokens, 'the same prompt');
  assert(b.usage.prompt_tokens_details.cached_tokens >= a.usage.prompt_tokens - 4,
    `reordered tools hit the cache: ${b.usage.prompt_tokens_details.cached_tokens} of ${b.usage.prompt_tokens}`);
  assert(/event=prompt.normalize [^\n]*rule=tools-order/.test(C.log()), 'the rule is logged');
  await C.stop();
}, 120000);

for (const s of Object.values(servers)) for (const srv of s) await srv.stop();
process.exit(0);
