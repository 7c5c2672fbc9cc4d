// agent_api.mjs - end-to-end tests of the agent APIs of `kvkeep serve`:
// the Anthropic Messages API through the official @anthropic-ai/sdk
// (messages.create and messages.stream, tools, a tool_use / tool_result
// round trip, thinking on and off, count_tokens, HEAD /) and the OpenAI
// Responses API through the official openai client (responses.create and
// responses.stream, function tools, a function_call_output turn). Cached
// tokens grow over three turns; greedy output with the cache equals the
// output of a server with --disable-prefix-cache; the billing-header rule
// lets two Claude-Code-like sessions share their system prompt; malformed
// bodies get 400 in each API's own error shape.
// Run by tests/e2e/agent_api.sh; prints ok/FAIL lines.
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { createRequire } from 'node:module';
import {
  ROOT, loadOpenAI, check, assert, eq, mkModel, startServer, postJSON, fail, until,
} from './server_util.mjs';

const T = 'agent_api';
const require = createRequire(import.meta.url);
const OpenAI = loadOpenAI();
const sdkPath = join(ROOT, 'tests/node/node_modules/@anthropic-ai/sdk');
if (!OpenAI || !existsSync(sdkPath)) {
  fail(`${T}:npm`, 'tests/node/node_modules/openai or @anthropic-ai/sdk is missing (run make npm)');
  process.exit(1);
}
const AnthropicMod = require(sdkPath);
const Anthropic = AnthropicMod.default || AnthropicMod.Anthropic || AnthropicMod;

const model = mkModel('tiny-hybrid', 'hybrid-qwen', true);
const NAME = 'tiny';
const common = ['--served-model-name', NAME, '--page-tokens', '16'];
const A = await startServer(model, common);
const B = await startServer(model, [...common, '--disable-prefix-cache']);
const anth = (srv) => new Anthropic({ baseURL: srv.base, apiKey: 'none', maxRetries: 0, timeout: 60000 });
const oai = (srv) => new OpenAI({ baseURL: `${srv.base}/v1`, apiKey: 'none', maxRetries: 0, timeout: 60000 });

const SYSTEM = [
  { type: 'text', text: 'x-anthropic-billing-header: cc_version=2.1.0.abc; cc_entrypoint=sdk-cli; cch=00001;' },
  { type: 'text', text: 'You are a careful coding agent. '.repeat(20), cache_control: { type: 'ephemeral' } },
];
const TOOLS = [
  { name: 'Bash', description: 'Run a shell command.', input_schema: { type: 'object', properties: { command: { type: 'string' } }, required: ['command'] } },
  { name: 'Read', description: 'Read a file.', input_schema: { type: 'object', properties: { path: { type: 'string' } }, required: ['path'] } },
];

async function turn(client, messages, extra = {}) {
  return client.messages.create({
    model: NAME, max_tokens: 8, temperature: 0, system: SYSTEM, tools: TOOLS, messages,
    thinking: { type: 'disabled' }, ...extra,
  });
}

await check(`${T}:head_root`, async () => {
  const r = await fetch(A.url('/'), { method: 'HEAD' });
  eq(r.status, 200, 'HEAD / status');
});

await check(`${T}:messages_create_three_turns_cache_grows`, async () => {
  const c = anth(A);
  const msgs = [{ role: 'user', content: 'List the files in this folder, please.' }];
  const r1 = await turn(c, msgs);
  assert(/^msg_/.test(r1.id), `id ${r1.id}`);
  eq(r1.type, 'message', 'type');
  eq(r1.role, 'assistant', 'role');
  assert(['end_turn', 'max_tokens', 'tool_use', 'stop_sequence'].includes(r1.stop_reason), `stop_reason ${r1.stop_reason}`);
  // Anthropic's rule: the three input fields add up to the prompt (a cold
  // turn: what it prefilled is newly cached)
  const prompt1 = r1.usage.input_tokens + r1.usage.cache_creation_input_tokens + r1.usage.cache_read_input_tokens;
  assert(prompt1 > 100, `prompt ${prompt1}`);
  eq(r1.usage.cache_read_input_tokens, 0, 'cold turn: nothing read from the cache');
  eq(r1.usage.cache_creation_input_tokens, prompt1, 'cold turn: the whole prompt is newly cached');
  // turn 2: the answer plus a tool_use / tool_result round trip
  msgs.push({ role: 'assistant', content: [{ type: 'text', text: 'Running ls.' }, { type: 'tool_use', id: 'toolu_01', name: 'Bash', input: { command: 'ls' } }] });
  msgs.push({ role: 'user', content: [{ type: 'tool_result', tool_use_id: 'toolu_01', content: [{ type: 'text', text: 'a.c\nb.c' }] }, { type: 'text', text: 'Now read a.c' }] });
  const r2 = await turn(c, msgs);
  msgs.push({ role: 'assistant', content: [{ type: 'tool_use', id: 'toolu_02', name: 'Read', input: { path: 'a.c' } }] });
  msgs.push({ role: 'user', content: [{ type: 'tool_result', tool_use_id: 'toolu_02', content: 'int main(void) { return 0; }', is_error: false }] });
  const r3 = await turn(c, msgs);
  const c2 = r2.usage.cache_read_input_tokens, c3 = r3.usage.cache_read_input_tokens;
  assert(c2 > 100, `turn 2 cache_read_input_tokens ${c2}`);
  assert(c3 > c2, `cached tokens grow: ${c2} then ${c3}`);
  const u3 = r3.usage;
  assert(u3.input_tokens + u3.cache_creation_input_tokens > 0, 'turn 3 prefilled its new messages');
  const count3 = await c.messages.countTokens({ model: NAME, system: SYSTEM, tools: TOOLS, thinking: { type: 'disabled' }, messages: msgs });
  eq(u3.input_tokens + u3.cache_creation_input_tokens + u3.cache_read_input_tokens, count3.input_tokens,
    'the three input fields add up to the prompt');
});

