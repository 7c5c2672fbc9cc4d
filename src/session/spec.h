/*
 * spec.h - speculative decoding's decisions for one generating sequence:
 * where a draft comes from, how long it is, and when not to draft at all.
 *
 * Speculative decoding changes nothing but speed (docs/engine.md,
 * "Speculative decoding"): a draft of k tokens is verified by one forward
 * of k + 1 rows whose logits are bit for bit those of decoding the tokens
 * one at a time, and each position is sampled exactly as plain decoding
 * samples it (session/decode.c); a draft token is kept only if it equals
 * the token sampled there. So the draft only decides how many tokens one
 * forward yields, and this module's job is to make drafts pay:
 *
 *   sources   prompt lookup (session/lookup.h: the continuation of the
 *             longest earlier match of the sequence's suffix), and the
 *             model's MTP head when it has one (engine/mtp.h), offered by
 *             the caller as a callback. In `auto` each step takes the
 *             source with the larger expected gain: a lookup draft when a
 *             match is trusted, else the MTP head.
 *   estimate  per source an acceptance probability p (lookup: one per
 *             match-length class, 1, 2-3, 4-7, 8+ tokens, so that short,
 *             accidental matches can be distrusted while long ones, a file
 *             being copied, are not: the adaptive n), from decayed counts
 *             of the draft positions verified and kept, starting from a
 *             prior; the cost of verifying r rows relative to one decode
 *             step, c(r) = 1 + a (r - 1), with a measured from the step
 *             times the caller reports (a verification's forward and its
 *             rollback); the MTP head's cost per draft token b relative to
 *             a decode step, measured the same way. On a shared machine a
 *             step time is its cost plus other jobs' time: the unit is the
 *             smallest recent plain step, a and b the medians of their
 *             recent observations (the prior until there are 3), and
 *             observations are forgotten while none come, so one slow
 *             step cannot turn drafting off for good.
 *   length    the k <= budget maximising the expected tokens per unit of
 *             time, (1 + p + p^2 + ... + p^k) / (c(k + 1) + b k) (a draft
 *             token is kept only if every earlier one was).
 *   turning off  when no k gains at least KSS_SPEC_MIN_GAIN over plain
 *             decoding the step does not draft. Every step without an
 *             observation moves a source's counts back toward the prior,
 *             so a source that stopped paying is tried again now and
 *             then (about once per 20-40 tokens) and comes back as soon
 *             as it pays: free prose loses at most a failed one-token
 *             verification now and then.
 *
 * Not thread-safe: one per sequence, used by its request's thread.
 */
#ifndef KV_SESSION_SPEC_H
#define KV_SESSION_SPEC_H

#include <stddef.h>
#include <stdint.h>

/* --speculative */
enum kss_spec_mode { KSS_SPEC_OFF = 0, KSS_SPEC_LOOKUP = 1, KSS_SPEC_MTP = 2, KSS_SPEC_AUTO = 3 };
/* "off" | "lookup" | "mtp" | "auto" -> the mode, -1 for anything else. */
int kss_spec_mode_parse(const char *s);
const char *kss_spec_mode_name(int mode);

enum kss_spec_src { KSS_SRC_LOOKUP = 0, KSS_SRC_MTP = 1, KSS_SRC_N = 2 };

#define KSS_SPEC_MIN_GAIN 1.03

/* What one sequence's speculation did (added up by the caller). */
struct kss_spec_stats {
	uint64_t steps;                   /* verification forwards */
	uint64_t drafted[KSS_SRC_N];      /* draft tokens verified */
	uint64_t accepted[KSS_SRC_N];     /* of those, kept */
	uint64_t plain_steps;             /* decode forwards without a draft */
	uint64_t mtp_s_us;                /* time in the MTP head, microseconds */
};

/*
 * The MTP head as a draft source (NULL: none): up to max draft tokens
 * continuing the sequence (its last sampled token is the caller's to
 * know), into out; returns how many (0: none, e.g. the head failed), and
 * *seconds the time it took.
 */
typedef int (*kss_mtp_fn)(void *ctx, int max, int32_t *out, double *seconds);

struct kss_spec_params {
	int mode;                 /* enum kss_spec_mode; OFF makes kss_spec_create give NULL */
	int max_draft;            /* draft tokens a step may verify: 1..KE_SPEC_MAX_ROWS - 1 */
	kss_mtp_fn mtp;           /* the MTP head, or NULL */
	void *mtp_ctx;
};

struct kss_spec;

/* *out = NULL (and KV_OK) when p->mode is off, or mtp is asked for a
 * model without a head. The prompt seeds the lookup index. */
int kss_spec_create(const struct kss_spec_params *p, const int32_t *prompt, uint32_t n, struct kss_spec **out);
void kss_spec_destroy(struct kss_spec *sp);
/* A token became part of the sequence's text (sampled or forced, in order). */
int kss_spec_append(struct kss_spec *sp, int32_t tok);
/* A draft continuing the appended tokens, at most `budget` tokens, into
 * draft; *src its source. 0: decode this step without one. */
int kss_spec_draft(struct kss_spec *sp, int budget, int32_t *draft, int *src);
/* The verification of a draft of k tokens from src kept `accepted` of them
 * (0..k) in a forward of k + 1 rows that took `seconds`. */
void kss_spec_verified(struct kss_spec *sp, int src, int k, int accepted, double seconds);
/* A decode forward of one row took `seconds` (the cost unit). */
void kss_spec_plain(struct kss_spec *sp, double seconds);
const struct kss_spec_stats *kss_spec_stats(const struct kss_spec *sp);

#endif
