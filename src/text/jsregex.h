/*
 * jsregex.h - a subset of ECMAScript regular expressions (JSON Schema
 * "pattern", and the string formats, which jschema.c writes as patterns)
 * compiled into the grammar IR (gram.h).
 *
 * The expression matches the strings s for which the pattern finds a
 * match in s (JSON Schema patterns are not anchored: "ab" accepts "xaby";
 * a top-level alternative that starts with ^ / ends with $ is anchored at
 * that end). The strings are written as the content of a JSON string
 * (KV_RX_JSON: '"', '\' and control characters as escapes) or as raw text
 * (KV_RX_RAW: the Qwen3.5 tool-call parameter values).
 *
 * Supported: literals (UTF-8), escapes \d \D \w \W \s \S \n \r \t \f \v
 * \0 \xHH \uHHHH \u{H..} and escaped punctuation, '.', classes [...] and
 * [^...] with ranges and class escapes, groups ( ), (?: ), (?<name> ),
 * alternation |, quantifiers * + ? {n} {n,} {n,m} (lazy forms too: they
 * match the same strings), ^ and $ at the ends of top-level alternatives.
 * Not supported (KV_ERR_UNSUPPORTED naming it): lookahead and lookbehind,
 * back-references, \b \B, \p{..} property classes, anchors elsewhere.
 */
#ifndef KV_TEXT_JSREGEX_H
#define KV_TEXT_JSREGEX_H

#include <stddef.h>
#include <stdint.h>

#include "text/gram.h"

enum { KV_RX_JSON = 0, KV_RX_RAW = 1 };

struct kv_rx_opts {
	int mode;    /* KV_RX_JSON or KV_RX_RAW */
	int no_lt;   /* never a raw '<': JSON writes it as \u003c, RAW leaves it out
		      * (the tool-call grammars keep their closing tags out of values) */
};

/* pat[0..n): an expression in g (*expr). Errors name the construct and
 * its offset in the pattern. */
int kv_rx_compile(struct kv_gram *g, const char *pat, size_t n, const struct kv_rx_opts *o, int *expr);

/* One character of the code point class (pairs as kv_gram_cps), encoded
 * for the mode: the building block of every string the JSON Schema
 * compiler writes. -1 on a (sticky) grammar error. */
int kv_rx_class(struct kv_gram *g, const uint32_t *pairs, int n, int negate, const struct kv_rx_opts *o);

/*
 * A pattern that only bounds which characters and how many: ^C*$, ^C+$,
 * ^C?$, ^C{m}$, ^C{m,}$, ^C{m,n}$ with C a class, '.' or a class escape.
 * 1 with the class as sorted, merged code point ranges (*pairs, malloc'd,
 * n_pairs of them), *min and *max (-1: none); else 0. The JSON Schema
 * compiler intersects several such patterns (allOf) and length bounds.
 */
int kv_rx_simple(const char *pat, size_t n, uint32_t **pairs, int *n_pairs, int *min, int *max);

#endif
