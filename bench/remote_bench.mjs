// remote_bench.mjs - the remote tier's numbers (docs/cluster.md
// "Benchmark"); run through bench/remote_bench.sh.
//
//   ttft   one agent prompt (kvkeep bench mktrace, --prompt-tokens with 30
//          tools): per repetition a cold prefill on server A (which writes
//          its disk and the remote tier), then - in an order that rotates
//          from one repetition to the next - the same prompt on a restarted
//          A with its disk in the page cache ("disk"), on a restarted A with
//          those files dropped from the page cache ("disk-dropped"), and on
//          a fresh server B with an empty disk and the remote tier
//          ("remote"). TTFT from each server's request log line, restore
//          bandwidth from its store.fetch / remote.fetch line.
//   trace  8 agent sessions (same system prompt and tools, their own tasks)
//          through HAProxy (deploy/haproxy/render.sh) over servers A and B;
//          after half of the requests B is stopped (a deploy, a failure) and
//          its sessions go on on A. Aggregate tok/s of the whole replay,
//          with and without the remote tier, alternating.
//
// Each server runs with KVKEEP_THREADS (default 1); the cluster is 3
// masters + 3 replicas (tests/e2e/redis_util.mjs). Prints a table and
// writes every measurement as JSON (--out).
import { spawn, spawnSync, execFileSync } from 'node:child_process';
import { mkdtempSync, mkdirSync, rmSync, readdirSync, statSync, writeFileSync, readFileSync, existsSync, cpSync } from 'node:fs';
import http from 'node:http';
import { tmpdir } from 'node:os';
import { join, dirname } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Cluster, freePorts, sleep } from '../tests/e2e/redis_util.mjs';

const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..');
const KV = process.env.KT_BIN || join(ROOT, 'build/kvkeep');
const args = process.argv.slice(2);
const opt = (name, def) => { const i = args.indexOf(`--${name}`); return i >= 0 ? args[i + 1] : def; };
const flag = (name) => args.includes(`--${name}`);
const MODEL = opt('model');
const LABEL = opt('label', MODEL ? MODEL.split('/').pop() : '');
const REPS = Number(opt('reps', '3'));
// a cold prefill of the 9B geometry at 17K tokens on one thread takes hours
// on a shared machine: --cold-reps 1 measures it once, and the later
// repetitions reuse its disk folder and remote keys for their hits
const COLD_REPS = Number(opt('cold-reps', String(REPS)));
const PROMPT_TOKENS = Number(opt('prompt-tokens', '17000'));
const THREADS = opt('threads', '1');
// --remote-cache-timeout-ms of every server (default: the server's 200); on
// a machine whose cores are all busy a 2 MiB GET can miss 220 ms, and a
// lookup that fails a call is a miss (docs/cluster.md "Faults")
const REMOTE_TIMEOUT = opt('remote-timeout-ms', null);
const OUT = opt('out', null);
const PARTS = (opt('parts', 'ttft,trace')).split(',');
const SESSIONS = Number(opt('sessions', '8'));
const TURNS = Number(opt('turns', '4'));
const TRACE_SYSTEM = Number(opt('trace-system-tokens', '1500'));
const WORK = opt('work', null) || mkdtempSync(join(process.env.TMPDIR || tmpdir(), 'kvkeep-remote-bench-'));
if (!MODEL) { console.error('usage: remote_bench.mjs --model DIR|FILE.gguf [--label L] [--reps N] [--prompt-tokens N] [--parts ttft,trace] [--out FILE]'); process.exit(2); }
mkdirSync(WORK, { recursive: true });
const PW = 'kvkeep-bench-pw';
const results = { model: LABEL, threads: THREADS, reps: REPS, host: {}, ttft: [], trace: [] };

const procs = new Set();
process.on('exit', () => { for (const p of procs) { try { p.kill('SIGKILL'); } catch { /* gone */ } } });
process.on('SIGINT', () => process.exit(130));

