// server_batch.mjs - continuous batching end to end: concurrent requests
// give exactly what they give one at a time, a short request is not stuck
// behind a long prefill, a client that does not read stalls only itself,
// two requests on one long prefix prefill it once, clients leaving at
// random moments under load free every page, SIGTERM answers every
// queued request with 503 + Retry-After, cache salts are byte strings.
import {
  check, assert, eq, mkModel, startServer, metrics, postJSON, sleep, until, failures_count,
} from './server_util.mjs';

const T = 'server_batch';
const NAME = 'tiny';
const model = mkModel('tiny-dense', 'dense-batch', false);
const hyb = mkModel('tiny-hybrid', 'hybrid-batch', false);

// One streaming request; returns its tokens' logprobs entries and text.
async function stream(S, body) {
  const r = await fetch(S.url('/v1/chat/completions'), {
    method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: NAME, stream: true, ...body }),
  });
  eq(r.status, 200, 'stream status');
  const text = await r.text();
  const lps = [];
  let content = '';
  for (const line of text.split('\n')) {
    if (!line.startsWith('data: ') || line === 'data: [DONE]') continue;
    const j = JSON.parse(line.slice(6));
    if (j.error) throw new Error(`stream error ${JSON.stringify(j.error)}`);
    const ch = j.choices && j.choices[0];
    if (!ch) continue;
    if (ch.delta && ch.delta.content) content += ch.delta.content;
    if (ch.logprobs && ch.logprobs.content) lps.push(...ch.logprobs.content);
  }
  return { content, lps };
}

const SYS = 'You are a careful agent. '.repeat(40);
const reqs = Array.from({ length: 8 }, (_, i) => ({
  messages: [{ role: 'system', content: SYS }, { role: 'user', content: `task number ${i}: ${'abc '.repeat(i * 3)}` }],
  max_tokens: 24, temperature: 0, logprobs: true, top_logprobs: 3, ignore_eos: true,
}));

for (const [label, m, extra] of [['dense_cache', model, []], ['dense_nocache', model, ['--disable-prefix-cache']],
  ['hybrid_cache', hyb, []]]) {
  await check(`${T}:eight_concurrent_equal_one_at_a_time_${label}`, async () => {
    // one at a time on a server of its own, then all 8 at once on another
    const A = await startServer(m, ['--served-model-name', NAME, '--max-running', '1', ...extra]);
    const seq = [];
    try { for (const r of reqs) seq.push(await stream(A, r)); } finally { await A.stop(); }
    const B = await startServer(m, ['--served-model-name', NAME, '--max-running', '8', ...extra]);
    try {
      const par = await Promise.all(reqs.map((r) => stream(B, r)));
      for (let i = 0; i < reqs.length; i++) {
        eq(par[i].lps.length, 24, `request ${i} tokens`);
        eq(JSON.stringify(par[i].lps), JSON.stringify(seq[i].lps), `request ${i}: tokens and top_logprobs`);
        eq(par[i].content, seq[i].content, `request ${i}: content`);
      }
      const mm = await metrics(B);
      assert(mm.get('kvkeep_engine_batch_size_max') >= 2, `batches of more than one sequence ran (max ${mm.get('kvkeep_engine_batch_size_max')})`);
      assert(mm.get('kvkeep_engine_steps_total') > 0, 'steps counted');
      eq(mm.get('kvkeep_kv_pages_in_use') || 0, label === 'dense_nocache' ? 0 : mm.get('kvkeep_kv_pages_in_use'), 'pages');
    } finally { await B.stop(); }
  }, 120000);
}

