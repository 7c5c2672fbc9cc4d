// harmony_api.mjs - GPT-OSS's harmony format through `kvkeep serve` (issue
// 32): tiny-gpt-oss with the real GPT-OSS tokenizer and chat template.
//
//   stop ids       <|return|> and <|call|> end a generation, <|end|> does not
//                  (the final answer comes after the analysis message)
//   constraints    tool_choice required/named and response formats are a
//                  400 naming the harmony format in the three APIs (the
//                  grammar engine has no harmony syntax); auto, none and
//                  strict functions run unconstrained
//   history        an assistant turn sent back with reasoning_content and
//                  tool_calls (arguments as JSON text) renders as harmony:
//                  the analysis message and the arguments as an object; the
//                  server's prompt is the renderer's, token for token
//   effort         reasoning_effort (chat), reasoning.effort (Responses) and
//                  chat_template_kwargs reach the template ("Reasoning: high")
import { execFileSync } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { KT_BIN, TMP, check, assert, eq, startServer, postJSON, failures_count } from './server_util.mjs';

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
  const named = { type: 'function', function: { name: 'get_weather' } };

  // Structured output's grammars know the Qwen call syntaxes only: a
  // harmony model refuses forced calls and formats by name (400), in each
  // API, instead of constraining them wrongly; auto, none and strict functions run
  // unconstrained.
  await check(`${P}:forced_call_and_format_refused`, async () => {
    const bad = [
      ['/v1/chat/completions', { ...base, tool_choice: named }],
      ['/v1/chat/completions', { ...base, tool_choice: 'required' }],
      ['/v1/chat/completions', { model: 'm', max_tokens: 8, messages: base.messages,
        response_format: { type: 'json_object' } }],
      ['/v1/responses', { model: 'm', max_output_tokens: 8, input: 'Weather in Paris?',
        tools: [{ type: 'function', name: 'get_weather', description: 'Weather of a city',
          parameters: tools[0].function.parameters }],
        tool_choice: { type: 'function', name: 'get_weather' } }],
      ['/v1/messages', { model: 'm', max_tokens: 8, messages: [{ role: 'user', content: 'Weather in Paris?' }],
        tools: [{ name: 'get_weather', description: 'Weather of a city', input_schema: tools[0].function.parameters }],
        tool_choice: { type: 'tool', name: 'get_weather' } }]];
    for (const [path, b] of bad) {
      const r = await postJSON(srv, path, b);
      eq(r.status, 400, `${path}: ${r.text.slice(0, 200)}`);
      assert(/harmony format/.test(r.text), `${path}: the error does not name the harmony format: ${r.text.slice(0, 300)}`);
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
