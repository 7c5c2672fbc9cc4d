// remote_kills.mjs - no wrong answer while Redis masters die (docs/cluster.md
// "Benchmark"); run through bench/remote_kills.sh. Not in `make test`: it
// takes minutes.
//
// A 3+3 Redis Cluster, two kvkeep servers A and B with the remote tier and
// a server without any cache (the reference). Then, --kills times: a random
// live master is SIGKILLed; while the cluster fails over, pairs of requests
// run (A prefills a new session, B asks for the same one: a remote lookup
// every time); the killed node is started again (it comes back as a
// replica) and the next kill waits for it to be in sync. Every answer must
// be 200 and equal to the reference, text and logprobs. Prints the totals;
// exit 1 on any wrong or failed answer.
import { spawnSync } from 'node:child_process';
import { join } from 'node:path';
import { TMP, mkModel, startServer, postJSON, until, sleep } from '../tests/e2e/server_util.mjs';
import { Cluster, resp } from '../tests/e2e/redis_util.mjs';

const args = process.argv.slice(2);
const opt = (name, def) => { const i = args.indexOf(`--${name}`); return i >= 0 ? args[i + 1] : def; };
const KILLS = Number(opt('kills', '50'));
const PW = 'kvkeep-kills-pw';
const cluster = new Cluster(join(TMP, 'redis'), { password: PW, nodeTimeout: 1000 });
process.on('exit', () => cluster.cleanup());
await cluster.start();
const model = opt('model', null) || mkModel('tiny-hybrid', 'hybrid', true);
const flags = ['--served-model-name', 'm', '--echo-generated', 'off'];
const remote = ['--remote-cache', cluster.url(), '--remote-cache-password-file', join(TMP, 'pw')];
spawnSync('sh', ['-c', `printf '%s\\n' '${PW}' > ${join(TMP, 'pw')}`]);
const A = await startServer(model, [...flags, ...remote]);
const B = await startServer(model, [...flags, ...remote]);
const cold = await startServer(model, [...flags, '--disable-prefix-cache']);

const sys = 'You are a careful coding agent that reads and edits files. '.repeat(25);
const body = (tag) => ({ model: 'm', temperature: 0, max_tokens: 4, logprobs: true, top_logprobs: 2,
  messages: [{ role: 'system', content: `Project ${tag}. ${sys}` }, { role: 'user', content: `Fix the failing test in module ${tag}.` }] });
const tot = { kills: 0, requests: 0, wrong: 0, failed: 0, b_remote_hits: 0, pairs_during_failover: 0 };
async function ask(srv, b) {
  const r = await postJSON(srv, '/v1/chat/completions', b).catch((e) => ({ status: 0, text: String(e) }));
  tot.requests++;
  if (r.status !== 200) { tot.failed++; console.error(`FAILED ${r.status} ${String(r.text).slice(0, 200)}`); return null; }
  return JSON.stringify([r.json.choices[0].message.content, r.json.choices[0].logprobs]);
}
let seq = 0;
async function pair() {
  const b = body(`k${seq++}`);
  const ref = await ask(cold, b);
  for (const srv of [A, B]) {
    const got = await ask(srv, b);
    if (got !== null && ref !== null && got !== ref) { tot.wrong++; console.error(`WRONG answer from ${srv === A ? 'A' : 'B'} on ${b.messages[0].content.slice(0, 20)}`); }
  }
}
const remoteInfo = async (srv) => (await (await fetch(srv.url('/v1/cache/info'))).json()).remote;
async function clusterOk() {
  try { await cluster.waitOk(300); return true; } catch { return false; }
}
async function replicaInSync(port) {
  try {
    const r = (await resp(port, PW, ['INFO', 'replication'], 1000)).toString();
    return /role:slave/.test(r) && /master_link_status:up/.test(r);
  } catch { return false; }
}

const t0 = Date.now();
for (let k = 1; k <= KILLS; k++) {
  const ms = await cluster.masters();
  const victim = ms[Math.floor(Math.random() * ms.length)].port;
  cluster.kill(victim);
  tot.kills++;
  // requests while the cluster notices and promotes the replica
  let n = 0;
  do { await pair(); n++; } while (!(await clusterOk()) && n < 200);
  tot.pairs_during_failover += n;
  cluster.startNode(victim);
  await cluster.waitPing(victim);
  const synced = await until(() => replicaInSync(victim), 30000, 100);
  if (!synced) throw new Error(`node ${victim} did not come back as a replica`);
  await until(async () => (await remoteInfo(A)).up === 1 && (await remoteInfo(B)).up === 1, 15000, 100);
  await pair(); // and once with everything up
  if (k % 10 === 0) console.error(`${k} kills, ${tot.requests} requests, ${tot.wrong} wrong, ${tot.failed} failed, ${((Date.now() - t0) / 1000).toFixed(0)} s`);
}
const rb = await remoteInfo(B), ra = await remoteInfo(A);
tot.b_remote_hits = rb.hits;
tot.b_remote_lookups = rb.lookups;
tot.downs = { A: ra.downs, B: rb.downs };
tot.seconds = (Date.now() - t0) / 1000;
console.log(JSON.stringify(tot));
await A.stop();
await B.stop();
await cold.stop();
await cluster.stop();
process.exit(tot.wrong || tot.failed ? 1 : 0);
