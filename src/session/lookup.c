/*
 * lookup.c - see lookup.h.
 *
 * Invariant: the n-grams ending at positions [0, indexed) are in the
 * tables, and indexed <= len - 1: an n-gram is entered only once a token
 * follows it, so every candidate has a continuation and the suffix being
 * looked up never finds itself.
 */
#include "session/lookup.h"
#include "base/err.h"
#include "base/mem.h"

#include <stdlib.h>
#include <string.h>

#define NG 3          /* n-gram sizes 1..NG */
#define MIN_SLOTS (1u << 12)
#define MAX_SLOTS (1u << 20)

struct kss_lookup {
	int32_t *tok;         /* the history */
	uint32_t len, cap;
	uint32_t indexed;     /* n-grams ending before this are in the tables */
	uint32_t mask;        /* slots - 1 */
	uint32_t *tab[NG];    /* [slots]: end position + 1 of the n-gram, 0 empty */
	uint32_t src, src_len; /* the last draft's source: candidate end src, history length src_len (0: none) */
};

/* The n tokens ending at t[end] (inclusive). */
static uint32_t key(const int32_t *t, uint32_t end, int n)
{
	uint64_t h = 0x9E3779B97F4A7C15ull * (uint64_t)(n + 1);
	for (int i = n - 1; i >= 0; i--) {
		h ^= (uint32_t)t[end - (uint32_t)i];
		h *= 0xBF58476D1CE4E5B9ull;
		h ^= h >> 29;
	}
	return (uint32_t)(h >> 32);
}

int kss_lookup_create(uint32_t expect, struct kss_lookup **out)
{
	*out = NULL;
	struct kss_lookup *l = calloc(1, sizeof *l);
	if (!l)
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	uint32_t slots = MIN_SLOTS;
	while (slots < MAX_SLOTS && slots < 2ull * expect)
		slots <<= 1;
	l->mask = slots - 1;
	for (int i = 0; i < NG; i++)
		if (!(l->tab[i] = kv_zalloc(KV_MEM_OTHER, (size_t)slots * sizeof *l->tab[i]))) {
			kss_lookup_destroy(l);
			return kv_fail(KV_ERR_NOMEM, "prompt lookup: %u slots", slots);
		}
	*out = l;
	return KV_OK;
}

void kss_lookup_destroy(struct kss_lookup *l)
{
	if (!l)
		return;
	for (int i = 0; i < NG; i++)
		kv_free(l->tab[i]);
	kv_free(l->tok);
	free(l);
}

uint32_t kss_lookup_len(const struct kss_lookup *l)
{
	return l->len;
}

int kss_lookup_append(struct kss_lookup *l, const int32_t *tok, uint32_t n)
{
	if (n > UINT32_MAX - 1 - l->len)
		return kv_fail(KV_ERR_INVALID, "prompt lookup: history too long");
	if (l->len + n > l->cap) {
		uint32_t cap = l->cap ? l->cap : 1024;
		while (cap < l->len + n)
			cap = cap > UINT32_MAX / 2 ? l->len + n : cap * 2;
		int32_t *t = kv_realloc(KV_MEM_OTHER, l->tok, (size_t)cap * sizeof *t);
		if (!t)
			return kv_fail(KV_ERR_NOMEM, "prompt lookup: history of %u tokens", cap);
		l->tok = t;
		l->cap = cap;
	}
	memcpy(l->tok + l->len, tok, (size_t)n * sizeof *tok);
	l->len += n;
	for (; l->indexed + 1 < l->len; l->indexed++)
		for (int g = 1; g <= NG && (uint32_t)g <= l->indexed + 1; g++)
			l->tab[g - 1][key(l->tok, l->indexed, g) & l->mask] = l->indexed + 1;
	return KV_OK;
}

/* How far back the tokens ending at c equal those ending at end (c < end),
 * up to KSS_LOOKUP_MAX_MATCH; 0 if tok[c] != tok[end]. */
static int match_len(const struct kss_lookup *l, uint32_t c, uint32_t end)
{
	int m = 0;
	while (m < KSS_LOOKUP_MAX_MATCH && (uint32_t)m <= c && l->tok[c - (uint32_t)m] == l->tok[end - (uint32_t)m])
		m++;
	return m;
}

int kss_lookup_draft(struct kss_lookup *l, int max, int32_t *out, int *match)
{
	*match = 0;
	if (max <= 0 || l->len < 2)
		return 0;
	uint32_t end = l->len - 1, best = 0;
	int bm = 0;
	for (int g = NG; g >= 1; g--) {
		if ((uint32_t)g > l->len)
			continue;
		uint32_t slot = l->tab[g - 1][key(l->tok, end, g) & l->mask];
		if (!slot)
			continue;
		uint32_t c = slot - 1; /* end of the candidate n-gram, < end */
		if (c < (uint32_t)g - 1 || memcmp(l->tok + c + 1 - g, l->tok + end + 1 - g, (size_t)g * sizeof *l->tok))
			continue; /* another n-gram in the slot */
		best = c;
		bm = match_len(l, c, end);
		break;
	}
	/* The last draft's source, moved on by what the history gained since:
	 * while the text being copied goes on, it is the same place in it, and
	 * it wins over the table's most recent occurrence unless that matches
	 * further back (a short n-gram common in code, "    return", recurs
	 * everywhere: its latest occurrence is rarely the copied line's). */
	if (l->src_len && l->len > l->src_len && l->src + (l->len - l->src_len) < end) {
		uint32_t a = l->src + (l->len - l->src_len);
		int am = match_len(l, a, end);
		if (am > 0 && am >= bm) {
			best = a;
			bm = am;
		}
	}
	if (!bm) {
		l->src_len = 0;
		return 0;
	}
	uint32_t avail = end - best; /* tokens after the candidate, up to the end */
	int n = (uint32_t)max < avail ? max : (int)avail;
	memcpy(out, l->tok + best + 1, (size_t)n * sizeof *out);
	*match = bm;
	l->src = best;
	l->src_len = l->len;
	return n;
}
