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
 *   qwen3_next  hybrid Qwen3-Next (fused DeltaNet projections), sparse
 *               mixture-of-experts MLP on layer l iff num_experts > 0, l
 *               is not in mlp_only_layers and (l + 1) %
 *               decoder_sparse_step == 0 (configuration_qwen3_next.py),
 *               other layers the dense MLP of intermediate_size.
 *   qwen3_5_moe  hybrid Qwen3.5 with a sparse MoE MLP on every layer
 *               (configuration_qwen3_5_moe.py: no dense layers, top-k
 *               weights always renormalised), nested under "text_config"
 *               like qwen3_5; qwen3_5_moe_text is its flat text config.
 *   qwen3_5_text  the flat text config of Qwen3.5 (what the nested
 *               "text_config" holds), read like qwen3_5.
 *   llama       Llama 2/3.x (LlamaForCausalLM): plain attention, SwiGLU,
 *               RoPE with the "llama3" frequency scaling (rope_scaling
 *               rope_type llama3: factor, low_freq_factor,
 *               high_freq_factor, original_max_position_embeddings).
 *   gemma3_text Gemma 3 (Gemma3ForCausalLM); gemma3 is the multimodal
 *               Gemma3ForConditionalGeneration with the text model under
 *               "text_config" (weights under model.language_model.).
 *               Sliding-window layers (layer_types, else every layer but
 *               each sliding_window_pattern-th), rope_local_base_freq on
 *               the sliding layers and rope_theta / rope_scaling on the
 *               global ones, (1 + w) RMSNorms before and after attention
 *               and the MLP, q/k norms, GeGLU (gelu_pytorch_tanh), the
 *               embedding scaled by sqrt(hidden), the softmax scale
 *               query_pre_attn_scalar^-0.5, final_logit_softcapping.
 *   gpt_oss     GPT-OSS (GptOssForCausalLM): alternating sliding (128)
 *               and full attention layers, q/k/v/o biases, a learned sink
 *               logit per query head, YaRN RoPE, a sparse MoE on every
 *               layer (router with bias, top-k on the logits then softmax
 *               over the k, experts with biases and the clamped SwiGLU
 *               of swiglu_limit and alpha 1.702), experts in the MXFP4
 *               release layout (_blocks / _scales) or as GGUF stacks.
 * Anything else is KV_ERR_UNSUPPORTED naming the model_type (qwen3_moe
 * gets a message saying MoE). Impossible shapes (heads not
 * dividing, zero sizes, head counts that do not match GQA, rotary dims
 * odd, layer_types of the wrong length, ...) are KV_ERR_INVALID naming the
 * field, e.g. "config.json: text_config.num_key_value_heads: 3 does not
 * divide num_attention_heads 16". Features the engine does not implement
 * (sliding windows, rope types other than default, mrope, linear and yarn,
 * attention biases, an activation other than silu) are KV_ERR_UNSUPPORTED
 * naming the field; "dynamic" NTK scaling is refused because its
 * frequencies depend on how long the batch being computed is, which would
 * make a token's KV depend on chunking (cached != cold).
 *
 * Defaults for missing fields are those of the Hugging Face configuration
 * classes (configuration_qwen3.py, configuration_qwen3_next.py,
 * configuration_qwen3_5.py): e.g. head_dim 128 for qwen3 and 256 for the
 * hybrids, num_key_value_heads = num_attention_heads for qwen3,
 * partial_rotary_factor 0.25 for the hybrids, rope_theta 10000,
 * rms_norm_eps 1e-6, tie_word_embeddings false; MoE: qwen3_next
 * num_experts 512, num_experts_per_tok 10, norm_topk_prob true,
 * moe_intermediate_size 512, shared_expert_intermediate_size 512,
 * decoder_sparse_step 1, mlp_only_layers []; qwen3_5_moe num_experts 256,
 * num_experts_per_tok 8, the same sizes, hidden_size 2048, 40 layers.
 * A qwen3_next config is dense only with "num_experts": 0 or every layer
 * in "mlp_only_layers".
 * rope_theta / partial_rotary_factor inside "rope_parameters" win over the
 * top-level ones (that is how transformers standardises them).
 *
 * Weight names (docs/models.md): qwen3 and flat qwen3_5_text checkpoints
 * use "model.layers.N...."; nested qwen3_5 checkpoints
 * (Qwen3_5ForConditionalGeneration, the real Qwen3.5 releases) use
 * "model.language_model.layers.N....", with "lm_head.weight" at the top
 * level in both. kv_config_tensors lists what a config implies;
 * model/open.h loads the config of a model path of any format and checks
 * a weights handle against it.
 */
