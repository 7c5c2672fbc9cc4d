/*
 * sched.h - the scheduler that owns the engine: continuous batching.
 *
 * Every forward pass of every running sequence goes through one engine
 * thread. A running request drives its own sequence (session/run.h: lookup,
 * resume, prefill with stop points, decode, store) on its own thread and
 * hands each forward to the scheduler with kss_sched_forward, which blocks
 * until the step that ran it is over. The engine thread gathers what the
 * running sequences submitted and runs it as ONE batch (engine/seq.h
 * ke_batch_run): the decode token of every decoding sequence plus prefill
 * chunks, oldest first, up to max_batch_tokens rows. A long cold prefill
 * therefore advances one chunk per step while the others keep decoding,
 * and a short request that arrives meanwhile gets its first token after a
 * few steps instead of after the whole prefill.
 *
 *     request thread A (decoding)      engine thread           request thread B (prefill)
 *     forward(A, tok, 1) ---------->  gather: A(1) + B(256) <- forward(B, chunk, 256)
 *            (blocked)                ke_batch_run
 *     <---- logits of A               wake A and B ----------> logits of B's last row
 *     sample, stream, forward(A) ...                          stop point? next chunk ...
 *
 * Gathering. A step starts as soon as every joined sequence that is not
 * "away" has submitted, or gather_us after the oldest submission, whichever
 * comes first. A sequence is away while it waits for something other than
 * the engine (a client that does not read its stream): the engine never
 * waits for it, so a stalled client delays no one else by more than one
 * step. The batch never changes results: the kernels are M-invariant, so
 * each sequence's logits are bit-identical to running it alone.
 *
 * In-flight prefills (cache-aware scheduling). A request registers the
 * prompt it is prefilling and its stop points (kss_sched_flight_*). A new
 * request whose prompt shares a stop point that another running request
 * has not reached yet waits for it (kss_sched_flight_wait) and then finds
 * it in the cache, instead of prefilling the same tokens a second time:
 * two agents started together on one system prompt prefill it once.
 *
 * Threads: every function is thread-safe. kss_sched_forward must not be
 * called twice at once for one sequence.
 */
#ifndef KV_SESSION_SCHED_H
#define KV_SESSION_SCHED_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/model.h"
#include "engine/seq.h"

struct kss_sched_params {
	struct ke_model *model;
	int max_running;          /* sequences in one step, >= 1 */
	int max_batch_tokens;     /* rows in one step; 0: chunk + max_running */
	int chunk;                /* prefill tokens per item and step; 0: 256; cut to
				   * max_batch_tokens - max_running + 1 so that a chunk
				   * always fits beside the other sequences' decodes */
	int gather_us;            /* longest wait for joined sequences to submit; 0: 2000 */
	int spec_rows;            /* rows a verification may hold (speculative decoding,
				   * 1..KE_SPEC_MAX_ROWS); 0: none. With max_batch_tokens 0
				   * the default becomes chunk + max_running x spec_rows */
};

struct kss_sched_stats {
	uint64_t steps;           /* forwards run */
	uint64_t rows;            /* tokens through them */
	uint64_t items;           /* sequence-steps (sum of batch sizes) */
	uint64_t prefill_rows;    /* rows of items with n > 1, verifications aside */
	uint64_t verify_rows;     /* rows of verifications (speculative decoding) */
	double step_s;            /* seconds spent in ke_batch_run */
	int last_batch;           /* sequences in the last step */
	int last_rows;
	int max_batch;            /* most sequences one step has run */
	double last_step_s;
	int joined;               /* sequences running now */
	int away;                 /* of those, waiting on something else */
	int pending;              /* forwards waiting for a step */
	uint64_t flight_waits;    /* requests that waited for another's prefill */
	uint64_t flight_tokens;   /* prompt tokens those waits saved from a second prefill */
};

struct kss_sched;

int kss_sched_create(const struct kss_sched_params *p, struct kss_sched **out);
/* Fails every pending forward with KV_ERR_CANCELLED, stops the engine
 * thread and frees. No forward may be submitted after. NULL ok. */
