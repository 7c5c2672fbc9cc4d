// structured_output.mjs - issue 30 through the server: JSON schemas,
// json_object, GBNF grammars and tool_choice in the three APIs, streaming
// and not, on a random-weight tiny-hybrid with the real Qwen3 tokenizer and
// both tool-call syntaxes (Qwen3 JSON, Qwen3.5-style XML). Every
// constrained answer is checked by ajv against its schema, or against the
// grammar's language; bad constraints are 400s naming the problem; a
// constrained request beside unconstrained ones changes none of their
// tokens, and the cache is the same with and without a constraint.
//
// The schemas use enums, booleans and bounded integers: a random model has
// no reason ever to close a free string, so a free-string schema would only
// test max_tokens (tests/e2e/grammar_corpus.sh closes them on purpose).
import { createRequire } from 'node:module';
import { copyFileSync } from 'node:fs';
import { join } from 'node:path';
import {
  ROOT, check, assert, eq, mkModel, startServer, stopServer, postJSON, failures_count,
} from './server_util.mjs';

const T = 'structured_output';
const require = createRequire(import.meta.url);
const Ajv = require(join(ROOT, 'tests/node/node_modules/ajv')).default;
const ajv = new Ajv({ strict: false });

const model = mkModel('tiny-hybrid', 'so-qwen3', true);
const model35 = mkModel('tiny-hybrid', 'so-qwen35', true);
copyFileSync(join(ROOT, 'tests/data/templates/qwen35_style.jinja'), join(model35, 'chat_template.jinja'));
const NAME = 'm';
const common = ['--served-model-name', NAME, '--page-tokens', '16'];
const Q3 = await startServer(model, common);
const Q35 = await startServer(model35, common);

const SCHEMA = {
  type: 'object',
  properties: { color: { enum: ['red', 'green', 'blue'] }, n: { type: 'integer', minimum: 0, maximum: 9 }, ok: { type: 'boolean' } },
  required: ['color', 'n', 'ok'], additionalProperties: false,
};
const TOOLS = [
  { type: 'function', function: { name: 'open_file', description: 'Open one of the files.',
    parameters: { type: 'object', properties: { path: { enum: ['a.txt', 'b.txt'] }, line: { type: 'integer', minimum: 1, maximum: 9 } }, required: ['path', 'line'] } } },
  { type: 'function', function: { name: 'set_flag', description: 'Set a flag.',
    parameters: { type: 'object', properties: { on: { type: 'boolean' } }, required: ['on'] } } },
];
const paramsOf = (name) => TOOLS.find((t) => t.function.name === name).function.parameters;
const NOTHINK = { chat_template_kwargs: { enable_thinking: false } };
const chat = (extra) => ({ model: NAME, max_tokens: 60, temperature: 1, ...NOTHINK,
  messages: [{ role: 'user', content: 'Answer in the required form.' }], ...extra });

// A streamed chat answer, reassembled: {content, tool_calls, finish}.
async function chatStream(srv, body) {
  const r = await fetch(srv.url('/v1/chat/completions'), { method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ ...body, stream: true }) });
  eq(r.status, 200, `stream status: ${r.status}`);
  let content = '', finish = null;
  const calls = [];
  for (const line of (await r.text()).split('\n')) {
    if (!line.startsWith('data: ') || line === 'data: [DONE]') continue;
    const ch = JSON.parse(line.slice(6)).choices[0];
    if (!ch) continue;
    if (ch.delta.content) content += ch.delta.content;
    for (const tc of ch.delta.tool_calls || []) {
      calls[tc.index] = calls[tc.index] || { name: '', arguments: '' };
      if (tc.function.name) calls[tc.index].name += tc.function.name;
      if (tc.function.arguments) calls[tc.index].arguments += tc.function.arguments;
    }
    if (ch.finish_reason) finish = ch.finish_reason;
  }
  return { content, tool_calls: calls, finish };
}

