// harmony_api.mjs - GPT-OSS's harmony format through `kvkeep serve` (issue
// 32): tiny-gpt-oss with the real GPT-OSS tokenizer and chat template.
//
//   stop ids       <|return|> and <|call|> end a generation, <|end|> does not
//                  (the final answer comes after the analysis message)
//   constraints    response formats (json_schema, json_object, grammar)
//                  in the final channel and tool_choice required / named
//                  as a commentary-channel call, in the three APIs,
//                  streaming and not: the random model's answer parses and
//                  follows the schema; reasoning may come first; the next
//                  turn (the server's answer sent back) hits the cache; a
//                  constraint the engine refuses is a 400 naming it; auto,
//                  none and strict functions run unconstrained
//   history        an assistant turn sent back with reasoning_content and
//                  tool_calls (arguments as JSON text) renders as harmony:
//                  the analysis message and the arguments as an object; the
//                  server's prompt is the renderer's, token for token
//   effort         reasoning_effort (chat), reasoning.effort (Responses) and
//                  chat_template_kwargs reach the template ("Reasoning: high")
import { execFileSync } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { join } from 'node:path';
import { ROOT, KT_BIN, TMP, check, assert, eq, startServer, postJSON, failures_count } from './server_util.mjs';

const require = createRequire(import.meta.url);
const Ajv = require(join(ROOT, 'tests/node/node_modules/ajv')).default;
const ajv = new Ajv({ strict: false });

const P = 'harmony_api';
const tokdir = process.argv[2];
const model = join(TMP, 'gptoss');
execFileSync(KT_BIN, ['mkmodel', '--preset', 'tiny-gpt-oss', '--out', model, '--tokenizer', tokdir],
  { stdio: ['ignore', 'ignore', 'inherit'] });

const tools = [{ type: 'function', function: { name: 'get_weather', description: 'Weather of a city',
  parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } }];
const MARK = /<\|(channel|message|start|end|call|return|constrain)\|>/;

let nreq = 0;
function render(b) {
  const f = join(TMP, `req-${nreq++}.json`);
  writeFileSync(f, JSON.stringify(b));
  return JSON.parse(execFileSync(KT_BIN, ['render', '--model', model, '--request', f, '--json', '--tokens']).toString());
}

async function sse(srv, path, body) {
  const r = await fetch(srv.url(path), { method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ ...body, stream: true }) });
  assert(r.status === 200, `status ${r.status}`);
  const events = [];
  for (const line of (await r.text()).split('\n'))
    if (line.startsWith('data: ') && line !== 'data: [DONE]') events.push(JSON.parse(line.slice(6)));
  return events;
}

