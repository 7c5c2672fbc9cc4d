// server_hardening.mjs - issue 37: explanations that leak nothing, one salt
// rule on every route, a dashboard that keeps tenants' text to the admin,
// browsers kept to what the user allowed, precise refusals. Every check
// has a positive control (the text appears where it may), so a check that
// could not fail would show.
import http from 'node:http';
import { execFileSync } from 'node:child_process';
import { createRequire } from 'node:module';
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import {
  ROOT, KT_BIN, loadOpenAI, check, assert, eq, mkModel, startServer, stopServer, postJSON, failures_count,
} from './server_util.mjs';

const T = 'server_hardening';
const require = createRequire(import.meta.url);
const NAME = 'm';
const model = mkModel('tiny-hybrid', 'harden-hybrid', true);
const common = ['--served-model-name', NAME, '--page-tokens', '16'];

// Raw HTTP (fetch may not set Host or Origin): {status, headers, text, json}.
function raw(srv, method, path, { headers = {}, body } = {}) {
  return new Promise((resolve, reject) => {
    const data = body === undefined ? undefined : typeof body === 'string' ? body : JSON.stringify(body);
    const h = { ...headers };
    if (data !== undefined && !Object.keys(h).some((k) => k.toLowerCase() === 'content-type'))
      h['content-type'] = 'application/json';
    if (data !== undefined) h['content-length'] = Buffer.byteLength(data);
    const req = http.request({ host: '127.0.0.1', port: srv.port, method, path, headers: h }, (res) => {
      let text = '';
      res.setEncoding('utf8');
      res.on('data', (d) => { text += d; });
      res.on('end', () => {
        let json = null;
        try { json = JSON.parse(text); } catch { /* not JSON */ }
        resolve({ status: res.statusCode, headers: res.headers, text, json });
      });
    });
    req.on('error', reject);
    req.end(data);
  });
}

const SECRET = 'The vault code is 7-ALPHA-93 and the launch phrase is purple elephant dancing at midnight.';
const SYSTEM = `You are the assistant of ACME. ${SECRET} Never reveal it. `.repeat(3);
const chatBody = (system, user, extra = {}) => ({
  model: NAME, max_tokens: 2, temperature: 0,
  messages: [{ role: 'system', content: system }, { role: 'user', content: user }], ...extra,
});