function validSchema(text, schema, what) {
  let v;
  try { v = JSON.parse(text); } catch (e) { throw new Error(`${what}: not JSON: ${JSON.stringify(text).slice(0, 200)}`); }
  assert(ajv.validate(schema, v), `${what}: ${ajv.errorsText()} in ${text}`);
}

for (const [tag, srv] of [['qwen3', Q3], ['qwen35', Q35]]) {
  await check(`${T}:${tag}:chat_json_schema`, async () => {
    for (const seed of [1, 2, 3]) {
      const r = await postJSON(srv, '/v1/chat/completions', chat({ seed,
        response_format: { type: 'json_schema', json_schema: { name: 'x', strict: true, schema: SCHEMA } } }));
      eq(r.status, 200, r.text);
      eq(r.json.choices[0].finish_reason, 'stop', 'finish');
      validSchema(r.json.choices[0].message.content, SCHEMA, `seed ${seed}`);
      const s = await chatStream(srv, chat({ seed,
        response_format: { type: 'json_schema', json_schema: { name: 'x', strict: true, schema: SCHEMA } } }));
      eq(s.content, r.json.choices[0].message.content, 'streamed == whole');
    }
  });
  await check(`${T}:${tag}:chat_tool_choice_required_and_named`, async () => {
    for (const [tc, name] of [['required', null], [{ type: 'function', function: { name: 'open_file' } }, 'open_file'],
      [{ type: 'function', function: { name: 'set_flag' } }, 'set_flag']]) {
      for (const stream of [false, true]) {
        const body = chat({ seed: 7, max_tokens: 200, tools: TOOLS, tool_choice: tc, parallel_tool_calls: false });
        let calls, finish;
        if (stream) {
          ({ tool_calls: calls, finish } = await chatStream(srv, body));
        } else {
          const r = await postJSON(srv, '/v1/chat/completions', body);
          eq(r.status, 200, r.text);
          calls = (r.json.choices[0].message.tool_calls || []).map((c) => c.function);
          finish = r.json.choices[0].finish_reason;
        }
        eq(finish, 'tool_calls', `finish (${JSON.stringify(tc)}, stream ${stream})`);
        eq(calls.length, 1, 'one call');
        if (name) eq(calls[0].name, name, 'the named function');
        validSchema(calls[0].arguments, paramsOf(calls[0].name), `${calls[0].name} arguments`);
      }
    }
  });
  await check(`${T}:${tag}:anthropic_tool_choice_any_and_tool`, async () => {
    const tools = TOOLS.map((t) => ({ name: t.function.name, description: t.function.description, input_schema: t.function.parameters }));
    for (const tc of [{ type: 'any', disable_parallel_tool_use: true }, { type: 'tool', name: 'set_flag', disable_parallel_tool_use: true }]) {
      const body = { model: NAME, max_tokens: 200, temperature: 1, thinking: { type: 'disabled' }, tools, tool_choice: tc,
        messages: [{ role: 'user', content: 'Do it.' }] };
      const r = await postJSON(srv, '/v1/messages', body);
      eq(r.status, 200, r.text);
      eq(r.json.stop_reason, 'tool_use', 'stop_reason');
      const uses = r.json.content.filter((b) => b.type === 'tool_use');
      eq(uses.length, 1, 'one tool_use');
      if (tc.name) eq(uses[0].name, tc.name, 'the named tool');
      assert(ajv.validate(paramsOf(uses[0].name), uses[0].input), `input: ${ajv.errorsText()}`);
      const s = await fetch(srv.url('/v1/messages'), { method: 'POST', headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ ...body, stream: true }) });
      const text = await s.text();
      assert(/"type":"tool_use"/.test(text) && /"stop_reason":"tool_use"/.test(text), `stream: ${text.slice(-300)}`);
    }
  });
  await check(`${T}:${tag}:responses_text_format_and_tool_choice`, async () => {
    const base = { model: NAME, max_output_tokens: 200, temperature: 1, reasoning: { effort: 'none' }, input: 'Answer.' };
    const r = await postJSON(srv, '/v1/responses', { ...base, text: { format: { type: 'json_schema', name: 'x', strict: true, schema: SCHEMA } } });
    eq(r.status, 200, r.text);
    const msg = r.json.output.find((o) => o.type === 'message');
    validSchema(msg.content[0].text, SCHEMA, 'responses text');
    const t = await postJSON(srv, '/v1/responses', { ...base, parallel_tool_calls: false, tool_choice: 'required',
      tools: TOOLS.map((x) => ({ type: 'function', name: x.function.name, parameters: x.function.parameters })) });
    eq(t.status, 200, t.text);
    const fc = t.json.output.filter((o) => o.type === 'function_call');
    eq(fc.length, 1, 'one function_call');
    validSchema(fc[0].arguments, paramsOf(fc[0].name), 'function_call arguments');
    const s = await fetch(srv.url('/v1/responses'), { method: 'POST', headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ ...base, stream: true, text: { format: { type: 'json_schema', name: 'x', schema: SCHEMA } } }) });
    const done = (await s.text()).split('\n').filter((l) => l.startsWith('data: ')).map((l) => JSON.parse(l.slice(6)))
      .find((e) => e.type === 'response.output_text.done');
    assert(done, 'no output_text.done');
    validSchema(done.text, SCHEMA, 'streamed responses text');
  });
}

