#!/usr/bin/env node
// tok_ucd.js OUT.h - generates src/text/tokenizer_ucd.h, the table of code
// points whose regex class differs between the oracle's regex engine
// (Oniguruma inside Hugging Face's tokenizers, through @anush008/tokenizers)
// and PCRE2 10.42 (Debian 12; Unicode 14 tables, like Debian's Python 3.11
// unicodedata, which stands in for PCRE2 here), with a stand-in code point
// for each: same UTF-8 length, and the oracle's class as PCRE2 sees it.
//
// Classes compared: the general category (what \p{L}, \p{Lu}, \p{N},
// \p{M}, \p{P}, \p{S}, \p{Z}, \p{C} test) and \s. Takes about five minutes
// (one oracle pass over all 1.1M code points per class). Run with Debian's
// /usr/bin/python3 available; the tokenizer e2e test checks the result.
'use strict';
const fs = require('fs');
const { execFileSync } = require('child_process');
const { Tokenizer } = require('@anush008/tokenizers');

const out = process.argv[2];
if (!out) { console.error('usage: tok_ucd.js OUT.h'); process.exit(2); }

const GCS = ['Lu', 'Ll', 'Lt', 'Lm', 'Lo', 'Mn', 'Mc', 'Me', 'Nd', 'Nl', 'No', 'Pc', 'Pd', 'Ps', 'Pe', 'Pi', 'Pf',
  'Po', 'Sm', 'Sc', 'Sk', 'So', 'Zs', 'Zl', 'Zp', 'Cc', 'Cf', 'Co'];  // Cs never occurs in UTF-8; rest = Cn

// PCRE2's side first (needed to pick the candidates)
// PCRE2 10.42's view: Unicode 14 general categories; \s with UCP is
// \p{Z} plus \h and \v, whose lists add TAB, LF, VT, FF, CR, NEL and U+180E
const py = execFileSync('/usr/bin/python3', ['-c', `
import unicodedata, sys
print(unicodedata.unidata_version)
sys.stdout.write(''.join(chr(48 + ${JSON.stringify(GCS)}.index(unicodedata.category(chr(c)))) if unicodedata.category(chr(c)) in ${JSON.stringify(GCS)} else '~' for c in range(0x110000)))
`], { maxBuffer: 1 << 23 }).toString();
const [pyVersion, pyCats] = [py.slice(0, py.indexOf('\n')), py.slice(py.indexOf('\n') + 1)];
if (pyVersion !== '14.0.0') throw new Error(`python unicodedata is ${pyVersion}, expected 14.0.0 (PCRE2 10.42)`);
const pcreGc = c => (pyCats[c] === '~' ? 255 : pyCats.charCodeAt(c) - 48);
const H_V = new Set([0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x85, 0x180E]);
const pcreSpace = c => { const g = pcreGc(c); return (g !== 255 && GCS[g][0] === 'Z') || H_V.has(c) ? 1 : 0; };


// Candidates: code points whose category in Node's ICU (a newer Unicode
// than the oracle's) differs from Unicode 14. Everything that changed in
// the oracle's version changed there too; the oracle decides the rest.
const JS_GC = GCS.map(g => new RegExp(`^\\p{gc=${g}}$`, 'u'));
const cand = [];
for (let c = 0; c <= 0x10FFFF; c++) {
  if (c >= 0xD800 && c <= 0xDFFF) continue;
  const ch = String.fromCodePoint(c);
  let g = 255;
  for (let k = 0; k < GCS.length; k++) if (JS_GC[k].test(ch)) { g = k; break; }
  if (g !== pcreGc(c)) cand.push(c);
}
process.stderr.write(`${cand.length} candidate code points\n`);