// --- servers ----------------------------------------------------------------
let memoFrom = null; // a cache root whose weights/ memo spares the next start the hashing
function start(name, extra, { remote = null, cacheDir, timeoutMs = 900000 } = {}) {
  mkdirSync(cacheDir, { recursive: true });
  if (memoFrom && !existsSync(join(cacheDir, 'weights')) && existsSync(join(memoFrom, 'weights')))
    cpSync(join(memoFrom, 'weights'), join(cacheDir, 'weights'), { recursive: true });
  const a = ['serve', '--model', MODEL, '--host', '127.0.0.1', '--port', '0', '--served-model-name', 'kvkeep',
    '--cache-dir', cacheDir, '--echo-generated', 'off', ...extra];
  if (remote) a.push('--remote-cache', remote.url, '--remote-cache-prefix', remote.prefix);
  if (remote && REMOTE_TIMEOUT) a.push('--remote-cache-timeout-ms', REMOTE_TIMEOUT);
  const env = { ...process.env, KVKEEP_LOG: 'info', KVKEEP_THREADS: THREADS, KVKEEP_REMOTE_CACHE_PASSWORD: PW };
  const p = spawn(KV, a, { env, stdio: ['ignore', 'pipe', 'pipe'] });
  procs.add(p);
  const srv = { name, proc: p, text: '', cacheDir };
  p.stdout.on('data', (d) => { srv.text += d; });
  p.stderr.on('data', (d) => { srv.text += d; });
  srv.closed = new Promise((r) => p.once('close', r));
  p.on('exit', () => procs.delete(p));
  return new Promise((resolve, reject) => {
    const t = setTimeout(() => reject(new Error(`${name} did not start`)), timeoutMs);
    const poll = setInterval(() => {
      const m = srv.text.match(/event=serve\.ready [^\n]*port=(\d+)/);
      if (m) {
        clearInterval(poll); clearTimeout(t);
        srv.port = Number(m[1]);
        if (!memoFrom) memoFrom = cacheDir;
        resolve(srv);
      }
      if (p.exitCode !== null) { clearInterval(poll); clearTimeout(t); reject(new Error(`${name} exited: ${srv.text.slice(-400)}`)); }
    }, 50);
  });
}
let logN = 0; // every server's log stays in the work folder (--keep to read it)
async function stop(srv) {
  if (srv.proc.exitCode === null) srv.proc.kill('SIGTERM');
  await srv.closed;
  writeFileSync(join(WORK, `log-${String(++logN).padStart(2, '0')}-${srv.name}.txt`), srv.text);
}
function post(port, path, body, headers = {}, timeoutMs = 7200000) {
  return new Promise((resolve, reject) => {
    const data = Buffer.from(JSON.stringify(body));
    const rq = http.request({ host: '127.0.0.1', port, path, method: 'POST', agent: false,
      headers: { 'content-type': 'application/json', 'content-length': data.length, ...headers } }, (res) => {
      let b = '';
      res.on('data', (d) => { b += d; });
      res.on('end', () => { try { resolve({ status: res.statusCode, json: JSON.parse(b), server: res.headers['x-kvkeep-server'] }); } catch { resolve({ status: res.statusCode, json: null, text: b }); } });
    });
    rq.on('error', reject);
    rq.setTimeout(timeoutMs, () => rq.destroy(new Error('timeout')));
    rq.end(data);
  });
}
async function getJSON(port, path) {
  return new Promise((resolve, reject) => {
    http.get({ host: '127.0.0.1', port, path, agent: false }, (res) => {
      let b = '';
      res.on('data', (d) => { b += d; });
      res.on('end', () => { try { resolve(JSON.parse(b)); } catch (e) { reject(e); } });
    }).on('error', reject);
  });
}
// disk writer and remote writer both idle, twice in a row
async function settled(srv, ms = 1800000) {
  const end = Date.now() + ms;
  let last = -1;
  while (Date.now() < end) {
    const i = await getJSON(srv.port, '/v1/cache/info');
    const idle = i.disk.dirty_objects === 0 && (!i.remote || i.remote.queue_length === 0);
    const w = i.remote ? i.remote.written_objects + i.remote.present_objects : i.disk.written_objects;
    if (idle && w === last) return i;
    last = idle ? w : -1;
    await sleep(250);
  }
  throw new Error('the write-behind did not settle');
}
const lastMatch = (text, re) => { const m = [...text.matchAll(re)]; return m.length ? m[m.length - 1] : null; };
function lastRequest(srv) {
  const m = lastMatch(srv.text, /event=request [^\n]*prompt_tokens=(\d+) cached_tokens=(\d+)[^\n]*ttft_ms=([\d.]+)[^\n]*prefill_ms=([\d.]+)/g);
  return m ? { prompt: Number(m[1]), cached: Number(m[2]), ttft_ms: Number(m[3]), prefill_ms: Number(m[4]) } : null;
}
function lastFetch(srv, ev) {
  const m = lastMatch(srv.text, new RegExp(`event=${ev} resumed_at=(\\d+)[^\\n]* bytes=(\\d+) ms=([\\d.]+)`, 'g'));
  return m ? { at: Number(m[1]), bytes: Number(m[2]), ms: Number(m[3]) } : null;
}
function dropPageCache(dir) {
  // only this folder's files (never the machine's whole page cache: it is shared)
  spawnSync('/usr/bin/python3', ['-c', `
import os, sys
for root, _, files in os.walk(sys.argv[1]):
    for f in files:
        p = os.path.join(root, f)
        try:
            fd = os.open(p, os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED); os.close(fd)
        except OSError: pass
`, dir]);
}
function load() {
  const l = readFileSync('/proc/loadavg', 'utf8').split(' ');
  return { load1: Number(l[0]), load5: Number(l[1]), load15: Number(l[2]) };
}
const median = (xs) => { const s = xs.slice().sort((a, b) => a - b); return s.length ? (s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2) : NaN; };

