/*
 * moe.h - the sparse mixture-of-experts MLP block of Qwen3.5-MoE
 * (qwen3_5_moe) and Qwen3-Next (qwen3_next), as in transformers'
 * Qwen3_5MoeSparseMoeBlock / Qwen3NextSparseMoeBlock:
 *
 *   logits = h W_router^T                       [E] per token (mlp.gate)
 *   p      = softmax(logits)                    f32
 *   S      = the k experts of largest p; ties go to the lower expert id
 *   w_e    = p_e / sum_{S} p (norm_topk_prob; qwen3_5_moe always), else p_e
 *   y      = sum_{e in S, ascending e} w_e * down_e(silu(gate_e h) * up_e h)
 *          + sigmoid(h . w_shared_gate) * shared_down(silu(shared_gate h) * shared_up h)
 *   x     += y
 *
 * Batch invariance (docs/engine.md): every quantity above is computed per
 * token by kernels whose result does not depend on how many other tokens
 * share the call (ke_gemm rows), and a token's y is summed in one fixed
 * order: its selected experts by ascending expert id (the order of
 * transformers' index_add_ loop), each term w_e * out_e rounded before it
 * is added, starting from +0, then the gated shared expert, then the
 * residual add. So 1 token or 2048 tokens per chunk, any thread count and
 * any CPU path give the same bits.
 *
 * GPT-OSS (kind KV_MOE_OAI, GptOssTopKRouter / GptOssExperts):
 *   logits = h W_router^T + b_router; S = the k largest logits (ties to
 *   the lower id); w = softmax over those k values (f32, in rank order);
 *   expert e: a = W_gu h + b_gu (gate i and up i: rows 2i and 2i + 1 of
 *   the release's interleaved gate_up, or separate gate / up stacks with
 *   their biases); gate = min(gate, L); up = clamp(up, -L, L);
 *   out_e = W_down ((up + 1) * gate * sigmoid(1.702 gate)) + b_down;
 *   y summed as above (no shared expert), x += y. The release's MXFP4
 *   blocks / scales are repacked into ggml's MXFP4 layout at load (one
 *   copy of the expert bytes, kept by the block); GGUF MXFP4 stacks are
 *   used in the mapping.
 *
 * Gemma 4 (kind KV_MOE_GEMMA4, llama.cpp's gemma4 graph; 26B-A4B): the
 * experts run beside the layer's dense MLP, on the residual stream x
 * after attention:
 *   r      = (rmsnorm(x) * D^-1/2) * router.scale      (no weight in the norm)
 *   logits = r W_router^T; S, w as Qwen's above (softmax, top k renormalised)
 *   h2     = rmsnorm(x) * pre_feedforward_layernorm_2
 *   out_e  = (W_down_e (gelu_tanh(W_gate_e h2) * W_up_e h2)) * per_expert_scale[e]
 *            (gate rows then up rows of the fused experts.gate_up_proj)
 *   y      = rmsnorm(sum, ascending e, w_e out_e) * post_feedforward_layernorm_2
 *   mlp   += y   (the dense MLP's output, already normed by its own
 *                 post_feedforward_layernorm_1; the layer then norms the
 *                 sum with post_feedforward_layernorm and adds it to x).
 *
 * Weights stay in the mapping: an expert is three ke_mat views, either
 * into the per-expert tensors (mlp.experts.N.{gate,up,down}_proj.weight)
 * or into the stacked ones (mlp.experts.gate_up_proj [E][2I][D],
 * mlp.experts.down_proj [E][D][I]), or into mlx-lm's
 * mlp.switch_mlp.{gate,up,down}_proj stacks (floats, or MLX codes with
 * scales and biases stacked alike); GGUF's ffn_{gate,up,down}_exps are
 * [E][rows][cols] stacks loaded under the switch_mlp names
 * (model/gguf_model.h). Any dtype ke_gemm runs (F32, BF16, F16, ggml
 * block types, MLX groups): a view starts at row e * rows with the
 * type's row stride (whole blocks for ggml types). Only the selected experts' rows are read; in a prefill chunk the
 * tokens routed to one expert are gathered and multiplied together, so
 * each expert's weights are read once per chunk.
 */
