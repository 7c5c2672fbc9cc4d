// extract_suite.mjs - the schemas of the official JSON Schema Test Suite
// (draft 4, MIT licence, npm package json-schema-test-suite 0.0.10) for the
// keywords the constraint engine supports, rewritten to draft 7 where draft 4
// differs (boolean exclusiveMinimum / exclusiveMaximum) so ajv's default
// draft checks them. Groups that need what the engine does not claim
// (remote $refs, the meta-schema, oneOf branches that overlap) are left out.
//   node extract_suite.mjs SUITE_DIR OUT_DIR
import fs from 'node:fs';
import path from 'node:path';

const [suite, out] = process.argv.slice(2);
const files = ['additionalItems', 'additionalProperties', 'allOf', 'anyOf', 'default', 'definitions', 'enum', 'items',
  'maxItems', 'maxLength', 'maximum', 'minItems', 'minLength', 'minimum', 'oneOf', 'pattern', 'properties', 'ref',
  'required', 'type'];
// groups whose schema the engine does not claim (by description)
const skip = [/remote/i, /metaschema|meta-schema/i, /root pointer ref/i, /oneOf$/, /oneOf with base schema/i,
  /escaped pointer ref/i, /nested refs/i, /change resolution scope/i, /ref overrides any sibling/i,
  /\$ref to boolean/i, /property named \$ref/i, /Recursive references between schemas/i];
const draft7 = (v) => {
  if (Array.isArray(v)) return v.map(draft7);
  if (v && typeof v === 'object') {
    const o = {};
    for (const [k, x] of Object.entries(v)) o[k] = draft7(x);
    if (o.exclusiveMinimum === true) { o.exclusiveMinimum = o.minimum; delete o.minimum; }
    if (o.exclusiveMaximum === true) { o.exclusiveMaximum = o.maximum; delete o.maximum; }
    if (o.exclusiveMinimum === false) delete o.exclusiveMinimum;
    if (o.exclusiveMaximum === false) delete o.exclusiveMaximum;
    return o;
  }
  return v;
};
let n = 0;
for (const f of files) {
  const groups = JSON.parse(fs.readFileSync(path.join(suite, 'tests', 'draft4', f + '.json')));
  groups.forEach((g, i) => {
    if (skip.some((r) => r.test(g.description))) return;
    const s = JSON.stringify(g.schema);
    if (s.includes('http') || s.includes('"not"') || s.includes('uniqueItems":true')) return;
    fs.writeFileSync(path.join(out, `suite__${f}__${i}.json`), JSON.stringify(draft7(g.schema), null, 1) + '\n');
    n++;
  });
}
console.log(n, 'schemas');