// --- the cluster ------------------------------------------------------------
const cluster = new Cluster(join(WORK, 'redis'), { password: PW, nodeTimeout: 2000, maxmemoryMb: Number(opt('redis-maxmemory-mb', '3072')) });
process.on('exit', () => cluster.cleanup());
await cluster.start();
const URL = cluster.url();
results.host = { nproc: Number(execFileSync('nproc').toString()), load_at_start: load(), cpu: (readFileSync('/proc/cpuinfo', 'utf8').match(/model name\s*:\s*(.*)/) || [])[1] };
console.error(`cluster up (${cluster.ports.join(',')}); model ${MODEL}; work ${WORK}; load ${JSON.stringify(results.host.load_at_start)}`);

// --- TTFT ---------------------------------------------------------------------
if (PARTS.includes('ttft')) {
  const tracePath = join(WORK, 'prompt.jsonl');
  execFileSync(KV, ['bench', 'mktrace', '--tools', '30', '--system-tokens', String(PROMPT_TOKENS - 4400), '--turns', '1', '--out', tracePath, '--quiet']);
  const body = JSON.parse(readFileSync(tracePath, 'utf8').split('\n')[0]);
  Object.assign(body, { model: 'kvkeep', stream: false, max_tokens: 4, temperature: 0, logprobs: true, top_logprobs: 2 });
  delete body.stream_options;
  const one = async (srv) => {
    const n0 = (srv.text.match(/event=request /g) || []).length;
    const r = await post(srv.port, '/v1/chat/completions', body);
    if (r.status !== 200) throw new Error(`${srv.name}: HTTP ${r.status} ${r.text || JSON.stringify(r.json)}`);
    // the request's log line follows its answer
    for (let i = 0; i < 200 && (srv.text.match(/event=request /g) || []).length <= n0; i++) await sleep(25);
    return { ...lastRequest(srv), text: r.json.choices[0].message.content + JSON.stringify(r.json.choices[0].logprobs) };
  };
  let coldRow = null;
  for (let rep = 1; rep <= REPS; rep++) {
    const src = rep <= COLD_REPS ? rep : 1; // whose cold run the hits read
    const remote = { url: URL, prefix: `kvkeep-bench-${src}:` };
    const dirA = join(WORK, `a-${src}`), dirB = join(WORK, `b-${rep}`);
    const row = { rep, load: load() };
    let a;
    if (rep <= COLD_REPS) {
      // cold, writing the disk and the remote tier
      a = await start('A', [], { remote, cacheDir: dirA });
      const c = await one(a);
      row.cold = c;
      await settled(a);
      const ri = await getJSON(a.port, '/v1/cache/info');
      row.written = { disk_bytes: ri.disk.written_bytes, remote_bytes: ri.remote.written_bytes, remote_objects: ri.remote.written_objects };
      await stop(a);
      if (!coldRow) coldRow = row;
    } else {
      row.cold = { ...coldRow.cold, reused_from_rep: 1 };
    }
    const order = [['disk', 'disk-dropped', 'remote'], ['remote', 'disk', 'disk-dropped'], ['disk-dropped', 'remote', 'disk']][(rep - 1) % 3];
    for (const what of order) {
      if (what === 'remote') {
        const b = await start('B', [], { remote, cacheDir: dirB });
        row.remote = { ...(await one(b)), fetch: lastFetch(b, 'remote.fetch') };
        await stop(b);
        rmSync(dirB, { recursive: true, force: true }); // a fresh B next time
        mkdirSync(dirB, { recursive: true });
        cpSync(join(memoFrom, 'weights'), join(dirB, 'weights'), { recursive: true });
      } else {
        if (what === 'disk-dropped') dropPageCache(dirA);
        a = await start('A', [], { cacheDir: dirA }); // no remote tier: the disk answers
        row[what] = { ...(await one(a)), fetch: lastFetch(a, 'store.fetch') };
        await stop(a);
      }
    }
    for (const k of ['disk', 'disk-dropped', 'remote'])
      if (row[k].text !== row.cold.text) row.wrong = (row.wrong || []).concat(k);
    results.ttft.push(row);
    const f = (x) => `${x.ttft_ms.toFixed(0)} ms (cached ${x.cached}/${x.prompt})`;
    console.error(`rep ${rep}: cold ${f(row.cold)} | disk ${f(row.disk)} | disk-dropped ${f(row['disk-dropped'])} | remote ${f(row.remote)}` +
      ` | load ${row.load.load1}${row.wrong ? ` | WRONG: ${row.wrong}` : ''}`);
  }
}