await check(`${T}:grammar_and_json_schema_fields`, async () => {
  const gbnf = 'root ::= answer "."\nanswer ::= "yes" | "no" | "maybe"';
  for (const seed of [1, 2, 3, 4]) {
    const r = await postJSON(Q3, '/v1/chat/completions', chat({ seed, grammar: gbnf }));
    eq(r.status, 200, r.text);
    assert(/^(yes|no|maybe)\.$/.test(r.json.choices[0].message.content), `chat grammar: ${r.json.choices[0].message.content}`);
    const c = await postJSON(Q3, '/v1/completions', { model: NAME, prompt: 'Q: ', max_tokens: 20, temperature: 1, seed, grammar: gbnf });
    eq(c.status, 200, c.text);
    assert(/^(yes|no|maybe)\.$/.test(c.json.choices[0].text), `completion grammar: ${c.json.choices[0].text}`);
    const j = await postJSON(Q3, '/v1/completions', { model: NAME, prompt: 'Q: ', max_tokens: 40, temperature: 1, seed, json_schema: SCHEMA });
    eq(j.status, 200, j.text);
    validSchema(j.json.choices[0].text, SCHEMA, 'completion json_schema');
  }
});

await check(`${T}:json_object_starts_an_object`, async () => {
  const r = await postJSON(Q3, '/v1/chat/completions', chat({ seed: 3, max_tokens: 30, response_format: { type: 'json_object' } }));
  eq(r.status, 200, r.text);
  const t = r.json.choices[0].message.content;
  // a random model rarely closes a free string: the answer is an object,
  // or (cut at max_tokens) the start of one
  assert(t.startsWith('{'), `not an object: ${t.slice(0, 80)}`);
  if (r.json.choices[0].finish_reason === 'stop') assert(typeof JSON.parse(t) === 'object', t);
});

await check(`${T}:tool_choice_none_and_auto_with_a_strict_tool`, async () => {
  const strict = TOOLS.map((t) => ({ ...t, function: { ...t.function, strict: true } }));
  for (const seed of [1, 2, 3]) {
    const n = await postJSON(Q3, '/v1/chat/completions', chat({ seed, tools: TOOLS, tool_choice: 'none', max_tokens: 40 }));
    eq(n.status, 200, n.text);
    assert(!n.json.choices[0].message.tool_calls && !/<tool_call>/.test(n.json.choices[0].message.content || ''), 'none: a call');
    const a = await postJSON(Q3, '/v1/chat/completions', chat({ seed, tools: strict, tool_choice: 'auto', max_tokens: 40 }));
    eq(a.status, 200, a.text);
    const m = a.json.choices[0].message;
    for (const c of m.tool_calls || []) validSchema(c.function.arguments, paramsOf(c.function.name), 'auto strict call');
    assert(!/<tool_call>/.test(m.content || ''), `auto: a raw call in the text: ${m.content}`);
  }
});