#ifndef KV_MODEL_CONFIG_H
#define KV_MODEL_CONFIG_H

#include <stdint.h>
#include <stddef.h>

#define KV_MAX_LAYERS 256

enum kv_arch { KV_ARCH_QWEN3 = 0, KV_ARCH_QWEN3_5 = 1, KV_ARCH_QWEN3_NEXT = 2,
	       /* the sliding-window families (issue 32) */
	       KV_ARCH_LLAMA = 16, KV_ARCH_GEMMA3 = 17, KV_ARCH_GPT_OSS = 18,
	       KV_ARCH_GEMMA4 = 19 };
/* How a checkpoint stores the routed experts of a MoE layer (docs/models.md):
 *   STACKED   mlp.experts.gate_up_proj [E, 2 I, D] (gate rows then up rows
 *             of each expert) and mlp.experts.down_proj [E, D, I], the
 *             parameters of transformers' Qwen3_5MoeExperts / Qwen3NextExperts;
 *   SPLIT     mlp.experts.N.{gate,up}_proj.weight [I, D] and
 *             mlp.experts.N.down_proj.weight [D, I] (nn.Linear per expert, the
 *             layout of the released Qwen3-Next checkpoints);
 *   SWITCH    mlp.switch_mlp.{gate,up}_proj.weight [E, I, D] and
 *             mlp.switch_mlp.down_proj.weight [E, D, I] (mlx-lm's SwitchGLU
 *             stacks, unquantized). */
enum kv_expert_layout { KV_EXPERTS_STACKED = 0, KV_EXPERTS_SPLIT = 1, KV_EXPERTS_SWITCH = 2,
	/* GPT-OSS's release: mlp.experts.gate_up_proj_blocks [E, 2I, D/32, 16]
	 * and _scales [E, 2I, D/32] (U8, MXFP4: gate and up rows interleaved,
	 * row 2i gate i, row 2i + 1 up i), down_proj_blocks [E, D, I/32, 16]
	 * and _scales; gate_up_proj_bias [E, 2I], down_proj_bias [E, D]. */
	KV_EXPERTS_OAI_MXFP4 = 3 };
/* How a MoE layer routes and what an expert computes (moe.h). */
enum kv_moe_kind { KV_MOE_QWEN = 0, KV_MOE_OAI = 1, KV_MOE_GEMMA4 = 2 };
/* The MLP's activation: silu(gate) * up, or gelu_tanh(gate) * up. */
enum kv_mlp_act { KV_ACT_SILU = 0, KV_ACT_GELU_TANH = 1 };
enum kv_layer_type { KV_LAYER_ATTN = 0, KV_LAYER_DELTANET = 1 };
/* The Mamba-2 hybrids (model/config_ssm.c): their own arch and layer
 * values, far from the ones above so that other families can be added
 * there without renumbering. */
enum kv_arch_ssm { KV_ARCH_GRANITE_HYBRID = 32, KV_ARCH_NEMOTRON_H = 33 };
/* 1: arch is a sliding-window family (llama, gemma3, gpt_oss, gemma4);
 * the Mamba-2 arches above are numbered past them. */
static inline int kv_arch_window_family(int arch)
{
	return arch >= KV_ARCH_LLAMA && arch <= KV_ARCH_GEMMA4;
}
enum kv_layer_ssm {
	KV_LAYER_MAMBA = 8,   /* Mamba-2 mixer: conv + SSM state (recurrent, snapshotted like DeltaNet) */
	KV_LAYER_MLP = 9,     /* Nemotron-H '-': an MLP block alone */
};

enum kv_rope_scaling { KV_ROPE_NONE = 0, KV_ROPE_LINEAR, KV_ROPE_YARN, KV_ROPE_LLAMA3 };

