/*
 * json.h - small helpers over jansson with kvkeep's error convention.
 *
 * Untrusted JSON (HTTP bodies, files from disk) is parsed with a depth
 * limit, since jansson's own limit (2048) is deep enough to be slow.
 */
#ifndef KV_BASE_JSON_H
#define KV_BASE_JSON_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#define KV_JSON_MAX_DEPTH 128

/* Parse bytes; KV_ERR_INVALID with "what: line L column C: reason". The
 * depth of arrays/objects is checked before parsing. *out is a new ref.
 *
 * Every JSON number is accepted. jansson holds integers in int64 and reals
 * in double and refuses the rest ("too big integer", "real number
 * overflow"); such a number (18446744073709551615, 1e400) is kept as a
 * "number literal" instead: a string value that kv_json_number_literal
 * recognises and that holds the literal text exactly as sent. Code that
 * wants a number sees a string and refuses it as usual; the chat template
 * renders it as Python's json.loads + json.dumps would (big integers digit
 * for digit, an overflowing real as Infinity). The string is
 * "\0kvnum-<16 hex>:<literal>" with a random per-process tag, so no
 * client string can pass for one. The rewrite runs only when jansson has
 * refused the text, so ordinary bodies cost nothing extra. */
int kv_json_parse(const char *what, const char *p, size_t n, int max_depth, json_t **out);
/* 1 when v is a number literal made by kv_json_parse: *lit (borrowed from
 * v) and *n are its text, a valid JSON number; 0 otherwise. */
int kv_json_number_literal(const json_t *v, const char **lit, size_t *n);
/* Read and parse a file no larger than max_len. */
int kv_json_load_file(const char *path, size_t max_len, json_t **out);
/* Nesting depth of the JSON text (strings skipped); a cheap pre-check. */
int kv_json_text_depth(const char *p, size_t n);

/* Typed getters: missing key -> *out = def, KV_OK. Present with a wrong
 * type -> KV_ERR_INVALID naming `what` and the key. */
int kv_json_get_int(const json_t *obj, const char *key, int64_t def, int64_t *out, const char *what);
int kv_json_get_num(const json_t *obj, const char *key, double def, double *out, const char *what);
int kv_json_get_bool(const json_t *obj, const char *key, int def, int *out, const char *what);
/* Borrowed pointer valid as long as obj; missing -> def. */
int kv_json_get_str(const json_t *obj, const char *key, const char *def, const char **out, const char *what);

#endif
