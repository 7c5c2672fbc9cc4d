/*
 * model.h - a loaded model: config, mmap'd weights, and the state layout.
 *
 * Families: qwen3 (dense), qwen3_5 (hybrid, separate DeltaNet
 * projections), qwen3_5_moe (qwen3_5 with a sparse MoE MLP, moe.h),
 * qwen3_next (hybrid, fused in_proj_qkvz / in_proj_ba, MoE on the layers
 * its config makes sparse). Weight names may carry the
 * "model.language_model." prefix (multimodal Qwen3.5 checkpoints) or
 * "model."; lm_head.weight, or the embeddings when tied. docs/engine.md
 * has the math.
 *
 * Loading checks every tensor the config implies: present, the right
 * shape, and a dtype the engine runs (F32 or BF16 for matrices; F32, BF16
 * or F16 for the small vectors, which are converted to f32 copies). Every
 * failure is an error whose message names the tensor (or the file, for a
 * malformed or truncated file); nothing from the files reaches an assert.
 *
 * A loaded model is read-only: any number of sequences (seq.h) may use it
 * at once from different threads, one forward at a time per sequence.
 * Large matrices stay in the mapping (counted under KV_MEM_WEIGHTS by the
 * safetensors reader); small f32 copies are kv_alloc'd under
 * KV_MEM_WEIGHTS too. The model owns the page pool its sequences' KV
 * pages come from (page_bytes = layout.page_bytes).
 */
#ifndef KV_ENGINE_MODEL_H
#define KV_ENGINE_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "base/pages.h"
#include "engine/gemm.h"
#include "engine/layout.h"
#include "model/config.h"

/* Bumped whenever a kernel's order of operations changes: part of the
 * cache namespace, so KV written by other numerics is never reused. */
#define KE_NUMERICS_VERSION "ke-numerics-3"

/* --kv-dtype: how K and V rows are stored (layout.h kv_dtype), in the
 * live sequences and in every cached and stored entry. bf16 (the
 * default) and f32 are exact copies of what the forward pass computed,
 * rounded to bf16 or not; q8_0 (engine/kvq8.h) quantizes each row to int8
 * blocks with a half scale, half the bytes of bf16 and lossy. The
 * dtype is part of the cache namespace (server/fingerprint.c). */
enum ke_kv { KE_KV_BF16 = 0, KE_KV_F32 = 1, KE_KV_Q8_0 = 2 };
/* "bf16" (or NULL), "f32", "q8_0" -> enum ke_kv; -1 for anything else. */
int ke_kv_parse(const char *s);
/* "bf16", "f32", "q8_0"; NULL for a value that is not an enum ke_kv. */
const char *ke_kv_name(int kv);
/* The layout kv_dtype (KV_DT_BF16, KV_DT_F32, KV_DT_Q8_0) of an enum
 * ke_kv; -1 for anything else. */
int ke_kv_dtype(int kv);

struct ke_model_params {
	int kv;              /* enum ke_kv; default (0): bf16 KV */
	int page_tokens;     /* B, tokens per KV page; 0 = 256 */
	size_t max_pages;    /* page pool limit, 0 = none */
	int quant_act;       /* enum ke_quant_act: how ggml block matrices (Q8_0 ... Q6_K) multiply */
};

/* --quant-act: KE_QACT_Q8 (the default, 0) quantizes each activation row
 * to int8 blocks for integer dots with Q8_0 / Q4_0 / Q4_1 / Q5_0 / Q5_1 /
 * Q2_K / Q3_K / Q4_K / Q5_K / Q6_K weights
 * (engine/qdot.h); KE_QACT_F32 keeps activations f32 against the exactly
 * dequantized weights (the numerics of the f32 engine). Other types and
 * F32/BF16/F16/MLX matrices are the same in both modes. Part of the cache
 * namespace (server/fingerprint.c). */
enum ke_quant_act { KE_QACT_Q8 = 0, KE_QACT_F32 = 1 };
/* "q8" (or NULL) / "f32"; -1 for anything else. */
int ke_quant_act_parse(const char *s);

struct ke_model;

/* Load a model folder (config.json + model.safetensors[.index.json]).
 * p may be NULL (defaults). *out owned by the caller (ke_model_destroy). */
int ke_model_load(const char *dir, const struct ke_model_params *p, struct ke_model **out);
/* All sequences of the model must be destroyed first. */
void ke_model_destroy(struct ke_model *m);

/* Views valid for the model's lifetime. */
const struct kv_model_config *ke_model_config(const struct ke_model *m);
/* Bytes of the prepacked panels the model's products read (engine/qpanel.h),
 * 0 when this path and these types keep none. */
size_t ke_model_packed_bytes(const struct ke_model *m);
const struct ke_layout *ke_model_layout(const struct ke_model *m);
/* The pool KV pages come from (shared with the prefix cache). */
struct kv_pages *ke_model_pages(struct ke_model *m);

/* Bytes of weights one decoded token reads (every matrix once, plus one
 * embedding row; in MoE layers the router, the shared expert and k of the
 * E routed experts): the numerator of the memory-bandwidth bound. */
uint64_t ke_model_decode_bytes(const struct ke_model *m);
/* 1 if some matrix multiplies with int8 activations (--quant-act q8 on a
 * model with block matrices of a type engine/qdot.h takes): the cache namespace names it. */
int ke_model_qdot(const struct ke_model *m);
/* The model's matrices, largest first (for benchmarks). i < ke_model_n_mats. */
int ke_model_n_mats(const struct ke_model *m);
const struct ke_mat *ke_model_mat(const struct ke_model *m, int i, const char **name);
/* 1 if the model has an MTP head that the engine loaded (engine/mtp.h). */
int ke_model_has_mtp(const struct ke_model *m);
/* Scratch bytes a sequence with this prefill chunk will allocate. */
size_t ke_model_scratch_bytes(const struct ke_model *m, int chunk);
/* The most window-page bytes a sequence holds while it prefills chunks of
 * `chunk` tokens (sliding layers; 0 without): its window, the 64-key block
 * the window starts in and the chunk, in whole pages (engine/seq.c). */
size_t ke_model_window_seq_bytes(const struct ke_model *m, int chunk);

#endif