struct kv_model_config {
	int arch;                     /* enum kv_arch */
	char model_type[32];          /* as written in config.json */
	int hidden;                   /* hidden_size */
	int n_layers;                 /* num_hidden_layers */
	int n_heads;                  /* num_attention_heads (query heads) */
	int n_kv_heads;               /* num_key_value_heads */
	int head_dim;                 /* head_dim (HF default: 128 qwen3, 256 hybrids) */
	int intermediate;             /* intermediate_size */
	int vocab;                    /* vocab_size */
	double rms_eps;               /* rms_norm_eps */
	double rope_theta;            /* rope_theta */
	double partial_rotary;        /* partial_rotary_factor (1.0 dense) */
	int rotary_dim;               /* head_dim x partial_rotary, even */
	int tie_embeddings;           /* tie_word_embeddings */
	int max_positions;            /* max_position_embeddings (0 unknown) */
	/* RoPE scaling (rope_scaling / rope_parameters "rope_type"): the
	 * engine's inverse frequencies follow transformers'
	 * modeling_rope_utils.py; docs/engine.md has the formulas. */
	int rope_scaling;             /* enum kv_rope_scaling */
	double rope_factor;           /* "factor" (linear, yarn); 1 for none */
	double rope_attn_factor;      /* cos/sin multiplier: YaRN's attention factor, else 1 */
	double rope_beta_fast;        /* yarn "beta_fast" (32) */
	double rope_beta_slow;        /* yarn "beta_slow" (1) */
	int rope_orig_max_pos;        /* yarn "original_max_position_embeddings" (max_positions) */
	int rope_truncate;            /* yarn "truncate" (true) */
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
	/* Added by the model layer (additive). */
	int text_nested;              /* qwen3_5 fields came from "text_config" */
	int fused_deltanet;           /* qwen3_next: in_proj_qkvz / in_proj_ba */
	char architecture[64];        /* "architectures"[0] or "" */
	/* Mixture of experts (0 / unset for dense models). */
	int n_experts;                /* num_experts (E); 0 = no MoE layer */
	int n_experts_per_tok;        /* num_experts_per_tok (k <= E) */
	int norm_topk_prob;           /* renormalise the k routing weights */
	int moe_intermediate;         /* moe_intermediate_size (I of an expert) */
	int shared_intermediate;      /* shared_expert_intermediate_size */
	int n_moe_layers;
	uint8_t layer_moe[KV_MAX_LAYERS]; /* 1: layer l has the sparse MoE block */
	int expert_layout;            /* enum kv_expert_layout the tensor list uses */
	/* Multi-token prediction (hybrid): mtp_num_hidden_layers (Qwen3.5's
	 * text config; GGUF nextn_predict_layers). The head's tensors are
	 * listed by kv_config_mtp_tensors, never by kv_config_tensors: a folder
	 * without them (mlx-lm drops them) is still a whole model. */
	int n_mtp_layers;
	/* Set when the model comes from a GGUF file (model/gguf_model.h). */
	int gguf;                     /* 1: weights and metadata from a .gguf */
	int a_is_neg_exp;             /* the A_log tensor holds -exp(A_log) (GGUF ssm_a) */
	int out_proj_tiled;           /* DeltaNet out_proj columns in llama.cpp's tiled
	                                 value-head order (its input must be permuted) */
	int vrows_tiled;              /* DeltaNet in_proj_qkv (v rows), in_proj_z, in_proj_b,
	                                 in_proj_a rows in tiled order (outputs permuted) */
	/*
	 * Sliding-window attention and the block variants of llama, gemma3 and
	 * gpt_oss. A sliding layer is an attention layer (layer_type ATTN)
	 * with layer_window[l] set: its query at position p attends keys
	 * [max(0, p - W + 1), p] (W keys, its own included: transformers'
	 * "kv_idx > q_idx - sliding_window", llama.cpp's standard SWA). Its KV
	 * is not paged with the global layers' (engine/layout.h): a sequence
	 * keeps only the window, and a cache entry of such a model cannot be
	 * trimmed (its window state is snapshot state, like a recurrent one).
	 */
	int sliding_window;           /* W, keys a sliding layer attends; 0: no sliding layer */
	uint8_t layer_window[KV_MAX_LAYERS]; /* 1: attention layer l is sliding (window W) */
	int n_swa_layers;             /* attention layers with a window */
	double rope_local_theta;      /* RoPE base of the sliding layers (gemma3
					 rope_local_base_freq; rope_theta otherwise); no scaling */
	double attn_scale;            /* softmax scale; 0: head_dim^-0.5 (gemma3 query_pre_attn_scalar,
					 granite attention_multiplier) */
	int qk_norm;                  /* per-head q/k RMSNorm before RoPE (qwen3, gemma3) */
	int attn_bias;                /* q/k/v/o projection biases (gpt_oss) */
	int attn_sinks;               /* a learned sink logit per query head (gpt_oss) */
	int sandwich_norm;            /* gemma3: RMSNorm of the attention and MLP outputs
					 before the residual adds (post_attention_layernorm,
					 pre/post_feedforward_layernorm) */
	int mlp_act;                  /* enum kv_mlp_act */
	int embed_scale;              /* embeddings times sqrt(hidden) (gemma, in f32) */
	double final_softcap;         /* logits = cap tanh(logits / cap); 0: none */
	double rope_low_freq;         /* llama3 rope low_freq_factor (1) */
	double rope_high_freq;        /* llama3 rope high_freq_factor (4) */
	int rope_interleaved;         /* RoPE rotates adjacent pairs (llama.cpp's "normal"
					 mode: a llama GGUF's q/k rows are permuted for it) */
	int rope_freqs_tensor;        /* GGUF: inverse frequencies divided by the file's
					 rope_freqs factors (llama3) */
	int moe_kind;                 /* enum kv_moe_kind */
	double swiglu_limit;          /* gpt_oss clamp of the expert's gate and up (7) */
	/* Mamba-2 hybrids (granitemoehybrid, nemotron_h; model/config_ssm.c).
	 * Their recurrent layers are KV_LAYER_MAMBA; hybrid stays 0 (it names
	 * the Qwen3.5 / Qwen3-Next conventions). conv_kernel is the mixer's
	 * d_conv. */
	int ssm;                      /* 1: Mamba-2 hybrid */
	int n_ssm_layers;             /* KV_LAYER_MAMBA layers */
	int n_mlp_layers;             /* KV_LAYER_MLP layers (nemotron_h) */
	int ssm_heads;                /* H: mamba_n_heads */
	int ssm_head_dim;             /* P: mamba_d_head / mamba_head_dim */
	int ssm_state;                /* N: d_state */
	int ssm_groups;               /* G: n_groups (B and C per group, H / G heads each) */
	int ssm_norm_groups;          /* groups of the gated RMSNorm over the H P outputs */
	int ssm_conv_bias;            /* conv1d has a bias */
	int layer_ffn;                /* every layer has a post-norm FFN (granite); 0: nemotron_h */
	int mlp_relu2;                /* the MLP is down(relu(up h)^2) (nemotron_h) */
	int shared_ungated;           /* MoE shared expert added without a gate (granite) */
	double embed_mult;            /* granite embedding_multiplier (1 otherwise) */
	double residual_mult;         /* granite residual_multiplier (1 otherwise) */
	double logits_div;            /* granite logits_scaling: logits / it (1 otherwise) */
	int shared_split;             /* granite MoE: the shared expert as shared_mlp.{gate,up}_proj
	                                 (a GGUF's ffn_{gate,up}_shexp) instead of input_linear */
	/*
	 * Gemma 4 (gemma4_text / gemma4): the sliding and the global layers
	 * have their own head geometry. head_dim and n_kv_heads above are the
	 * global (paged) layers' (HF global_head_dim, num_global_key_value_heads);
	 * the sliding layers' are below (HF head_dim, num_key_value_heads).
	 * 0 means "as the global layers" (every other family):
	 * kv_config_layer_head_dim / kv_config_layer_kv_heads answer per layer.
	 */
	int swa_head_dim;             /* head_dim of the sliding layers, or 0 */
	int swa_kv_heads;             /* KV heads of the sliding layers, or 0 */
	int local_rotary_dim;         /* rotary dim of the sliding layers, or 0 (rotary_dim) */
	int rope_rot_pairs;           /* "proportional" RoPE of the global layers: the first
					 rope_rot_pairs of the rotary_dim / 2 frequencies
					 rotate, the others are 0 (0: all rotate) */
	int k_eq_v;                   /* attention_k_eq_v: the global layers have no v_proj,
					 V is k_proj's output (before k_norm and RoPE) */
	int v_norm;                   /* V rows RMS-normalised, without a weight (gemma4) */
	int layer_scalar;             /* layers.N.layer_scalar [1] multiplies each layer's
					 output (gemma4) */
	int n_kv_shared;              /* gemma4 num_kv_shared_layers: the last ones have no KV
					 of their own and read the last earlier layer of their
					 type's (kv_config_kv_layer) */
	int double_wide;              /* gemma4 use_double_wide_mlp: the KV-shared layers' MLP
					 is 2 x intermediate_size wide */
	int ple_dim;                  /* gemma4 hidden_size_per_layer_input: per-layer
					 embeddings of this width (0: none) */
};

