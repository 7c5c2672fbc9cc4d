// dashboard.mjs - the live dashboard in a real browser: a server on
// tiny-hybrid (real Qwen3 tokenizer), three agent turns and a forced miss
// (a tool description changes), then Debian's Chromium, driven by
// playwright-core, opens /dashboard and the DOM is checked against what the
// API reported: the entries table lists the stored entries with their
// lengths, each request bar shows the cached counts the API returned, the
// forced miss shows its reason, and the page logs no console error.
// Screenshots (1280 px and a phone-width window) go to out/dashboard-*.png.
// The JSON route the page reads (/v1/dashboard/state) is checked on its own
// first; with --admin-key it answers only to that key.
// Issue 35 item 5: the polls are logged at debug, not info; the first
// request on an empty cache reads as a cold start, not as an error, and a
// miss is amber, not red; the namespace row counts the rows the entries
// table lists; disk-only entries show their files' bytes, as `kvkeep cache
// ls` counts them; the key prompt asks for the key the server wants (API
// or admin); and during a long prefill (bench-hybrid) the page shows the
// request running with its progress and the prefill rate from the
// engine's live counters (screenshot out/dashboard-prefill.png).
// Run by tests/e2e/dashboard.sh; prints ok/FAIL lines.
import { existsSync, mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { createRequire } from 'node:module';
import { execFileSync } from 'node:child_process';
import { ROOT, KT_BIN, TMP, check, assert, eq, mkModel, startServer, postJSON, fail, sleep, until } from './server_util.mjs';

const T = 'dashboard';
const require = createRequire(import.meta.url);
const pwPath = join(ROOT, 'tests/node/node_modules/playwright-core');
const CHROMIUM = process.env.KVKEEP_CHROMIUM || '/usr/bin/chromium';
if (!existsSync(pwPath)) { fail(`${T}:npm`, 'tests/node/node_modules/playwright-core is missing (run make npm)'); process.exit(1); }
if (!existsSync(CHROMIUM)) { fail(`${T}:chromium`, `${CHROMIUM} is missing (apt-get install chromium)`); process.exit(1); }
const { chromium } = require(pwPath);
const launch = () => chromium.launch({
  executablePath: CHROMIUM,
  args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
    '--disable-background-networking', '--disable-component-update', '--disable-sync'],
});

const model = mkModel('tiny-hybrid', 'hybrid-dash', true);
const S = await startServer(model, ['--served-model-name', 'tiny', '--page-tokens', '16']);
const OUT = join(ROOT, 'out');
mkdirSync(OUT, { recursive: true });

const SYSTEM = 'You are a coding agent. Use the tools. '.repeat(12);
const tool = (name, description) => ({ type: 'function', function: { name, description, parameters: { type: 'object', properties: { path: { type: 'string' } } } } });
const TOOLS = [tool('read_file', 'Read a file.'), tool('list_dir', 'List a folder.')];
const messages = [{ role: 'system', content: SYSTEM }, { role: 'user', content: 'What is in src?' }];
const api = [];

async function chat(msgs, tools) {
  const r = await postJSON(S, '/v1/chat/completions', { model: 'tiny', messages: msgs, tools, max_tokens: 6, temperature: 0 });
  assert(r.status === 200, `chat status ${r.status}: ${r.text.slice(0, 200)}`);
  api.push({ prompt: r.json.usage.prompt_tokens, cached: r.json.usage.prompt_tokens_details.cached_tokens });
  return r.json;
}

await check(`${T}:three_turns_and_a_forced_miss`, async () => {
  for (let t = 0; t < 3; t++) {
    const r = await chat(messages, TOOLS);
    messages.push({ role: 'assistant', content: r.choices[0].message.content || '' });
    messages.push({ role: 'user', content: `turn ${t + 2}: go on` });
  }
  assert(api[1].cached > 0 && api[2].cached > api[1].cached, `cached grows: ${api.map((a) => a.cached)}`);
  // the same conversation with the second tool's description changed
  await chat(messages, [TOOLS[0], tool('list_dir', 'List the entries of a folder.')]);
});

