// mamba_text.mjs - the Mamba-2 families' chat formats through kvkeep serve
// (run by tests/e2e/mamba_text.sh): tiny-granite-h with the Granite 4.0-H
// format and tiny-nemotron-h with the Nemotron Nano 2 format
// (tests/data/families). For each, in each of the three APIs (Chat
// Completions, Messages, Responses): a request with tools and a tool call
// and its result in the history, tool_choice naming read_file: the answer
// is a read_file call, or (the random model rarely closes the call within
// max_tokens) text that starts with the family's own tool-call opener, as
// the tool-call grammar constrains it (text/tcgram.h); the same request
// again is served from the cache with the same answer, and a
// --disable-prefix-cache server gives that answer too (greedy).
import { join } from 'node:path';
import { execFileSync } from 'node:child_process';
import { ROOT, KT_BIN, TMP, check, assert, eq, startServer, postJSON, failures_count } from './server_util.mjs';

const P = 'mamba_text';
const FAMILIES = [
  { preset: 'tiny-granite-h', tok: 'granite4', opener: '<tool_call>\n{"name": "read_file", "arguments": ' },
  { preset: 'tiny-nemotron-h', tok: 'nemotron2', opener: '<TOOLCALL>[{"name": "read_file", "arguments": ' },
];
const params = { type: 'object', properties: { path: { type: 'string' } }, required: ['path'] };
// /no_think: Nemotron's generation prompt would otherwise open a <think>
// block, and a forced tool call does not go inside reasoning
const system = 'You are a careful coding agent. '.repeat(10) + '/no_think';

const bodies = {
  chat: () => ({ model: 'm', temperature: 0, max_tokens: 48,
    tools: [{ type: 'function', function: { name: 'read_file', description: 'Read a file.', parameters: params } }],
    tool_choice: { type: 'function', function: { name: 'read_file' } },
    messages: [{ role: 'system', content: system }, { role: 'user', content: 'Open the README.' },
      { role: 'assistant', content: null, tool_calls: [{ id: 'c1', type: 'function', function: { name: 'read_file', arguments: '{"path": "README"}' } }] },
      { role: 'tool', tool_call_id: 'c1', content: 'kvkeep: a prefix cache' }, { role: 'user', content: 'Now the Makefile.' }] }),
  messages: () => ({ model: 'm', temperature: 0, max_tokens: 48, system,
    tools: [{ name: 'read_file', description: 'Read a file.', input_schema: params }],
    tool_choice: { type: 'tool', name: 'read_file' },
    messages: [{ role: 'user', content: 'Open the README.' },
      { role: 'assistant', content: [{ type: 'tool_use', id: 'c1', name: 'read_file', input: { path: 'README' } }] },
      { role: 'user', content: [{ type: 'tool_result', tool_use_id: 'c1', content: 'kvkeep: a prefix cache' }, { type: 'text', text: 'Now the Makefile.' }] }] }),
  responses: () => ({ model: 'm', temperature: 0, max_output_tokens: 48, instructions: system,
    tools: [{ type: 'function', name: 'read_file', description: 'Read a file.', parameters: params }],
    tool_choice: { type: 'function', name: 'read_file' },
    input: [{ role: 'user', content: 'Open the README.' },
      { type: 'function_call', call_id: 'c1', name: 'read_file', arguments: '{"path": "README"}' },
      { type: 'function_call_output', call_id: 'c1', output: 'kvkeep: a prefix cache' },
      { role: 'user', content: 'Now the Makefile.' }] }),
};
const paths = { chat: '/v1/chat/completions', messages: '/v1/messages', responses: '/v1/responses' };

// The answer as {calls: [names], text, cached}.
function answer(api, j) {
  if (api === 'chat') {
    const m = j.choices[0].message;
    return { calls: (m.tool_calls || []).map((c) => c.function.name), text: m.content || '',
      cached: j.usage.prompt_tokens_details ? j.usage.prompt_tokens_details.cached_tokens : 0 };
  }
  if (api === 'messages') {
    return { calls: j.content.filter((b) => b.type === 'tool_use').map((b) => b.name),
      text: j.content.filter((b) => b.type === 'text').map((b) => b.text).join(''),
      cached: j.usage.cache_read_input_tokens || 0 };
  }
  return { calls: j.output.filter((o) => o.type === 'function_call').map((o) => o.name),
    text: j.output.filter((o) => o.type === 'message').map((o) => o.content.map((c) => c.text || '').join('')).join(''),
    cached: j.usage.input_tokens_details ? j.usage.input_tokens_details.cached_tokens : 0 };
}

for (const f of FAMILIES) {
  const dir = join(TMP, f.preset);
  execFileSync(KT_BIN, ['mkmodel', '--preset', f.preset, '--out', dir, '--tokenizer', join(ROOT, 'tests/data/families', f.tok), '--no-sync'],
    { stdio: ['ignore', 'ignore', 'inherit'] });
  const A = await startServer(dir, ['--served-model-name', 'm']);
  const B = await startServer(dir, ['--served-model-name', 'm', '--disable-prefix-cache']);
  for (const api of ['chat', 'messages', 'responses']) {
    await check(`${P}:${f.tok}_${api}_tool_history_named_tool_choice_cached_equals_cold`, async () => {
      const r1 = await postJSON(A, paths[api], bodies[api]());
      assert(r1.status === 200, `status ${r1.status}: ${r1.text.slice(0, 300)}`);
      const a1 = answer(api, r1.json);
      assert(a1.calls.includes('read_file') || a1.text.startsWith(f.opener),
        `neither a read_file call nor the ${f.tok} opener: ${JSON.stringify(a1).slice(0, 200)}`);
      const r2 = await postJSON(A, paths[api], bodies[api]());
      const a2 = answer(api, r2.json);
      assert(a2.cached > 0, `the repeated request cached ${a2.cached}`);
      const c = answer(api, (await postJSON(B, paths[api], bodies[api]())).json);
      eq(JSON.stringify([a1.calls, a1.text]), JSON.stringify([c.calls, c.text]), 'first answer vs cold');
      eq(JSON.stringify([a2.calls, a2.text]), JSON.stringify([c.calls, c.text]), 'cached answer vs cold');
    }, 120000);
  }
  await A.stop();
  await B.stop();
}
process.exit(failures_count() ? 1 : 0);