void kss_sched_destroy(struct kss_sched *s);
/* Prefill tokens one forward may carry; rows one step may hold. */
int kss_sched_chunk(const struct kss_sched *s);
int kss_sched_max_batch_tokens(const struct kss_sched *s);

/* A sequence starts / stops running (the engine waits for joined ones
 * when it gathers a step). */
void kss_sched_join(struct kss_sched *s);
void kss_sched_leave(struct kss_sched *s);
/* The calling sequence waits on something other than the engine (away
 * = 1) or is back (0). */
void kss_sched_away(struct kss_sched *s, int away);

/*
 * Forward n tokens (1 <= n <= kss_sched_chunk) of seq in the next step;
 * blocks until it ran. logits (vocab floats, may be NULL) gets the last
 * token's. Returns what ke_batch_run gave this item (KV_ERR_FULL page
 * pool, KV_ERR_INVALID token ids) or KV_ERR_CANCELLED at shutdown.
 */
int kss_sched_forward(struct kss_sched *s, struct ke_seq *seq, const int32_t *tok, int n, float *logits);

/*
 * A verification (speculative decoding, session/decode.h): n rows (1 <=
 * n <= kss_sched_spec_rows) of seq as one speculative item
 * (engine/seq.h ke_batch_item.spec) in the next step, taken with the
 * decodes, before prefill chunks; blocks until it ran. logits_all gets
 * every row's logits (n x vocab floats), hidden (may be NULL) every row's
 * final-normed hidden state. Then the caller keeps what it accepts with
 * ke_seq_accept before its next forward.
 */
int kss_sched_verify(struct kss_sched *s, struct ke_seq *seq, const int32_t *tok, int n, float *logits_all,
		     float *hidden);
/* A forward of n tokens like kss_sched_forward that also gives every
 * row's final-normed hidden state into hidden (n x hidden floats): the
 * context of the MTP head (engine/mtp.h). */
int kss_sched_forward_hidden(struct kss_sched *s, struct ke_seq *seq, const int32_t *tok, int n, float *logits,
			     float *hidden);
/* Rows a verification may hold: spec_rows, cut so that every running
 * sequence's verification and a prefill chunk fit one step (0: none). */
int kss_sched_spec_rows(const struct kss_sched *s);

void kss_sched_stats(struct kss_sched *s, struct kss_sched_stats *out);

/* --- in-flight prefills ---------------------------------------------------- */

struct kss_flight;

/*
 * Before the lookup of tok[0, n) in namespace `ns` (any pointer naming it,
 * e.g. its cache): while another flight of ns has a stop point that this
 * prompt shares (<= the common prefix, < n) and has not stored it yet,
 * wait for it (*waited: the furthest stop waited for, 0 none; the wait
 * ends early when *cancel becomes nonzero, cancel may be NULL). Then,
 * atomically with the last check, register this prompt as a flight with
 * the provisional stop points stops[] (its message boundaries and n: what
 * the lookup may choose from), so that a request arriving during our
 * lookup waits for us too. NULL when out of memory (nobody waits for it).
 */
struct kss_flight *kss_sched_flight_begin(struct kss_sched *s, const void *ns, const int32_t *tok, uint32_t n,
					  const uint32_t *stops, size_t n_stops, const atomic_int *cancel,
					  uint32_t *waited);
/* The lookup chose the prefill's real stop points (ascending, copied);
 * waiters re-check against them. */
void kss_sched_flight_stops(struct kss_sched *s, struct kss_flight *f, const uint32_t *stops, size_t n_stops);
/* 1 if a request waits for stop point pos of f: the prefill must store
 * an entry there (cache/turn.h kc_turn_share_at_stop), then call
 * kss_sched_flight_at. 0 if none does: pos is passed at once, in the same
 * lock, so a request arriving from now on does not wait for a store that
 * will not come (it prefills that prefix itself). */
int kss_sched_flight_wanted(struct kss_sched *s, struct kss_flight *f, uint32_t pos);
/* The prefill stored its stop point `pos`: waiters for it go on. */
void kss_sched_flight_at(struct kss_sched *s, struct kss_flight *f, uint32_t pos);
/* The prefill is over (done, failed or cancelled). NULL ok. */
void kss_sched_flight_end(struct kss_sched *s, struct kss_flight *f);

#endif
