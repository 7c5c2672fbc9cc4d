/*
 * seq.h - one sequence: its tokens, its paged KV and its recurrent state,
 * and the forward passes that extend it (prefill, decode).
 *
 * State.
 *   tokens   the ids of positions [0, pos).
 *   pages    ceil(pos / B) refcounted pages (base/pages.h) from the
 *            model's pool, in the byte layout of layout.h; page i holds
 *            positions [i B, (i+1) B). The sequence holds one reference on
 *            each. A page whose refcount is above 1 is shared (with the
 *            prefix cache or another sequence) and is never written again:
 *            before writing into a shared partial page the sequence copies
 *            its rows to a fresh page (copy-on-write). Full pages are
 *            never written at all.
 *   rec      hybrid models: conv state and S of every DeltaNet layer, f32,
 *            exactly in the snapshot format of layout.h, so a snapshot is
 *            one memcpy.
 *
 * Batch invariance. Every kernel reduces in an order that does not depend
 * on the number of rows or on chunk boundaries, and prefill/decode both
 * go through the same per-chunk forward. So the logits at a position are
 * bit-identical whether the prompt was prefilled whole, split anywhere,
 * fed token by token, or resumed from shared pages + tail + snapshot.
 *
 * The cache contract (what the prefix cache builds on).
 *   - Read: ke_seq_pos, ke_seq_tokens, ke_seq_n_pages / ke_seq_page (take
 *     a kv_page_ref to keep a page beyond the sequence's next call), the
 *     tail rows of the last partial page (layout.h helpers on its data),
 *     ke_seq_snapshot into a buffer of layout.snapshot_bytes.
 *   - Resume: ke_seq_resume builds a sequence at position p from the
 *     floor(p/B) full pages (shared by reference), the p mod B tail rows
 *     (copied into a fresh page), the tokens [0, p) and, for hybrid
 *     models, a snapshot taken at exactly p. Continuing from it is bit for
 *     bit what continuing the original would give.
 *   - Stop points: prefill stops at each position of `stops` (absolute
 *     positions, ascending), calls the callback with the state exactly at
 *     that position (take snapshots, ref pages there), then goes on. A
 *     cancel flag is read between chunks.
 *   - Memory: scratch is sized once per sequence for the prefill chunk
 *     (ke_seq_scratch_bytes, under KV_MEM_SCRATCH) and does not grow with
 *     the prompt: attention works in 64-key blocks (attn.h), so the
 *     transient memory of a prefill is this scratch plus the KV pages of
 *     the new tokens. Nothing is allocated per token (pages come per B
 *     tokens from the pool; the token list grows geometrically).
 *
 * Threading: one call at a time per sequence; kernels use the global pool.
 */
#ifndef KV_ENGINE_SEQ_H
#define KV_ENGINE_SEQ_H

#include <stddef.h>
#include <stdint.h>

#include "base/pages.h"
#include "engine/model.h"

struct ke_seq_params {
	int chunk;        /* prefill tokens per forward step; 0 = 256 */
	int max_tokens;   /* refuse to grow past this many positions; 0 = no cap */
};

struct ke_seq;

/* An empty sequence at position 0. p may be NULL. */
int ke_seq_create(struct ke_model *m, const struct ke_seq_params *p, struct ke_seq **out);
/* Drops the sequence's page references. NULL ok. */
void ke_seq_destroy(struct ke_seq *s);

int ke_seq_pos(const struct ke_seq *s);
/* Token ids of [0, pos); valid until the next call that changes s. */
const int32_t *ke_seq_tokens(const struct ke_seq *s);
int ke_seq_n_pages(const struct ke_seq *s);
/* Borrowed: valid while s holds it (ref it to keep it). */
struct kv_page *ke_seq_page(const struct ke_seq *s, int i);
struct ke_model *ke_seq_model(const struct ke_seq *s);
/* Window pages the sequence holds (sliding layers; the ones before its
 * window are dropped). */
int ke_seq_window_pages(const struct ke_seq *s);
/* Scratch bytes this sequence allocated (KV_MEM_SCRATCH). */
size_t ke_seq_scratch_bytes(const struct ke_seq *s);

/* Called at a stop point with the state exactly at `pos`. Return KV_OK to
 * go on, anything else to end the prefill with that code. */
typedef int (*ke_stop_fn)(void *ctx, struct ke_seq *s, int pos);

struct ke_prefill_opts {
	const int *stops;        /* ascending absolute positions in (pos, pos + n] */
	int n_stops;
	ke_stop_fn on_stop;
	void *ctx;
	const int *cancel;       /* read (atomically) between chunks; nonzero stops
				  * with KV_ERR_CANCELLED, state consistent */
	float *logits_all;       /* if set: [n][vocab] logits of every new position */
	float *hidden_all;       /* if set: [n][hidden] final-normed hidden state of every
				  * new position (the MTP head's input, mtp.h) */
	int spec;                /* speculative: n <= KE_SPEC_MAX_ROWS and no stops;
				  * the rows may be taken back (ke_seq_accept) */
};

/*
 * Run n tokens from the current position. logits (vocab floats, may be
 * NULL) gets the logits of the last one. o may be NULL. On error the
 * sequence stays consistent at the last finished chunk (ke_seq_pos says
 * where). Token ids outside the vocabulary are KV_ERR_INVALID before
 * anything runs; a full page pool is KV_ERR_FULL.
 */
int ke_seq_prefill(struct ke_seq *s, const int32_t *tokens, int n, const struct ke_prefill_opts *o,
		   float *logits);
