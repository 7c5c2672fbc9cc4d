// server_robust.mjs - robustness of `kvkeep serve` on loopback, every step
// bounded in time (the whole script takes well under a minute):
//   - a body over the limit gets 413 before it is read whole (the client
//     sends only the head and reads the answer);
//   - malformed, deeply nested and wrongly typed JSON get 400;
//   - a client sending its head one byte per 500 ms is closed by the head
//     timeout while another client keeps being served;
//   - a client that disconnects mid-stream stops its generation within a
//     step and its KV pages are released (seen in /metrics);
//   - 200 connections opened at once do not stop the server from serving;
//   - the server is still healthy at the end and exits cleanly on SIGTERM.
// Run by tests/e2e/server_robust.sh; prints ok/FAIL lines.
import net from 'node:net';
import {
  check, assert, eq, mkModel, startServer, metrics, postJSON, sleep, until, fail,
} from './server_util.mjs';

const T = 'server_robust';
const model = mkModel('tiny-dense', 'dense-synth', false);
const NAME = 'tiny';
// no prefix cache: after a request ends no page may stay referenced
// two requests generate together (batched): a third one queues
const RUNNING = 2;
const S = await startServer(model, ['--served-model-name', NAME, '--max-body-mb', '1', '--header-timeout-ms', '2000',
  '--disable-prefix-cache', '--max-running', String(RUNNING)]);

// Raw socket helper: connect, optionally write, collect what comes back.
function raw(port) {
  return new Promise((resolve, reject) => {
    const s = net.connect({ host: '127.0.0.1', port }, () => resolve(s));
    s.on('error', reject);
  });
}
function readAll(sock, ms) {
  return new Promise((resolve) => {
    let buf = '';
    let closed = false;
    const t = setTimeout(() => resolve({ buf, closed }), ms);
    sock.on('data', (d) => { buf += d.toString(); });
    sock.on('close', () => { closed = true; clearTimeout(t); resolve({ buf, closed }); });
    sock.on('error', () => { /* a reset counts as closed */ });
  });
}

await check(`${T}:413_before_body_is_read`, async () => {
  const s = await raw(S.port);
  const t0 = Date.now();
  s.write('POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n' +
    `Content-Length: ${50 * 1024 * 1024}\r\n\r\n{"model": "tiny", "messages": [`);
  const { buf, closed } = await readAll(s, 5000);
  assert(/^HTTP\/1\.1 413/.test(buf), `answer: ${buf.slice(0, 60)}`);
  assert(buf.includes('request_too_large'), 'JSON error body');
  assert(closed, 'connection closed after the 413');
  assert(Date.now() - t0 < 3000, 'answered without waiting for 50 MB');
  s.destroy();
});

await check(`${T}:bad_json_400`, async () => {
  const cases = [
    '{"model": "tiny", "messages": [{"role": "user", "content": "x"}',   // truncated
    '{"model": "tiny", "messages": [{"role": "user", "content": "x"}]} trailing',
    '\u0000\u0001garbage',
    '['.repeat(100000) + ']'.repeat(100000),                              // deeply nested
    '{"a":'.repeat(3000) + '1' + '}'.repeat(3000),
    JSON.stringify({ model: NAME, messages: [{ role: 'user', content: { text: 'x' } }] }),
    JSON.stringify({ model: NAME, messages: [{ role: 7, content: 'x' }] }),
    JSON.stringify({ model: NAME, messages: [{ role: 'user', content: 'x' }], max_tokens: [5] }),
    JSON.stringify({ model: NAME, messages: [{ role: 'user', content: 'x' }], stop: { a: 1 } }),
    JSON.stringify({ model: NAME, messages: [{ role: 'user', content: 'x' }], tools: 'all' }),
    JSON.stringify({ model: NAME, messages: [{ role: 'tool', content: 'x' }] }),
  ];
  for (const body of cases) {
    const t0 = Date.now();
    const r = await postJSON(S, '/v1/chat/completions', body);
    eq(r.status, 400, `body ${JSON.stringify(body.slice(0, 40))}`);
    assert(r.json && r.json.error && r.json.error.type === 'invalid_request_error', 'error object');
    assert(Date.now() - t0 < 2000, 'quick');
  }
});

await check(`${T}:slow_head_closed_while_others_served`, async () => {
  const m0 = await metrics(S);
  const s = await raw(S.port);
  const head = 'GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ' + 'a'.repeat(60) + '\r\n\r\n';
  let closedAt = -1;
  const t0 = Date.now();
  s.on('close', () => { if (closedAt < 0) closedAt = Date.now() - t0; });
  s.on('error', () => { /* reset */ });
  let served = 0;
  const other = (async () => {
    while (closedAt < 0 && Date.now() - t0 < 8000) {
      const r = await fetch(S.url('/health'));
      if (r.status === 200) served++;
      await sleep(200);
    }
  })();
  for (let i = 0; i < head.length && closedAt < 0; i++) {
    s.write(head[i]);
    await sleep(500);
  }
  await other;
  assert(closedAt >= 1500 && closedAt < 4000, `slow client closed at ${closedAt} ms (timeout 2000 ms)`);
  assert(served >= 5, `other client served ${served} times meanwhile`);
  const m1 = await metrics(S);
  assert(m1.get('kvkeep_http_header_timeouts_total') > (m0.get('kvkeep_http_header_timeouts_total') || 0), 'timeout counted');
  s.destroy();
});