await check(`${T}:short_request_first_token_during_long_prefill`, async () => {
  // small chunks make the long cold prefill many steps long
  const S = await startServer(model, ['--served-model-name', NAME, '--prefill-chunk', '32', '--disable-prefix-cache']);
  try {
    const long = { messages: [{ role: 'user', content: 'lorem ipsum dolor '.repeat(300) }], max_tokens: 1 };
    const t0 = Date.now();
    let longDone = 0;
    const pl = postJSON(S, '/v1/chat/completions', { model: NAME, ...long }).then((r) => { longDone = Date.now(); return r; });
    // the short one is sent once the long prefill is under way
    await until(async () => (await metrics(S)).get('kvkeep_requests_running') === 1, 5000, 5);
    const r = await fetch(S.url('/v1/chat/completions'), {
      method: 'POST', headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: NAME, stream: true, messages: [{ role: 'user', content: 'hi' }], max_tokens: 2 }),
    });
    const reader = r.body.getReader();
    let first = 0, buf = '';
    while (!first) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += new TextDecoder().decode(value);
      if (/"content":"[^"]/.test(buf) || /"logprobs"|finish_reason":"length/.test(buf)) first = Date.now();
    }
    while (!(await reader.read()).done) { /* drain */ }
    const lr = await pl;
    eq(lr.status, 200, 'long request');
    assert(lr.json.usage.prompt_tokens > 1200, `long prompt ${lr.json.usage.prompt_tokens} tokens`);
    assert(first && first < longDone, `short request's first token (${first - t0} ms) came before the long prefill ended (${longDone - t0} ms)`);
  } finally { await S.stop(); }
}, 120000);

await check(`${T}:non_reading_client_stalls_only_itself`, async () => {
  const S = await startServer(model, ['--served-model-name', NAME, '--disable-prefix-cache']);
  try {
    // a stream with logprobs (big chunks) that is never read
    const ctl = new AbortController();
    const res = await fetch(S.url('/v1/chat/completions'), {
      method: 'POST', signal: ctl.signal, headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: NAME, stream: true, messages: [{ role: 'user', content: 'go' }], max_tokens: 60000,
        ignore_eos: true, logprobs: true, top_logprobs: 20 }),
    });
    eq(res.status, 200, 'stream started');
    // wait until it stops making progress: its buffers are full
    let prev = -1, same = 0;
    const stalled = await until(async () => {
      const g = (await metrics(S)).get('kvkeep_generation_tokens_total') || 0;
      const away = (await metrics(S)).get('kvkeep_engine_sequences_away');
      same = g === prev ? same + 1 : 0;
      prev = g;
      return away === 1 ? true : null;
    }, 60000, 100);
    assert(stalled, 'the unread stream never filled its buffer');
    // another request runs at full speed beside it
    const t0 = Date.now();
    const r = await postJSON(S, '/v1/chat/completions', { model: NAME, messages: [{ role: 'user', content: 'x' }], max_tokens: 50, ignore_eos: true });
    eq(r.status, 200, 'the other request');
    eq(r.json.usage.completion_tokens, 50, 'completion tokens');
    const ms = Date.now() - t0;
    assert(ms < 10000, `the other request took ${ms} ms`);
    ctl.abort();
    const idle = await until(async () => {
      const m = await metrics(S);
      return m.get('kvkeep_requests_running') === 0 && m.get('kvkeep_kv_pages_in_use') === 0;
    }, 5000, 20);
    assert(idle, 'the stalled request did not end when its client left');
  } finally { await S.stop(); }
}, 120000);