// The oracle's class of code points: split them with a run of the class,
// behaviour Removed; what is left (in code point offsets) is outside it.
function oracleClass(cls, list) {
  const j = { version: '1.0', added_tokens: [], normalizer: null, post_processor: null, decoder: null,
    pre_tokenizer: { type: 'Split', pattern: { Regex: cls + '+' }, behavior: 'Removed', invert: false },
    model: { type: 'BPE', vocab: { a: 0 }, merges: [] } };
  const pt = Tokenizer.fromString(JSON.stringify(j)).getPreTokenizer();
  const text = list.map(c => String.fromCodePoint(c)).join('');
  const inClass = new Uint8Array(0x110000);
  for (const c of list) inClass[c] = 1;
  for (const [, [a, b]] of pt.preTokenizeString(text))
    for (let k = a; k < b; k++) inClass[list[k]] = 0;
  return inClass;
}
const t0 = Date.now();
const onigGc = new Uint8Array(0x110000);
for (let c = 0; c < 0x110000; c++) onigGc[c] = c >= 0xD800 && c <= 0xDFFF ? 255 : pcreGc(c);
for (const c of cand) onigGc[c] = 255;
GCS.forEach((gc, gi) => {
  const s = oracleClass(`\\p{${gc}}`, cand);
  for (const c of cand) if (s[c]) onigGc[c] = gi;
});
const all = [];
for (let c = 0; c <= 0x10FFFF; c++) if (c < 0xD800 || c > 0xDFFF) all.push(c);
const onigSpace = oracleClass('\\s', all);
process.stderr.write(`oracle classes in ${((Date.now() - t0) / 1000).toFixed(0)} s\n`);

const ulen = c => (c < 0x80 ? 1 : c < 0x800 ? 2 : c < 0x10000 ? 3 : 4);
// a stand-in for (gc, space, length): a code point PCRE2 puts in that class,
// outside the table, with no case mapping (so (?i:...) cannot match it)
const standins = new Map();
function standin(g, sp, len) {
  const key = `${g},${sp},${len}`;
  if (standins.has(key)) return standins.get(key);
  let found = -1;
  for (let c = 0x80; c < 0x110000 && found < 0; c++) {
    if (c >= 0xD800 && c <= 0xDFFF) continue;
    if (ulen(c) !== len || pcreGc(c) !== g || pcreSpace(c) !== sp) continue;
    if (onigGc[c] !== g || onigSpace[c] !== sp) continue; // agreed on by both engines
    const ch = String.fromCodePoint(c);
    if (ch.toLowerCase() !== ch || ch.toUpperCase() !== ch) continue;
    found = c;
  }
  standins.set(key, found);
  return found;
}

const ranges = [];
for (let c = 0; c < 0x110000; c++) {
  if (c >= 0xD800 && c <= 0xDFFF) continue;
  if (onigGc[c] === pcreGc(c) && onigSpace[c] === pcreSpace(c)) continue;
  const s = standin(onigGc[c], onigSpace[c], ulen(c));
  if (s < 0) throw new Error(`no stand-in for U+${c.toString(16)} (${GCS[onigGc[c]] || 'Cn'}, space ${onigSpace[c]})`);
  const last = ranges[ranges.length - 1];
  if (last && last.hi === c - 1 && last.s === s) last.hi = c;
  else ranges.push({ lo: c, hi: c, s, gc: GCS[onigGc[c]] || 'Cn', sp: onigSpace[c], was: GCS[pcreGc(c)] || 'Cn',
    wassp: pcreSpace(c) });
}
const hex = c => '0x' + c.toString(16).toUpperCase().padStart(4, '0');
let h = `/*
 * tokenizer_ucd.h - generated by tests/node/tok_ucd.js; do not edit.
 *
 * Code points whose regex class (general category, and \\s) differs between
 * the oracle's regex engine (Oniguruma in Hugging Face's tokenizers) and
 * PCRE2 10.42 (Unicode 14 tables), each with a stand-in that PCRE2 puts in
 * the oracle's class and that has the same UTF-8 length. The pre-tokenizer
 * runs the Split regex over a copy of the text with these replaced, so the
 * regex itself stays verbatim and the pieces match the oracle's.
 * ${ranges.reduce((n, r) => n + r.hi - r.lo + 1, 0)} code points in ${ranges.length} ranges.
 */
#ifndef KV_TEXT_TOKENIZER_UCD_H
#define KV_TEXT_TOKENIZER_UCD_H

#include <stdint.h>

struct kv_tok_ucd_fix {
	uint32_t lo, hi;  /* code point range, inclusive */
	uint32_t standin; /* replacement seen by the regex */
};

static const struct kv_tok_ucd_fix KV_TOK_UCD_FIX[] = {
`;
for (const r of ranges)
  h += `\t{${hex(r.lo)}, ${hex(r.hi)}, ${hex(r.s)}}, /* ${r.was}${r.wassp ? ' \\s' : ''} -> ${r.gc}${r.sp ? ' \\s' : ''} */\n`;
h += '};\n\n#endif\n';
fs.writeFileSync(out, h);
process.stderr.write(`wrote ${out}: ${ranges.length} ranges\n`);