// --- the 8-session trace through HAProxy -------------------------------------------
if (PARTS.includes('trace')) {
  const sessions = [];
  for (let s = 0; s < SESSIONS; s++) {
    const p = join(WORK, `session-${s}.jsonl`);
    execFileSync(KV, ['bench', 'mktrace', '--tools', '10', '--system-tokens', String(TRACE_SYSTEM), '--turns', String(TURNS),
      '--seed', String(s + 1), '--out', p, '--quiet']);
    sessions.push(readFileSync(p, 'utf8').trim().split('\n').map((l) => JSON.parse(l)));
  }
  // one agent: every session gets session 0's system prompt
  const sys0 = sessions[0][0].messages[0];
  for (const ss of sessions) for (const b of ss) {
    b.messages[0] = sys0;
    Object.assign(b, { model: 'kvkeep', stream: false, max_tokens: 16, temperature: 0 });
    delete b.stream_options;
  }
  const total = SESSIONS * TURNS;
  for (let rep = 1; rep <= REPS; rep++) {
    for (const withRemote of rep % 2 ? [true, false] : [false, true]) {
      const remote = withRemote ? { url: URL, prefix: `kvkeep-trace-${rep}:` } : null;
      const A = await start('A', [], { remote, cacheDir: join(WORK, `ta-${rep}-${withRemote}`) });
      const B = await start('B', [], { remote, cacheDir: join(WORK, `tb-${rep}-${withRemote}`) });
      const [hp] = await freePorts(1, { bus: 0 });
      const cfg = join(WORK, `ha-${rep}-${withRemote}.cfg`);
      writeFileSync(cfg, execFileSync('bash', [join(ROOT, 'deploy/haproxy/render.sh'), '--bind', `127.0.0.1:${hp}`,
        '--check-inter', '300', '--quiet', `127.0.0.1:${A.port}`, `127.0.0.1:${B.port}`]));
      const ha = spawn('haproxy', ['-f', cfg, '-db'], { stdio: 'ignore' });
      procs.add(ha);
      await sleep(1500);
      let done = 0, stopped = false, moved = 0;
      const rows = [];
      const t0 = Date.now();
      await Promise.all(sessions.map(async (ss, s) => {
        let where = null;
        for (let t = 0; t < ss.length; t++) {
          const t1 = Date.now();
          let r;
          for (let k = 0; k < 40; k++) { // a server going down answers 503 until HAProxy takes it out
            r = await post(hp, '/v1/chat/completions', ss[t], { 'x-claude-code-session-id': `bench-${rep}-${s}` }).catch((e) => ({ status: 0, e }));
            if (r.status === 200) break;
            await sleep(250);
          }
          if (r.status !== 200) throw new Error(`session ${s} turn ${t}: HTTP ${r.status}`);
          const u = r.json.usage;
          if (where && r.server !== where) moved++;
          where = r.server;
          rows.push({ s, t, server: r.server, prompt: u.prompt_tokens, cached: u.prompt_tokens_details.cached_tokens,
            gen: u.completion_tokens, ms: Date.now() - t1 });
          if (++done >= total / 2 && !stopped) {
            stopped = true;
            B.proc.kill('SIGTERM'); // B goes away: its sessions land on A
          }
        }
      }));
      const wall = (Date.now() - t0) / 1000;
      const sum = (k) => rows.reduce((x, r) => x + r[k], 0);
      const ai = await getJSON(A.port, '/v1/cache/info');
      const run = { rep, remote: withRemote, wall_s: wall, requests: rows.length, prompt_tokens: sum('prompt'),
        cached_tokens: sum('cached'), generated_tokens: sum('gen'), moved_requests: moved,
        tok_s: (sum('prompt') + sum('gen')) / wall, computed_tok_s: (sum('prompt') - sum('cached') + sum('gen')) / wall,
        gen_tok_s: sum('gen') / wall, remote_hits_a: ai.remote ? ai.remote.hits : 0, load: load() };
      results.trace.push(run);
      console.error(`trace rep ${rep} remote=${withRemote}: ${wall.toFixed(1)} s, ${run.tok_s.toFixed(1)} tok/s (prompt+gen), cached ${run.cached_tokens}/${run.prompt_tokens}, A remote hits ${run.remote_hits_a}, load ${run.load.load1}`);
      ha.kill('SIGKILL');
      await stop(A);
      await stop(B);
    }
  }
}

