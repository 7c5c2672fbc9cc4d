/*
 * engine_int.h - structures shared by model.c, seq.c and forward.c.
 * Private to src/engine: other layers use model.h and seq.h.
 */
#ifndef KV_ENGINE_ENGINE_INT_H
#define KV_ENGINE_ENGINE_INT_H

#include <pthread.h>

#include "base/pages.h"
#include "engine/gemm.h"
#include "engine/layout.h"
#include "engine/model.h"
#include "engine/moe.h"
#include "engine/seq.h"
#include "model/config.h"
#include "model/safetensors.h"

struct ke_layer {
	int type;                 /* enum kv_layer_type */
	int idx;                  /* index among the layers of its type */
	const float *in_norm;     /* [hidden] effective weight (1 + w for hybrids) */
	const float *post_norm;   /* [hidden] */
	struct ke_mat gate, up, down;
	/* attention */
	struct ke_mat q, k, v, o;
	const float *q_norm;      /* [head_dim] effective, or NULL (no q/k norm) */
	const float *k_norm;
	int window;               /* sliding layer: W; its KV in the sequence's window pages */
	int widx;                 /* index among the window layers (sliding) or the paged ones */
	const float *q_b, *k_b, *v_b, *o_b; /* projection biases, or NULL */
	const float *sinks;       /* [n_heads] sink logits, or NULL */
	const float *attn_post_norm; /* gemma: norm of the attention output, or NULL */
	const float *ffn_post_norm;  /* gemma: norm of the MLP output, or NULL */
	/* DeltaNet */
	int fused;                /* qwen3_next: qkvz and ba */
	struct ke_mat qkv, z, b, a; /* qkv = in_proj_qkv or in_proj_qkvz; b = in_proj_b or in_proj_ba */
	struct ke_mat out;
	const float *conv_w;      /* [conv_dim][K] */
	const float *neg_a;       /* [Hv] -exp(A_log) */
	const float *dt_bias;     /* [Hv] */
	const float *gnorm;       /* [dv] plain weight */
	struct ke_moe *moe;       /* sparse MoE block instead of gate/up/down (moe.h), or NULL */
};

/* 8 matrices per layer at most for dense layers; a MoE layer lists its
 * router and shared expert (4) instead of gate/up/down (3). */
#define KE_MAX_MATS (KV_MAX_LAYERS * 9 + 2)

#define KE_STASH 2

struct ke_model {
	char dir[1024];
	char prefix[64];
	struct kv_model_config cfg;
	struct ke_layout lay;
	struct kv_weights *w;
	struct kv_pages *pages;
	struct ke_mat embed;      /* [vocab][hidden] */
	struct ke_mat lm_head;    /* embed when tied */
	const float *final_norm;  /* [hidden] effective */
	struct ke_layer layers[KV_MAX_LAYERS];
	float *inv_freq;          /* [rotary_dim / 2] */
	float *inv_freq_local;    /* the sliding layers' (gemma3 rope_local_base_freq), or == inv_freq */
	struct ke_layout wlay;    /* window pages: lay's row format over the window layers */
	struct kv_pages *wpages;  /* their pool, or NULL */
	float embed_mul;          /* embeddings times this (sqrt(hidden) for gemma, else 1) */
	void *owned;              /* one kv_alloc block holding every f32 copy */
	uint64_t decode_bytes;
	int qdot;            /* --quant-act q8: ggml block matrices set ke_mat.qdot
				(engine/qgemm.h); every ke_mat of the model follows it */
	int n_mats;
	struct ke_mat mats[KE_MAX_MATS];
	const char *mat_names[KE_MAX_MATS];
	int conv_dim;
	/* Buffers of destroyed sequences kept for the next ones (seq.c): on
	 * this kind of machine the first touch of fresh memory runs at a few
	 * hundred MB/s, so a new sequence that allocated its 10-30 MiB of
	 * scratch and recurrent state afresh would pay tens of ms per request.
	 * At most KE_STASH of each; guarded by stash_lock. */
	pthread_mutex_t stash_lock;
	int n_scratch, n_rec;
	void *stash_scratch[KE_STASH]; /* kv_alloc blocks, all of one size per chunk */
	size_t stash_scratch_bytes[KE_STASH];
	void *stash_rec[KE_STASH];     /* lay.snapshot_bytes each */
};

/* Take a stashed buffer of `bytes` (NULL if none); give one back (freed
 * when the stash is full). kind 0 = scratch block, 1 = recurrent state. */