for (const [label, m] of [['hybrid', hyb], ['dense', model]]) {
await check(`${T}:shared_prefix_submitted_together_prefilled_once_${label}`, async () => {
  const S = await startServer(m, ['--served-model-name', NAME, '--prefill-chunk', '64']);
  try {
    const sys = 'Shared agent system prompt with tools. '.repeat(120);
    const mk = (u) => ({ model: NAME, messages: [{ role: 'system', content: sys }, { role: 'user', content: u }], max_tokens: 2 });
    const [a, b] = await Promise.all([postJSON(S, '/v1/chat/completions', mk('first agent')),
      postJSON(S, '/v1/chat/completions', mk('second agent'))]);
    eq(a.status, 200, 'a');
    eq(b.status, 200, 'b');
    const cached = Math.max(a.json.usage.prompt_tokens_details.cached_tokens, b.json.usage.prompt_tokens_details.cached_tokens);
    assert(a.json.usage.prompt_tokens > 1000, `prompt ${a.json.usage.prompt_tokens}`);
    assert(cached > 1000, `the second request resumed from the first one's prefix (cached ${cached})`);
    const m = await metrics(S);
    assert(m.get('kvkeep_engine_prefix_waits_total') >= 1, 'the wait is counted');
    const prefilled = m.get('kvkeep_prompt_tokens_total') - m.get('kvkeep_cached_tokens_total');
    assert(prefilled < a.json.usage.prompt_tokens + 200, `tokens prefilled ${prefilled}: the shared prefix once`);
  } finally { await S.stop(); }
}, 120000);
}

await check(`${T}:disconnects_under_load_free_every_page`, async () => {
  // 8 batched streams (and long prefills) whose clients leave at random
  // moments: afterwards nothing runs and no page is referenced
  const S = await startServer(model, ['--served-model-name', NAME, '--max-running', '8', '--prefill-chunk', '16',
    '--disable-prefix-cache']);
  try {
    let seed = 7;
    const rnd = (n) => { seed = (seed * 1103515245 + 12345) % 2147483648; return seed % n; };
    const runs = Array.from({ length: 16 }, async (_, i) => {
      const ctl = new AbortController();
      const after = 20 + rnd(400);
      setTimeout(() => ctl.abort(), after);
      try {
        const r = await fetch(S.url('/v1/chat/completions'), {
          method: 'POST', signal: ctl.signal, headers: { 'content-type': 'application/json' },
          body: JSON.stringify({ model: NAME, stream: i % 2 === 0, messages: [{ role: 'user', content: `w${i} `.repeat(20 + rnd(300)) }],
            max_tokens: 2000, ignore_eos: true }),
        });
        const rd = r.body.getReader();
        while (!(await rd.read()).done) { /* until the abort */ }
      } catch { /* aborted */ }
    });
    await Promise.all(runs);
    const idle = await until(async () => {
      const m = await metrics(S);
      return m.get('kvkeep_requests_running') === 0 && m.get('kvkeep_requests_waiting') === 0 &&
        m.get('kvkeep_kv_pages_in_use') === 0 && m.get('kvkeep_engine_sequences') === 0 ? m : null;
    }, 10000, 50);
    assert(idle, 'requests or pages left after every client left');
    const ok = await postJSON(S, '/v1/chat/completions', { model: NAME, messages: [{ role: 'user', content: 'after' }], max_tokens: 3 });
    eq(ok.status, 200, 'still serving');
  } finally { await S.stop(); }
}, 120000);

