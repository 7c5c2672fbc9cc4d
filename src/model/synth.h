/*
 * synth.h - synthetic model folders in the real Hugging Face layout.
 *
 * No weights can be downloaded here, so tests and benchmarks run on
 * models written by `kvkeep mkmodel`: a folder with config.json,
 * model.safetensors (deterministic random weights, same seed -> same
 * bytes), tokenizer.json and tokenizer_config.json (with a chat template).
 * Names, shapes and config fields are exactly those the Hugging Face
 * modeling code loads (see kv_config_tensors and docs/models.md), so the
 * engine loads a synthetic folder the way it loads a real one.
 *
 * Weights are scaled so that activations stay finite and well-conditioned
 * over long contexts: projections ~ N(0, 1/fan_in), residual output
 * projections further scaled by 1/sqrt(2 x n_layers), RMSNorm weights
 * near 1 (near 0 where the model stores (1 + w) offsets), DeltaNet decays
 * alpha = exp(g) spread over 0.9 .. 0.999 per value head. docs/models.md
 * explains every choice. The normal deviates are made from integer
 * arithmetic only (a sum of four 16-bit uniforms), so the bytes do not
 * depend on the libm of the machine; only A_log uses exp/log.
 *
 * The built-in tokenizer is a small byte-level BPE (256 byte tokens in
 * GPT-2 byte-level form, merges learned deterministically from a built-in
 * English/code text with the Qwen3 pre-tokenizer regex, the Qwen3 added
 * tokens) in the same JSON structure as the real Qwen3 tokenizer.json.
 */
#ifndef KV_MODEL_SYNTH_H
#define KV_MODEL_SYNTH_H

#include <stddef.h>
#include <stdint.h>

#include "model/config.h"

struct kv_synth_preset {
	const char *name;
	const char *summary;
	int arch;                  /* enum kv_arch */
	int hidden;
	int n_layers;
	int n_heads;
	int n_kv_heads;
	int head_dim;
	int intermediate;
	int full_attention_interval; /* hybrid: layer i is attention iff (i+1) % it == 0 */
	int lin_k_heads, lin_v_heads, lin_k_dim, lin_v_dim, conv_kernel;
	double partial_rotary;     /* 1.0 dense */
	double rope_theta;
	double rms_eps;
	int tie_embeddings;
	int max_positions;
	int config_only;           /* real size: config + tokenizer only unless opts.large */
	int release_files;         /* as the Qwen3.5 releases ship: config.json's eos_token_id
				    * is <|endoftext|> only, and generation_config.json lists
				    * [<|im_end|>, <|endoftext|>] with the model card's sampling
				    * (do_sample, temperature 0.6, top_k 20, top_p 0.95) */
	/* Mixture of experts (n_experts 0: dense MLP). arch KV_ARCH_QWEN3_5
	 * with experts writes model_type qwen3_5_moe (every layer sparse,
	 * stacked experts); KV_ARCH_QWEN3_NEXT writes a flat qwen3_next config
	 * (fused DeltaNet projections, per-expert tensors). */
	int n_experts, n_experts_per_tok, moe_intermediate, shared_intermediate;
	int norm_topk_prob;        /* qwen3_next only */
	int mlp_only_layer;        /* qwen3_next: this layer keeps the dense MLP; -1 none */
	int vocab;                 /* config-only presets: the real vocab_size (0: the tokenizer's) */
	/* llama / gemma3 / gpt_oss (config.h): sliding window W (0 none) and
	 * pattern (layer i global iff (i + 1) % pattern == 0); gemma3's local
	 * RoPE base; gpt_oss's experts (n_experts, n_experts_per_tok,
	 * intermediate per expert) in the MXFP4 release layout. */
	int sliding_window, swa_pattern;
	double rope_local_theta;
	/* gemma4: the global layers' head size and KV heads (head_dim and
	 * n_kv_heads above are the sliding layers'), their share of rotated
	 * dims ("proportional" RoPE), attention_k_eq_v, the final softcap */
	int global_head_dim, global_kv_heads, k_eq_v;
	double global_partial_rotary, final_softcap;
	/* gemma4 E2B / E4B: the last kv_shared layers read an earlier layer's
	 * KV, per-layer embeddings of ple_dim, double-wide shared-layer MLPs */
	int kv_shared, ple_dim, double_wide;
	/* Mamba-2 hybrids (arch KV_ARCH_GRANITE_HYBRID / KV_ARCH_NEMOTRON_H,
	 * synth_ssm.c): the layer pattern, one character per layer ('M'
	 * Mamba-2, '*' attention, '-' an MLP layer of nemotron_h), the mixer's
	 * heads, head dim, state size and groups (conv_kernel is its d_conv),
	 * and Granite's multipliers. Granite with n_experts > 0 is the MoE +
	 * shared-expert variant (intermediate = an expert's size), else dense
	 * (shared_intermediate alone). */
	const char *pattern;
	int ssm_heads, ssm_head_dim, ssm_state, ssm_groups;
	double embed_mult, residual_mult, attn_mult, logits_scaling;
};