void *ke_stash_take(struct ke_model *m, int kind, size_t bytes);
void ke_stash_put(struct ke_model *m, int kind, void *p);

/* Per-sequence scratch, carved from one block, sized for `chunk` rows.
 * x, h, the RoPE tables and the attention scratch are separate; the
 * attention, DeltaNet and MLP buffers overlay one region (ke_scratch_plan),
 * so a buffer of one group is garbage once another group has run. */
struct ke_scratch {
	int chunk;
	float *x;      /* [C][hidden] residual stream */
	float *h;      /* [C][hidden] normalised input */
	float *q;      /* [C][H hd (x2 gated)] q_proj output */
	float *qh;     /* [C][H hd] queries */
	float *gate;   /* [C][H hd] output gate (hybrid) */
	float *k;      /* [C][Hkv hd] */
	float *v;      /* [C][Hkv hd] */
	float *att;    /* [C][H hd] */
	float *m1;     /* [C][I] */
	float *m2;     /* [C][I] */
	float *mix;    /* [C][qkv or qkvz width] DeltaNet projections */
	float *dq;     /* [C][conv_dim] q|k|v after conv (rearranged for fused) */
	float *z;      /* [C][Hv dv] */
	float *ba;     /* [C][2 Hv] b then a (or fused ba output) */
	float *beta;   /* [C][Hv] */
	float *alpha;  /* [C][Hv] */
	float *core;   /* [C][Hv dv] */
	float *moe;    /* ke_moe_scratch_floats (MLP group) */
	float *cosv;   /* [C][rot/2] */
	float *sinv;   /* [C][rot/2] */
	float *cosl;   /* [C][rot/2] the sliding layers' RoPE (own base), or == cosv */
	float *sinl;
	float *attn_scr; /* threads x ke_attn_scratch_floats */
	int attn_threads;
	void *block;
	size_t bytes;
};

struct ke_seq {
	struct ke_model *m;
	struct ke_seq_params p;
	int pos;
	int32_t *tokens;
	int tok_cap;
	struct kv_page **pages;
	int n_pages;
	int pages_cap;
	/* window pages (sliding layers): page i holds positions [i B, (i+1) B)
	 * of the window layers; entries below the current window are NULL
	 * (dropped), n_wpages == ceil(pos / B) */
	struct kv_page **wpages;
	int n_wpages;
	int wpages_cap;
	float *rec;               /* lay.rec_bytes, or NULL without recurrent layers */
	struct ke_scratch sc;
};

/* Scratch layout for a model and chunk; with block == NULL only sizes. */
size_t ke_scratch_plan(const struct ke_model *m, int chunk, struct ke_scratch *sc, void *block);

/*
 * Forward n <= chunk tokens at positions [s->pos, s->pos + n). Pages for
 * those positions must be present and writable. Logits: rows_out (n x V)
 * for every row if set, else last_out (V) for the last row if set.
 * Advances nothing: the caller updates pos and tokens.
 */
void ke_forward(struct ke_seq *s, const int32_t *tok, int n, float *rows_out, float *last_out);

/* Most rows of one forward (a prefill chunk, or one batch step). */
#define KE_FWD_MAX_ROWS 8192

/*
 * One forward over the rows of several sequences, concatenated: rows
 * [row0[i], row0[i + 1]) belong to seqs[i] and sit at its positions
 * [pos, pos + rows). row_seq[t] says which sequence row t is of. The
 * projections and the MLP run as one GEMM over all n rows (M-invariant
 * kernels: each row's result is what it would be alone); RoPE, the KV
 * writes, attention and the DeltaNet state are per sequence.
 */
struct ke_fwd {
	const struct ke_model *m;
	struct ke_scratch *sc;         /* sized for >= n rows */
	int n;                         /* rows in all */
	int n_seq;
	struct ke_seq *const *seqs;    /* [n_seq] */
	const int *row0;               /* [n_seq + 1] */
	const int *row_seq;            /* [n] */
};

/* Run f. toks[i]: the row0[i+1] - row0[i] tokens of seqs[i]. last_out[i]
 * (V floats or NULL): logits of that sequence's last row. logits_tmp holds
 * n_seq x V floats. Pages must be writable; advances nothing. */
void ke_forward_batch(const struct ke_fwd *f, const int32_t *const *toks, float *const *last_out, float *logits_tmp);

#endif