/* Head size and KV heads of attention layer l (the sliding layers' may
 * differ: gemma4). */
static inline int kv_config_layer_head_dim(const struct kv_model_config *c, int l)
{
	return c->layer_window[l] && c->swa_head_dim ? c->swa_head_dim : c->head_dim;
}
static inline int kv_config_layer_kv_heads(const struct kv_model_config *c, int l)
{
	return c->layer_window[l] && c->swa_kv_heads ? c->swa_kv_heads : c->n_kv_heads;
}
static inline int kv_config_swa_head_dim(const struct kv_model_config *c)
{
	return c->swa_head_dim ? c->swa_head_dim : c->head_dim;
}
static inline int kv_config_swa_kv_heads(const struct kv_model_config *c)
{
	return c->swa_kv_heads ? c->swa_kv_heads : c->n_kv_heads;
}
/* The layer whose KV attention layer l reads: l itself, or for gemma4's
 * last n_kv_shared layers the last layer before them of the same type
 * (sliding or global), as transformers' Gemma 4 picks it; -1 when there is
 * none (kv_config_parse refuses that). */
static inline int kv_config_kv_layer(const struct kv_model_config *c, int l)
{
	int F = c->n_layers - c->n_kv_shared;
	if (!c->n_kv_shared || l < F)
		return l;
	for (int j = F - 1; j >= 0; j--)
		if (c->layer_type[j] == c->layer_type[l] && c->layer_window[j] == c->layer_window[l])
			return j;
	return -1;
}
/* Attention layers with KV of their own: the global (paged) ones, or
 * (swa 1) the sliding ones. */