const srv = await startServer(model, ['--served-model-name', 'm']);
try {
  await check(`${P}:stop_ids_return_and_call_not_end`, async () => {
    const m = srv.log().match(/stop_token_ids=([0-9,]+)/);
    assert(m, 'no stop_token_ids in the log');
    const ids = m[1].split(',').map(Number);
    const [ret, call, end] = JSON.parse(execFileSync(KT_BIN, ['tokenize', '--model', model, '--json', '--text',
      '<|return|><|call|><|end|>']).toString());
    assert(ids.includes(ret) && ids.includes(call), `stop ids ${ids} lack <|return|> ${ret} or <|call|> ${call}`);
    assert(!ids.includes(end), `stop ids ${ids} include <|end|> ${end}`);
  });

  const base = { model: 'm', temperature: 0, max_tokens: 24, tools,
    messages: [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Weather in Paris?' }] };

  // Structured output in harmony (docs/constrain.md "Harmony"): the
  // random model writes garbage, the grammar holds it to the form. The
  // schemas use enums, booleans and bounded integers (a random model never
  // closes a free string).
  const SCHEMA = { type: 'object', properties: { color: { enum: ['red', 'green', 'blue'] },
    n: { type: 'integer', minimum: 0, maximum: 9 }, ok: { type: 'boolean' } },
  required: ['color', 'n', 'ok'], additionalProperties: false };
  const TOOLS = [
    { type: 'function', function: { name: 'open_file', description: 'Open one of the files.',
      parameters: { type: 'object', properties: { path: { enum: ['a.txt', 'b.txt'] }, line: { type: 'integer', minimum: 1, maximum: 9 } },
        required: ['path', 'line'] } } },
    { type: 'function', function: { name: 'set_flag', description: 'Set a flag.',
      parameters: { type: 'object', properties: { on: { type: 'boolean' } }, required: ['on'] } } }];
  const paramsOf = (name) => TOOLS.find((t) => t.function.name === name).function.parameters;
  const NOTHINK = { chat_template_kwargs: { enable_thinking: false } };
  const chat = (extra) => ({ model: 'm', max_tokens: 60, temperature: 1, ...NOTHINK,
    messages: [{ role: 'user', content: 'Answer in the required form.' }], ...extra });
  const fmt = { type: 'json_schema', json_schema: { name: 'x', strict: true, schema: SCHEMA } };
  const validSchema = (text, schema, what) => {
    let v;
    try { v = JSON.parse(text); } catch (e) { throw new Error(`${what}: not JSON: ${JSON.stringify(text).slice(0, 200)}`); }
    assert(ajv.validate(schema, v), `${what}: ${ajv.errorsText()} in ${text}`);
  };
  // a streamed chat answer, reassembled
  const chatStream = async (body) => {
    let content = '', reasoning = '', finish = null;
    const calls = [];
    for (const e of await sse(srv, '/v1/chat/completions', body)) {
      const ch = e.choices && e.choices[0];
      if (!ch) continue;
      content += ch.delta.content || '';
      reasoning += ch.delta.reasoning_content || '';
      for (const tc of ch.delta.tool_calls || []) {
        calls[tc.index] = calls[tc.index] || { name: '', arguments: '' };
        calls[tc.index].name += tc.function.name || '';
        calls[tc.index].arguments += tc.function.arguments || '';
      }
      if (ch.finish_reason) finish = ch.finish_reason;
    }
    return { content, reasoning, calls, finish };
  };

  await check(`${P}:formats_in_the_final_channel`, async () => {
    for (const seed of [1, 2, 3]) {
      const r = await postJSON(srv, '/v1/chat/completions', chat({ seed, response_format: fmt }));
      eq(r.status, 200, r.text.slice(0, 300));
      const m = r.json.choices[0].message;
      eq(r.json.choices[0].finish_reason, 'stop', 'finish');
      validSchema(m.content, SCHEMA, `seed ${seed}`);
      assert(!m.reasoning_content && !m.tool_calls, `reasoning or calls: ${JSON.stringify(m).slice(0, 300)}`);
      const s = await chatStream(chat({ seed, response_format: fmt }));
      eq(s.content, m.content, 'streamed == whole');
      eq(s.finish, 'stop', 'streamed finish');
    }
    const gbnf = 'root ::= answer "."\nanswer ::= "yes" | "no" | "maybe"';
    for (const seed of [1, 2]) {
      const r = await postJSON(srv, '/v1/chat/completions', chat({ seed, grammar: gbnf }));
      eq(r.status, 200, r.text.slice(0, 300));
      assert(/^(yes|no|maybe)\.$/.test(r.json.choices[0].message.content), `grammar: ${r.json.choices[0].message.content}`);
      const j = await postJSON(srv, '/v1/chat/completions', chat({ seed, json_schema: SCHEMA }));
      validSchema(j.json.choices[0].message.content, SCHEMA, 'the json_schema field');
      // the completions API has no template: its text is the grammar's alone
      const c = await postJSON(srv, '/v1/completions', { model: 'm', prompt: 'Q: ', max_tokens: 20, temperature: 1, seed, grammar: gbnf });
      eq(c.status, 200, c.text.slice(0, 300));
      assert(/^(yes|no|maybe)\.$/.test(c.json.choices[0].text), `completion grammar: ${c.json.choices[0].text}`);
    }
    const o = await postJSON(srv, '/v1/chat/completions', chat({ seed: 3, max_tokens: 30, response_format: { type: 'json_object' } }));
    eq(o.status, 200, o.text.slice(0, 300));
    const t = o.json.choices[0].message.content;
    assert(t.startsWith('{'), `json_object: not an object: ${t.slice(0, 80)}`);
    if (o.json.choices[0].finish_reason === 'stop') assert(typeof JSON.parse(t) === 'object', t);
    assert(!MARK.test(t), `a marker in the content: ${t}`);
  });

  await check(`${P}:forced_calls_required_and_named`, async () => {
    for (const [tc, name] of [['required', null], [{ type: 'function', function: { name: 'open_file' } }, 'open_file'],
      [{ type: 'function', function: { name: 'set_flag' } }, 'set_flag']]) {
      for (const seed of [1, 2]) {
        const body = chat({ seed, max_tokens: 100, tools: TOOLS, tool_choice: tc });
        const r = await postJSON(srv, '/v1/chat/completions', body);
        eq(r.status, 200, r.text.slice(0, 300));
        const calls = (r.json.choices[0].message.tool_calls || []).map((c) => c.function);
        eq(r.json.choices[0].finish_reason, 'tool_calls', `finish (${JSON.stringify(tc)})`);
        eq(calls.length, 1, 'one call');
        if (name) eq(calls[0].name, name, 'the named function');
        validSchema(calls[0].arguments, paramsOf(calls[0].name), `${calls[0].name} arguments`);
        assert(!r.json.choices[0].message.content, `content beside the call: ${r.json.choices[0].message.content}`);
        const s = await chatStream(body);
        eq(s.finish, 'tool_calls', 'streamed finish');
        eq(JSON.stringify(s.calls), JSON.stringify(calls.map((c) => ({ name: c.name, arguments: c.arguments }))),
          'streamed call == whole');
      }
    }
  });

  await check(`${P}:anthropic_and_responses`, async () => {
    const tools = TOOLS.map((t) => ({ name: t.function.name, description: t.function.description, input_schema: t.function.parameters }));
    for (const tc of [{ type: 'any' }, { type: 'tool', name: 'open_file' }]) {
      const body = { model: 'm', max_tokens: 100, temperature: 1, thinking: { type: 'disabled' }, tools, tool_choice: tc,
        messages: [{ role: 'user', content: 'Do it.' }] };
      const r = await postJSON(srv, '/v1/messages', body);
      eq(r.status, 200, r.text.slice(0, 300));
      eq(r.json.stop_reason, 'tool_use', 'stop_reason');
      const uses = r.json.content.filter((b) => b.type === 'tool_use');
      eq(uses.length, 1, 'one tool_use');
      if (tc.name) eq(uses[0].name, tc.name, 'the named tool');
      assert(ajv.validate(paramsOf(uses[0].name), uses[0].input), `input: ${ajv.errorsText()}`);
      const ev = await sse(srv, '/v1/messages', body);
      assert(ev.some((e) => e.content_block?.type === 'tool_use') && ev.some((e) => e.delta?.stop_reason === 'tool_use'),
        'streamed: no tool_use');
    }
    const base = { model: 'm', max_output_tokens: 100, temperature: 1, reasoning: { effort: 'none' }, input: 'Answer.' };
    const r = await postJSON(srv, '/v1/responses', { ...base, text: { format: { type: 'json_schema', name: 'x', strict: true, schema: SCHEMA } } });
    eq(r.status, 200, r.text.slice(0, 300));
    validSchema(r.json.output.find((o) => o.type === 'message').content[0].text, SCHEMA, 'responses text');
    for (const tc of ['required', { type: 'function', name: 'set_flag' }]) {
      const t = await postJSON(srv, '/v1/responses', { ...base, tool_choice: tc,
        tools: TOOLS.map((x) => ({ type: 'function', name: x.function.name, description: x.function.description,
          parameters: x.function.parameters })) });
      eq(t.status, 200, t.text.slice(0, 300));
      const fc = t.json.output.filter((o) => o.type === 'function_call');
      eq(fc.length, 1, 'one function_call');
      if (tc.name) eq(fc[0].name, tc.name, 'the named function');
      validSchema(fc[0].arguments, paramsOf(fc[0].name), 'function_call arguments');
    }
    const done = (await sse(srv, '/v1/responses', { ...base, text: { format: { type: 'json_schema', name: 'x', schema: SCHEMA } } }))
      .find((e) => e.type === 'response.output_text.done');
    assert(done, 'no output_text.done');
    validSchema(done.text, SCHEMA, 'streamed responses text');
  });

  // With reasoning on the model may write one analysis message first (free:
  // a random model seldom ends it within max_tokens); the answer after it
  // still follows the form, and no marker leaks into the text.
  await check(`${P}:reasoning_may_come_first`, async () => {
    for (const seed of [1, 2, 3, 4]) {
      const body = { ...chat({ seed, max_tokens: 40, response_format: fmt }), chat_template_kwargs: undefined };
      const r = await postJSON(srv, '/v1/chat/completions', body);
      eq(r.status, 200, r.text.slice(0, 300));
      const c = r.json.choices[0], m = c.message;
      assert(!MARK.test(m.content || '') && !MARK.test(m.reasoning_content || ''), `a marker: ${JSON.stringify(m)}`);
      if (c.finish_reason === 'stop') validSchema(m.content, SCHEMA, `seed ${seed}`);
      else eq(c.finish_reason, 'length', 'finish');
      const s = await chatStream(body);
      eq(s.content, m.content || '', 'streamed content');
      eq(s.reasoning, m.reasoning_content || '', 'streamed reasoning');
    }
  });

  // The server's answer sent back: the next turn's prompt starts with the
  // previous one, which the cache holds.
  await check(`${P}:the_next_turn_hits_the_cache`, async () => {
    const msgs = [{ role: 'user', content: 'Open a file, then answer.' }];
    const t1 = await postJSON(srv, '/v1/chat/completions', chat({ seed: 11, max_tokens: 100, tools: TOOLS,
      tool_choice: { type: 'function', function: { name: 'open_file' } }, messages: msgs }));
    eq(t1.status, 200, t1.text.slice(0, 300));
    const call = t1.json.choices[0].message.tool_calls[0];
    msgs.push({ role: 'assistant', content: null, tool_calls: [call] },
      { role: 'tool', tool_call_id: call.id, content: 'line 1: hello' });
    const t2 = await postJSON(srv, '/v1/chat/completions', chat({ seed: 12, tools: TOOLS, tool_choice: 'none',
      response_format: fmt, messages: msgs }));
    eq(t2.status, 200, t2.text.slice(0, 300));
    validSchema(t2.json.choices[0].message.content, SCHEMA, 'turn 2');
    const c2 = t2.json.usage.prompt_tokens_details.cached_tokens;
    assert(c2 >= t1.json.usage.prompt_tokens - 2, `turn 2 cached ${c2} of turn 1's ${t1.json.usage.prompt_tokens}`);
    msgs.push({ role: 'assistant', content: t2.json.choices[0].message.content }, { role: 'user', content: 'Again.' });
    const t3 = await postJSON(srv, '/v1/chat/completions', chat({ seed: 13, tools: TOOLS, tool_choice: 'none',
      response_format: fmt, messages: msgs }));
    eq(t3.status, 200, t3.text.slice(0, 300));
    const c3 = t3.json.usage.prompt_tokens_details.cached_tokens;
    assert(c3 >= t2.json.usage.prompt_tokens - 2, `turn 3 cached ${c3} of turn 2's ${t2.json.usage.prompt_tokens}`);
  });

  await check(`${P}:bad_constraints_are_400s_that_name_the_problem`, async () => {
    const bad = { type: 'object', patternProperties: { a: {} } };
    const cases = [
      ['/v1/chat/completions', chat({ response_format: { type: 'json_schema', json_schema: { strict: true, schema: bad } } }), /patternProperties/],
      ['/v1/chat/completions', chat({ grammar: 'root ::= undefined_rule' }), /undefined_rule/],
      ['/v1/chat/completions', chat({ tools: TOOLS, tool_choice: { type: 'function', function: { name: 'nope' } } }), /nope/],
      ['/v1/responses', { model: 'm', input: 'x', text: { format: { type: 'json_schema', name: 'x', strict: true, schema: bad } } },
        /patternProperties/],
      ['/v1/messages', { model: 'm', max_tokens: 8, messages: [{ role: 'user', content: 'x' }],
        tools: [{ name: 'f', description: 'f', input_schema: { type: 'object', properties: { a: { type: 'string' } } } }],
        tool_choice: { type: 'tool', name: 'nope' } }, /nope/]];
    for (const [path, body, re] of cases) {
      const r = await postJSON(srv, path, body);
      eq(r.status, 400, `${path} ${JSON.stringify(body).slice(0, 120)}: ${r.text.slice(0, 300)}`);
      assert(re.test(r.text), `${path}: ${re} not in ${r.text.slice(0, 300)}`);
    }
    for (const extra of [{ tool_choice: 'auto' }, { tool_choice: 'none' },
      { tools: [{ ...tools[0], function: { ...tools[0].function, strict: true } }] }]) {
      const r = await postJSON(srv, '/v1/chat/completions', { ...base, ...extra });
      eq(r.status, 200, `${JSON.stringify(extra)}: ${r.text.slice(0, 200)}`);
    }
  });

  await check(`${P}:history_renders_as_harmony`, async () => {
    const b = { model: 'm', temperature: 0, max_tokens: 4, tools, messages: [
      { role: 'system', content: 'Be brief.' },
      { role: 'user', content: 'Weather in Paris?' },
      { role: 'assistant', content: null, reasoning_content: 'Need the weather tool.',
        tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Paris"}' } }] },
      { role: 'tool', tool_call_id: 'call_1', content: 'sunny' },
      { role: 'user', content: 'Thanks. And Rome?' }] };
    const want = render(b);
    assert(want.text.includes('<|start|>assistant<|channel|>analysis<|message|>Need the weather tool.<|end|>'),
      'the reasoning is not the analysis message');
    assert(want.text.includes('to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Paris"}<|call|>'),
      `the arguments are not an object: ${want.text.slice(-400)}`);
    const r = await postJSON(srv, '/v1/chat/completions', b);
    eq(r.status, 200, r.text.slice(0, 200));
    eq(r.json.usage.prompt_tokens, want.tokens.length, 'server prompt == renderer tokens');
  });

  await check(`${P}:reasoning_effort_reaches_the_template`, async () => {
    const q = { model: 'm', temperature: 0, max_tokens: 1, logprobs: true, top_logprobs: 5,
      messages: [{ role: 'user', content: 'Hi' }] };
    const lp = async (extra) => {
      const r = await postJSON(srv, '/v1/chat/completions', { ...q, ...extra });
      eq(r.status, 200, r.text.slice(0, 200));
      return JSON.stringify(r.json.choices[0].logprobs);
    };
    const high = await lp({ reasoning_effort: 'high' }), low = await lp({ reasoning_effort: 'low' });
    assert(high !== low, 'reasoning_effort high and low give the same logits');
    eq(await lp({ reasoning_effort: 'high', chat_template_kwargs: { reasoning_effort: 'low' } }), low,
      'chat_template_kwargs win over reasoning_effort');
    eq(await lp({}), await lp({ reasoning_effort: 'medium' }), 'the template default is medium');
    const t = render({ ...q, chat_template_kwargs: { reasoning_effort: 'high' } }).text;
    assert(t.includes('Reasoning: high'), 'the template does not show the effort');
    // Responses' reasoning.effort: its prompt is the chat request's with
    // the same effort (the cache holds it), not the other effort's
    const u = 'Hi, what is new?';
    const rr = await postJSON(srv, '/v1/responses', { model: 'm', temperature: 0, max_output_tokens: 1, input: u,
      reasoning: { effort: 'low' } });
    eq(rr.status, 200, rr.text.slice(0, 200));
    const cached = async (effort) => {
      const r = await postJSON(srv, '/v1/chat/completions', { ...q, reasoning_effort: effort,
        messages: [{ role: 'user', content: u }] });
      eq(r.status, 200, r.text.slice(0, 200));
      return [r.json.usage.prompt_tokens_details?.cached_tokens || 0, r.json.usage.prompt_tokens];
    };
    const [ch] = await cached('high');
    const [cl, nl] = await cached('low');
    assert(cl > ch && cl >= nl - 2, `cached after Responses' low effort: low ${cl}/${nl}, high ${ch}`);
  });
} finally {
  await srv.stop();
}
process.exit(failures_count() ? 1 : 0);