let state = null;
await check(`${T}:state_route`, async () => {
  const r = await fetch(S.url('/v1/dashboard/state'));
  eq(r.status, 200, 'status');
  state = await r.json();
  eq(state.model, 'tiny', 'model');
  for (const k of ['ram_cache_bytes', 'ram_budget_bytes', 'weights_bytes', 'free_bytes', 'ram_total_bytes', 'disk_bytes', 'disk_cap_bytes'])
    assert(Number.isInteger(state.memory[k]), `memory.${k} ${state.memory[k]}`);
  assert(state.memory.ram_cache_bytes > 0 && state.memory.ram_cache_bytes <= state.memory.ram_budget_bytes, 'RAM within budget');
  eq(state.namespaces.length, 1, 'one namespace');
  eq(state.namespaces[0].name, 'default', 'namespace name');
  const info = await (await fetch(S.url('/v1/cache/info'))).json();
  const ram = state.entries.filter((e) => e.where !== 'disk');
  eq(ram.length, state.namespaces[0].entries, 'entries listed = entries counted');
  assert(ram.length > 0, 'entries stored');
  for (const e of state.entries) {
    assert(Number.isInteger(e.tokens) && e.tokens > 0, 'tokens');
    assert(e.anchor === 0 || e.anchor <= e.tokens, 'anchor inside');
    for (const c of e.checkpoints) assert(c > 0 && c <= e.tokens, 'checkpoint inside');
  }
  const longest = Math.max(...ram.map((e) => e.tokens));
  assert(longest >= api[3].prompt, `an entry covers the last prompt (${longest} >= ${api[3].prompt})`);
  eq(state.requests.length, 4, 'four requests');
  state.requests.forEach((q, i) => {
    eq(q.prompt_tokens, api[i].prompt, `request ${i} prompt tokens`);
    eq(q.cached_ram + q.cached_disk, api[i].cached, `request ${i} cached`);
    eq(q.computed, q.prompt_tokens - api[i].cached, `request ${i} computed`);
  });
  const miss = state.requests[3].miss;
  assert(miss && miss.role === 'system' && miss.tool === 1, `forced miss explained: ${JSON.stringify(miss)}`);
  assert(state.counters.prompt_tokens === api.reduce((a, b) => a + b.prompt, 0), 'counters');
  assert(typeof info === 'object', 'cache info answers');
});

await check(`${T}:browser_dom`, async () => {
  const browser = await chromium.launch({
    executablePath: CHROMIUM,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  });
  try {
    const errors = [];
    const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
    page.on('console', (m) => { if (m.type() === 'error') errors.push(m.text()); });
    page.on('pageerror', (e) => errors.push(String(e)));
    await page.goto(S.url('/dashboard'));
    await page.waitForFunction(() => document.querySelectorAll('#requests .req').length === 4, null, { timeout: 20000 });
    await page.waitForFunction(() => document.querySelectorAll('#entries tr.entry').length > 0, null, { timeout: 20000 });
    // entries: the table lists the stored entries with their lengths
    const rows = await page.$$eval('#entries tr.entry', (trs) => trs.map((t) => Number(t.dataset.tokens)).sort((a, b) => a - b));
    const want = state.entries.map((e) => e.tokens).sort((a, b) => a - b);
    eq(JSON.stringify(rows), JSON.stringify(want), 'entry lengths in the table');
    // request bars: the cached counts the API reported, oldest at the bottom
    const reqs = await page.$$eval('#requests .req', (ds) => ds.map((d) => ({
      prompt: Number(d.dataset.prompt), cached: Number(d.dataset.cachedRam) + Number(d.dataset.cachedDisk),
      computed: Number(d.dataset.computed), why: (d.querySelector('.miss-reason') || {}).textContent || '' })).reverse());
    reqs.forEach((q, i) => {
      eq(q.prompt, api[i].prompt, `bar ${i} prompt`);
      eq(q.cached, api[i].cached, `bar ${i} cached`);
      eq(q.computed, api[i].prompt - api[i].cached, `bar ${i} computed`);
    });
    assert(/message 0 \(system\), tool 1 changed/.test(reqs[3].why), `forced miss reason on the page: "${reqs[3].why}"`);
    // sorting by tokens, ascending after two clicks
    await page.click('#entries th[data-key="tokens"]');
    await page.click('#entries th[data-key="tokens"]');
    const asc = await page.$$eval('#entries tr.entry', (trs) => trs.map((t) => Number(t.dataset.tokens)));
    eq(JSON.stringify(asc), JSON.stringify([...asc].sort((a, b) => a - b)), 'sorted ascending');
    await page.waitForTimeout(1500); // a second reading draws the rate charts
    await page.screenshot({ path: join(OUT, 'dashboard-1280.png'), fullPage: true });
    await page.setViewportSize({ width: 390, height: 844 });
    await page.waitForTimeout(300);
    const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
    assert(overflow <= 1, `no horizontal page overflow at phone width (${overflow}px)`);
    await page.screenshot({ path: join(OUT, 'dashboard-390.png'), fullPage: true });
    eq(errors.length, 0, `console errors: ${errors.join(' | ')}`);
  } finally {
    await browser.close();
  }
}, 90000);

