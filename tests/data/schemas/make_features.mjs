// make_features.mjs - kvkeep's own JSON Schema cases for the constraint
// engine (written for this project): one per supported keyword and form,
// recursive schemas, and agent-style combinations. Writes feat__NAME.json and
// rec__NAME.json into OUT_DIR.   node make_features.mjs OUT_DIR
import fs from 'node:fs';
import path from 'node:path';

const out = process.argv[2];
const S = (props, req, extra = {}) => ({type: 'object', properties: props, required: req, additionalProperties: false, ...extra});
const str = {type: 'string'}, int = {type: 'integer'}, num = {type: 'number'}, bool = {type: 'boolean'};
const feat = {
  string: str, integer: int, number: num, boolean: bool, null: {type: 'null'},
  any: {}, any_true: true, object_free: {type: 'object'}, array_free: {type: 'array'},
  type_list: {type: ['string', 'integer', 'null']}, type_list2: {type: ['boolean', 'array']},
  nullable_openapi: {type: 'string', nullable: true}, nullable_object: {...S({a: int}, ['a']), nullable: true},
  enum_strings: {enum: ['red', 'green', 'blue']}, enum_mixed: {enum: ['a', 1, 2.5, true, null, {x: [1, 2]}, [3]]},
  enum_typed: {type: 'string', enum: ['x', 'y', 3]}, enum_escapes: {enum: ['quote"d', 'back\\slash', 'new\nline', 'tab\t', 'ünïcödé', '日本語']},
  const_string: {const: 'fixed'}, const_object: {const: {a: 1, b: [true, null], c: 'x'}}, const_number: {const: 3.25},
  int_min: {type: 'integer', minimum: 1}, int_max: {type: 'integer', maximum: -3}, int_range: {type: 'integer', minimum: -20, maximum: 37},
  int_range_big: {type: 'integer', minimum: 100, maximum: 123456}, int_excl: {type: 'integer', exclusiveMinimum: 0, exclusiveMaximum: 10},
  int_neg_range: {type: 'integer', minimum: -1000, maximum: -999}, int_zero_only: {type: 'integer', minimum: 0, maximum: 0},
  int_frac_bounds: {type: 'integer', minimum: 0.5, maximum: 7.5},
  num_min0: {type: 'number', minimum: 0}, num_excl0: {type: 'number', exclusiveMinimum: 0}, num_unit: {type: 'number', minimum: 0, maximum: 1},
  num_range: {type: 'number', minimum: -2.5, maximum: 10}, num_excl_max: {type: 'number', exclusiveMaximum: 100},
  num_neg: {type: 'number', maximum: -1}, num_neg_excl: {type: 'number', minimum: -5, exclusiveMaximum: 0},
  num_multiple1: {type: 'number', multipleOf: 1},
  str_min: {type: 'string', minLength: 3}, str_max: {type: 'string', maxLength: 5}, str_range: {type: 'string', minLength: 2, maxLength: 4},
  str_exact: {type: 'string', minLength: 6, maxLength: 6}, str_huge_max: {type: 'string', maxLength: 524288},
  pat_anchored: {type: 'string', pattern: '^[a-z]+[0-9]{2,3}$'}, pat_unanchored: {type: 'string', pattern: 'ab+c'},
  pat_alt: {type: 'string', pattern: '^(foo|ba[rz])(-[A-Z])?$'}, pat_escapes: {type: 'string', pattern: '^\\d{3}-\\w+\\s\\S$'},
  pat_class_neg: {type: 'string', pattern: '^[^"\\\\]{1,8}$'}, pat_dot: {type: 'string', pattern: '^a.c$'},
  pat_quotes: {type: 'string', pattern: '^"[^"]*"$'}, pat_unicode: {type: 'string', pattern: '^[à-ÿ日本]+$'},
  pat_simple_lines: {type: 'string', pattern: '^[^\\n\\r]*$'}, pat_two_simple: {type: 'string', allOf: [{pattern: '^[^\\n\\r]*$'}, {pattern: '^[\\s\\S]{0,30}$'}]},
  pat_with_length: {type: 'string', pattern: '^[a-f0-9]+$', maxLength: 12}, pat_lazy: {type: 'string', pattern: '^x.*?y$'},
  fmt_date: {type: 'string', format: 'date'}, fmt_time: {type: 'string', format: 'time'}, fmt_datetime: {type: 'string', format: 'date-time'},
  fmt_uuid: {type: 'string', format: 'uuid'}, fmt_email: {type: 'string', format: 'email'}, fmt_hostname: {type: 'string', format: 'hostname'},
  fmt_ipv4: {type: 'string', format: 'ipv4'}, fmt_uri: {type: 'string', format: 'uri'}, fmt_uri_ref: {type: 'string', format: 'uri-reference'},
  obj_required: S({a: str, b: int, c: bool}, ['a', 'b', 'c']), obj_optional: S({a: str, b: int, c: bool}, []),
  obj_mixed: S({a: str, b: int, c: bool, d: num}, ['b', 'd']), obj_last_required: S({a: str, b: int, c: bool}, ['c']),
  obj_addl_true: {type: 'object', properties: {a: int}, required: ['a'], additionalProperties: true},
  obj_addl_schema: {type: 'object', properties: {a: int}, additionalProperties: {type: 'string', maxLength: 3}},
  obj_map: {type: 'object', additionalProperties: {type: 'integer'}}, obj_required_only: {type: 'object', required: ['x', 'y']},
  obj_implied: {properties: {k: {enum: [1, 2]}}, required: ['k']}, obj_escaped_keys: S({'a"b': int, 'c\\d': str, 'é': bool}, ['a"b']),
  obj_false_prop: {type: 'object', properties: {a: int, b: false}, additionalProperties: false},
  obj_minprops_ok: {...S({a: int, b: int}, ['a']), minProperties: 1, maxProperties: 2},
  obj_nested: S({user: S({name: str, age: {type: 'integer', minimum: 0, maximum: 150}}, ['name']), tags: {type: 'array', items: str}}, ['user']),
  arr_items: {type: 'array', items: int}, arr_min: {type: 'array', items: str, minItems: 2}, arr_max: {type: 'array', items: bool, maxItems: 2},
  arr_exact: {type: 'array', items: {enum: ['a', 'b']}, minItems: 3, maxItems: 3}, arr_range: {type: 'array', items: num, minItems: 1, maxItems: 4},
  arr_prefix: {type: 'array', prefixItems: [str, int], items: false}, arr_prefix_rest: {type: 'array', prefixItems: [bool], items: int, minItems: 2},
  arr_prefix_open: {type: 'array', prefixItems: [int, str]}, arr_tuple_draft7: {type: 'array', items: [int, str], additionalItems: false},
  arr_of_objects: {type: 'array', items: S({id: int, label: str}, ['id']), maxItems: 5}, arr_nested: {type: 'array', items: {type: 'array', items: int, maxItems: 3}},
  anyof_types: {anyOf: [str, int, S({k: bool}, ['k'])]}, anyof_siblings: {type: 'object', properties: {a: int, b: str}, additionalProperties: false, anyOf: [{required: ['a']}, {required: ['b']}]},
  oneof_disjoint: {oneOf: [{type: 'string'}, {type: 'integer'}]}, oneof_tagged: {oneOf: [S({kind: {const: 'a'}, x: int}, ['kind', 'x']), S({kind: {const: 'b'}, y: str}, ['kind', 'y'])]},
  allof_objects: {allOf: [{type: 'object', properties: {a: int}, required: ['a']}, {properties: {b: str}, required: ['b']}]},
  allof_closed: {allOf: [S({a: int}, ['a']), {properties: {a: {maximum: 3}, b: str}}]},
  allof_same_prop: {allOf: [S({a: {type: 'integer', minimum: 0}}, ['a']), S({a: {type: 'integer', maximum: 9}}, ['a'])]},
  ref_defs: {$defs: {pt: S({x: num, y: num}, ['x', 'y'])}, type: 'object', properties: {from: {$ref: '#/$defs/pt'}, to: {$ref: '#/$defs/pt'}}, required: ['from', 'to'], additionalProperties: false},
  ref_definitions: {definitions: {id: {type: 'string', pattern: '^[A-Z]{3}$'}}, type: 'array', items: {$ref: '#/definitions/id'}, maxItems: 3},
  ref_pointer: {type: 'object', properties: {a: {type: 'integer', minimum: 5}, b: {$ref: '#/properties/a'}}, required: ['b'], additionalProperties: false},
  ref_sibling_desc: {$defs: {v: {enum: [1, 2, 3]}}, $ref: '#/$defs/v', description: 'annotation only'},
  unknown_annotations: {type: 'string', 'x-vendor': {any: 'thing'}, markdownDescription: 'text', deprecated: true, readOnly: true},
  deep_nesting: S({a: S({b: S({c: S({d: {type: 'array', items: S({e: {type: 'string', maxLength: 4}}, ['e'])}}, ['d'])}, ['c'])}, ['b'])}, ['a']),
};
const rec = {
  tree: {$defs: {node: S({value: int, children: {type: 'array', items: {$ref: '#/$defs/node'}, maxItems: 3}}, ['value'])}, $ref: '#/$defs/node'},
  linked_list: {$defs: {cell: S({head: str, tail: {anyOf: [{$ref: '#/$defs/cell'}, {type: 'null'}]}}, ['head', 'tail'])}, $ref: '#/$defs/cell'},
  root_ref: {type: 'object', properties: {name: str, child: {$ref: '#'}}, required: ['name'], additionalProperties: false},
  json_value: {$defs: {v: {anyOf: [str, num, bool, {type: 'null'}, {type: 'array', items: {$ref: '#/$defs/v'}}, {type: 'object', additionalProperties: {$ref: '#/$defs/v'}}]}}, $ref: '#/$defs/v'},
  expr: {$defs: {e: {anyOf: [{type: 'integer'}, S({op: {enum: ['+', '*']}, args: {type: 'array', items: {$ref: '#/$defs/e'}, minItems: 2, maxItems: 2}}, ['op', 'args'])]}}, $ref: '#/$defs/e'},
  mutual: {$defs: {a: S({b: {$ref: '#/$defs/b'}}, []), b: S({a: {$ref: '#/$defs/a'}, n: int}, ['n'])}, $ref: '#/$defs/a'},
  menu: {definitions: {item: S({label: str, items: {type: 'array', items: {$ref: '#/definitions/item'}}}, ['label'])}, type: 'array', items: {$ref: '#/definitions/item'}, maxItems: 2},
  file_tree: {$defs: {entry: {oneOf: [S({file: str, size: {type: 'integer', minimum: 0}}, ['file']), S({dir: str, entries: {type: 'array', items: {$ref: '#/$defs/entry'}}}, ['dir', 'entries'])]}}, $ref: '#/$defs/entry'},
  free_object_args: S({tool: str, input: {type: 'object'}}, ['tool', 'input']),
  nested_free: {type: 'object', properties: {meta: {}, data: {type: 'array'}}, required: ['meta', 'data'], additionalProperties: false},
};
for (const [k, v] of Object.entries(feat)) fs.writeFileSync(path.join(out, `feat__${k}.json`), JSON.stringify(v, null, 1) + '\n');
for (const [k, v] of Object.entries(rec)) fs.writeFileSync(path.join(out, `rec__${k}.json`), JSON.stringify(v, null, 1) + '\n');
console.log(Object.keys(feat).length, 'features,', Object.keys(rec).length, 'recursive');