static inline int kv_config_kv_layers(const struct kv_model_config *c, int swa)
{
	int n = 0;
	for (int l = 0; l < c->n_layers - c->n_kv_shared; l++)
		n += c->layer_type[l] == KV_LAYER_ATTN && (c->layer_window[l] != 0) == (swa != 0);
	return n;
}
/* The MLP width of layer l (gemma4's double-wide KV-shared layers). */
static inline int kv_config_layer_intermediate(const struct kv_model_config *c, int l)
{
	return c->double_wide && l >= c->n_layers - c->n_kv_shared ? 2 * c->intermediate : c->intermediate;
}
/* 1: layer l of a k_eq_v model has no v_proj (a global layer). */
static inline int kv_config_layer_v_is_k(const struct kv_model_config *c, int l)
{
	return c->k_eq_v && !c->layer_window[l];
}

/* Largest config.json read (model/open.c, the MLX readers and writer). */
#define KV_CONFIG_MAX_BYTES (16u * 1024 * 1024)

/* Parse config.json text. `what` names the source in messages. */
int kv_config_parse(const char *text, size_t len, const char *what, struct kv_model_config *out);

/* config_ssm.c: the Mamba-2 families. kv_config_parse hands them on. */
int kv_config_is_ssm_type(const char *model_type);
/* config.json text as Python's json writes it may hold the bare literals
 * NaN, Infinity and -Infinity (Nemotron-H's "time_step_limit": [0.0,
 * Infinity]), which JSON (and jansson) refuse: a copy with each such
 * literal outside strings written as a string ("Infinity"), or NULL when
 * the text has none (*out untouched). */
int kv_config_json_relax(const char *text, size_t len, char **out, size_t *out_len);
/* conv channels of a Mamba-2 layer: H P + 2 G N. */
uint64_t kv_config_ssm_conv_dim(const struct kv_model_config *c);

/* conv channels of a DeltaNet layer: 2 Hk dk + Hv dv. */
uint64_t kv_config_conv_dim(const struct kv_model_config *c);
/* KV bytes per token over all attention layers for an element size
 * (2 for 16-bit KV): n_attn_layers x 2 x n_kv_heads x head_dim x elem. */
uint64_t kv_config_kv_bytes_per_token(const struct kv_model_config *c, int elem_bytes);
/* KV bytes of the sliding layers' windows (W - 1 rows each: what a
 * snapshot keeps), for an element size: n_swa_layers x 2 x n_kv_heads x
 * head_dim x (W - 1) x elem. kv_config_kv_bytes_per_token counts only the
 * other (global) attention layers. */
