// progress.mjs - nothing is silent during a long prefill (issue 35 item 1).
//
// Loading: the port is bound before the model loads. A model whose
// tokenizer.json is a FIFO holds the server in its load for as long as
// the test wants: meanwhile /health answers 503 "loading" (llama.cpp's
// shape), the API routes 503 with Retry-After, the dashboard page 200,
// and a second server on the same port fails at once, naming --port 0,
// without loading anything.
//
// Prefill (bench-hybrid, the real Qwen3 tokenizer, 64-token chunks,
// prompts of ~5K tokens): return_progress on /v1/chat/completions
// through the npm openai client (stream and the .stream() helper) and
// raw SSE (chat, a cached prefix, /v1/completions): llama.cpp's
// prompt_progress {total, cache, processed, time_ms} in chunks before the
// first token, processed from cache up to total, the answer unchanged;
// none without the field. Anthropic's stream sends ping events and the
// Responses stream ": keep-alive" comments while prefilling (the SDKs
// still read them), the log has request.progress lines every 3 s, and
// /v1/dashboard/state shows the request running with its progress and
// the engine's live counters moving. Run by tests/e2e/progress.sh.
import { spawn } from 'node:child_process';
import { existsSync, mkdirSync, rmSync, writeFileSync, openSync, closeSync, constants } from 'node:fs';
import { execFileSync } from 'node:child_process';
import { join } from 'node:path';
import { createRequire } from 'node:module';
import { ROOT, KT_BIN, TMP, check, assert, eq, mkModel, startServer, postJSON, loadOpenAI, fail, sleep, until } from './server_util.mjs';

const T = 'progress';
const require = createRequire(import.meta.url);
const OpenAI = loadOpenAI();
const sdkPath = join(ROOT, 'tests/node/node_modules/@anthropic-ai/sdk');
if (!OpenAI || !existsSync(sdkPath)) { fail(`${T}:npm`, 'tests/node/node_modules lacks openai or @anthropic-ai/sdk (run make npm)'); process.exit(1); }
const AnthropicMod = require(sdkPath);
const Anthropic = AnthropicMod.default || AnthropicMod.Anthropic || AnthropicMod;

// --- loading: a tokenizer.json that is a FIFO keeps the server loading
await check(`${T}:loading_health_503_and_port_bound_first`, async () => {
  const model = mkModel('tiny-hybrid', 'fifo-model', true);
  rmSync(join(model, 'tokenizer.json'));
  execFileSync('mkfifo', [join(model, 'tokenizer.json')]);
  const env = { ...process.env, KVKEEP_LOG: 'info', KVKEEP_CACHE_DIR: join(TMP, 'dc-fifo') };
  const proc = spawn(KT_BIN, ['serve', model, '--port', '0', '-a', 'tiny'], { env, stdio: ['ignore', 'pipe', 'pipe'] });
  let log = '';
  proc.stderr.on('data', (d) => { log += d.toString(); });
  const exited = new Promise((res) => proc.on('exit', (code) => res(code)));
  try {
    const port = await until(() => (log.match(/event=serve\.listening [^\n]*port=(\d+)/) || [])[1], 20000);
    assert(port, `no serve.listening line: ${log.slice(-400)}`);
    const url = (p) => `http://127.0.0.1:${port}${p}`;
    const h = await fetch(url('/health'));
    eq(h.status, 503, '/health while loading');
    const hj = await h.json();
    eq(hj.status, 'loading', 'status');
    eq(hj.error.message, 'Loading model', "llama.cpp's message");
    eq(hj.error.type, 'unavailable_error', "llama.cpp's type");
    const c = await fetch(url('/v1/chat/completions'), { method: 'POST', headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'tiny', messages: [{ role: 'user', content: 'hi' }] }) });
    eq(c.status, 503, 'chat while loading');
    assert(Number(c.headers.get('retry-after')) >= 1, 'Retry-After');
    assert(/Loading model/.test((await c.json()).error.message), 'says it is loading');
    eq((await fetch(url('/v1/models'))).status, 503, '/v1/models while loading');
    eq((await fetch(url('/dashboard'))).status, 200, 'the page answers');
    assert(!/engine\.model\.load/.test(log), 'still loading');
    // a second server on the busy port: refused before loading anything
    const t0 = Date.now();
    const out = await new Promise((res) => {
      const p2 = spawn(KT_BIN, ['serve', model.replace('fifo-model', 'fifo-model'), '--port', String(port)], { env, stdio: ['ignore', 'pipe', 'pipe'] });
      let o = '';
      p2.stdout.on('data', (d) => { o += d; }); p2.stderr.on('data', (d) => { o += d; });
      p2.on('exit', (code) => res({ code, o }));
    });
    assert(out.code !== 0, `second server exit ${out.code}`);
    assert(/already in use/.test(out.o) && /--port 0/.test(out.o), `busy port message: ${out.o}`);
    assert(!/engine\.model\.load|tokenizer/.test(out.o), `loaded nothing: ${out.o}`);
    assert(Date.now() - t0 < 10000, `fast: ${Date.now() - t0} ms`);
  } finally {
    // let the load go on: an empty FIFO is not a tokenizer, so it fails and exits
    try { const fd = openSync(join(model, 'tokenizer.json'), constants.O_WRONLY | constants.O_NONBLOCK); closeSync(fd); } catch { /* gone */ }
    const code = await Promise.race([exited, sleep(20000).then(() => { proc.kill('SIGKILL'); return 'killed'; })]);
    assert(code !== 0 && code !== 'killed', `the load ended (exit ${code})`);
  }
}, 60000);

