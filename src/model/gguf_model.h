/*
 * gguf_model.h - Qwen3 / Qwen3.5 / Qwen3.5-MoE / Qwen3-Next models in GGUF
 * files (qwen3, qwen35, qwen35moe, qwen3next), read as the Hugging Face
 * model they were converted from (docs/gguf.md has the tables; the names
 * and layouts are model/gguf_map.h, the other direction is
 * model/gguf_convert.h):
 *
 *   kv_gguf_config       GGUF metadata -> struct kv_model_config
 *   kv_gguf_hf_tensors   GGUF tensors -> the Hugging Face names and layout
 *                        the engine loads (kv_weights_open uses it)
 *   kv_gguf_tokenizer_json / kv_gguf_chat_template   tokenizer.ggml.* and
 *                        tokenizer.chat_template -> what kvkeep's tokenizer
 *                        and template loaders read
 *
 * Conversions llama.cpp applies to qwen35 (convert_hf_to_gguf.py, Qwen3.5
 * text model) and how they are undone here:
 *   RMSNorm weights used as (1 + w) are stored with the 1 added (f32):
 *     the config from a GGUF says norm_plus_one = 0, so the engine uses the
 *     stored value as is (bit-identical to adding 1 to the HF weight in f32).
 *   A_log is stored as ssm_a = -exp(A_log): the config says a_is_neg_exp,
 *     and the engine takes the values as -exp(A_log) directly.
 *   conv1d [C, 1, K] is stored squeezed as [C, K]: same bytes, shape put back.
 *   When linear_num_key_heads < linear_num_value_heads, value heads are
 *     stored in "tiled" order (head j*Hk + k is HF's head k*(Hv/Hk) + j) in
 *     in_proj_qkv's v rows, in_proj_z, in_proj_b, in_proj_a, conv1d's v
 *     channels, dt_bias, A and out_proj's columns. conv1d, dt_bias and A
 *     are permuted back into an owned copy; the projections are not copied:
 *     the config says vrows_tiled and the engine moves the value heads of
 *     their outputs back to HF order (exact: each output is the same dot
 *     product). out_proj's columns are permuted back for float types (so
 *     the sum runs in HF's order), otherwise out_proj_tiled is set and the
 *     engine feeds it its input in tiled order. So kv_gguf_hf_tensors'
 *     in_proj_qkv/z/b/a keep the tiled row order when vrows_tiled.
 */
#ifndef KV_MODEL_GGUF_MODEL_H
#define KV_MODEL_GGUF_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "model/config.h"
#include "model/gguf.h"

/* Config from metadata (general.architecture qwen3, qwen35, qwen35moe or
 * qwen3next). MoE files: every sparse layer's expert tensors are checked
 * (present, llama.cpp's shapes; errors name the GGUF tensor), the expert
 * layout is the one kv_gguf_hf_tensors presents (SWITCH, or STACKED for a
 * fused ffn_gate_up_exps), and qwen3next loads unfused (attn_qkv /
 * attn_gate, ssm_ba split) unless the file has the old fused ssm_in. */
int kv_gguf_config(const struct kv_gguf *g, struct kv_model_config *out);

/*
 * The model's tensors under their Hugging Face names ("model.layers.N..."
 * prefix "model.", "lm_head.weight") with HF shapes; *out is a malloc'd
 * array of *n (free() it and its names with kv_gguf_hf_free). Tensors
 * that had to be permuted point into *blob (kv_alloc'd under
 * KV_MEM_WEIGHTS, kv_free), the others into the mapping (expert stacks
 * always: mlp.switch_mlp.{gate,up,down}_proj.weight [E, rows, cols]).
 * Tensors the engine does not know are left out.
 */
int kv_gguf_hf_tensors(const struct kv_gguf *g, const struct kv_model_config *c, struct kv_tensor **out,
		       size_t *n, void **blob);
void kv_gguf_hf_free(struct kv_tensor *t, size_t n);
/* 1 if out_proj of DeltaNet layers is left in tiled value-head order. */
int kv_gguf_out_tiled(const struct kv_gguf *g, const struct kv_model_config *c);

/* A tokenizer.json text (malloc'd, free()) built from tokenizer.ggml.*;
 * KV_ERR_UNSUPPORTED for a tokenizer.ggml.model other than gpt2 or a
 * `pre` kvkeep has no regex for. */
int kv_gguf_tokenizer_json(const struct kv_gguf *g, char **json, size_t *len);
/* tokenizer.chat_template (malloc'd) or KV_ERR_NOT_FOUND. */
int kv_gguf_chat_template(const struct kv_gguf *g, char **out);
/* A tokenizer_config.json text (malloc'd) for the chat template loader:
 * chat_template, bos/eos/pad token strings from their ids, and the
 * control / user-defined tokens as added_tokens_decoder. */
int kv_gguf_tokenizer_config_json(const struct kv_gguf *g, char **json, size_t *len);

#endif
