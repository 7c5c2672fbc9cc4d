// redis_util.mjs - a real Redis Cluster for the end-to-end tests of the
// remote tier (tests/e2e/remote_tier.mjs) and its benchmark
// (bench/remote_bench.sh): redis-server processes on free loopback ports
// (each port and its cluster bus port, +10000, checked free), joined with
// `redis-cli --cluster create`, with a password, allkeys-lru and a short
// node timeout so a failover takes a second or two; a small binary-safe
// RESP client that follows MOVED; kill / restart of one node; waits with
// deadlines. Nothing here knows kvkeep.
import { spawn, execFileSync } from 'node:child_process';
import { mkdirSync, rmSync } from 'node:fs';
import net from 'node:net';
import { join } from 'node:path';

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function portFree(port) {
  return new Promise((resolve) => {
    const s = net.createServer();
    s.once('error', () => resolve(false));
    s.listen(port, '127.0.0.1', () => s.close(() => resolve(true)));
  });
}

// n ports p in [lo, hi) with p and p + bus free (bus 0: only p).
export async function freePorts(n, { lo = 21000, hi = 29000, bus = 10000 } = {}) {
  const out = [];
  for (let tries = 0; out.length < n && tries < 2000; tries++) {
    const p = lo + Math.floor(Math.random() * (hi - lo));
    if (out.includes(p) || out.includes(p - bus) || out.includes(p + bus)) continue;
    if (await portFree(p) && (!bus || await portFree(p + bus))) out.push(p);
  }
  if (out.length < n) throw new Error('no free ports');
  return out;
}

// --- RESP ------------------------------------------------------------------

function encode(args) {
  const parts = [Buffer.from(`*${args.length}\r\n`)];
  for (const a of args) {
    const b = Buffer.isBuffer(a) ? a : Buffer.from(String(a));
    parts.push(Buffer.from(`$${b.length}\r\n`), b, Buffer.from('\r\n'));
  }
  return Buffer.concat(parts);
}

// Parse one reply at buf[pos]: [value, next] or null when incomplete.
// Errors come back as {error: 'MSG'}, bulk strings as Buffers.
function parse(buf, pos) {
  const nl = buf.indexOf('\r\n', pos);
  if (nl < 0) return null;
  const t = String.fromCharCode(buf[pos]), line = buf.toString('latin1', pos + 1, nl);
  const next = nl + 2;
  if (t === '+') return [line, next];
  if (t === '-') return [{ error: line }, next];
  if (t === ':') return [Number(line), next];
  if (t === '$') {
    const n = Number(line);
    if (n < 0) return [null, next];
    if (buf.length < next + n + 2) return null;
    return [buf.subarray(next, next + n), next + n + 2];
  }
  if (t === '*') {
    const n = Number(line);
    if (n < 0) return [null, next];
    const arr = [];
    let p = next;
    for (let i = 0; i < n; i++) {
      const r = parse(buf, p);
      if (!r) return null;
      arr.push(r[0]);
      p = r[1];
    }
    return [arr, p];
  }
  throw new Error(`bad RESP type ${t}`);
}

// One connection, one command at a time (AUTH first).
export function resp(port, password, args, timeoutMs = 5000) {
  return new Promise((resolve, reject) => {
    const sock = net.connect(port, '127.0.0.1');
    let buf = Buffer.alloc(0), want = password ? 2 : 1;
    const replies = [];
    const timer = setTimeout(() => { sock.destroy(); reject(new Error(`redis :${port} timed out on ${args[0]}`)); }, timeoutMs);
    sock.on('connect', () => {
      if (password) sock.write(encode(['AUTH', password]));
      sock.write(encode(args));
    });
    sock.on('data', (d) => {
      buf = Buffer.concat([buf, d]);
      for (;;) {
        const r = parse(buf, 0);
        if (!r) break;
        replies.push(r[0]);
        buf = buf.subarray(r[1]);
      }
      if (replies.length >= want) {
        clearTimeout(timer);
        sock.end();
        resolve(replies[want - 1]);
      }
    });
    sock.on('error', (e) => { clearTimeout(timer); reject(e); });
  });
}

export class Cluster {
  constructor(dir, { password = 'kvkeep-test-pw', nodeTimeout = 1000, maxmemoryMb = 256, server = 'redis-server' } = {}) {
    this.dir = dir;
    this.password = password;
    this.nodeTimeout = nodeTimeout;
    this.maxmemoryMb = maxmemoryMb;
    this.server = server;
    this.procs = new Map(); // port -> child
    this.ports = [];
  }

  async pickPorts(n = 6) {
    this.ports = await freePorts(n);
    return this.ports;
  }

  url(ports = this.ports.slice(0, 3)) {
    return 'redis://' + ports.map((p) => `127.0.0.1:${p}`).join(',');
  }

