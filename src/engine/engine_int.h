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
	const float *ffn_post_norm1; /* gemma4 MoE layer: norm of the dense MLP's output before
					the experts' is added (post_feedforward_layernorm_1) */
	int hd, n_kv;             /* attention: head size and KV heads of this layer (gemma4's
				     sliding and global layers differ) */
	int v_is_k;               /* gemma4 attention_k_eq_v global layer: no v_proj, V = k_proj x */
	int kv_shared;            /* gemma4 KV-shared layer: q only; idx is the KV layer it reads */
	struct ke_mat ple_gate, ple_out; /* gemma4 per-layer embedding block: [P][D], [D][P] */
	const float *ple_post;    /* [D] its output norm, or NULL (no per-layer embeddings) */
	const float *scalar;      /* [1] gemma4 layer_scalar: the layer's output times it, or NULL */
	/* DeltaNet */
	int fused;                /* qwen3_next: qkvz and ba */
	struct ke_mat qkv, z, b, a; /* qkv = in_proj_qkv or in_proj_qkvz; b = in_proj_b or in_proj_ba */
	struct ke_mat out;
	const float *conv_w;      /* [conv_dim][K] */
	const float *neg_a;       /* [Hv] -exp(A_log) */
	const float *dt_bias;     /* [Hv] */
	const float *gnorm;       /* [dv] plain weight */
	struct ke_moe *moe;       /* sparse MoE block instead of gate/up/down (moe.h), or NULL */
	/* Mamba-2 (KV_LAYER_MAMBA, mamba.c): in_proj gives [z | xBC | dt];
	 * conv_w, neg_a, dt_bias, gnorm ([H P]) and out above are its too.
	 * Nemotron-H layers have no post_norm and no FFN (post_norm NULL);
	 * its MLP layers (KV_LAYER_MLP) use up and down. */
	struct ke_mat in_proj;
	const float *conv_b;      /* [C] conv bias, or NULL */
	const float *ssm_d;       /* [H] the D skip */
};

/* 8 matrices per layer at most for dense layers; a MoE layer lists its
 * router and shared expert (4) instead of gate/up/down (3). */
#define KE_MAX_MATS (KV_MAX_LAYERS * 9 + 2)

#define KE_STASH 2

/*
 * The multi-token-prediction head (mtp.h), when the weights have one: a
 * full-attention decoder layer fed fc([norm_e(embed(next token)) |
 * norm_h(hidden)]), then its own final norm and the model's lm_head. Its
 * attention keeps a KV of its own per sequence, in pages of a one-layer
 * layout from its own pool.
 */
struct ke_mtp_head {
	struct ke_mat fc;         /* [hidden][2 hidden] mtp.fc.weight */
	const float *enorm;       /* [hidden] effective (1 + w) */
	const float *hnorm;
	const float *norm;        /* [hidden] the head's final norm */
	struct ke_layer layer;    /* type ATTN, idx 0 (in lay) */
	struct ke_layout lay;     /* one attention layer, the model's heads and page size */
	struct kv_pages *pages;   /* its pool (KV pages of lay.page_bytes) */
};

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
	float *inv_freq;          /* [rot_half]: rotary_dim / 2 */
	float *inv_freq_local;    /* [rot_half_local] the sliding layers' (gemma3 rope_local_base_freq,
				     gemma4's own rotary dim), or == inv_freq */
	int rot_half, rot_half_local;
	struct ke_layout wlay;    /* window pages: lay's row format over the window layers */
	struct kv_pages *wpages;  /* their pool, or NULL */
	float embed_mul;          /* embeddings times this (sqrt(hidden) for gemma, else 1) */
	/* gemma4 per-layer embeddings (cfg.ple_dim = P > 0): the table
	 * [vocab][L P], the projection [L P][D] of the scaled embedding, the
	 * norm [P] of each layer's P-slice of it */
	struct ke_mat ple_embed, ple_proj;
	const float *ple_norm;
	void *owned;              /* one kv_alloc block holding every f32 copy */
	void *packed;             /* one kv_alloc block: every ke_mat.panels (model.c prepack) */
	size_t packed_bytes;
	uint64_t decode_bytes;
	int qdot;            /* --quant-act q8: ggml block matrices set ke_mat.qdot
				(engine/qgemm.h); every ke_mat of the model follows it */
	int n_mats;
	struct ke_mat mats[KE_MAX_MATS];
	const char *mat_names[KE_MAX_MATS];
	int conv_dim;
	struct ke_mtp_head *mtp;  /* NULL: no MTP head (model.c, mtp.c) */
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
	float *cosv;   /* [C][rot_half] */
	float *sinv;   /* [C][rot_half] */
	float *cosl;   /* [C][rot_half_local] the sliding layers' RoPE (own base or dim), or == cosv */
	float *sinl;
	float *ple;    /* [C][L P] gemma4: each row's per-layer inputs (live across the layers) */
	float *ple2;   /* [C][L P] their projection, while they are made */
	float *attn_scr; /* threads x ke_attn_scratch_floats */
	int attn_threads;
	void *block;
	size_t bytes;
};