size_t kv_synth_preset_count(void);
const struct kv_synth_preset *kv_synth_preset_at(size_t i);
/* NULL if there is no preset of that name. */
const struct kv_synth_preset *kv_synth_preset_find(const char *name);

struct kv_synth_opts {
	const char *preset;        /* preset name */
	const char *out_dir;       /* created if missing (mode 0755) */
	const char *tokenizer_dir; /* copy tokenizer.json + tokenizer_config.json
				    * from here; NULL: the built-in tokenizer */
	uint64_t seed;             /* weights seed */
	int dtype;                 /* KV_DT_BF16 or KV_DT_F32 (must be set) */
	int config_only;           /* no model.safetensors */
	int large;                 /* write the weights of a config-only (real-size)
				    * preset anyway (--large: tens of GB) */
	unsigned dw_flags;         /* KV_DW_* for every file written */
	int mtp;                   /* hybrid presets: add the multi-token-prediction head
				    * (config mtp_num_hidden_layers 1, the mtp.* tensors of
				    * the releases: model/config.h kv_config_mtp_tensors) */
};

/*
 * Write the folder. Errors: KV_ERR_INVALID for an unknown preset, a bad
 * dtype, or weights asked of a config-only preset; I/O errors as the
 * durable writer reports them; tokenizer files that are not valid JSON
 * are KV_ERR_INVALID naming the file. The folder's config.json has
 * vocab_size = max id + 1 over the tokenizer's vocab and added tokens,
 * except for config-only presets that carry their real vocab (.vocab),
 * whose parameter counts are then those of the released model.
 */
int kv_synth_write(const struct kv_synth_opts *o);

/*
 * config.json text of a preset for a tokenizer with `vocab` ids and the
 * given bos/eos ids (-1: absent). *out is malloc'd (free()).
 */
int kv_synth_config_json(const struct kv_synth_preset *p, int vocab, int bos_id, int eos_id, int dtype,
			 char **out, size_t *len);
/* The same for the Mamba-2 presets (synth_ssm.c; kv_synth_config_json
 * hands them on). */
int kv_synth_ssm_config_json(const struct kv_synth_preset *p, int vocab, int bos_id, int eos_id, int dtype,
			     char **out, size_t *len);

/*
 * The built-in tokenizer: tokenizer.json and tokenizer_config.json texts,
 * malloc'd (free()). Deterministic (no seed involved).
 */
int kv_synth_tokenizer(char **tok_json, size_t *tok_len, char **cfg_json, size_t *cfg_len);
/* The ChatML chat template written into tokenizer_config.json. */
const char *kv_synth_chat_template(void);

/*
 * Scan tokenizer.json text: number of ids (max id + 1 over model.vocab and
 * added_tokens) and the ids of "<|endoftext|>" and "<|im_end|>" (-1 when
 * absent). KV_ERR_INVALID naming `what` when the JSON is not a tokenizer.
 */
int kv_synth_tokenizer_ids(const char *json, size_t len, const char *what, int *n_ids, int *bos_id,
			   int *eos_id);

/*
 * The values of one tensor, as written to model.safetensors: nbytes of
 * dtype (F32 or BF16) for spec s of config c. Exposed so tests can check
 * the statistics without a file.
 */
int kv_synth_fill(const struct kv_model_config *c, const struct kv_tensor_spec *s, uint64_t seed, int dtype,
		  void *dst, uint64_t nbytes);

#endif
