/*
 * gguf_map.h - how llama.cpp's GGUF files name and lay out what a Hugging
 * Face folder holds, for Qwen3 / Qwen3.5 / Qwen3.5-MoE / Qwen3-Next
 * (docs/gguf.md has the tables). Both directions use it: the converter
 * (model/gguf_convert.c, HF -> GGUF) and the loader (model/gguf_model.c,
 * GGUF -> the HF names the engine reads).
 *
 *   names        "model.layers.N.<hf>" <-> "blk.N.<gg>", the top-level
 *                tensors, the MoE and fused DeltaNet tensors;
 *   transforms   what llama.cpp's converter does to a tensor's values
 *                (enum kv_gguf_xf);
 *   value heads  the tiled order of qwen35 / qwen35moe's value heads, and
 *                the permutation between it and HF's grouped order;
 *   pre-tokenizer  tokenizer.ggml.pre names and the Split regexes of the
 *                real tokenizer.json files.
 */
#ifndef KV_MODEL_GGUF_MAP_H
#define KV_MODEL_GGUF_MAP_H

#include <stddef.h>
#include <stdint.h>

#include "model/config.h"

/* How a tensor's bytes differ between the HF layout and llama.cpp's. */
enum kv_gguf_xf {
	KV_GGUF_XF_NONE = 0,
	KV_GGUF_XF_NORM1,     /* (1 + w) norm: GGUF stores 1 + w (hybrid only) */
	KV_GGUF_XF_NEGEXP,    /* A_log -> -exp(A_log) */
	KV_GGUF_XF_VROWS,     /* rows are value heads (blocks of vrow rows) from row voff on */
	KV_GGUF_XF_VCOLS,     /* columns are value heads (blocks of dv) */
	KV_GGUF_XF_F32,       /* kept F32 whatever the file type (1-D, conv) */
	KV_GGUF_XF_PERMQK,    /* llama: q/k rows permuted per head for llama.cpp's adjacent-pair
				 RoPE (its converter's LlamaModel.permute); read back as is,
				 with RoPE on adjacent pairs (config.h rope_interleaved) */
};

/* general.architecture of a config: "qwen3", "qwen35", "qwen35moe",
 * "qwen3next", "llama", "gemma3", "gpt-oss", "granitehybrid" or
 * "nemotron_h". */
const char *kv_gguf_arch(const struct kv_model_config *c);

/* The Mamba-2 hybrids' top-level tensors (token_embd, output_norm,
 * output) under their HF names for c ("backbone." names for nemotron_h);
 * NULL for any other name. */
const char *kv_gguf_ssm_top_hf(const struct kv_model_config *c, const char *gg);

/* GGUF name of an HF tensor name (into buf); 0 if unmapped. */
int kv_gguf_name_from_hf(const struct kv_model_config *c, const char *hf, char *buf, size_t cap);
/* A layer tensor's HF suffix ("self_attn.q_proj.weight") for its GGUF
 * suffix after "blk.N." ("attn_q.weight"), with *xf its transform (xf may
 * be NULL); NULL when the layer table has no such tensor for c. */
const char *kv_gguf_layer_hf(const struct kv_model_config *c, const char *gg, int *xf);
/* The same for the MoE and fused DeltaNet tensors ("ffn_gate_exps.weight"
 * -> "mlp.switch_mlp.gate_proj.weight"); NULL if none. */
const char *kv_gguf_moe_hf(const char *gg);
/* The MTP head's own tensors: llama.cpp's nextn suffix (after
 * "blk.<n_layers>.") for a Hugging Face mtp.* name and back, NULL when the
 * name is not one (its decoder layer maps as any layer's, under
 * mtp.layers.0.); *xf as for the layers (its norms are (1 + w) norms). */
const char *kv_gguf_nextn_gg(const char *hf, int *xf);
const char *kv_gguf_nextn_hf(const char *gg);

/* 1 if c's value heads are stored tiled: llama.cpp's qwen35 / qwen35moe
 * converter tiles them (head j Hk + k is HF's head k (Hv / Hk) + j); its
 * qwen3next converter keeps HF's grouped order. */
int kv_gguf_vperm(const struct kv_model_config *c);
/* Where the value heads sit in the rows of GGUF tensor gg (a name or its
 * suffix): the first row and the rows per head. */
void kv_gguf_vrows(const struct kv_model_config *c, const char *gg, int64_t *voff, int64_t *vrow);
/* Permute the value-head rows of a row-major byte matrix in place, via
 * tmp (as large as the value rows), toward GGUF (to_gguf) or back. */
void kv_gguf_perm_rows(const struct kv_model_config *c, uint8_t *p, size_t row_bytes, int64_t voff, int64_t vrow,
		       int to_gguf, uint8_t *tmp);
/* Permute the value-head column blocks of each row (head_bytes per head:
 * dv elements, or whole quant blocks), via tmp (one row). */
void kv_gguf_perm_cols(const struct kv_model_config *c, uint8_t *p, int64_t rows, size_t row_bytes,
		       size_t head_bytes, int to_gguf, uint8_t *tmp);

/* gemma4's per-layer embedding tensors outside the layers: {Hugging Face
 * name (model. prefix), GGUF name}. */
extern const char *const kv_gguf_g4_top[3][2];

/* The Split regex of tokenizer.ggml.pre ("qwen2", "qwen35"), NULL if
 * kvkeep has none; and back, the name of a regex, NULL if it is neither. */
const char *kv_gguf_pre_regex(const char *pre);
const char *kv_gguf_pre_name(const char *re);

#endif
