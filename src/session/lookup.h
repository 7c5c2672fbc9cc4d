/*
 * lookup.h - prompt-lookup drafts: the tokens that followed the most
 * recent earlier occurrence of the sequence's current suffix. Model-free;
 * one per generating sequence (speculative decoding, session/spec.h).
 *
 * Agents write much of what is already in their context (the file they
 * read and now edit, the tool output they quote), and such text continues
 * after its match for many tokens. The index maps n-grams (n = 1, 2, 3)
 * of the sequence's history (its prompt and every token it has generated)
 * to where they last ended; a draft looks up the longest n-gram ending at
 * the history's end, checks the candidate's tokens (a hash only finds
 * it), measures how far back the match really goes (up to
 * KSS_LOOKUP_MAX_MATCH tokens: the caller's measure of confidence) and
 * proposes the tokens that followed it. The previous draft's source,
 * moved on by the tokens the history gained since, is a second candidate
 * and wins when it matches at least as far back: while a copy goes on it
 * stays on the copied text instead of jumping to the latest occurrence of
 * a common n-gram.
 *
 * Bounded: three tables of `slots` positions each (a power of two, sized
 * once from the expected length, 4,096 to 1,048,576: at most 12 MiB), a
 * later n-gram overwriting an earlier one in its slot; the history itself
 * is a copy of the tokens (4 bytes each). Memory from kv_alloc
 * (KV_MEM_OTHER). Not thread-safe: one per sequence.
 */
#ifndef KV_SESSION_LOOKUP_H
#define KV_SESSION_LOOKUP_H

#include <stdint.h>

#define KSS_LOOKUP_MAX_MATCH 64

struct kss_lookup;

/* expect: tokens the history will likely reach (sizes the tables). */
int kss_lookup_create(uint32_t expect, struct kss_lookup **out);
void kss_lookup_destroy(struct kss_lookup *l);
/* Append tokens to the history (KV_ERR_NOMEM). */
int kss_lookup_append(struct kss_lookup *l, const int32_t *tok, uint32_t n);
uint32_t kss_lookup_len(const struct kss_lookup *l);
/* Up to max tokens that continue the history, into out; *match gets the
 * length of the suffix the draft's source matched (1..KSS_LOOKUP_MAX_MATCH).
 * Returns how many were written (0: the suffix never occurred before). */
int kss_lookup_draft(struct kss_lookup *l, int max, int32_t *out, int *match);

#endif
