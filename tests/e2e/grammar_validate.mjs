// grammar_validate.mjs - checks what `kvkeep generate --out-dir` wrote under a
// constraint against a real JSON Schema validator (ajv 8 with ajv-formats,
// from tests/node/node_modules). Prints one ok/FAIL line per output.
//   node grammar_validate.mjs schemas SCHEMA_DIR OUT_DIR LABEL
//     every SCHEMA_DIR/NAME.json must have OUT_DIR/NAME: one JSON text that
//     the schema accepts (draft 2020-12 when the schema uses prefixItems,
//     $defs or says so, else draft 7, ajv's default)
//   node grammar_validate.mjs tools TOOLS_FILE OUT_DIR LABEL
//     every tool must have OUT_DIR/NAME.calls.json ({"content", "tool_calls"}
//     as kvkeep's tool-call parser read the completion back): no content, at
//     least one call, every call of that tool, its arguments accepted by the
//     tool's parameters schema
import { createRequire } from 'node:module';
import { readFileSync, readdirSync, existsSync } from 'node:fs';
import { join, dirname } from 'node:path';
import { fileURLToPath } from 'node:url';

const ROOT = join(dirname(fileURLToPath(import.meta.url)), '../..');
const require = createRequire(join(ROOT, 'tests/node/node_modules/'));
let Ajv, Ajv2020, addFormats;
try {
  Ajv = require('ajv').default;
  Ajv2020 = require('ajv/dist/2020').default;
  addFormats = require('ajv-formats').default;
} catch (e) {
  console.log(`FAIL grammar:npm: ajv or ajv-formats is missing from tests/node/node_modules (run make npm): ${e.message}`);
  process.exit(1);
}
const [mode, src, outDir, label] = process.argv.slice(2);
const mk = (cls) => {
  const a = new cls({strict: false, allErrors: true, validateFormats: true});
  addFormats(a);
  return a;
};
const ajv7 = mk(Ajv), ajv20 = mk(Ajv2020);
// OpenAPI's nullable: true means null is allowed too
const openapi = (s) => {
  if (Array.isArray(s)) return s.map(openapi);
  if (!s || typeof s !== 'object') return s;
  const o = {};
  for (const [k, v] of Object.entries(s)) o[k] = k === 'enum' || k === 'const' ? v : openapi(v);
  if (o.nullable === true) { delete o.nullable; return {anyOf: [o, {type: 'null'}]}; }
  return o;
};
const compile = (schema) => {
  const text = JSON.stringify(schema);
  const use20 = text.includes('"prefixItems"') || text.includes('"$defs"') || text.includes('2020-12');
  const s = typeof schema === 'object' && schema ? {...schema} : schema;
  if (s && typeof s === 'object') delete s.$schema;
  return (use20 ? ajv20 : ajv7).compile(openapi(s));
};
const short = (t) => JSON.stringify(t.length > 300 ? t.slice(0, 300) + '...' : t);
let bad = 0, n = 0;
const fail = (name, why) => { console.log(`FAIL grammar:${label}:${name}: ${why}`); bad++; };
if (mode === 'schemas') {
  for (const f of readdirSync(src).filter((x) => x.endsWith('.json')).sort()) {
    n++;
    const out = join(outDir, f);
    if (!existsSync(out)) { fail(f, 'no output (see the generate log)'); continue; }
    const text = readFileSync(out, 'utf8');
    let v;
    try { v = JSON.parse(text); } catch (e) { fail(f, `not JSON: ${e.message}: ${short(text)}`); continue; }
    let validate;
    try { validate = compile(JSON.parse(readFileSync(join(src, f), 'utf8'))); } catch (e) { fail(f, `ajv cannot compile the schema: ${e.message}`); continue; }
    if (!validate(v)) fail(f, `invalid: ${ajv7.errorsText(validate.errors)}: ${short(text)}`);
    else console.log(`ok grammar:${label}:${f}`);
  }
} else {
  const tools = JSON.parse(readFileSync(src, 'utf8'));
  for (const t of tools) {
    const fn = t.function || t;
    n++;
    const out = join(outDir, `${fn.name}.calls.json`);
    if (!existsSync(out)) { fail(fn.name, 'no output (see the generate log)'); continue; }
    const r = JSON.parse(readFileSync(out, 'utf8'));
    const raw = existsSync(join(outDir, `${fn.name}.txt`)) ? readFileSync(join(outDir, `${fn.name}.txt`), 'utf8') : '';
    if (r.content.trim()) { fail(fn.name, `text outside the call: ${short(r.content)} (completion ${short(raw)})`); continue; }
    if (!r.tool_calls.length) { fail(fn.name, `no tool call parsed from ${short(raw)}`); continue; }
    let validate;
    try { validate = compile(fn.parameters || {type: 'object'}); } catch (e) { fail(fn.name, `ajv cannot compile: ${e.message}`); continue; }
    let ok = true;
    for (const c of r.tool_calls) {
      if (c.function.name !== fn.name) { fail(fn.name, `call of ${c.function.name}`); ok = false; break; }
      let args;
      try { args = JSON.parse(c.function.arguments); } catch (e) { fail(fn.name, `arguments are not JSON: ${short(c.function.arguments)}`); ok = false; break; }
      if (!validate(args)) { fail(fn.name, `invalid arguments: ${ajv7.errorsText(validate.errors)}: ${short(c.function.arguments)} (completion ${short(raw)})`); ok = false; break; }
    }
    if (ok) console.log(`ok grammar:${label}:${fn.name}`);
  }
}
if (!n) { console.log(`FAIL grammar:${label}: nothing to check in ${src}`); bad++; }
process.exit(bad ? 1 : 0);