await check(`${T}:root_serves_the_page_to_browsers`, async () => {
  const html = await fetch(S.url('/'), { headers: { accept: 'text/html,application/xhtml+xml' } });
  eq(html.status, 200, 'status');
  assert((html.headers.get('content-type') || '').startsWith('text/html'), 'html');
  const j = await fetch(S.url('/'));
  assert((j.headers.get('content-type') || '').startsWith('application/json'), 'json for API clients');
});

await check(`${T}:admin_key_protects_the_state`, async () => {
  const P = await startServer(model, ['--served-model-name', 'tiny', '--admin-key', 'sekret']);
  try {
    eq((await fetch(P.url('/v1/dashboard/state'))).status, 401, 'no key');
    eq((await fetch(P.url('/v1/dashboard/state'), { headers: { authorization: 'Bearer wrong' } })).status, 401, 'wrong key');
    const ok = await fetch(P.url('/v1/dashboard/state'), { headers: { authorization: 'Bearer sekret' } });
    eq(ok.status, 200, 'admin key');
    eq((await fetch(P.url('/dashboard'))).status, 200, 'the page itself holds no data');
  } finally {
    await P.stop();
  }
});

await check(`${T}:polls_logged_at_debug`, async () => {
  // the browser above polled for several seconds: none of it at info
  const polls = S.log().split('\n').filter((l) => /event=cache\.admin route=\/v1\/dashboard\/state/.test(l));
  eq(polls.length, 0, `poll lines at info: ${polls.slice(0, 2).join(' | ')}`);
  // other admin routes still leave their line
  await fetch(S.url('/v1/cache/info'));
  assert(await until(() => /level=info event=cache\.admin route=\/v1\/cache\/info/.test(S.log()), 3000), 'cache/info logged at info');
});

await check(`${T}:cold_start_and_misses_are_not_errors_and_counts_agree`, async () => {
  const browser = await launch();
  try {
    const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
    await page.goto(S.url('/dashboard'));
    await page.waitForFunction(() => document.querySelectorAll('#requests .req').length === 4, null, { timeout: 20000 });
    const rows = await page.$$eval('#requests .req', (ds) => ds.map((d) => {
      const m = d.querySelector('.miss-reason');
      return m ? { cls: m.className, text: m.textContent, color: getComputedStyle(m).color } : null;
    }).reverse());
    const warn = await page.evaluate(() => { const e = document.createElement('span'); e.style.color = 'var(--warn)'; document.body.append(e); const c = getComputedStyle(e).color; e.remove(); return c; });
    assert(rows[0] && rows[0].cls === 'miss-reason cold' && /^cold start/.test(rows[0].text), `first request: ${JSON.stringify(rows[0])}`);
    assert(rows[3] && rows[3].cls === 'miss-reason' && rows[3].color !== warn, `a miss is not drawn as an error: ${JSON.stringify(rows[3])} vs ${warn}`);
    for (const r of rows) assert(!r || r.color !== warn, 'nothing in the error colour');
    // the namespace row counts the rows the entries table lists
    const nsCount = await page.$eval('#namespaces tbody tr[data-ns="default"] td:nth-child(2)', (td) => Number(td.textContent));
    const listed = await page.$$eval('#entries tr.entry', (trs) => trs.filter((t) => t.firstChild.textContent === 'default').length);
    eq(nsCount, listed, 'namespace entries = rows listed');
  } finally { await browser.close(); }
}, 60000);

await check(`${T}:disk_only_entries_show_their_files`, async () => {
  // a dense model: an entry's files are its manifest and its blocks (no
  // snapshots), so the page's bytes and cache ls's are the same number
  const dm = mkModel('tiny-dense', 'dense-disk', true);
  const dir = `${TMP}/disk-sizes`;
  const args = ['--served-model-name', 'tiny', '--page-tokens', '16', '--cache-dir', dir];
  let P = await startServer(dm, args);
  const r = await postJSON(P, '/v1/chat/completions', { model: 'tiny', messages: [{ role: 'user', content: 'Count the files. '.repeat(30) }], max_tokens: 4 });
  eq(r.status, 200, 'request');
  await P.stop();
  P = await startServer(dm, args);
  try {
    // the startup scan catalogs the files in the background
    assert(await until(async () => (await (await fetch(P.url('/v1/cache/info'))).json()).disk.scan_done, 20000), 'scan done');
    const st = await until(async () => { const x = await (await fetch(P.url('/v1/dashboard/state'))).json(); return x.entries.some((e) => e.where === 'disk') ? x : null; }, 10000);
    assert(st, 'a disk-only entry after the restart');
    const ls = JSON.parse(execFileSync(KT_BIN, ['cache', 'ls', '--cache-dir', dir, '--json']).toString());
    const lsEntries = ls.namespaces.flatMap((n) => n.entries);
    for (const e of st.entries.filter((x) => x.where === 'disk')) {
      const m = lsEntries.find((x) => x.tokens === e.tokens);
      assert(m, `cache ls lists the ${e.tokens}-token entry`);
      eq(e.bytes, m.bytes, `bytes of the ${e.tokens}-token entry`);
      assert(e.bytes > 16 * 1024, `more than a manifest: ${e.bytes}`);
    }
    const ns = st.namespaces[0];
    eq(ns.entries + ns.disk_only_entries, st.entries.filter((e) => e.ns === ns.name).length, 'counts agree');
  } finally { await P.stop(); }
}, 90000);