await check(`${T}:disconnect_stops_generation_and_frees_pages`, async () => {
  const m0 = await metrics(S);
  const ctl = new AbortController();
  const res = await fetch(S.url('/v1/chat/completions'), {
    method: 'POST', signal: ctl.signal, headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: NAME, messages: [{ role: 'user', content: 'tell a long story' }], max_tokens: 20000, ignore_eos: true, stream: true }),
  });
  eq(res.status, 200, 'stream');
  const reader = res.body.getReader();
  for (let i = 0; i < 5; i++) await reader.read();
  const during = await metrics(S);
  assert(during.get('kvkeep_requests_running') === 1, 'generation running');
  assert(during.get('kvkeep_kv_pages_in_use') > 0, 'pages held while generating');
  ctl.abort();
  const t0 = Date.now();
  const after = await until(async () => {
    const m = await metrics(S);
    return m.get('kvkeep_requests_running') === 0 && m.get('kvkeep_kv_pages_in_use') === 0 ? m : null;
  }, 3000, 20);
  assert(after, 'generation still running or pages still held 3 s after the disconnect');
  assert(after.get('kvkeep_requests_cancelled_total') > (m0.get('kvkeep_requests_cancelled_total') || 0), 'cancel counted');
  const gen = after.get('kvkeep_generation_tokens_total') - (m0.get('kvkeep_generation_tokens_total') || 0);
  assert(gen < 20000, `generated ${gen} tokens: it did not stop`);
  // nothing moves any more
  await sleep(300);
  const later = await metrics(S);
  eq(later.get('kvkeep_generation_tokens_total'), after.get('kvkeep_generation_tokens_total'), 'no tokens after the stop');
  console.error(`# disconnect noticed and pages freed after ${Date.now() - t0} ms (${gen} tokens generated)`);
});

await check(`${T}:queued_request_cancelled_by_disconnect`, async () => {
  const m0 = await metrics(S);
  // RUNNING long streams fill every running slot
  const longs = [];
  for (let i = 0; i < RUNNING; i++) {
    const ctl = new AbortController();
    const res = await fetch(S.url('/v1/chat/completions'), {
      method: 'POST', signal: ctl.signal, headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: NAME, messages: [{ role: 'user', content: `long ${i}` }], max_tokens: 20000, ignore_eos: true, stream: true }),
    });
    const reader = res.body.getReader();
    await reader.read();
    longs.push({ ctl, reader });
  }
  // one more request waits in the queue behind them; its client gives up
  const qCtl = new AbortController();
  const queued = fetch(S.url('/v1/chat/completions'), {
    method: 'POST', signal: qCtl.signal, headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: NAME, messages: [{ role: 'user', content: 'short' }], max_tokens: 5 }),
  }).catch(() => null);
  const waiting = await until(async () => (await metrics(S)).get('kvkeep_requests_waiting') === 1, 3000, 20);
  assert(waiting, 'the request did not queue');
  qCtl.abort();
  await queued;
  const gone = await until(async () => {
    const m = await metrics(S);
    return m.get('kvkeep_requests_waiting') === 0 && m.get('kvkeep_requests_running') === RUNNING ? m : null;
  }, 3000, 20);
  assert(gone, 'the queued request was not removed while the others still run');
  assert(gone.get('kvkeep_requests_cancelled_total') > (m0.get('kvkeep_requests_cancelled_total') || 0), 'counted');
  for (const l of longs) l.ctl.abort();
  const idle = await until(async () => {
    const m = await metrics(S);
    return m.get('kvkeep_requests_running') === 0 && m.get('kvkeep_kv_pages_in_use') === 0;
  }, 3000, 20);
  assert(idle, 'the running requests did not stop');
  // the queued one never ran: only the long ones reached the engine
  const m1 = await metrics(S);
  const runs = (k) => ['miss', 'hit', 'snap', 'anchor'].reduce((a, x) => a + (k.get(`kvkeep_resume_total{kind="${x}"}`) || 0), 0);
  eq(runs(m1) - runs(m0), RUNNING, 'engine runs');
});

await check(`${T}:two_hundred_connections_at_once`, async () => {
  const socks = await Promise.all(Array.from({ length: 200 }, () => raw(S.port)));
  for (const s of socks) s.on('error', () => {});
  const t0 = Date.now();
  const h = await fetch(S.url('/health'));
  eq(h.status, 200, 'health with 200 idle connections open');
  const r = await postJSON(S, '/v1/chat/completions', { model: NAME, messages: [{ role: 'user', content: 'hi' }], max_tokens: 3 });
  eq(r.status, 200, 'chat with 200 idle connections open');
  assert(Date.now() - t0 < 5000, 'served promptly');
  // the server accepts the backlog one by one: all 200 are its own within seconds
  const m = await until(async () => {
    const x = await metrics(S);
    return x.get('kvkeep_http_connections') >= 200 ? x : null;
  }, 5000, 50);
  assert(m, 'the server did not take all 200 connections');
  for (const s of socks) s.destroy();
});

await check(`${T}:still_healthy_and_clean_exit`, async () => {
  const h = await fetch(S.url('/health'));
  eq(h.status, 200, 'health');
  const st = await S.stop('SIGTERM', 8000);
  eq(st.code, 0, 'exit status');
});

process.exit(0);
