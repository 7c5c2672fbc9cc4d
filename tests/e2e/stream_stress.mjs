// stream_stress.mjs - every stream ends, under load (issue 37 item 4).
//
// 20 clients stream answers from the three APIs at once, against
// --max-running 12, while busy loops started here keep the 2 cores loaded,
// for a bounded number of requests. Each stream is read on a raw HTTP/1.1
// keep-alive connection (node:http), so the test sees what a client sees:
// the chunked terminator (res.complete), and the API's last event
// ([DONE], message_stop, response.completed) or its error event. A stream
// that stops without either is the failure this test exists for; the
// server's log line of each failed one is printed.
import http from 'node:http';
import { spawn } from 'node:child_process';
import { mkModel, startServer, stopServer, check, assert, until, failures_count } from './server_util.mjs';

const T = 'stream_stress';
const CLIENTS = 20;
const TOTAL = Number(process.env.KT_STRESS_REQUESTS || 1200);
const DEADLINE_MS = 120000;

const model = mkModel('tiny-hybrid', 'stress-hybrid', true);
const srv = await startServer(model, ['--max-running', '12', '--max-queue', '256', '--served-model-name', 'm']);
const agent = new http.Agent({ keepAlive: true, maxSockets: CLIENTS });

// Busy loops beside the server: the load under which streams used to end
// silently.
const burners = [];
for (let i = 0; i < 3; i++)
  burners.push(spawn(process.execPath, ['-e', 'for(;;){}'], { stdio: 'ignore' }));
process.on('exit', () => { for (const b of burners) try { b.kill('SIGKILL'); } catch { /* gone */ } });

const words = 'alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu'.split(' ');
function prompt(i) {
  let s = `request ${i}:`;
  for (let k = 0; k < 5 + (i % 40); k++) s += ' ' + words[(i * 7 + k * 3) % words.length];
  return s;
}

function body(api, i) {
  const max = 1 + (i * 13) % 24;
  const text = prompt(i);
  if (api === 'chat')
    return ['/v1/chat/completions', { model: 'm', stream: true, max_tokens: max, temperature: 0.7, seed: i,
      stream_options: { include_usage: true }, messages: [{ role: 'user', content: text }] }];
  if (api === 'messages')
    return ['/v1/messages', { model: 'm', stream: true, max_tokens: max, temperature: 0.7,
      messages: [{ role: 'user', content: text }] }];
  return ['/v1/responses', { model: 'm', stream: true, max_output_tokens: max, temperature: 0.7, input: text }];
}

// One streamed request: resolves {complete, ended, errored, status, tail}.
function stream(api, i) {
  const [path, b] = body(api, i);
  const data = JSON.stringify(b);
  return new Promise((resolve) => {
    const req = http.request({ host: '127.0.0.1', port: srv.port, path, method: 'POST', agent,
      headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(data) } }, (res) => {
      let text = '';
      res.setEncoding('utf8');
      res.on('data', (d) => { text += d; });
      const done = () => {
        const ended = api === 'chat' ? /data: \[DONE\]\n\n$/.test(text)
          : api === 'messages' ? /event: message_stop\n/.test(text)
            : /event: response\.completed\n/.test(text);
        const errored = /event: error\n/.test(text) || /"error":/.test(text.slice(-600));
        resolve({ complete: res.complete, ended, errored, status: res.statusCode, tail: text.slice(-200) });
      };
      res.on('end', done);
      res.on('aborted', done);
      res.on('error', done);
    });
    req.on('error', (e) => resolve({ complete: false, ended: false, errored: false, status: 0, tail: String(e) }));
    req.end(data);
  });
}

await check(`${T}:every_stream_ends_under_load`, async () => {
  const apis = ['chat', 'messages', 'responses'];
  let next = 0, okN = 0, errN = 0, busyN = 0;
  const bad = [];
  const t0 = Date.now();
  async function client() {
    while (next < TOTAL && Date.now() - t0 < DEADLINE_MS) {
      const i = next++;
      const api = apis[i % 3];
      const r = await stream(api, i);
      if (r.status === 429 || r.status === 503) { busyN++; continue; }
      if (r.status === 200 && r.complete && r.ended) okN++;
      else if (r.complete && r.errored) errN++;
      else bad.push({ i, api, ...r });
    }
  }
  await Promise.all(Array.from({ length: CLIENTS }, client));
  const secs = ((Date.now() - t0) / 1000).toFixed(1);
  console.log(`# ${T}: ${next} requests in ${secs} s: ${okN} complete, ${errN} ended with an error event, ` +
    `${busyN} refused (429/503), ${bad.length} silent`);
  for (const b of bad.slice(0, 5)) console.log(`# silent: ${JSON.stringify(b)}`);
  assert(bad.length === 0, `${bad.length} streams ended without their last event or an error event`);
  assert(okN >= Math.min(TOTAL, next) * 0.9, `only ${okN} of ${next} streams completed`);
}, DEADLINE_MS + 30000);

for (const b of burners) b.kill('SIGKILL');

// A stream its client abandons ends as cancelled, and the request log says why.
await check(`${T}:a_hangup_is_logged_with_its_reason`, async () => {
  const data = JSON.stringify({ model: 'm', stream: true, max_tokens: 4000, ignore_eos: true,
    messages: [{ role: 'user', content: 'a long answer, abandoned' }] });
  await new Promise((resolve, reject) => {
    const req = http.request({ host: '127.0.0.1', port: srv.port, path: '/v1/chat/completions', method: 'POST',
      headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(data) } }, (res) => {
      res.once('data', () => { req.destroy(); resolve(); });
    });
    req.on('error', () => { /* destroyed on purpose */ });
    setTimeout(() => reject(new Error('no first chunk in 20 s')), 20000);
    req.end(data);
  });
  assert(await until(() => /event=request route=\/v1\/chat\/completions stream=1 .*finish=cancelled why=hangup/.test(srv.log()), 20000), 'no request line with finish=cancelled why=hangup: ' + srv.log().split('\n').filter((l) => /event=request /.test(l)).slice(-2).join(' / '));
}, 60000);

agent.destroy();
await stopServer(srv);
process.exit(failures_count() ? 1 : 0);
