// replay_fake_server.js - a tiny OpenAI-compatible chat server for the
// `kvkeep bench replay` tests (a fixture, not a test: run.sh runs *.sh only).
//
//   node tests/e2e/replay_fake_server.js --port P [--state FILE]
//        [--disable-prefix-cache] [--dump DIR] [--delay-ms MS]
//
// GET /v1/cache/info also says how many chat requests it answered at once
// at most (max_in_flight), for the --concurrency test.
// It answers GET /health, GET /v1/cache/info and POST /v1/chat/completions
// (streaming only). "Tokens" are 4-byte slices of the JSON of the messages
// and tools, so a request that extends an earlier one shares a prefix; the
// cached count is the longest prefix shared with any earlier prompt, which
// is how a prefix cache answers. With --state FILE the prompts seen are
// saved at SIGTERM and loaded at start (a stand-in for a disk tier, shown
// as cache_info.disk_tier = true). It checks what the replayer must set
// (stream, stream_options.include_usage, temperature 0, max_tokens cap) and
// answers 400 when the body is wrong or has a message with an unknown role
// (the "body the server rejects" case). With --dump DIR every accepted body
// is written to DIR/N.json so tests can compare it with the trace.
'use strict';
const http = require('http');
const fs = require('fs');

const args = process.argv.slice(2);
const opt = { port: 0, state: null, nocache: false, dump: null, delay: 0 };
for (let i = 0; i < args.length; i++) {
  const a = args[i];
  if (a === '--port') opt.port = Number(args[++i]);
  else if (a === '--state') opt.state = args[++i];
  else if (a === '--disable-prefix-cache') opt.nocache = true;
  else if (a === '--dump') opt.dump = args[++i];
  else if (a === '--delay-ms') opt.delay = Number(args[++i]);
  else { console.error(`fake server: unknown argument ${a}`); process.exit(2); }
}

let prompts = [];
if (opt.state && fs.existsSync(opt.state)) prompts = JSON.parse(fs.readFileSync(opt.state, 'utf8'));
let nreq = 0;
let inflight = 0, maxInflight = 0; // chat requests being answered now / at most at once

function tokens(body) {
  const s = JSON.stringify([body.tools || null, body.messages]);
  // a request's rendering ends with the open assistant turn; drop the
  // closing "]]" so that an extended history shares everything before it
  const core = s.slice(0, s.length - 2);
  const t = [];
  for (let i = 0; i < core.length; i += 4) t.push(core.slice(i, i + 4));
  return t;
}

function lcp(a, b) {
  let i = 0;
  while (i < a.length && i < b.length && a[i] === b[i]) i++;
  return i;
}

function reject(res, code, msg) {
  res.writeHead(code, { 'Content-Type': 'application/json' });
  res.end(JSON.stringify({ error: { message: msg, type: 'invalid_request_error' } }));
}

const server = http.createServer((req, res) => {
  if (req.method === 'GET' && req.url === '/health') {
    res.writeHead(200, { 'Content-Type': 'application/json' });
    return res.end('{"status":"ok"}');
  }
  if (req.method === 'GET' && req.url === '/v1/cache/info') {
    res.writeHead(200, { 'Content-Type': 'application/json' });
    return res.end(JSON.stringify({ fake: true, disk_tier: !!opt.state && !opt.nocache, entries: prompts.length,
      max_in_flight: maxInflight }));
  }
  if (req.method !== 'POST' || req.url !== '/v1/chat/completions') return reject(res, 404, 'no such route');
  const chunks = [];
  req.on('data', (c) => chunks.push(c));
  req.on('end', () => {
    let body;
    try { body = JSON.parse(Buffer.concat(chunks).toString('utf8')); } catch (e) { return reject(res, 400, 'body is not JSON'); }
    if (!Array.isArray(body.messages)) return reject(res, 400, "'messages' must be an array");
    for (const m of body.messages)
      if (!['system', 'user', 'assistant', 'tool', 'developer'].includes(m.role)) return reject(res, 400, `unknown role '${m.role}'`);
    if (body.stream !== true) return reject(res, 400, 'the replayer must stream');
    if (!body.stream_options || body.stream_options.include_usage !== true) return reject(res, 400, 'include_usage not set');
    if (body.temperature !== 0) return reject(res, 400, 'temperature must be 0');
    if (!(body.max_tokens >= 1 && body.max_tokens <= 16)) return reject(res, 400, 'max_tokens not capped');
    nreq++;
    if (opt.dump) fs.writeFileSync(`${opt.dump}/${nreq}.json`, JSON.stringify(body));
    const t = tokens(body);
    let cached = 0;
    if (!opt.nocache) for (const p of prompts) cached = Math.max(cached, lcp(p, t));
    if (cached >= t.length) cached = t.length - 1; // one token is always computed
    if (!opt.nocache) prompts.push(t);
    const id = `chatcmpl-fake${nreq}`;
    const send = (o) => res.write(`data: ${JSON.stringify(o)}\n\n`);
    res.writeHead(200, { 'Content-Type': 'text/event-stream', 'Cache-Control': 'no-cache' });
    const n = Math.min(body.max_tokens, 3);
    inflight++;
    maxInflight = Math.max(maxInflight, inflight);
    setTimeout(() => {
      inflight--;
      send({ id, object: 'chat.completion.chunk', choices: [{ index: 0, delta: { role: 'assistant', content: '' }, finish_reason: null }], usage: null });
      for (let k = 0; k < n; k++)
        send({ id, object: 'chat.completion.chunk', choices: [{ index: 0, delta: { content: `tok${k} ` }, finish_reason: null }], usage: null });
      send({ id, object: 'chat.completion.chunk', choices: [{ index: 0, delta: {}, finish_reason: 'length' }], usage: null });
      // a comment line and a CRLF-terminated event exercise the SSE parser
      res.write(': keep-alive\r\n\r\n');
      send({ id, object: 'chat.completion.chunk', choices: [], usage: { prompt_tokens: t.length, completion_tokens: n, total_tokens: t.length + n, prompt_tokens_details: { cached_tokens: cached } } });
      res.end('data: [DONE]\n\n');
    }, opt.delay);
  });
});

process.on('SIGTERM', () => {
  if (opt.state && !opt.nocache) fs.writeFileSync(opt.state, JSON.stringify(prompts));
  server.close();
  process.exit(0);
});
server.listen(opt.port, '127.0.0.1');