/*
 * What a speculative forward (seq.h ke_batch_item.spec) keeps so that its
 * rows can be taken back (ke_seq_accept). Allocated on a sequence's first
 * speculative forward and kept for its life.
 *
 * Hybrid models run the forward's DeltaNet layers out of place: the conv
 * state and each head's S are read from `rec` (the state before the
 * forward) and written to `alt`, head by head while the head is in cache,
 * so keeping the old state costs no memory traffic. After the forward the
 * two swap: rec holds the state after all rows, alt the state before.
 * Taking rows back swaps them again and replays the kept rows' delta rule
 * and conv shift on the old state from the log, which holds each row's
 * DeltaNet inputs as the forward computed them (the same bits a plain
 * decode of those tokens computes: the kernels are batch-invariant).
 *
 * Log, per DeltaNet layer (index among the DeltaNet layers), per row r <
 * KE_SPEC_MAX_ROWS, W = 2 C + 2 Hv floats:
 *   [0, C)            the conv's input x (q|k|v projections before the conv)
 *   [C, 2C)           q|k|v after conv, SiLU, l2 norms and the q scale
 *   [2C, 2C+Hv)       alpha
 *   [2C+Hv, 2C+2Hv)   beta
 * A Mamba-2 layer (mamba.c) runs out of place the same way (conv state
 * and SSM state S per head), and logs W = C + H floats per row: the
 * conv's input x|B|C before the conv, then the raw dt of each head;
 * ke_mamba_replay redoes the conv, activations and scan of the kept rows.
 */
struct ke_spec {
	float *alt;               /* snapshot_bytes (hybrid), else NULL */
	float *log;               /* n_rec_layers x KE_SPEC_MAX_ROWS x W floats (hybrid) */
	float *junk;              /* ke_spec_junk_w floats: a replay's unused outputs */
	int rows;                 /* rows of the last forward that may still be taken back (0: none) */
	int pos0;                 /* that forward's first position */
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
	struct ke_spec *spec;     /* NULL until the first speculative forward */
	int spec_fwd;             /* the forward being run is speculative (set around it) */
};

/* Floats per row of a recurrent layer's speculative log (ke_spec):
 * DeltaNet's conv input, q|k|v, alpha, beta; Mamba-2's conv input and raw
 * dt (mamba.c). */
static inline size_t ke_spec_log_w(const struct ke_model *m)
{
	if (m->cfg.n_ssm_layers)
		return (size_t)m->conv_dim + (size_t)m->cfg.ssm_heads;
	return 2 * (size_t)m->conv_dim + 2 * (size_t)m->cfg.lin_v_heads;
}
/* Floats of ke_spec.junk: the DeltaNet replay's outputs of every row, or
 * Mamba-2's one row of conv output, dt, dA and one head's y. */
static inline size_t ke_spec_junk_w(const struct ke_model *m)
{
	if (m->cfg.n_ssm_layers)
		return (size_t)m->conv_dim + 2 * (size_t)m->cfg.ssm_heads + (size_t)m->cfg.ssm_head_dim;
	return (size_t)KE_SPEC_MAX_ROWS * m->cfg.lin_v_heads * m->cfg.lin_v_dim;
}
/* Row r of recurrent layer `idx` in a speculative sequence's log. */
static inline float *ke_spec_log_row(const struct ke_seq *s, int idx, int r)
{
	return s->spec->log + ((size_t)idx * KE_SPEC_MAX_ROWS + (size_t)r) * ke_spec_log_w(s->m);
}
/* ke_spec_replay for the Mamba-2 layers (mamba.c). */
void ke_mamba_replay(struct ke_seq *s, int keep);
/* Replay the first `keep` logged rows of every DeltaNet layer on s->rec
 * (the state before the speculative forward): conv shift and delta rule.
 * forward.c. */
void ke_spec_replay(struct ke_seq *s, int keep);

/* Scratch layout for a model and chunk; with block == NULL only sizes. */
size_t ke_scratch_plan(const struct ke_model *m, int chunk, struct ke_scratch *sc, void *block);

/*
 * Forward n <= chunk tokens at positions [s->pos, s->pos + n). Pages for
 * those positions must be present and writable. Logits: rows_out (n x V)
 * for every row if set, else last_out (V) for the last row if set.
 * Advances nothing: the caller updates pos and tokens.
 */
void ke_forward(struct ke_seq *s, const int32_t *tok, int n, float *rows_out, float *last_out);
/* The final-normed hidden state of every row (the MTP head's input) into
 * hid_out (n x hidden), from the residual stream a forward left in sc->x. */
void ke_forward_hidden(const struct ke_model *m, const struct ke_scratch *sc, int r0, int n, float *hid_out);

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
	const struct ke_layout *lay;   /* the KV layout of the layers run (NULL: the model's;
					* the MTP head's one-layer layout for mtp.c) */
};

/* fn(ctx, t) for t in [0, n) on the pool when there is enough work
 * (about `work` float operations a row); each row the same function of its
 * own data, so the split never changes a bit (rows.c). */
typedef void (*ke_row_fn)(const void *ctx, int t);
void ke_par_rows(int n, double work, ke_row_fn fn, const void *ctx);
/* x += (in W^T) over the f->n rows, through sc->h (which must be dead)
 * times residual_multiplier when the model has one (Granite), else
 * accumulated straight into x. */
void ke_gemm_residual(const struct ke_fwd *f, const struct ke_mat *w, const float *in, size_t k);
/* One embedding row (dequantized for quantized tables). forward.c */
void ke_forward_embed(const struct ke_model *m, int32_t id, float *out);
/* One decoder layer over f's rows in f->sc->x (RoPE tables made for f's
 * sequences first): what a forward does per layer. forward.c */
void ke_forward_layer(const struct ke_fwd *f, const struct ke_layer *ly);

/* Run f. toks[i]: the row0[i+1] - row0[i] tokens of seqs[i]. last_out[i]
 * (V floats or NULL): logits of that sequence's last row; all_out[i] (rows
 * x V floats or NULL, all_out itself may be NULL): logits of every row of
 * that sequence (then last_out[i] gets its last row too if set). logits_tmp
 * holds one row of V floats per row asked for. Pages must be writable;
 * advances nothing. */
void ke_forward_batch(const struct ke_fwd *f, const int32_t *const *toks, float *const *last_out,
		      float *const *all_out, float *logits_tmp);

#endif
