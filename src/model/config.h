/*
 * config.h - config.json of the supported model families.
 *
 *   qwen3       dense Qwen3: every layer full attention.
 *   qwen3_5     hybrid Qwen3.5: the text model config may be nested under
 *               "text_config" (multimodal checkpoints) or flat. Layer types
 *               from "layer_types" ("linear_attention"/"full_attention"),
 *               else layer i is full attention iff (i+1) %
 *               full_attention_interval == 0 (default 4). rope_theta and
 *               partial_rotary_factor may sit in "rope_parameters".
 *   qwen3_next  hybrid Qwen3-Next (fused DeltaNet projections). MoE
 *               configurations (num_experts > 0 on any layer) are
 *               rejected with KV_ERR_UNSUPPORTED for now.
 * Anything else is KV_ERR_UNSUPPORTED naming the model_type. Impossible
 * shapes (heads not dividing, zero sizes, head counts that do not match
 * GQA, rotary dims odd, ...) are KV_ERR_INVALID naming the field.
 */
#ifndef KV_MODEL_CONFIG_H
#define KV_MODEL_CONFIG_H

#include <stdint.h>
#include <stddef.h>

#define KV_MAX_LAYERS 256

enum kv_arch { KV_ARCH_QWEN3 = 0, KV_ARCH_QWEN3_5 = 1, KV_ARCH_QWEN3_NEXT = 2 };
enum kv_layer_type { KV_LAYER_ATTN = 0, KV_LAYER_DELTANET = 1 };

struct kv_model_config {
	int arch;                     /* enum kv_arch */
	char model_type[32];          /* as written in config.json */
	int hidden;                   /* hidden_size */
	int n_layers;                 /* num_hidden_layers */
	int n_heads;                  /* num_attention_heads (query heads) */
	int n_kv_heads;               /* num_key_value_heads */
	int head_dim;                 /* head_dim (default hidden / n_heads) */
	int intermediate;             /* intermediate_size */
	int vocab;                    /* vocab_size */
	double rms_eps;               /* rms_norm_eps */
	double rope_theta;            /* rope_theta */
	double partial_rotary;        /* partial_rotary_factor (1.0 dense) */
	int rotary_dim;               /* head_dim x partial_rotary, even */
	int tie_embeddings;           /* tie_word_embeddings */
	int max_positions;            /* max_position_embeddings (0 unknown) */
	int hybrid;                   /* 1 for qwen3_5 / qwen3_next */
	int attn_output_gate;         /* q_proj carries a per-head gate (hybrid) */
	int norm_plus_one;            /* RMSNorm scales by (1 + w) (hybrid) */
	uint8_t layer_type[KV_MAX_LAYERS]; /* enum kv_layer_type per layer */
	int n_attn_layers;
	int n_deltanet_layers;
	/* Gated DeltaNet geometry (hybrid only). */
	int lin_k_heads;              /* linear_num_key_heads (Hk) */
	int lin_v_heads;              /* linear_num_value_heads (Hv) */
	int lin_k_dim;                /* linear_key_head_dim (dk) */
	int lin_v_dim;                /* linear_value_head_dim (dv) */
	int conv_kernel;              /* linear_conv_kernel_dim (K) */
	int eos_ids[8];               /* eos_token_id (int or list), -1 padded */
	int n_eos;
	int bos_id;                   /* -1 if absent */
	char torch_dtype[16];         /* "bfloat16", "float32", ... or "" */
};

/* Parse config.json text. `what` names the source in messages. */
int kv_config_parse(const char *text, size_t len, const char *what, struct kv_model_config *out);
/* Read <model_dir>/config.json. */
int kv_config_load(const char *model_dir, struct kv_model_config *out);

/* conv channels of a DeltaNet layer: 2 Hk dk + Hv dv. */
uint64_t kv_config_conv_dim(const struct kv_model_config *c);
/* KV bytes per token over all attention layers for an element size
 * (2 for 16-bit KV): n_attn_layers x 2 x n_kv_heads x head_dim x elem. */
uint64_t kv_config_kv_bytes_per_token(const struct kv_model_config *c, int elem_bytes);
/* fp32 delta-rule state of one DeltaNet layer: Hv x dk x dv x 4. */
uint64_t kv_config_recurrent_state_bytes(const struct kv_model_config *c);
/* fp32 conv state of one DeltaNet layer: conv_dim x (K - 1) x 4. */
uint64_t kv_config_conv_state_bytes(const struct kv_model_config *c);
/* Parameter count implied by the config (embeddings included, lm_head
 * counted once when tied). */
uint64_t kv_config_param_count(const struct kv_model_config *c);
/* "qwen3", "qwen3_5", "qwen3_next". */
const char *kv_arch_name(int arch);

#endif