  startNode(port) {
    const d = join(this.dir, String(port));
    mkdirSync(d, { recursive: true });
    const args = ['--port', String(port), '--bind', '127.0.0.1', '--cluster-enabled', 'yes',
      '--cluster-config-file', 'nodes.conf', '--cluster-node-timeout', String(this.nodeTimeout),
      '--cluster-replica-validity-factor', '0', '--save', '', '--appendonly', 'no', '--dir', d,
      '--requirepass', this.password, '--masterauth', this.password, '--maxmemory', `${this.maxmemoryMb}mb`,
      '--maxmemory-policy', 'allkeys-lru', '--logfile', join(d, 'redis.log'), '--protected-mode', 'no'];
    const p = spawn(this.server, args, { stdio: 'ignore' });
    this.procs.set(port, p);
    p.on('exit', () => { if (this.procs.get(port) === p) this.procs.delete(port); });
    return p;
  }

  async ping(port) {
    try { return (await resp(port, this.password, ['PING'], 1000)) === 'PONG'; } catch { return false; }
  }

  async waitPing(port, ms = 10000) {
    const end = Date.now() + ms;
    while (Date.now() < end) {
      if (await this.ping(port)) return true;
      await sleep(50);
    }
    throw new Error(`redis :${port} did not answer PING`);
  }

  // Start every node and join them: 3 masters + 3 replicas.
  async start() {
    if (!this.ports.length) await this.pickPorts(6);
    for (const p of this.ports) this.startNode(p);
    for (const p of this.ports) await this.waitPing(p);
    execFileSync('redis-cli', ['-a', this.password, '--no-auth-warning', '--cluster', 'create',
      ...this.ports.map((p) => `127.0.0.1:${p}`), '--cluster-replicas', '1', '--cluster-yes'],
    { stdio: ['ignore', 'ignore', 'pipe'], timeout: 60000 });
    await this.waitOk();
  }

  // Restart nodes that were stopped (they rejoin from nodes.conf).
  async restartAll() {
    for (const p of this.ports) if (!this.procs.has(p)) this.startNode(p);
    for (const p of this.ports) await this.waitPing(p);
    await this.waitOk();
  }

  async info(port) {
    const r = await resp(port, this.password, ['CLUSTER', 'INFO'], 2000);
    return Buffer.isBuffer(r) ? r.toString() : String(r);
  }

  // Every live node says cluster_state:ok and all slots are assigned to a
  // live master.
  async waitOk(ms = 30000) {
    const end = Date.now() + ms;
    while (Date.now() < end) {
      let ok = true;
      for (const p of this.procs.keys()) {
        try {
          const i = await this.info(p);
          if (!/cluster_state:ok/.test(i) || !/cluster_slots_ok:16384/.test(i)) ok = false;
        } catch { ok = false; }
        if (!ok) break;
      }
      if (ok && this.procs.size) {
        const m = await this.masters();
        if (m.length >= 3 && m.every((x) => this.procs.has(x.port))) return;
      }
      await sleep(100);
    }
    throw new Error('the cluster did not reach cluster_state:ok');
  }

  // Live masters from CLUSTER NODES: [{id, port, slots}].
  async masters() {
    for (const p of this.procs.keys()) {
      try {
        const r = (await resp(p, this.password, ['CLUSTER', 'NODES'], 2000)).toString();
        const out = [];
        for (const line of r.trim().split('\n')) {
          const f = line.split(' ');
          if (!f[2].includes('master') || f[2].includes('fail')) continue;
          const slots = f.slice(8).filter((s) => /^\d/.test(s));
          if (!slots.length) continue;
          out.push({ id: f[0], port: Number(f[1].split(':')[1].split('@')[0]), slots });
        }
        return out;
      } catch { /* try another node */ }
    }
    return [];
  }

  kill(port, sig = 'SIGKILL') {
    const p = this.procs.get(port);
    if (p) { p.kill(sig); this.procs.delete(port); }
  }

  async stop() {
    for (const [port, p] of this.procs) { p.kill('SIGKILL'); this.procs.delete(port); }
    await sleep(50);
  }

  cleanup() {
    for (const p of this.procs.values()) { try { p.kill('SIGKILL'); } catch { /* gone */ } }
    try { rmSync(this.dir, { recursive: true, force: true }); } catch { /* gone */ }
  }

  // A command on the node owning the key (MOVED followed).
  async cmd(args, key) {
    let port = [...this.procs.keys()][0];
    for (let hop = 0; hop < 5; hop++) {
      const r = await resp(port, this.password, args);
      if (r && r.error && /^(MOVED|ASK) /.test(r.error)) {
        port = Number(r.error.split(' ')[2].split(':')[1]);
        continue;
      }
      if (r && r.error) throw new Error(`redis: ${r.error} (${args[0]} ${key || ''})`);
      return r;
    }
    throw new Error('too many redirects');
  }

  // Every key matching pattern, over the masters.
  async keys(pattern) {
    const out = [];
    for (const m of await this.masters()) {
      let cursor = '0';
      do {
        const r = await resp(m.port, this.password, ['SCAN', cursor, 'MATCH', pattern, 'COUNT', '1000']);
        cursor = r[0].toString();
        for (const k of r[1]) out.push(k.toString());
      } while (cursor !== '0');
    }
    return out;
  }
}
