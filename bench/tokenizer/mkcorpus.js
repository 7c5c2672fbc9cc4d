#!/usr/bin/env node
// mkcorpus.js DIR OUT [BYTES] - a deterministic mixed corpus for the
// tokenizer benchmark: the lines of every file in DIR (the test corpus,
// tests/data/tokenizer), shuffled with a fixed seed and repeated until OUT
// holds at least BYTES bytes (default 1 MiB). Same input -> same bytes.
'use strict';
const fs = require('fs');
const path = require('path');
const [dir, out, bytesArg] = process.argv.slice(2);
const want = bytesArg ? parseInt(bytesArg, 10) : 1 << 20;
const lines = [];
for (const f of fs.readdirSync(dir).sort()) {
  if (f.endsWith('.md')) continue;
  const s = fs.readFileSync(path.join(dir, f), 'utf8');
  for (const l of s.split('\n')) if (l.length) lines.push(l);
}
let seed = 0x6b766b;
const rnd = () => { seed = (Math.imul(seed, 1103515245) + 12345) >>> 0; return seed / 4294967296; };
const parts = [];
let n = 0;
while (n < want) {
  const order = lines.map((l, i) => i);
  for (let i = order.length - 1; i > 0; i--) { const j = Math.floor(rnd() * (i + 1)); [order[i], order[j]] = [order[j], order[i]]; }
  for (const i of order) { parts.push(lines[i]); n += Buffer.byteLength(lines[i]) + 1; if (n >= want) break; }
}
fs.writeFileSync(out, parts.join('\n') + '\n');
