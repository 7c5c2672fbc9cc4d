/*
 * tokjson.h - internal to src/text/: the streaming tokenizer.json reader
 * of tokenizer.c (tokjson.c).
 *
 * Not a general JSON reader: it knows the two big values of a
 * tokenizer.json and nothing else, so it stays in the text layer. Every
 * other JSON in kvkeep goes through jansson (base/json.h).
 */
#ifndef KV_TEXT_TOKJSON_H
#define KV_TEXT_TOKJSON_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "base/buf.h"

/*
 * A Qwen3 tokenizer.json is 11 MB, nearly all of it model.vocab (151K
 * "token": id pairs) and model.merges (151K pairs). Building a jansson DOM
 * of that (450K nodes) was most of the load time, so this reader streams
 * those two values into flat arrays and hands every other value (all
 * small) to jansson, which keeps validating them. The reader itself is
 * strict JSON (RFC 8259) for what it parses: UTF-8 checked, escapes
 * decoded (\u0000 allowed, lone surrogates refused), duplicate keys
 * refused, nesting limited to KV_JSON_MAX_DEPTH.
 */
struct tj_str {
	uint32_t off, len;      /* bytes in tj.arena */
};

struct tj_vocab {
	struct tj_str s;
	int64_t id;             /* -1: the value was not an integer in range */
};

struct tj_merge {
	struct tj_str a, b;     /* a.len == UINT32_MAX: not "a b" nor ["a", "b"] */
	int pair;               /* 1 if written as ["a", "b"] */
};

struct tj {
	const char *what;
	const char *p;          /* input */
	size_t n, i;            /* length, cursor */
	int depth;
	struct kv_buf arena;    /* decoded strings */
	json_t *root;           /* everything except model.vocab / model.merges */
	struct tj_vocab *vocab;
	size_t n_vocab, c_vocab;
	struct tj_merge *merges;
	size_t n_merges, c_merges;
	int has_vocab, has_merges; /* model.vocab was an object / model.merges an array */
	const char *ctx;        /* key whose value is being read, for messages */
};

/* Read tokenizer.json text p[0..n) (`what` names it in messages) into r:
 * model.vocab and model.merges into r->vocab / r->merges (strings in
 * r->arena), everything else into r->root. KV_ERR_INVALID naming the
 * field on malformed JSON. kv_tokjson_free(r) afterwards, also on error. */
int kv_tokjson_read(struct tj *r, const char *p, size_t n, const char *what);
void kv_tokjson_free(struct tj *r);

#endif
