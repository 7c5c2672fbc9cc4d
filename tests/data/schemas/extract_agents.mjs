// extract_agents.mjs - turns captured agent requests into the corpus's tool
// schemas (tests/data/schemas/README.md says how the requests were captured).
//   node extract_agents.mjs CAPTURE_DIR OUT_DIR
// CAPTURE_DIR holds claude/*.json, codex/*.json, opencode/*.json, qwen/*.json:
// {"method", "url", "body"} of each request an agent CLI sent. Descriptions,
// titles and examples are dropped: only the structure of the schemas is kept.
import fs from 'node:fs';
import path from 'node:path';

const [cap, out] = process.argv.slice(2);
const strip = (v) => {
  if (Array.isArray(v)) return v.map(strip);
  if (v && typeof v === 'object') {
    const o = {};
    for (const [k, x] of Object.entries(v)) {
      if (['description', 'title', 'examples', 'markdownDescription'].includes(k) && typeof x !== 'object') continue;
      if (k === 'examples') continue;
      o[k] = strip(x);
    }
    return o;
  }
  return v;
};
const agents = {claude: 'claude_code', codex: 'codex', opencode: 'opencode', qwen: 'qwen_code'};
for (const [dir, agent] of Object.entries(agents)) {
  const tools = new Map();
  for (const f of fs.readdirSync(path.join(cap, dir)).sort()) {
    let body;
    try { body = JSON.parse(JSON.parse(fs.readFileSync(path.join(cap, dir, f))).body); } catch { continue; }
    for (const t of body.tools || []) {
      const name = t.name || (t.function && t.function.name);
      const params = t.input_schema || t.parameters || (t.function && t.function.parameters);
      if (!name || !params || tools.has(name)) continue;
      tools.set(name, strip(params));
    }
  }
  const arr = [];
  for (const [name, params] of [...tools.entries()].sort()) {
    fs.writeFileSync(path.join(out, 'json', `${agent}__${name}.json`), JSON.stringify(params, null, 1) + '\n');
    arr.push({type: 'function', function: {name, parameters: params}});
  }
  fs.writeFileSync(path.join(out, 'tools', `${agent}.json`), JSON.stringify(arr, null, 1) + '\n');
  console.log(agent, arr.length, 'tools');
}