// --- prefill progress
const model = mkModel('bench-hybrid', 'bench-progress', true);
const S = await startServer(model, ['-a', 'qwen', '--prefill-chunk', '64']);
const client = new OpenAI({ baseURL: S.url('/v1'), apiKey: 'none', maxRetries: 0, timeout: 300000 });
const anth = new Anthropic({ baseURL: S.base, apiKey: 'none', maxRetries: 0, timeout: 300000 });
let seq = 0;
// a new long prompt each time (cold): ~5K tokens
const longText = () => `Session ${++seq}: ` + 'the build log shows a warning about an unused variable in parser.c. '.repeat(370);
const requestLines = (route) => S.log().split('\n').filter((l) => l.includes('event=request ') && l.includes(`route=${route} `));
const prefillMs = (route, nth) => {
  const lines = requestLines(route);
  const l = lines[nth < 0 ? lines.length + nth : nth] || '';
  return Number((l.match(/prefill_ms=([\d.]+)/) || [])[1] || 0);
};
// the prefill time of the request that made the n-th line of a route (the
// line is written just after the stream's last event)
const prefillOf = async (route, n) => {
  await until(() => requestLines(route).length >= n, 10000);
  return prefillMs(route, n - 1);
};
// keep-alives come at chunk boundaries, at least a second apart: some in a
// long prefill, never a flood
function keepaliveCount(evs, ms, what) {
  if (ms >= 2500) assert(evs.length >= 1, `${what}: none in a ${ms} ms prefill`);
  assert(evs.length <= 2 + Math.ceil(ms / 1000), `${what}: ${evs.length} in ${ms} ms`);
  for (let i = 1; i < evs.length; i++) assert(evs[i].t - evs[i - 1].t >= 700, `${what}: ${evs[i].t - evs[i - 1].t} ms apart`);
}