await check(`${T}:messages_greedy_cache_equals_cold`, async () => {
  const msgs = [{ role: 'user', content: 'Say something about caches.' }];
  const warm1 = await turn(anth(A), msgs, { max_tokens: 12 });
  const warm2 = await turn(anth(A), msgs, { max_tokens: 12 });
  const cold = await turn(anth(B), msgs, { max_tokens: 12 });
  assert(warm2.usage.cache_read_input_tokens > 0, 'second request hit the cache');
  eq(JSON.stringify(warm2.content), JSON.stringify(cold.content), 'cached == cold');
  eq(JSON.stringify(warm1.content), JSON.stringify(cold.content), 'first == cold');
});

await check(`${T}:messages_stream_events_and_thinking`, async () => {
  const c = anth(A);
  for (const thinking of [{ type: 'enabled', budget_tokens: 1024 }, { type: 'disabled' }]) {
    const stream = c.messages.stream({
      model: NAME, max_tokens: 10, temperature: 0, system: SYSTEM, tools: TOOLS, thinking,
      messages: [{ role: 'user', content: 'Think, then answer.' }],
    });
    const types = [];
    stream.on('streamEvent', (e) => types.push(e.type));
    const final = await stream.finalMessage();
    eq(types[0], 'message_start', 'first event');
    eq(types[types.length - 1], 'message_stop', 'last event');
    assert(types.includes('message_delta'), 'message_delta sent');
    const starts = types.filter((t) => t === 'content_block_start').length;
    const stops = types.filter((t) => t === 'content_block_stop').length;
    eq(starts, stops, 'every block closed');
    eq(starts, final.content.length, 'one block per content entry');
    assert(final.usage.output_tokens > 0, 'output tokens');
  }
});

await check(`${T}:messages_count_tokens`, async () => {
  const c = anth(A);
  const r = await c.messages.countTokens({ model: NAME, system: SYSTEM, tools: TOOLS, thinking: { type: 'disabled' }, messages: [{ role: 'user', content: 'hi' }] });
  assert(Number.isInteger(r.input_tokens) && r.input_tokens > 100, `count ${r.input_tokens}`);
  const m = await turn(c, [{ role: 'user', content: 'hi' }]);
  eq(r.input_tokens, m.usage.input_tokens + m.usage.cache_creation_input_tokens + m.usage.cache_read_input_tokens,
    'count_tokens == prompt tokens');
});

await check(`${T}:billing_header_rule_shares_the_prefix`, async () => {
  // two sessions whose billing lines differ; with the default rule the
  // second reuses the whole system prompt + tools
  const sys2 = [{ ...SYSTEM[0], text: 'x-anthropic-billing-header: cc_version=2.1.0.def; cc_entrypoint=sdk-cli; cch=99999;' }, SYSTEM[1]];
  const c = anth(A);
  await c.messages.create({ model: NAME, max_tokens: 2, system: SYSTEM, tools: TOOLS, messages: [{ role: 'user', content: 'session one' }] });
  const r = await c.messages.create({ model: NAME, max_tokens: 2, system: sys2, tools: TOOLS, messages: [{ role: 'user', content: 'session two' }] });
  assert(r.usage.cache_read_input_tokens > 200, `shared ${r.usage.cache_read_input_tokens}`);
  assert(r.usage.kvkeep && r.usage.kvkeep.normalized && r.usage.kvkeep.normalized[0].rule === 'billing-header', 'the rule is reported');
});

