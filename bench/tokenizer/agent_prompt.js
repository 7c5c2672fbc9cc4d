#!/usr/bin/env node
// agent_prompt.js CORPUS_DIR OUT [TARGET_BYTES] - a deterministic agent
// prompt in Qwen3's ChatML layout, the kind the server tokenizes on every
// turn: a system prompt, 30 tool schemas in a <tools> block, then a history
// of user messages, <tool_call>s and <tool_response>s (file contents taken
// from the tokenizer test corpus), ending with the generation prompt.
// TARGET_BYTES (default 110000, about 30K Qwen3 tokens) bounds the history.
'use strict';
const fs = require('fs');
const path = require('path');
const [dir, out, targetArg] = process.argv.slice(2);
const target = targetArg ? parseInt(targetArg, 10) : 110000;

const files = fs.readdirSync(dir).filter(f => !f.endsWith('.md')).sort()
  .map(f => ({ name: f, text: fs.readFileSync(path.join(dir, f), 'utf8') }));

const verbs = ['read', 'write', 'search', 'list', 'delete', 'move', 'run', 'fetch', 'create', 'update'];
const nouns = ['file', 'directory', 'issue', 'branch'];
const tools = [];
for (let i = 0; tools.length < 30; i++) {
  const v = verbs[i % verbs.length], n = nouns[Math.floor(i / verbs.length) % nouns.length];
  tools.push({
    type: 'function',
    function: {
      name: `${v}_${n}`,
      description: `${v[0].toUpperCase()}${v.slice(1)} a ${n} in the workspace. Returns a JSON object with ` +
        `"ok", "result" and, on failure, "error" (a message meant for the model). Paths are relative to the ` +
        `repository root; at most ${16 * (i + 1)} KiB of output is returned.`,
      parameters: {
        type: 'object',
        properties: {
          path: { type: 'string', description: `Path of the ${n}, e.g. "src/cache/radix.c".` },
          recursive: { type: 'boolean', default: false, description: 'Apply to everything below the path.' },
          limit: { type: 'integer', minimum: 1, maximum: 1000, default: 100 },
          pattern: { type: ['string', 'null'], description: 'Optional regular expression filter (PCRE).' },
          mode: { type: 'string', enum: ['fast', 'exact', 'dry-run'] },
        },
        required: i % 3 === 0 ? ['path'] : ['path', 'mode'],
        additionalProperties: false,
      },
    },
  });
}

let p = '<|im_start|>system\n';
p += 'You are a careful software engineering agent working in a C code base. Read before you write, keep ' +
  'changes small, run the tests after every change, and explain what you did in plain sentences. Never ' +
  'invent file contents: read them with the tools. When a tool fails, read its error and try a different ' +
  'approach instead of repeating the same call.\n\n';
p += '# Tools\n\nYou may call one or more functions to assist with the user query.\n\n' +
  'You are provided with function signatures within <tools></tools> XML tags:\n<tools>';
for (const t of tools) p += '\n' + JSON.stringify(t);
p += '\n</tools>\n\nFor each function call, return a json object with function name and arguments within ' +
  '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n' +
  '</tool_call><|im_end|>\n';
p += '<|im_start|>user\nThe tokenizer tests fail on some inputs. Please look at the test corpus and tell me ' +
  'which files contain unusual characters.<|im_end|>\n';
for (let k = 0; Buffer.byteLength(p) < target; k++) {
  const f = files[k % files.length];
  p += '<|im_start|>assistant\n<think>\nI should read ' + f.name + ' to see what it contains.\n</think>\n\n' +
    '<tool_call>\n' + JSON.stringify({ name: 'read_file', arguments: { path: 'tests/data/tokenizer/' + f.name } }) +
    '\n</tool_call><|im_end|>\n';
  p += '<|im_start|>user\n<tool_response>\n' + JSON.stringify({ ok: true, result: f.text }) +
    '\n</tool_response><|im_end|>\n';
}
p += '<|im_start|>user\nThanks. Summarise what you found in three sentences.<|im_end|>\n<|im_start|>assistant\n';
fs.writeFileSync(out, p);