// SSE events of a raw streamed POST: [{event, data, comment, t}]
async function rawSSE(path, body) {
  const r = await fetch(S.url(path), { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
  eq(r.status, 200, `${path} status`);
  const out = [];
  let buf = '';
  const dec = new TextDecoder();
  for await (const chunk of r.body) {
    buf += dec.decode(chunk, { stream: true });
    let i;
    while ((i = buf.indexOf('\n\n')) >= 0) {
      const block = buf.slice(0, i); buf = buf.slice(i + 2);
      const ev = { t: Date.now() };
      for (const line of block.split('\n')) {
        if (line.startsWith(':')) ev.comment = line.slice(1).trim();
        else if (line.startsWith('event: ')) ev.event = line.slice(7);
        else if (line.startsWith('data: ')) ev.data = line.slice(6);
      }
      out.push(ev);
    }
  }
  return out;
}

function checkProgress(chunks, usage, what) {
  const prog = chunks.filter((c) => c.prompt_progress).map((c) => c.prompt_progress);
  assert(prog.length >= 3, `${what}: ${prog.length} progress chunks`);
  const first = prog[0], last = prog[prog.length - 1];
  eq(first.processed, first.cache, `${what}: the first says where the cache left off`);
  eq(last.processed, last.total, `${what}: the last is complete`);
  for (let i = 1; i < prog.length; i++) {
    assert(prog[i].processed >= prog[i - 1].processed, `${what}: processed goes up`);
    assert(prog[i].time_ms >= prog[i - 1].time_ms, `${what}: time_ms goes up`);
    eq(prog[i].total, first.total, `${what}: one total`);
  }
  eq(first.total, usage.prompt_tokens, `${what}: total is the prompt`);
  eq(first.cache, usage.prompt_tokens_details.cached_tokens, `${what}: cache is the cached tokens`);
  // every progress chunk comes before the first generated text
  const firstText = chunks.findIndex((c) => c.choices && c.choices[0] && (c.choices[0].delta || {}).content);
  const lastProg = chunks.map((c) => !!c.prompt_progress).lastIndexOf(true);
  assert(firstText < 0 || lastProg < firstText, `${what}: progress before text (${lastProg} < ${firstText})`);
  return prog;
}

let chatText = null, chatMessages = null;
await check(`${T}:openai_client_return_progress`, async () => {
  chatMessages = [{ role: 'user', content: longText() }];
  const body = { model: 'qwen', messages: chatMessages, max_tokens: 6, temperature: 0, stream: true,
    stream_options: { include_usage: true }, return_progress: true };
  const chunks = [];
  for await (const c of await client.chat.completions.create(body)) chunks.push(c);
  const usage = chunks[chunks.length - 1].usage;
  assert(usage && usage.prompt_tokens > 4000, `usage ${JSON.stringify(usage)}`);
  const prog = checkProgress(chunks, usage, 'chat');
  eq(prog[0].cache, 0, 'cold');
  assert(prog.length >= Math.floor(usage.prompt_tokens / 64) / 2, `one per chunk or so: ${prog.length}`);
  for (const c of chunks.filter((x) => x.prompt_progress))
    eq(JSON.stringify(c.choices[0].delta), JSON.stringify({ role: 'assistant', content: null }), "llama.cpp's delta");
  chatText = chunks.map((c) => (c.choices && c.choices[0] && c.choices[0].delta.content) || '').join('');
  // the SDK's accumulating helper reads the same answer through them
  const st = client.chat.completions.stream({ ...body, stream_options: undefined });
  const fin = await st.finalChatCompletion();
  eq(fin.choices[0].message.content, chatText, 'the .stream() helper assembles the same answer');
}, 300000);

await check(`${T}:raw_sse_cached_prefix_and_completions`, async () => {
  // the same conversation one turn further: progress starts at the cache
  const msgs = [...chatMessages, { role: 'assistant', content: chatText }, { role: 'user', content: 'Go on. ' + 'More detail please. '.repeat(60) }];
  const ev = await rawSSE('/v1/chat/completions', { model: 'qwen', messages: msgs, max_tokens: 4, temperature: 0, stream: true,
    stream_options: { include_usage: true }, return_progress: true });
  const chunks = ev.filter((e) => e.data && e.data !== '[DONE]').map((e) => JSON.parse(e.data));
  const usage = chunks[chunks.length - 1].usage;
  const prog = checkProgress(chunks, usage, 'cached');
  assert(prog[0].cache > 4000, `resumed from the cache: ${prog[0].cache}`);
  eq(ev[ev.length - 1].data, '[DONE]', 'ends with [DONE]');
  // completions: text "" chunks with prompt_progress
  const ce = await rawSSE('/v1/completions', { model: 'qwen', prompt: longText().slice(0, 3000), max_tokens: 2, stream: true, return_progress: true });
  const cc = ce.filter((e) => e.data && e.data !== '[DONE]').map((e) => JSON.parse(e.data));
  const cp = cc.filter((c) => c.prompt_progress);
  assert(cp.length >= 2, `completions progress chunks: ${cp.length}`);
  for (const c of cp) { eq(c.object, 'text_completion', 'object'); eq(c.choices[0].text, '', 'empty text'); }
  eq(cp[cp.length - 1].prompt_progress.processed, cp[0].prompt_progress.total, 'complete');
  // without the field: no progress chunks
  const ne = await rawSSE('/v1/chat/completions', { model: 'qwen', messages: [{ role: 'user', content: longText().slice(0, 4000) }], max_tokens: 2, stream: true });
  assert(!ne.some((e) => e.data && e.data.includes('prompt_progress')), 'no prompt_progress unless asked');
}, 300000);

await check(`${T}:anthropic_pings_while_prefilling`, async () => {
  const ev = await rawSSE('/v1/messages', { model: 'qwen', max_tokens: 4, stream: true, messages: [{ role: 'user', content: longText() }] });
  const names = ev.map((e) => e.event);
  const start = names.indexOf('message_start'), first = names.indexOf('content_block_start');
  assert(start >= 0 && first > start, `order: ${names.slice(0, 8)}`);
  const pings = ev.slice(start + 1, first).filter((e) => e.event === 'ping');
  const ms = await prefillOf('/v1/messages', 1);
  // one right after message_start (as Anthropic sends), then while prefilling
  eq(names[start + 1], 'ping', 'the first ping');
  keepaliveCount(pings.slice(1), ms, 'pings');
  for (const e of ev.filter((x) => x.event === 'ping')) eq(e.data, '{"type":"ping"}', 'ping data');
  // the SDK reads such a stream to its end
  const st = anth.messages.stream({ model: 'qwen', max_tokens: 4, messages: [{ role: 'user', content: longText() }] });
  const fin = await st.finalMessage();
  eq(fin.type, 'message', 'the SDK assembles the message');
  assert(await prefillOf('/v1/messages', 2) > 0, 'prefilled');
}, 300000);

await check(`${T}:responses_keepalive_comments`, async () => {
  const ev = await rawSSE('/v1/responses', { model: 'qwen', max_output_tokens: 4, stream: true, input: longText() });
  const kas = ev.filter((e) => e.comment);
  const comments = kas.map((e) => e.comment);
  keepaliveCount(kas, await prefillOf('/v1/responses', 1), 'keep-alives');
  let prev = -1;
  for (const c of comments) {
    const m = c.match(/^keep-alive prefill (\d+)\/(\d+)$/);
    assert(m, `comment text: ${c}`);
    assert(Number(m[1]) > prev && Number(m[1]) <= Number(m[2]), `it moves: ${c}`);
    prev = Number(m[1]);
  }
  // sequence numbers stay contiguous: comments use none
  const nums = ev.filter((e) => e.data).map((e) => JSON.parse(e.data).sequence_number);
  nums.forEach((n, i) => eq(n, i, 'sequence_number'));
  // and the npm client streams it to the end
  let done = null;
  for await (const e of await client.responses.create({ model: 'qwen', input: longText(), max_output_tokens: 4, stream: true }))
    if (e.type === 'response.completed') done = e;
  assert(done, 'the client saw response.completed');
}, 300000);

await check(`${T}:log_lines_during_a_long_prefill`, async () => {
  const lines = S.log().split('\n').filter((l) => l.includes('event=request.progress'));
  const longest = Math.max(...['/v1/chat/completions', '/v1/messages', '/v1/responses'].map((r) => prefillMs(r, 0)));
  // one every 3 s of a prefill: the longest alone gives floor(ms / 3000) of them
  assert(lines.length >= Math.floor(longest / 3000), `${lines.length} lines, longest prefill ${longest} ms`);
  for (const l of lines) assert(/level=info event=request\.progress route=\S+ phase=prefill processed=\d+ total=\d+ cached=\d+ elapsed_s=[\d.]+ tok_s=\d+ eta_s=/.test(l), `line: ${l}`);
}, 30000);

await check(`${T}:dashboard_state_shows_the_running_request`, async () => {
  const ctl = new AbortController();
  const pending = fetch(S.url('/v1/chat/completions'), { method: 'POST', signal: ctl.signal, headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'qwen', messages: [{ role: 'user', content: longText() + longText() }], max_tokens: 2, stream: true }) });
  try {
    const st = async () => (await fetch(S.url('/v1/dashboard/state'))).json();
    const a = await until(async () => { const s = await st(); const r = (s.running || [])[0]; return r && r.phase === 'prefill' && r.processed > 0 ? s : null; }, 60000, 100);
    assert(a, 'the request shows up prefilling');
    await sleep(1500);
    const b = await st();
    const ra = a.running[0], rb = b.running[0];
    assert(rb, 'still running');
    eq(rb.route, '/v1/chat/completions', 'route');
    assert(ra.prompt_tokens > 9000 && rb.prompt_tokens === ra.prompt_tokens, `prompt tokens ${ra.prompt_tokens}`);
    assert(rb.processed > ra.processed, `progress moves: ${ra.processed} -> ${rb.processed}`);
    assert(rb.prefill_tok_s > 0 && rb.elapsed_ms > ra.elapsed_ms, 'live rate and time');
    assert(b.counters.engine_prefill_tokens > a.counters.engine_prefill_tokens, 'the engine counters move during the prefill');
    assert(Number.isInteger(b.queued), 'queued');
    eq(b.counters.requests, a.counters.requests, 'the request has not ended');
  } finally { ctl.abort(); await pending.catch(() => {}); }
  const idle = await until(async () => { const s = await (await fetch(S.url('/v1/dashboard/state'))).json(); return s.running.length === 0 ? s : null; }, 30000);
  assert(idle, 'gone when it ends');
}, 300000);

await S.stop();