// which key the page asks for: the one the server wants
async function keyPrompt(args, key) {
  const P = await startServer(model, ['--served-model-name', 'tiny', ...args]);
  const browser = await launch();
  try {
    const page = await browser.newPage();
    const asked = [];
    page.on('dialog', (d) => { asked.push(d.message()); d.accept(key); });
    await page.goto(P.url('/dashboard'));
    await page.waitForFunction(() => window.kvkeepState && window.kvkeepState.model === 'tiny', null, { timeout: 20000 });
    return { asked, status: await page.$eval('#status', (e) => e.textContent) };
  } finally { await browser.close(); await P.stop(); }
}
await check(`${T}:key_prompt_asks_for_the_api_key`, async () => {
  const r = await keyPrompt(['--api-key', 'k-api'], 'k-api');
  eq(r.asked.length, 1, `one prompt: ${r.asked}`);
  assert(/API key \(--api-key\)/.test(r.asked[0]) && !/admin/.test(r.asked[0]), `asks for the API key: ${r.asked[0]}`);
}, 60000);
await check(`${T}:key_prompt_asks_for_the_admin_key`, async () => {
  const r = await keyPrompt(['--api-key', 'k-api', '--admin-key', 'k-admin'], 'k-admin');
  assert(r.asked.length === 1 && /admin key \(--admin-key\)/.test(r.asked[0]), `asks for the admin key: ${r.asked}`);
}, 60000);

await check(`${T}:browser_during_a_long_prefill`, async () => {
  const bm = mkModel('bench-hybrid', 'bench-dash', true);
  const P = await startServer(bm, ['--served-model-name', 'tiny', '--prefill-chunk', '64']);
  const ctl = new AbortController();
  const pending = fetch(P.url('/v1/chat/completions'), { method: 'POST', signal: ctl.signal, headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'tiny', max_tokens: 2, messages: [{ role: 'user', content: 'Explain the failing test in detail. '.repeat(900) }] }) });
  const browser = await launch();
  try {
    const errors = [];
    const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
    page.on('console', (m) => { if (m.type() === 'error') errors.push(m.text()); });
    page.on('pageerror', (e) => errors.push(String(e)));
    await page.goto(P.url('/dashboard'));
    await page.waitForSelector('#running .run[data-phase="prefill"]', { timeout: 60000 });
    const a = await page.$eval('#running .run', (d) => ({ p: Number(d.dataset.processed), n: Number(d.dataset.prompt), text: d.textContent }));
    assert(a.n > 5000 && /prefill \d+ \/ \d+ \(\d+%\), \d+ tok\/s/.test(a.text), `the running row: ${a.text}`);
    await page.waitForFunction((p0) => { const d = document.querySelector('#running .run'); return d && Number(d.dataset.processed) > p0; }, a.p, { timeout: 30000 });
    // two readings while prefilling: the prefill chart reads the engine's live counters
    await page.waitForFunction(() => {
      const t = [...document.querySelectorAll('#charts .chart')].find((c) => c.querySelector('.title span').textContent === 'prefill');
      return t && parseFloat(t.querySelector('.title span:last-child').textContent) > 0;
    }, null, { timeout: 30000 });
    assert(await page.$eval('#requests', (b) => /no request yet/.test(b.textContent)), 'the request has not ended yet');
    await page.screenshot({ path: join(OUT, 'dashboard-prefill.png'), fullPage: true });
    eq(errors.length, 0, `console errors: ${errors.join(' | ')}`);
  } finally {
    await browser.close();
    ctl.abort();
    await pending.catch(() => {});
    await P.stop();
  }
}, 180000);

await S.stop();