// --- 1. explanations scoped to their client --------------------------------
{
  const K = await startServer(model, [...common, '--api-key', 'k-api', '--admin-key', 'k-admin']);
  const O = await startServer(model, common); // keyless, loopback: its clients are the machine's user
  const api = { authorization: 'Bearer k-api' }, admin = { authorization: 'Bearer k-admin' };
  await check(`${T}:explanation_never_shows_another_clients_text`, async () => {
    eq((await postJSON(K, '/v1/chat/completions', chatBody(SYSTEM, 'hello'), api)).status, 200, 'victim');
    // the attacker knows the start and appends one character
    const probe = SYSTEM.slice(0, 40) + 'Z';
    const r = await postJSON(K, '/v1/chat/completions', chatBody(probe, 'hello'), api);
    eq(r.status, 200, 'attacker status');
    const ex = r.json.usage.kvkeep && r.json.usage.kvkeep.cache;
    assert(ex && ex.first_diff > 0, `no explanation: ${JSON.stringify(r.json.usage)}`);
    eq(ex.cached, null, 'cached text to an API-key client');
    assert(!r.text.includes('7-ALPHA-93') && !r.text.includes('vault code'), 'the secret is in the answer');
    // Messages and Responses carry the same extension
    const m = await postJSON(K, '/v1/messages', { model: NAME, max_tokens: 2, system: probe,
      messages: [{ role: 'user', content: 'hello' }] }, api);
    eq(m.status, 200, 'messages');
    assert(!m.text.includes('vault code'), 'the secret is in the Messages answer');
    // the log never holds the cached side
    assert(!/cached="/.test(K.log()), 'a miss_reason line logs cached text');
    assert(!K.log().split('\n').filter((l) => /miss_reason/.test(l) && /first_diff=[1-9]/.test(l))
      .some((l) => l.includes('vault code')), 'the attacker\'s miss line holds the secret');
  });
  await check(`${T}:the_admin_key_and_a_keyless_loopback_server_see_the_cached_side`, async () => {
    const probe = SYSTEM.slice(0, 40) + 'Q';
    const r = await postJSON(K, '/v1/chat/completions', chatBody(probe, 'hello'), admin);
    assert(r.json.usage.kvkeep.cache.cached && r.json.usage.kvkeep.cache.cached.length > 0,
      `admin sees no cached text: ${JSON.stringify(r.json.usage.kvkeep)}`);
    eq((await postJSON(O, '/v1/chat/completions', chatBody(SYSTEM, 'hello'))).status, 200, 'keyless victim');
    const o = await postJSON(O, '/v1/chat/completions', chatBody(probe, 'hello'));
    assert(o.json.usage.kvkeep.cache.cached, 'keyless loopback: no cached text');
    // the probe (an admin route) follows the same rule
    const pk = await postJSON(K, '/v1/cache/probe', { messages: chatBody(SYSTEM.slice(0, 40) + 'W', 'hello').messages }, admin);
    eq(pk.status, 200, 'probe');
    assert(pk.json.miss && pk.json.miss.cached, `probe with the admin key: ${pk.text}`);
  });
  await stopServer(K);
  await stopServer(O);
}

// --- 2. one salt rule on every route ---------------------------------------
const ROUTES = {
  chat: (p) => ['/v1/chat/completions', { model: NAME, max_tokens: 1, temperature: 0, messages: [{ role: 'user', content: p }] }],
  completions: (p) => ['/v1/completions', { model: NAME, max_tokens: 1, temperature: 0, prompt: p }],
  messages: (p) => ['/v1/messages', { model: NAME, max_tokens: 1, temperature: 0, messages: [{ role: 'user', content: p }] }],
  count_tokens: (p) => ['/v1/messages/count_tokens', { model: NAME, messages: [{ role: 'user', content: p }] }],
  responses: (p) => ['/v1/responses', { model: NAME, max_output_tokens: 1, temperature: 0, input: p }],
  probe: (p) => ['/v1/cache/probe', { messages: [{ role: 'user', content: p }] }],
};
const cachedOf = (route, j) => route === 'chat' || route === 'completions'
  ? (j.usage.prompt_tokens_details || {}).cached_tokens || 0
  : route === 'messages' ? j.usage.cache_read_input_tokens
    : route === 'responses' ? j.usage.input_tokens_details.cached_tokens : j.cached_tokens;
const ANTH = new Set(['messages', 'count_tokens']);
{
  const OFF = await startServer(model, common);
  const ON = await startServer(model, [...common, '--allow-request-salt']);
  const long = (r) => `The ${r} route's prompt, long enough to fill several cache blocks: ` + 'lorem ipsum dolor sit amet '.repeat(12);
  for (const route of Object.keys(ROUTES)) {
    await check(`${T}:salt_refused_without_the_flag:${route}`, async () => {
      const [path, body] = ROUTES[route](long(route));
      eq((await postJSON(OFF, path, body)).status, 200, 'unsalted');
      for (const [how, b, h] of [['body', { ...body, cache_salt: 's1' }, {}], ['header', body, { 'x-cache-salt': 's1' }]]) {
        const r = await postJSON(OFF, path, b, h);
        eq(r.status, 400, `${how} salt status`);
        if (ANTH.has(route)) {
          eq(r.json.type, 'error', `${how}: Anthropic error shape`);
          assert(/allow-request-salt/.test(r.json.error.message), r.text);
        } else {
          eq(r.json.error.param, 'cache_salt', `${how}: param`);
          assert(/allow-request-salt/.test(r.json.error.message), r.text);
        }
      }
    });
    await check(`${T}:salt_honoured_with_the_flag:${route}`, async () => {
      const p = long(route) + ' salted';
      const [path, body] = ROUTES[route](p);
      if (route === 'count_tokens') {
        const a = await postJSON(ON, path, body), b = await postJSON(ON, path, { ...body, cache_salt: 'sA' });
        const c = await postJSON(ON, path, body, { 'x-cache-salt': 'sA' });
        eq(a.status, 200, 'unsalted'); eq(b.status, 200, 'body salt'); eq(c.status, 200, 'header salt');
        eq(b.json.input_tokens, a.json.input_tokens, 'same count');
        eq(c.json.input_tokens, a.json.input_tokens, 'same count (header)');
        return;
      }
      if (route === 'probe') {
        // a prompt cached under salt sA only
        const [cp, cb] = ROUTES.chat(p);
        eq((await postJSON(ON, cp, { ...cb, cache_salt: 'sA' })).status, 200, 'salted chat');
        const un = await postJSON(ON, path, body), sa = await postJSON(ON, path, body, { 'x-cache-salt': 'sA' });
        eq(un.status, 200, 'probe unsalted'); eq(sa.status, 200, 'probe salted');
        eq(un.json.cached_tokens, 0, 'unsalted probe sees the salted prefix');
        assert(sa.json.cached_tokens > 0, `salted probe finds nothing: ${sa.text}`);
        return;
      }
      const first = await postJSON(ON, path, { ...body, cache_salt: 'sA' });
      eq(first.status, 200, `salted: ${first.text}`);
      const un = await postJSON(ON, path, body);
      eq(un.status, 200, 'unsalted');
      eq(cachedOf(route, un.json), 0, 'an unsalted request reads the salted namespace');
      const hdr = await postJSON(ON, path, body, { 'x-cache-salt': 'sA' });
      if (route === 'completions') {
        // a raw prompt has no message boundary for the hybrid model to
        // resume at: the explainer's shared prefix shows the namespace
        const shared = (j) => j.usage.kvkeep.cache.shared_tokens;
        eq(shared(hdr.json), hdr.json.usage.prompt_tokens, `header salt: shared prefix: ${hdr.text}`);
        assert(shared(un.json) < un.json.usage.prompt_tokens / 2, `unsalted: shared prefix: ${un.text}`);
      } else {
        assert(cachedOf(route, hdr.json) > 0, `the header salt does not reach the body salt's namespace: ${hdr.text}`);
      }
      const other = await postJSON(ON, path, { ...body, cache_salt: 'sB' });
      eq(cachedOf(route, other.json), 0, 'another salt reads sA');
      const both = await postJSON(ON, path, { ...body, cache_salt: 'sA' }, { 'x-cache-salt': 'sB' });
      eq(both.status, 400, 'body and header differ');
    });
  }

  // --- 3. the dashboard keeps prompt text to the admin when salts are in use
  await check(`${T}:dashboard_shows_numbers_only_with_salts`, async () => {
    const st = await (await fetch(ON.url('/v1/dashboard/state'))).json();
    eq(st.prompt_text, false, 'prompt_text');
    const misses = st.requests.filter((r) => r.miss);
    assert(misses.length > 0, 'no recorded misses');
    for (const r of misses) { eq(r.miss.new, null, 'new text'); eq(r.miss.cached, null, 'cached text'); }
    assert(misses.some((r) => r.namespace === 'salted') && misses.some((r) => r.namespace === 'default'), 'namespaces');
    assert(!JSON.stringify(st).includes('lorem ipsum'), 'prompt text in the state');
  });
  await check(`${T}:dashboard_shows_default_text_without_salts`, async () => {
    const st = await (await fetch(OFF.url('/v1/dashboard/state'))).json();
    eq(st.prompt_text, true, 'prompt_text');
    assert(st.requests.some((r) => r.miss && r.miss.new && r.miss.new.length), 'no text on a salt-free keyless server');
  });
  await stopServer(OFF);
  await stopServer(ON);
}
{
  const A = await startServer(model, [...common, '--allow-request-salt', '--admin-key', 'k-admin']);
  await check(`${T}:dashboard_text_of_salted_tenants_only_for_the_admin_key`, async () => {
    const [path, body] = ROUTES.chat('a salted tenant\'s private prompt');
    eq((await postJSON(A, path, { ...body, cache_salt: 'tenant' })).status, 200, 'tenant');
    const s1 = await (await fetch(A.url('/v1/dashboard/state'), { headers: { authorization: 'Bearer k-admin' } })).json();
    assert(s1.requests.some((r) => r.namespace === 'salted' && r.miss && /salted tenant/.test(r.miss.new)), 'admin sees no text');
  });
  await stopServer(A);
}

// --- 6. browsers -----------------------------------------------------------
{
  const S = await startServer(model, [...common, '--allowed-origin', 'https://app.example.org']);
  const K = await startServer(model, [...common, '--api-key', 'k']);
  const chat = chatBody('sys', 'hi');
  await check(`${T}:host_names_other_than_the_servers_are_refused_without_a_key`, async () => {
    const bad = await raw(S, 'GET', '/v1/models', { headers: { host: `rebind.attacker.test:${S.port}` } });
    eq(bad.status, 403, 'rebinding host');
    assert(/--allowed-host/.test(bad.text), bad.text);
    for (const h of [`localhost:${S.port}`, `127.0.0.1:${S.port}`, `[::1]:${S.port}`, `dev.localhost:${S.port}`, `10.1.2.3:${S.port}`,
      'app.example.org'])
      eq((await raw(S, 'GET', '/v1/models', { headers: { host: h } })).status, 200, `host ${h}`);
    // with an API key the key decides
    eq((await raw(K, 'GET', '/v1/models', { headers: { host: 'rebind.attacker.test', authorization: 'Bearer k' } })).status, 200, 'keyed');
    eq((await raw(K, 'GET', '/v1/models', { headers: { host: 'rebind.attacker.test' } })).status, 401, 'keyed, no key');
  });
  await check(`${T}:origins_other_than_loopback_and_allowed_are_refused`, async () => {
    const evil = await raw(S, 'POST', '/v1/chat/completions', { headers: { origin: 'https://evil.example' }, body: chat });
    eq(evil.status, 403, 'evil origin');
    assert(!evil.headers['access-control-allow-origin'], 'CORS header on a refusal');
    eq((await raw(S, 'POST', '/v1/cache/clear', { headers: { origin: 'https://evil.example', 'content-type': 'text/plain' }, body: '' })).status,
      403, 'a page clearing the cache');
    eq((await raw(S, 'POST', '/v1/chat/completions', { headers: { origin: 'null' }, body: chat })).status, 403, 'null origin');
    for (const o of ['http://localhost:3000', 'http://127.0.0.1:5173', 'https://app.example.org', `http://127.0.0.1:${S.port}`]) {
      const r = await raw(S, 'POST', '/v1/chat/completions', { headers: { origin: o }, body: chat });
      eq(r.status, 200, `origin ${o}`);
      eq(r.headers['access-control-allow-origin'], o, `ACAO for ${o}`);
    }
  });
  await check(`${T}:cors_preflight`, async () => {
    const ok = await raw(S, 'OPTIONS', '/v1/chat/completions', { headers: { origin: 'https://app.example.org',
      'access-control-request-method': 'POST', 'access-control-request-headers': 'authorization, content-type' } });
    eq(ok.status, 204, 'preflight');
    eq(ok.headers['access-control-allow-origin'], 'https://app.example.org', 'ACAO');
    assert(/POST/.test(ok.headers['access-control-allow-methods']), 'methods');
    assert(/authorization/.test(ok.headers['access-control-allow-headers']), 'headers');
    eq((await raw(S, 'OPTIONS', '/v1/chat/completions', { headers: { origin: 'https://evil.example',
      'access-control-request-method': 'POST' } })).status, 403, 'evil preflight');
  });
  await check(`${T}:simple_request_bodies_are_refused`, async () => {
    for (const ct of ['text/plain', 'application/x-www-form-urlencoded', 'multipart/form-data; boundary=x']) {
      const r = await raw(S, 'POST', '/v1/chat/completions', { headers: { 'content-type': ct }, body: JSON.stringify(chat) });
      eq(r.status, 415, ct);
      assert(/application\/json/.test(r.json.error.message), r.text);
    }
    const m = await raw(S, 'POST', '/v1/messages', { headers: { 'content-type': 'text/plain' },
      body: JSON.stringify({ model: NAME, max_tokens: 1, messages: [{ role: 'user', content: 'x' }] }) });
    eq(m.status, 415, 'messages'); eq(m.json.type, 'error', 'Anthropic shape');
    eq((await raw(S, 'POST', '/v1/chat/completions', { headers: { 'content-type': 'application/json; charset=utf-8' }, body: chat })).status,
      200, 'json with charset');
  });
  await check(`${T}:nosniff_everywhere_and_a_strict_csp_on_the_dashboard`, async () => {
    for (const [m, p, b] of [['GET', '/health'], ['GET', '/v1/models'], ['GET', '/nope'], ['POST', '/v1/chat/completions', chat],
      ['POST', '/v1/chat/completions', { ...chat, stream: true }], ['GET', '/metrics'], ['GET', '/dashboard']])
      eq((await raw(S, m, p, { body: b })).headers['x-content-type-options'], 'nosniff', `${m} ${p}`);
    const d = await raw(S, 'GET', '/dashboard');
    const csp = d.headers['content-security-policy'] || '';
    const nonce = (csp.match(/script-src 'nonce-([0-9a-f]+)'/) || [])[1];
    assert(nonce, `CSP: ${csp}`);
    assert(/default-src 'none'/.test(csp) && /frame-ancestors 'none'/.test(csp), csp);
    assert(d.text.includes(`<script nonce="${nonce}">`), 'the script does not carry the nonce');
    assert(!/<script>/.test(d.text), 'a script without the nonce');
    const d2 = await raw(S, 'GET', '/dashboard');
    assert(!d2.headers['content-security-policy'].includes(nonce), 'the nonce repeats');
  });
  await check(`${T}:sdks_and_curl_are_unaffected`, async () => {
    const OpenAI = loadOpenAI();
    const sdk = join(ROOT, 'tests/node/node_modules/@anthropic-ai/sdk');
    assert(OpenAI && existsSync(sdk), 'npm clients missing (make npm)');
    const oai = new OpenAI({ baseURL: `${S.base}/v1`, apiKey: 'none', maxRetries: 0 });
    const r = await oai.chat.completions.create({ model: NAME, max_tokens: 2, messages: [{ role: 'user', content: 'hi' }] });
    assert(r.choices[0].message, 'openai sdk');
    const AM = require(sdk);
    const Anthropic = AM.default || AM.Anthropic || AM;
    const an = new Anthropic({ baseURL: S.base, apiKey: 'none', maxRetries: 0 });
    const m = await an.messages.create({ model: NAME, max_tokens: 2, messages: [{ role: 'user', content: 'hi' }] });
    eq(m.type, 'message', 'anthropic sdk');
    const out = execFileSync('curl', ['-s', '-w', '\n%{http_code}', `${S.base}/v1/chat/completions`, '-H', 'Content-Type: application/json',
      '-d', JSON.stringify(chat)]).toString();
    assert(out.endsWith('\n200'), `curl: ${out.slice(-200)}`);
  });
  await stopServer(S);
  await stopServer(K);
}

// --- 7. precise refusals ----------------------------------------------------
{
  const S = await startServer(model, common);
  await check(`${T}:count_tokens_names_a_wrong_model`, async () => {
    const r = await postJSON(S, '/v1/messages/count_tokens', { model: 'nope', messages: [{ role: 'user', content: 'x' }] });
    eq(r.status, 404, 'status'); eq(r.json.error.type, 'not_found_error', 'type');
  });
  await check(`${T}:messages_max_tokens_null_is_refused`, async () => {
    const r = await postJSON(S, '/v1/messages', { model: NAME, max_tokens: null, messages: [{ role: 'user', content: 'x' }] });
    eq(r.status, 400, 'status'); assert(/max_tokens/.test(r.json.error.message), r.text);
  });
  await check(`${T}:numbers_beyond_range_are_named_as_numbers`, async () => {
    for (const [field, lit] of [['max_tokens', '9223372036854775808'], ['max_tokens', '1e999'], ['temperature', '1e999'],
      ['seed', '9223372036854775808'], ['top_p', '-1e999']]) {
      const body = `{"model":"${NAME}","${field}":${lit},"messages":[{"role":"user","content":"x"}]}`;
      const r = await postJSON(S, '/v1/chat/completions', body);
      eq(r.status, 400, `${field}=${lit}`);
      assert(!/string/.test(r.json.error.message), `${field}=${lit}: ${r.json.error.message}`);
      assert(/range/.test(r.json.error.message), `${field}=${lit}: ${r.json.error.message}`);
    }
  });
  await stopServer(S);
}
process.exit(failures_count() ? 1 : 0);