await check(`${T}:miss_explainer_names_the_changed_tool`, async () => {
  const c = anth(A);
  const sys = [{ type: 'text', text: 'You explain cache misses. '.repeat(15) }];
  const tools = [TOOLS[0], { ...TOOLS[1], description: 'Read a file from disk.' }];
  await c.messages.create({ model: NAME, max_tokens: 2, system: sys, tools, messages: [{ role: 'user', content: 'one' }] });
  const changed = [TOOLS[0], { ...TOOLS[1], description: 'Read a whole file from the disk.' }];
  const r = await c.messages.create({ model: NAME, max_tokens: 2, system: sys, tools: changed, messages: [{ role: 'user', content: 'one' }] });
  const ex = r.usage.kvkeep && r.usage.kvkeep.cache;
  assert(ex, 'usage.kvkeep.cache present');
  eq(ex.message, 0, 'the system turn');
  eq(ex.role, 'system', 'role');
  eq(ex.tool, 1, 'the second tool changed');
  assert(ex.first_diff > 100 && ex.first_diff === ex.shared_tokens, `first_diff ${ex.first_diff}`);
  assert(typeof ex.cached === 'string' && ex.cached.includes('Read a file'), `cached text ${ex.cached}`);
  assert(ex.new.includes('Read a whole'), `new text ${ex.new}`);
  // logged before the reply, but node may read the reply before the stderr pipe
  assert(await until(() => /event=cache\.miss_reason [^\n]*role=system tool=1/.test(A.log()), 5000), 'log line');
});

await check(`${T}:anthropic_errors`, async () => {
  const bad = [
    '{"max_tokens": 5}',
    '{"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}]}]}',
    '{"max_tokens": 5, "messages": [{"role": "robot", "content": "hi"}]}',
    '{"max_tokens": 0, "messages": [{"role": "user", "content": "hi"}]}',
    'not json',
  ];
  for (const b of bad) {
    const r = await postJSON(A, '/v1/messages?beta=true', b);
    eq(r.status, 400, `status for ${b}`);
    eq(r.json && r.json.type, 'error', `shape for ${b}`);
    eq(r.json.error.type, 'invalid_request_error', `type for ${b}`);
    assert(typeof r.json.error.message === 'string' && r.json.error.message.length > 0, 'message');
  }
});

await check(`${T}:responses_create_stream_and_function_call_output`, async () => {
  const c = oai(A);
  const tools = [{ type: 'function', name: 'shell', description: 'Run a command', parameters: { type: 'object', properties: { cmd: { type: 'string' } }, required: ['cmd'] } }];
  const instructions = 'You are Codex, a coding agent. '.repeat(20);
  const input = [{ type: 'message', role: 'user', content: [{ type: 'input_text', text: 'fix the build' }] }];
  const r1 = await c.responses.create({ model: NAME, instructions, input, tools, max_output_tokens: 8, temperature: 0, store: false });
  assert(/^resp_/.test(r1.id), `id ${r1.id}`);
  eq(r1.object, 'response', 'object');
  assert(['completed', 'incomplete'].includes(r1.status), `status ${r1.status}`);
  assert(r1.usage.input_tokens > 100, 'input tokens');
  input.push({ type: 'function_call', call_id: 'call_1', name: 'shell', arguments: '{"cmd":"make"}' });
  input.push({ type: 'function_call_output', call_id: 'call_1', output: 'error: missing ;' });
  const stream = c.responses.stream({ model: NAME, instructions, input, tools, max_output_tokens: 8, temperature: 0, store: false });
  const types = [];
  for await (const e of stream) types.push(e.type);
  const r2 = await stream.finalResponse();
  eq(types[0], 'response.created', 'first event');
  eq(types[types.length - 1], 'response.completed', 'last event');
  eq(types.filter((t) => t === 'response.output_item.added').length, types.filter((t) => t === 'response.output_item.done').length, 'items closed');
  const c2 = r2.usage.input_tokens_details.cached_tokens;
  assert(c2 > 100, `turn 2 cached ${c2}`);
  input.push({ type: 'message', role: 'assistant', content: [{ type: 'output_text', text: 'Fixed.' }] });
  input.push({ type: 'message', role: 'user', content: [{ type: 'input_text', text: 'thanks' }] });
  const r3 = await c.responses.create({ model: NAME, instructions, input, tools, max_output_tokens: 8, temperature: 0, store: false });
  assert(r3.usage.input_tokens_details.cached_tokens > c2, 'cached tokens grow');
  const cold = await oai(B).responses.create({ model: NAME, instructions, input, tools, max_output_tokens: 8, temperature: 0, store: false });
  eq(JSON.stringify(r3.output.map((o) => o.content || o.arguments)), JSON.stringify(cold.output.map((o) => o.content || o.arguments)), 'cached == cold');
});

await check(`${T}:responses_errors`, async () => {
  for (const b of ['{"model":"tiny"}', '{"input":"hi","previous_response_id":"resp_x"}', '{"input":[{"type":"teleport"}]}']) {
    const r = await postJSON(A, '/v1/responses', b);
    eq(r.status, 400, `status for ${b}`);
    assert(r.json && r.json.error && r.json.error.type === 'invalid_request_error', `shape for ${b}`);
  }
});

await A.stop();
await B.stop();