await check(`${T}:cache_salts_are_full_byte_strings`, async () => {
  const S = await startServer(model, ['--served-model-name', NAME, '--allow-request-salt']);
  try {
    const body = (salt) => ({ model: NAME, messages: [{ role: 'user', content: 'salted prompt here' }], max_tokens: 1, cache_salt: salt });
    // "x\u0000a" used to be cut at the NUL: the same namespace as "x"
    for (const bad of ['x\u0000a', 'x\u0000b', '\u0000', '']) {
      const r = await postJSON(S, '/v1/chat/completions', body(bad)); // JSON.stringify writes \u0000
      eq(r.status, 400, `salt ${JSON.stringify(bad)} refused (${r.text.slice(0, 100)})`);
      eq(r.json.error.param, 'cache_salt', 'param');
      const p = await postJSON(S, '/v1/cache/probe', { messages: body(bad).messages, cache_salt: bad });
      eq(p.status, 400, `probe with salt ${JSON.stringify(bad)} refused`);
    }
    // "x" and "x " are two namespaces: the second misses what the first stored
    const a1 = await postJSON(S, '/v1/chat/completions', body('x'));
    const a2 = await postJSON(S, '/v1/chat/completions', body('x'));
    const b1 = await postJSON(S, '/v1/chat/completions', body('x '));
    eq(a1.status, 200, 'x');
    assert(a2.json.usage.prompt_tokens_details.cached_tokens > 0, 'same salt shares');
    eq(b1.json.usage.prompt_tokens_details.cached_tokens, 0, 'another salt does not');
    // info, metrics and clear cover every namespace
    const info = await (await fetch(S.url('/v1/cache/info'))).json();
    eq(info.namespaces.length, 3, 'default + two salts');
    eq(new Set(info.namespaces.map((n) => n.namespace)).size, 3, 'three namespaces');
    const salted = info.namespaces.filter((n) => n.kind === 'request_salt');
    assert(salted.every((n) => n.stats.entries >= 1), 'each salt holds its entry');
    eq(info.all_stats.lookups, 3, 'all lookups counted');
    const m = await metrics(S);
    eq(m.get('kvkeep_prefix_cache_lookups_total'), 3, 'metrics count every namespace');
    eq(m.get('kvkeep_prefix_cache_entries'), info.all_stats.entries, 'entries of every namespace');
    // The last request's worker may still hold its cache hit (pinned, so
    // not evictable) for a moment after its reply went out: clear leaves
    // what is pinned and says so in "entries"; once the worker is done, a
    // clear empties every namespace. (CI saw entries 1 on a loaded machine.)
    let cl, cleared = 0;
    for (let i = 0; i < 50; i++) {
      cl = await postJSON(S, '/v1/cache/clear', {});
      eq(cl.status, 200, 'clear');
      cleared += cl.json.cleared_entries;
      if (cl.json.entries === 0) break;
      await new Promise((r) => setTimeout(r, 20));
    }
    eq(cl.json.entries, 0, 'nothing left in any namespace');
    assert(cleared >= 2, `salted entries cleared too (${cleared})`);
    const after = await (await fetch(S.url('/v1/cache/info'))).json();
    assert(after.namespaces.every((n) => n.stats.entries === 0), 'every namespace is empty in RAM');
  } finally { await S.stop(); }
  // an empty --cache-salt is refused at startup rather than meaning "no salt"
  let err = null;
  try { const X = await startServer(model, ['--cache-salt', '']); await X.stop(); } catch (e) { err = e; }
  assert(err && /cache-salt/.test(String(err)), `--cache-salt '' refused (${err})`);
});

await check(`${T}:sigterm_answers_every_queued_request_503`, async () => {
  const S = await startServer(model, ['--served-model-name', NAME, '--max-running', '1', '--disable-prefix-cache']);
  const ctl = new AbortController();
  const res = await fetch(S.url('/v1/chat/completions'), {
    method: 'POST', signal: ctl.signal, headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: NAME, stream: true, messages: [{ role: 'user', content: 'long' }], max_tokens: 100000, ignore_eos: true }),
  });
  const reader = res.body.getReader();
  await reader.read();
  // 40 waiting: before the fix a few of them got an empty reply (the
  // daemon stopped before their handlers answered)
  const queued = Array.from({ length: 40 }, (_, i) => postJSON(S, '/v1/chat/completions',
    { model: NAME, messages: [{ role: 'user', content: `q${i}` }], max_tokens: 2 }).catch((e) => ({ status: 0, err: String(e) })));
  assert(await until(async () => (await metrics(S)).get('kvkeep_requests_waiting') === 40, 5000, 20), '40 requests wait');
  const exit = S.stop('SIGTERM', 10000);
  const rs = await Promise.all(queued);
  for (const r of rs) {
    eq(r.status, 503, `queued request answered (${r.err || r.text.slice(0, 80)})`);
    assert(Number(r.headers.get('retry-after')) >= 1, 'Retry-After');
  }
  try { while (!(await reader.read()).done) { /* the stream ends */ } } catch { /* cut */ }
  eq((await exit).code, 0, 'clean exit');
});

process.exit(failures_count() ? 1 : 0);