await check(`${T}:logprobs_see_the_mask`, async () => {
  const r = await postJSON(Q3, '/v1/chat/completions', chat({ seed: 5, logprobs: true, top_logprobs: 10, grammar: 'root ::= "yes" | "no"' }));
  eq(r.status, 200, r.text);
  const first = r.json.choices[0].logprobs.content[0];
  for (const alt of first.top_logprobs)
    assert('yes'.startsWith(alt.token) || 'no'.startsWith(alt.token), `an alternative outside the grammar: ${JSON.stringify(alt)}`);
  const sum = first.top_logprobs.reduce((a, x) => a + Math.exp(x.logprob), 0);
  assert(sum > 0.999 && sum < 1.001, `the alternatives hold ${sum} of the probability`);
});

await check(`${T}:bad_constraints_are_400s_that_name_the_problem`, async () => {
  const cases = [
    [chat({ response_format: { type: 'json_schema', json_schema: { strict: true, schema: { type: 'object', patternProperties: { a: {} } } } } }), /patternProperties/],
    [chat({ grammar: 'root ::= undefined_rule' }), /undefined_rule/],
    [chat({ grammar: 'root ::= "a' }), /line 1/],
    [chat({ response_format: { type: 'xml' } }), /response_format.type/],
    [chat({ response_format: { type: 'json_object' }, grammar: 'root ::= "a"' }), /one of/],
    [chat({ response_format: { type: 'json_object' }, tools: TOOLS }), /tool_choice/],
    [chat({ tools: TOOLS, tool_choice: { type: 'function', function: { name: 'nope' } } }), /nope/],
  ];
  for (const [body, re] of cases) {
    const r = await postJSON(Q3, '/v1/chat/completions', body);
    eq(r.status, 400, `${JSON.stringify(body).slice(0, 120)}: ${r.text}`);
    assert(re.test(r.json.error.message) || re.test(r.json.error.param || ''), `${re}: ${r.json.error.message}`);
  }
  const rr = await postJSON(Q3, '/v1/responses', { model: NAME, input: 'x', text: { format: { type: 'yaml' } } });
  eq(rr.status, 400, rr.text);
});

await check(`${T}:constraints_leave_other_requests_and_the_cache_alone`, async () => {
  const plain = { model: NAME, max_tokens: 24, temperature: 0, ...NOTHINK, messages: [{ role: 'user', content: 'A plain greedy answer, please.' }] };
  const alone = await postJSON(Q3, '/v1/chat/completions', plain);
  const [beside] = await Promise.all([
    postJSON(Q3, '/v1/chat/completions', { ...plain, messages: [{ role: 'user', content: 'A plain greedy answer, please!' }] })
      .then(() => postJSON(Q3, '/v1/chat/completions', plain)),
    ...[1, 2, 3].map((seed) => postJSON(Q3, '/v1/chat/completions', chat({ seed,
      response_format: { type: 'json_schema', json_schema: { schema: SCHEMA } } }))),
  ]);
  eq(beside.json.choices[0].message.content, alone.json.choices[0].message.content, 'the unconstrained answer changed');
  // the same prompt constrained after unconstrained: the prefix is cached the same way
  const c = await postJSON(Q3, '/v1/chat/completions', { ...plain, response_format: { type: 'json_schema', json_schema: { schema: SCHEMA } } });
  assert(c.json.usage.prompt_tokens_details.cached_tokens >= alone.json.usage.prompt_tokens - 8,
    `cached ${c.json.usage.prompt_tokens_details.cached_tokens} of ${alone.json.usage.prompt_tokens}`);
  assert(/constraint=json_schema/.test(Q3.log()), 'the request log names the constraint');
});

await stopServer(Q3);
await stopServer(Q35);
process.exit(failures_count() ? 1 : 0);