// --- summary --------------------------------------------------------------------
if (results.ttft.length) {
  const col = (k) => results.ttft.filter((r) => k !== 'cold' || !r.cold.reused_from_rep).map((r) => r[k].ttft_ms);
  const bw = (k) => results.ttft.map((r) => r[k].fetch ? r[k].fetch.bytes / (r[k].fetch.ms / 1e3) / 1e6 : NaN);
  results.ttft_summary = {
    cold_runs: col('cold').length,
    cold_ms: median(col('cold')), disk_ms: median(col('disk')), disk_dropped_ms: median(col('disk-dropped')), remote_ms: median(col('remote')),
    remote_vs_disk: median(col('remote')) / median(col('disk')),
    remote_vs_disk_dropped: median(col('remote')) / median(col('disk-dropped')),
    cold_vs_remote: median(col('cold')) / median(col('remote')),
    restore_mb_s: { disk: median(bw('disk')), disk_dropped: median(bw('disk-dropped')), remote: median(bw('remote')) },
    wrong_answers: results.ttft.filter((r) => r.wrong).length,
    // the spread: every repetition's value, and the per-repetition ratio
    spread: { disk_ms: col('disk'), disk_dropped_ms: col('disk-dropped'), remote_ms: col('remote'),
      remote_vs_disk: results.ttft.map((r) => r.remote.ttft_ms / r.disk.ttft_ms),
      restore_mb_s: { disk: bw('disk'), disk_dropped: bw('disk-dropped'), remote: bw('remote') },
      load1: results.ttft.map((r) => r.load.load1) },
  };
  console.log(`\n${LABEL}: TTFT medians over ${REPS} reps (ms): cold ${results.ttft_summary.cold_ms.toFixed(0)}, disk ${results.ttft_summary.disk_ms.toFixed(0)}, ` +
    `disk (page cache dropped) ${results.ttft_summary.disk_dropped_ms.toFixed(0)}, remote ${results.ttft_summary.remote_ms.toFixed(0)}; ` +
    `remote/disk ${results.ttft_summary.remote_vs_disk.toFixed(2)}x, cold/remote ${results.ttft_summary.cold_vs_remote.toFixed(0)}x; ` +
    `restore MB/s: disk ${results.ttft_summary.restore_mb_s.disk.toFixed(0)}, disk dropped ${results.ttft_summary.restore_mb_s.disk_dropped.toFixed(0)}, remote ${results.ttft_summary.restore_mb_s.remote.toFixed(0)}`);
  const sp = results.ttft_summary.spread, r0 = (xs) => xs.map((x) => x.toFixed(0)).join('/');
  console.log(`${LABEL}: per repetition: disk ${r0(sp.disk_ms)} ms, remote ${r0(sp.remote_ms)} ms, remote/disk ${sp.remote_vs_disk.map((x) => x.toFixed(2)).join('/')}; ` +
    `restore MB/s disk ${r0(sp.restore_mb_s.disk)}, remote ${r0(sp.restore_mb_s.remote)}; load ${sp.load1.join('/')}`);
}
if (results.trace.length) {
  const m = (r) => median(results.trace.filter((x) => x.remote === r).map((x) => x.tok_s));
  results.trace_summary = { with_remote_tok_s: m(true), without_remote_tok_s: m(false), ratio: m(true) / m(false) };
  console.log(`${LABEL}: ${SESSIONS}-session trace through HAProxy (B stopped halfway), aggregate tok/s medians: with remote ${m(true).toFixed(1)}, without ${m(false).toFixed(1)} (${(m(true) / m(false)).toFixed(2)}x)`);
}
results.host.load_at_end = load();
if (OUT) writeFileSync(OUT, JSON.stringify(results, null, 1));
await cluster.stop();
if (!flag('keep')) rmSync(WORK, { recursive: true, force: true });
process.exit(results.ttft.some((r) => r.wrong) ? 1 : 0);