uint64_t kv_config_window_bytes(const struct kv_model_config *c, int elem_bytes);
/* fp32 delta-rule state of one DeltaNet layer: Hv x dk x dv x 4. */
uint64_t kv_config_recurrent_state_bytes(const struct kv_model_config *c);
/* fp32 conv state of one DeltaNet layer: conv_dim x (K - 1) x 4. */
uint64_t kv_config_conv_state_bytes(const struct kv_model_config *c);
/* Parameter count implied by the config (embeddings included, lm_head
 * counted once when tied). */
uint64_t kv_config_param_count(const struct kv_model_config *c);
/* Parameters one token reads: the count above less the E - k routed
 * experts a token does not use in each MoE layer (embeddings included;
 * equal to kv_config_param_count for dense models). */
uint64_t kv_config_active_param_count(const struct kv_model_config *c);
/* "qwen3", "qwen3_5", "qwen3_next", "llama", "gemma3", "gpt_oss",
 * "granitemoehybrid", "nemotron_h". */
const char *kv_arch_name(int arch);

/*
 * The tensors a config implies, with their Hugging Face names and shapes
 * (nn.Linear weights are [out, in]). `role` says what the tensor is for,
 * so generators and loaders can treat classes alike.
 */
enum kv_tensor_role {
	KV_ROLE_EMBED = 0,    /* embed_tokens [vocab, hidden] */
	KV_ROLE_LM_HEAD,      /* lm_head [vocab, hidden] (absent when tied) */
	KV_ROLE_NORM,         /* RMSNorm weight used as w */
	KV_ROLE_NORM_OFFSET,  /* RMSNorm weight used as (1 + w) */
	KV_ROLE_LINEAR,       /* projection reading the normalised input */
	KV_ROLE_LINEAR_OUT,   /* projection writing into the residual stream */
	KV_ROLE_LINEAR_A,     /* DeltaNet in_proj_a (feeds the decay) */
	KV_ROLE_CONV,         /* DeltaNet conv1d.weight [conv_dim, 1, K] */
	KV_ROLE_DT_BIAS,      /* DeltaNet dt_bias [Hv] */
	KV_ROLE_A_LOG,        /* DeltaNet A_log [Hv] */
	KV_ROLE_ROUTER,       /* MoE mlp.gate [E, hidden] router */
	KV_ROLE_BIAS,         /* a projection's bias (gpt_oss) */
	KV_ROLE_SINKS,        /* gpt_oss self_attn.sinks [heads] */
	KV_ROLE_MXFP4_BLOCKS, /* gpt_oss expert codes, U8 [.., rows, cols/32, 16] */
	KV_ROLE_MXFP4_SCALES, /* gpt_oss expert scales, U8 E8M0 [.., rows, cols/32] */
};
/* Roles of the Mamba-2 mixers (config_ssm.c), numbered apart. */
enum kv_tensor_role_ssm {
	KV_ROLE_CONV_BIAS = 32, /* conv1d.bias [conv channels] */
	KV_ROLE_SSM_D = 33,   /* D [heads]: the skip y += D x */
};

struct kv_tensor_spec {
	char name[96];
	int ndim;
	int64_t shape[4];
	int role;             /* enum kv_tensor_role */
	int layer;            /* model layer, -1 outside the layers */
	int expert;           /* routed expert of a SPLIT tensor, -1 otherwise */
};

/* Weight-name prefix of the text model: "model.language_model." for a
 * nested qwen3_5 config, else "model.". */
const char *kv_config_default_prefix(const struct kv_model_config *c);
/* All tensors for `prefix` (NULL: the default prefix). *out is malloc'd
 * (free()), *n its length. */
int kv_config_tensors(const struct kv_model_config *c, const char *prefix, struct kv_tensor_spec **out,
		      size_t *n);
/*
 * The multi-token-prediction head's tensors (one MTP layer; hybrid
 * families), by their Hugging Face names under "mtp.": fc [H, 2H] (input:
 * the normed token embedding, then the normed hidden state),
 * pre_fc_norm_embedding, pre_fc_norm_hidden and norm [H] ((1 + w)
 * norms), and layers.0.* a full-attention decoder layer with the text
 * model's attention geometry and its MLP (the sparse MoE block when
 * `moe`, in c->expert_layout). Entries carry layer = c->n_layers. *out
 * malloc'd.
 */
int kv_config_mtp_tensors(const struct kv_model_config *c, int moe, struct kv_tensor_spec **out, size_t *n);

/* Name of the lm_head weight for a prefix: "language_model.lm_head.weight"
 * for mlx-lm's "language_model.model.", else "lm_head.weight". */
const char *kv_config_lm_head_name(const char *prefix);

#endif