#ifndef KV_ENGINE_MOE_H
#define KV_ENGINE_MOE_H

#include <stddef.h>
#include <stdint.h>

#include "engine/gemm.h"
#include "model/config.h"

struct ke_model;

struct ke_moe {
	int E, k, I, Is;          /* experts, per token, expert / shared intermediate */
	int norm_topk;
	struct ke_mat router;     /* [E][D] mlp.gate.weight */
	struct ke_mat *gate, *up, *down; /* E views each: [I][D], [I][D], [D][I] */
	struct ke_mat sh_gate, sh_up, sh_down; /* shared expert */
	struct ke_mat sh_router;  /* [1][D] mlp.shared_expert_gate.weight; no data: ungated (Granite) */
	float out_scale;          /* x += out_scale * y: Granite's residual_multiplier; 0 means 1 */
	/* GPT-OSS (kind KV_MOE_OAI); NULL / 0 for Qwen's */
	int kind;                 /* enum kv_moe_kind */
	int gu_fused;             /* gate[e] is the interleaved gate_up matrix [2I][D] */
	const float *router_b;    /* [E] */
	const float *gu_b;        /* [E][2I] interleaved (gu_fused) or gate then up: [E][I] each */
	const float *up_b;        /* [E][I] when not fused */
	const float *down_b;      /* [E][D] */
	float limit;              /* swiglu_limit */
	/* Gemma 4 (kind KV_MOE_GEMMA4); NULL otherwise */
	const float *rscale;      /* [D] router.scale */
	const float *escale;      /* [E] router.per_expert_scale */
	const float *pre2, *post2; /* [D] pre_feedforward_layernorm_2, post_feedforward_layernorm_2 */
	float eps;                /* rms_norm_eps */
	void *owned;              /* biases and repacked MXFP4 experts (kv_alloc) */
};

/* Load layer `layer`'s block from m->w (names under m->prefix). Errors
 * name the tensor: missing, wrong shape, or a dtype the products do not
 * run.
 * *out is kv_alloc'd (KV_MEM_WEIGHTS); free with ke_moe_free. */
int ke_moe_load(struct ke_model *m, int layer, struct ke_moe **out);
void ke_moe_free(struct ke_moe *mo);
/* Granite 4.0-H's block (block_sparse_moe + shared_mlp): router
 * block_sparse_moe.router.layer.weight [E][D]; experts from the stacked
 * block_sparse_moe.input_linear.weight [E][2I][D] (gate rows, then up
 * rows) + output_linear.weight [E][D][I], or mlx-lm's / a GGUF's
 * block_sparse_moe.switch_mlp.{gate,up,down}_proj stacks; the shared
 * expert from shared_mlp.input_linear.weight [2 Is][D] (gate, up) and
 * output_linear.weight [D][Is], added without a gate; routing softmax
 * over the top-k logits (= renormalised top-k); y scaled by
 * residual_multiplier before the residual add. */
int ke_moe_load_granite(struct ke_model *m, int layer, struct ke_moe **out);

/* Scratch floats ke_moe_forward needs for `chunk` tokens (0 if dense). */
size_t ke_moe_scratch_floats(const struct kv_model_config *c, int chunk);

/* x[t] += the block's output for h[t], t < n (rows of D floats). */
void ke_moe_forward(const struct ke_moe *mo, const float *h, int n, int D, float *x, float *scratch);

/* Gemma 4's experts (moe.h): y[t] += the experts' normed output for the
 * residual rows x[t], t < n. */
void ke_moe_forward_gemma4(const struct ke_moe *mo, const float *x, float *y, int n, int D, float *scratch);

/* Route one token (for tests): the k selected expert ids in ascending id
 * order and their weights. logits [E] are overwritten with p. */
void ke_moe_route(const struct ke_moe *mo, float *logits, int32_t *sel, float *w);

/* Weight bytes one decoded token reads in the MoE blocks beyond the
 * matrices the model lists (router and shared expert are listed): k
 * experts' three matrices (ke_mat_bytes of expert 0's views, so at the
 * stored format) and the shared-expert gate per MoE layer. */
uint64_t ke_moe_decode_bytes(const struct ke_model *m);

#endif