/* One token (the same forward as a prefill of one). */
int ke_seq_decode(struct ke_seq *s, int32_t token, float *logits);

/*
 * Batches: one forward over several sequences (continuous batching). The
 * decode token of every running sequence and prefill chunks of others go
 * through the model as one set of GEMMs over the concatenated rows, with
 * attention and the recurrent state per sequence. Every kernel is
 * M-invariant, so each sequence's logits are bit-identical to running it
 * alone (tests/unit/test_engine.c checks it with memcmp).
 *
 * A batch object owns the scratch for max_tokens rows and the logits of up
 * to max_seqs sequences; it is reused for every step (nothing is allocated
 * per step). One ke_batch_run at a time per batch object; a sequence may
 * appear at most once in one run.
 */
struct ke_batch;

struct ke_batch_item {
	struct ke_seq *s;
	const int32_t *tokens;   /* n tokens at positions [pos, pos + n) (borrowed) */
	int n;                   /* >= 1 */
	float *logits;           /* out: vocab floats, the last token's logits, or NULL */
	int rc;                  /* out: KV_OK, or why this item did not run (the
				  * sequence is then unchanged) */
	float *logits_all;       /* out: n x vocab floats, every row's logits, or NULL
				  * (verification of draft tokens) */
	float *hidden;           /* out: n x hidden floats, every row's final-normed hidden
				  * state (the MTP head's input), or NULL */
	int spec;                /* speculative: the rows after the first may be taken
				  * back with ke_seq_accept (n <= KE_SPEC_MAX_ROWS) */
};

int ke_batch_create(struct ke_model *m, int max_tokens, int max_seqs, struct ke_batch **out);
void ke_batch_destroy(struct ke_batch *b);
/* Rows and sequences one run may hold. */
int ke_batch_max_tokens(const struct ke_batch *b);
int ke_batch_max_seqs(const struct ke_batch *b);
/*
 * Run the items as one forward. Items that cannot run (bad token ids,
 * the sequence limit, a full page pool: KV_ERR_FULL) get their rc and are
 * left out; the others advance by n. Returns KV_OK, or KV_ERR_INVALID when
 * the batch itself is malformed (more than max_tokens rows or max_seqs
 * items, an empty item); then nothing ran.
 */
int ke_batch_run(struct ke_batch *b, struct ke_batch_item *items, int n_items);

/*
 * Speculative forwards (speculative decoding, docs/engine.md "Speculative
 * decoding"). A forward with spec set (a batch item's, or a prefill's
 * ke_prefill_opts.spec) runs like any other and advances the sequence by
 * its n rows; until the sequence's next forward, ke_seq_accept(s, keep)
 * keeps its first keep rows (1 <= keep <= n) and takes the others back:
 * tokens and KV are cut to pos - n + keep and, for a hybrid model, the
 * recurrent state becomes exactly the state after those keep rows (the
 * state before the forward with the kept rows replayed: bit for bit what
 * decoding them one at a time gives); with sliding-window layers the
 * window pages the forward would have dropped are kept until the accept,
 * so the kept position still has its whole window. keep == n only ends
 * the undo. The
 * first speculative forward allocates ke_model_spec_bytes (KV_MEM_SCRATCH;
 * KV_ERR_NOMEM when that fails). Any other call that changes the
 * sequence (a forward, rewind, truncate) ends the undo: ke_seq_accept then
 * fails with KV_ERR_INVALID.
 */
#define KE_SPEC_MAX_ROWS 16
int ke_seq_accept(struct ke_seq *s, int keep);
/* Memory a sequence's first speculative forward allocates. */
size_t ke_model_spec_bytes(const struct ke_model *m);

/* Recurrent snapshot (hybrid; layout.snapshot_bytes, 0 for dense). */
size_t ke_seq_snapshot_bytes(const struct ke_seq *s);
int ke_seq_snapshot(const struct ke_seq *s, void *buf, size_t len);

/*
 * Go back to position p <= pos: KV and tokens are cut to p and, for a
 * hybrid model, the recurrent state is set from `snap` (which must have
 * been taken at exactly p on these tokens; len = snapshot_bytes). Dense
 * models pass snap = NULL. A hybrid model without a snapshot can only
 * "rewind" to its own position.
 */
int ke_seq_rewind(struct ke_seq *s, int p, const void *snap, size_t len);
/* Dense models only (or p == pos): cut KV and tokens to p. */
int ke_seq_truncate(struct ke_seq *s, int p);

struct ke_resume {
	int pos;                          /* p */
	const int32_t *tokens;            /* [0, p) */
	struct kv_page *const *pages;     /* floor(p / B) full pages; each gets a reference */
	const void *tail;                 /* p mod B rows per segment, or NULL when none */
	int tail_stride;                  /* rows per segment in `tail`: B for a page's data,
					   * p mod B for a compact tail */
	const void *snapshot;             /* hybrid: state at exactly p; NULL for dense */
	size_t snapshot_len;
};
/* A new sequence at position r->pos (see the contract above). */
int ke_seq_resume(struct ke_model *m, const struct ke_seq_params *p, const struct ke_resume *r,
		  struct ke_seq **out);
/* A new sequence sharing src's full pages up to p and a copy of the tail.
 * Hybrid models: p must equal ke_seq_pos(src) (or 0). */
int ke_seq_fork(const struct ke_seq *src, int p, const struct ke_seq_params *params, struct ke_seq **out);

#endif
