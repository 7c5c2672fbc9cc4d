/*
 * synth.c - synthetic model folders, see synth.h and docs/models.md.
 *
 * Pieces: the preset table; config.json built with jansson in the field
 * order of the real checkpoints; the built-in tokenizer (BPE merges
 * learned from g_corpus, pre-tokenised with the Qwen3 regex through
 * PCRE2, exactly as the real pipeline splits text); the chat template;
 * and the weight generator, which produces one tensor at a time through
 * the safetensors writer's fill callback so a 60M-parameter model never
 * sits in memory whole.
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "model/synth.h"
#include "model/safetensors.h"
#include "base/buf.h"
#include "base/durable.h"
#include "base/err.h"
#include "base/hash.h"
#include "base/io.h"
#include "base/json.h"
#include "base/map.h"
#include "base/utf8.h"

#include <jansson.h>
#include <math.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>

/* --- presets ------------------------------------------------------------- */

static const struct kv_synth_preset g_presets[] = {
	{
		.name = "tiny-dense",
		.summary = "Qwen3 shape, ~0.9M parameters: for unit tests and torch reference checks",
		.arch = KV_ARCH_QWEN3,
		.hidden = 128, .n_layers = 4, .n_heads = 4, .n_kv_heads = 2, .head_dim = 32,
		.intermediate = 384, .partial_rotary = 1.0, .rope_theta = 1000000, .rms_eps = 1e-6,
		.tie_embeddings = 1, .max_positions = 40960,
	},
	{
		.name = "tiny-hybrid",
		.summary = "Qwen3.5 shape, 3 Gated DeltaNet layers + 1 full attention (last)",
		.arch = KV_ARCH_QWEN3_5,
		.hidden = 64, .n_layers = 4, .n_heads = 4, .n_kv_heads = 2, .head_dim = 32,
		.intermediate = 192, .full_attention_interval = 4,
		.lin_k_heads = 2, .lin_v_heads = 4, .lin_k_dim = 16, .lin_v_dim = 16, .conv_kernel = 4,
		.partial_rotary = 0.25, .rope_theta = 10000000, .rms_eps = 1e-6, .max_positions = 262144,
	},
	{
		.name = "tiny-qwen35",
		.summary = "tiny-hybrid's shape with the files of a Qwen3.5 release: config.json ends at <|endoftext|> "
			   "only, generation_config.json has the eos list and the model card's sampling",
		.arch = KV_ARCH_QWEN3_5,
		.hidden = 64, .n_layers = 4, .n_heads = 4, .n_kv_heads = 2, .head_dim = 32,
		.intermediate = 192, .full_attention_interval = 4,
		.lin_k_heads = 2, .lin_v_heads = 4, .lin_k_dim = 16, .lin_v_dim = 16, .conv_kernel = 4,
		.partial_rotary = 0.25, .rope_theta = 10000000, .rms_eps = 1e-6, .max_positions = 262144,
		.release_files = 1,
	},
	{
		.name = "bench-dense",
		.summary = "Qwen3 shape, ~36M parameters without embeddings, 8 KiB of KV per token",
		.arch = KV_ARCH_QWEN3,
		.hidden = 512, .n_layers = 8, .n_heads = 8, .n_kv_heads = 2, .head_dim = 128,
		.intermediate = 2048, .partial_rotary = 1.0, .rope_theta = 1000000, .rms_eps = 1e-6,
		.max_positions = 40960,
	},
	{
		.name = "bench-hybrid",
		.summary = "Qwen3.5 shape, ~36M parameters without embeddings: 6 DeltaNet (9B heads) + 2 attention",
		.arch = KV_ARCH_QWEN3_5,
		.hidden = 256, .n_layers = 8, .n_heads = 8, .n_kv_heads = 4, .head_dim = 256,
		.intermediate = 1024, .full_attention_interval = 4,
		.lin_k_heads = 16, .lin_v_heads = 32, .lin_k_dim = 128, .lin_v_dim = 128, .conv_kernel = 4,
		.partial_rotary = 0.25, .rope_theta = 10000000, .rms_eps = 1e-6, .max_positions = 262144,
	},
	{
		.name = "qwen35-9b",
		.summary = "the real Qwen3.5-9B geometry: config only, or --large for 18 GB of weights",
		.arch = KV_ARCH_QWEN3_5,
		.hidden = 4096, .n_layers = 32, .n_heads = 16, .n_kv_heads = 4, .head_dim = 256,
		.intermediate = 12288, .full_attention_interval = 4,
		.lin_k_heads = 16, .lin_v_heads = 32, .lin_k_dim = 128, .lin_v_dim = 128, .conv_kernel = 4,
		.partial_rotary = 0.25, .rope_theta = 10000000, .rms_eps = 1e-6, .max_positions = 262144,
		.config_only = 1, .mlp_only_layer = -1, .vocab = 248320,
	},
	{
		/* Qwen/Qwen3-1.7B config.json: tied embeddings. */
		.name = "qwen3-1.7b",
		.summary = "the real Qwen3-1.7B geometry (tied embeddings): config only, or --large for 4 GB of weights",
		.arch = KV_ARCH_QWEN3,
		.hidden = 2048, .n_layers = 28, .n_heads = 16, .n_kv_heads = 8, .head_dim = 128,
		.intermediate = 6144, .partial_rotary = 1.0, .rope_theta = 1000000, .rms_eps = 1e-6,
		.tie_embeddings = 1, .max_positions = 40960, .vocab = 151936, .config_only = 1,
	},
	{
		/* Qwen/Qwen3-8B config.json. */
		.name = "qwen3-8b",
		.summary = "the real Qwen3-8B geometry: config only, or --large for 16 GB of weights",
		.arch = KV_ARCH_QWEN3,
		.hidden = 4096, .n_layers = 36, .n_heads = 32, .n_kv_heads = 8, .head_dim = 128,
		.intermediate = 12288, .partial_rotary = 1.0, .rope_theta = 1000000, .rms_eps = 1e-6,
		.max_positions = 40960, .vocab = 151936, .config_only = 1,
	},
	{
		.name = "tiny-moe",
		.summary = "Qwen3.5-MoE shape (qwen3_5_moe): 3 DeltaNet + 1 attention, 8 experts top-2 + shared",
		.arch = KV_ARCH_QWEN3_5,
		.hidden = 64, .n_layers = 4, .n_heads = 4, .n_kv_heads = 2, .head_dim = 32,
		.intermediate = 32, .full_attention_interval = 4,
		.lin_k_heads = 2, .lin_v_heads = 4, .lin_k_dim = 16, .lin_v_dim = 16, .conv_kernel = 4,
		.partial_rotary = 0.25, .rope_theta = 10000000, .rms_eps = 1e-6, .max_positions = 262144,
		.n_experts = 8, .n_experts_per_tok = 2, .moe_intermediate = 32, .shared_intermediate = 48,
		.norm_topk_prob = 1, .mlp_only_layer = -1,
	},
	{
		.name = "tiny-next",
		.summary = "Qwen3-Next shape (qwen3_next): fused in_proj_qkvz/ba, 8 experts top-3, layer 1 dense",
		.arch = KV_ARCH_QWEN3_NEXT,
		.hidden = 64, .n_layers = 4, .n_heads = 4, .n_kv_heads = 2, .head_dim = 32,
		.intermediate = 96, .full_attention_interval = 4,
		.lin_k_heads = 2, .lin_v_heads = 4, .lin_k_dim = 16, .lin_v_dim = 16, .conv_kernel = 4,
		.partial_rotary = 0.25, .rope_theta = 10000000, .rms_eps = 1e-6, .max_positions = 262144,
		.n_experts = 8, .n_experts_per_tok = 3, .moe_intermediate = 32, .shared_intermediate = 48,
		.norm_topk_prob = 0, .mlp_only_layer = 1,
	},
	{
		/* what llama.cpp's qwen3next GGUF can hold: no dense layer, top-k
		 * renormalised (its graph always does); the GGUF peer tests use it */
		.name = "tiny-next-moe",
		.summary = "tiny-next with a MoE block on every layer and norm_topk_prob (llama.cpp's qwen3next)",
		.arch = KV_ARCH_QWEN3_NEXT,
		.hidden = 64, .n_layers = 4, .n_heads = 4, .n_kv_heads = 2, .head_dim = 32,
		.intermediate = 96, .full_attention_interval = 4,
		.lin_k_heads = 2, .lin_v_heads = 4, .lin_k_dim = 16, .lin_v_dim = 16, .conv_kernel = 4,
		.partial_rotary = 0.25, .rope_theta = 10000000, .rms_eps = 1e-6, .max_positions = 262144,
		.n_experts = 8, .n_experts_per_tok = 3, .moe_intermediate = 32, .shared_intermediate = 48,
		.norm_topk_prob = 1, .mlp_only_layer = -1,
	},
	{
		.name = "bench-moe",
		.summary = "Qwen3.5-MoE shape, ~49M parameters without embeddings: 32 experts top-4 per layer",
		.arch = KV_ARCH_QWEN3_5,
		.hidden = 512, .n_layers = 8, .n_heads = 8, .n_kv_heads = 2, .head_dim = 64,
		.intermediate = 96, .full_attention_interval = 4,
		.lin_k_heads = 4, .lin_v_heads = 8, .lin_k_dim = 64, .lin_v_dim = 64, .conv_kernel = 4,
		.partial_rotary = 0.25, .rope_theta = 10000000, .rms_eps = 1e-6, .max_positions = 262144,
		.n_experts = 32, .n_experts_per_tok = 4, .moe_intermediate = 96, .shared_intermediate = 256,
		.norm_topk_prob = 1, .mlp_only_layer = -1,
	},
	{
		/* Qwen/Qwen3.5-35B-A3B config.json (text_config). */
		.name = "qwen35-35b-a3b",
		.summary = "the real Qwen3.5-35B-A3B geometry (256 experts top-8), config and tokenizer only",
		.arch = KV_ARCH_QWEN3_5,
		.hidden = 2048, .n_layers = 40, .n_heads = 16, .n_kv_heads = 2, .head_dim = 256,
		.intermediate = 512, .full_attention_interval = 4,
		.lin_k_heads = 16, .lin_v_heads = 32, .lin_k_dim = 128, .lin_v_dim = 128, .conv_kernel = 4,
		.partial_rotary = 0.25, .rope_theta = 10000000, .rms_eps = 1e-6, .max_positions = 262144,
		.n_experts = 256, .n_experts_per_tok = 8, .moe_intermediate = 512, .shared_intermediate = 512,
		.norm_topk_prob = 1, .mlp_only_layer = -1, .vocab = 248320, .config_only = 1,
	},
	{
		/* Qwen/Qwen3-Next-80B-A3B-Instruct config.json. */
		.name = "qwen3-next-80b-a3b",
		.summary = "the real Qwen3-Next-80B-A3B geometry (512 experts top-10), config and tokenizer only",
		.arch = KV_ARCH_QWEN3_NEXT,
		.hidden = 2048, .n_layers = 48, .n_heads = 16, .n_kv_heads = 2, .head_dim = 256,
		.intermediate = 5120, .full_attention_interval = 4,
		.lin_k_heads = 16, .lin_v_heads = 32, .lin_k_dim = 128, .lin_v_dim = 128, .conv_kernel = 4,
		.partial_rotary = 0.25, .rope_theta = 10000000, .rms_eps = 1e-6, .max_positions = 262144,
		.n_experts = 512, .n_experts_per_tok = 10, .moe_intermediate = 512, .shared_intermediate = 512,
		.norm_topk_prob = 1, .mlp_only_layer = -1, .vocab = 151936, .config_only = 1,
	},
	{
		.name = "tiny-dense-k",
		.summary = "tiny-dense with rows of 256 (hidden, heads, FFN), 8 layers: the K quant types apply to every "
			   "matrix (convert tests)",
		.arch = KV_ARCH_QWEN3,
		.hidden = 256, .n_layers = 8, .n_heads = 4, .n_kv_heads = 2, .head_dim = 64,
		.intermediate = 512, .partial_rotary = 1.0, .rope_theta = 1000000, .rms_eps = 1e-6,
		.tie_embeddings = 1, .max_positions = 40960,
	},
	{
		.name = "tiny-hybrid-k",
		.summary = "tiny-hybrid with rows of 256 (hidden, heads, DeltaNet values, FFN): the K quant types apply "
			   "to every matrix (convert tests)",
		.arch = KV_ARCH_QWEN3_5,
		.hidden = 256, .n_layers = 4, .n_heads = 4, .n_kv_heads = 2, .head_dim = 64,
		.intermediate = 512, .full_attention_interval = 4,
		.lin_k_heads = 2, .lin_v_heads = 4, .lin_k_dim = 64, .lin_v_dim = 64, .conv_kernel = 4,
		.partial_rotary = 0.25, .rope_theta = 10000000, .rms_eps = 1e-6, .max_positions = 262144,
	},
	/* The sliding-window families (issue 32). Windows of 16 keys in the
	 * tiny presets so a 64-token reference check runs far past them. */
	{
		.name = "tiny-llama3",
		.summary = "Llama 3.1 shape (llama3 RoPE scaling), ~0.6M parameters",
		.arch = KV_ARCH_LLAMA,
		.hidden = 128, .n_layers = 4, .n_heads = 4, .n_kv_heads = 2, .head_dim = 32,
		.intermediate = 256, .partial_rotary = 1.0, .rope_theta = 500000, .rms_eps = 1e-5,
		.max_positions = 131072, .mlp_only_layer = -1,
	},
	{
		.name = "tiny-gemma3",
		.summary = "Gemma 3 shape: 5 sliding (window 16) : 1 global, GeGLU, sandwich norms, tied",
		.arch = KV_ARCH_GEMMA3,
		.hidden = 128, .n_layers = 6, .n_heads = 4, .n_kv_heads = 2, .head_dim = 32,
		.intermediate = 256, .partial_rotary = 1.0, .rope_theta = 1000000, .rms_eps = 1e-6,
		.tie_embeddings = 1, .max_positions = 32768, .mlp_only_layer = -1,
		.sliding_window = 16, .swa_pattern = 6, .rope_local_theta = 10000,
	},
	{
		.name = "tiny-gpt-oss",
		.summary = "GPT-OSS shape: sliding (16) / full alternating, sinks, biases, 8 MXFP4 experts top-2, YaRN",
		.arch = KV_ARCH_GPT_OSS,
		.hidden = 64, .n_layers = 4, .n_heads = 4, .n_kv_heads = 2, .head_dim = 32,
		.intermediate = 64, .partial_rotary = 1.0, .rope_theta = 150000, .rms_eps = 1e-5,
		.max_positions = 131072, .n_experts = 8, .n_experts_per_tok = 2, .mlp_only_layer = -1,
		.sliding_window = 16, .swa_pattern = 2,
	},
	{
		.name = "tiny-gemma4",
		.summary = "Gemma 4 shape: 5 sliding (window 16, heads of 32) : 1 global (heads of 64, K = V, "
			   "proportional RoPE), layer scalars, softcap 30",
		.arch = KV_ARCH_GEMMA4,
		.hidden = 128, .n_layers = 6, .n_heads = 4, .n_kv_heads = 2, .head_dim = 32,
		.intermediate = 256, .partial_rotary = 1.0, .rope_theta = 1000000, .rms_eps = 1e-6,
		.tie_embeddings = 1, .max_positions = 131072, .mlp_only_layer = -1,
		.sliding_window = 16, .swa_pattern = 6, .rope_local_theta = 10000,
		.global_head_dim = 64, .global_kv_heads = 1, .k_eq_v = 1, .global_partial_rotary = 0.25,
		.final_softcap = 30.0,
	},
	{
		.name = "tiny-gemma4-moe",
		.summary = "Gemma 4 26B-A4B shape: tiny-gemma4 with 8 experts top-2 (GeGLU, per-expert scales) beside "
			   "the dense MLP on every layer",
		.arch = KV_ARCH_GEMMA4,
		.hidden = 128, .n_layers = 6, .n_heads = 4, .n_kv_heads = 2, .head_dim = 32,
		.intermediate = 96, .partial_rotary = 1.0, .rope_theta = 1000000, .rms_eps = 1e-6,
		.tie_embeddings = 1, .max_positions = 131072, .mlp_only_layer = -1,
		.sliding_window = 16, .swa_pattern = 6, .rope_local_theta = 10000,
		.global_head_dim = 64, .global_kv_heads = 1, .k_eq_v = 1, .global_partial_rotary = 0.25,
		.final_softcap = 30.0, .n_experts = 8, .n_experts_per_tok = 2, .moe_intermediate = 64,
	},
	{
		.name = "tiny-gemma4-e",
		.summary = "Gemma 4 E2B shape: 9 layers (2 sliding : 1 global), the last 3 reading earlier layers' KV, "
			   "per-layer embeddings of 16, double-wide MLPs on the shared layers, V projected",
		.arch = KV_ARCH_GEMMA4,
		.hidden = 128, .n_layers = 9, .n_heads = 4, .n_kv_heads = 2, .head_dim = 32,
		.intermediate = 128, .partial_rotary = 1.0, .rope_theta = 1000000, .rms_eps = 1e-6,
		.tie_embeddings = 1, .max_positions = 131072, .mlp_only_layer = -1,
		.sliding_window = 16, .swa_pattern = 3, .rope_local_theta = 10000,
		.global_head_dim = 64, .global_kv_heads = 1, .k_eq_v = 0, .global_partial_rotary = 0.25,
		.final_softcap = 30.0, .kv_shared = 3, .ple_dim = 16, .double_wide = 1,
	},
	{
		.name = "bench-llama3",
		.summary = "Llama 3 shape, ~34M parameters without embeddings, 8 KiB of KV per token",
		.arch = KV_ARCH_LLAMA,
		.hidden = 512, .n_layers = 8, .n_heads = 8, .n_kv_heads = 2, .head_dim = 128,
		.intermediate = 2048, .partial_rotary = 1.0, .rope_theta = 500000, .rms_eps = 1e-5,
		.max_positions = 131072, .mlp_only_layer = -1,
	},
	{
		.name = "bench-gemma3",
		.summary = "Gemma 3 shape, ~35M parameters without embeddings: 5 sliding (window 512) : 1 global",
		.arch = KV_ARCH_GEMMA3,
		.hidden = 512, .n_layers = 12, .n_heads = 4, .n_kv_heads = 1, .head_dim = 256,
		.intermediate = 1536, .partial_rotary = 1.0, .rope_theta = 1000000, .rms_eps = 1e-6,
		.tie_embeddings = 1, .max_positions = 32768, .mlp_only_layer = -1,
		.sliding_window = 512, .swa_pattern = 6, .rope_local_theta = 10000,
	},
	{
		.name = "bench-gpt-oss",
		.summary = "GPT-OSS shape, ~47M parameters without embeddings: window 128, 16 MXFP4 experts top-4",
		.arch = KV_ARCH_GPT_OSS,
		.hidden = 512, .n_layers = 8, .n_heads = 8, .n_kv_heads = 2, .head_dim = 64,
		.intermediate = 256, .partial_rotary = 1.0, .rope_theta = 150000, .rms_eps = 1e-5,
		.max_positions = 131072, .n_experts = 16, .n_experts_per_tok = 4, .mlp_only_layer = -1,
		.sliding_window = 128, .swa_pattern = 2,
	},
	{
		.name = "bench-gemma4",
		.summary = "Gemma 4 shape, ~38M parameters without embeddings: 5 sliding (window 512, heads of 128) : "
			   "1 global (heads of 256, K = V)",
		.arch = KV_ARCH_GEMMA4,
		.hidden = 512, .n_layers = 12, .n_heads = 8, .n_kv_heads = 2, .head_dim = 128,
		.intermediate = 1536, .partial_rotary = 1.0, .rope_theta = 1000000, .rms_eps = 1e-6,
		.tie_embeddings = 1, .max_positions = 131072, .mlp_only_layer = -1,
		.sliding_window = 512, .swa_pattern = 6, .rope_local_theta = 10000,
		.global_head_dim = 256, .global_kv_heads = 1, .k_eq_v = 1, .global_partial_rotary = 0.25,
		.final_softcap = 30.0,
	},
	{
		/* google/gemma-4-31B-it's text config (docs/models.md) */
		.name = "gemma-4-31b",
		.summary = "the gemma-4-31B geometry (60 layers, 5 sliding : 1 global, K = V): config only, or --large",
		.arch = KV_ARCH_GEMMA4,
		.hidden = 5376, .n_layers = 60, .n_heads = 32, .n_kv_heads = 16, .head_dim = 256,
		.intermediate = 21504, .partial_rotary = 1.0, .rope_theta = 1000000, .rms_eps = 1e-6,
		.tie_embeddings = 1, .max_positions = 262144, .mlp_only_layer = -1,
		.sliding_window = 1024, .swa_pattern = 6, .rope_local_theta = 10000, .vocab = 262144,
		.config_only = 1, .global_head_dim = 512, .global_kv_heads = 4, .k_eq_v = 1,
		.global_partial_rotary = 0.25, .final_softcap = 30.0,
	},
	{
		/* google/gemma-4-26B-A4B-it's text config (docs/models.md) */
		.name = "gemma-4-26b-a4b",
		.summary = "the gemma-4-26B-A4B geometry (30 layers, 128 experts top-8 beside a dense MLP): config only, "
			   "or --large",
		.arch = KV_ARCH_GEMMA4,
		.hidden = 2816, .n_layers = 30, .n_heads = 16, .n_kv_heads = 8, .head_dim = 256,
		.intermediate = 2112, .partial_rotary = 1.0, .rope_theta = 1000000, .rms_eps = 1e-6,
		.tie_embeddings = 1, .max_positions = 262144, .mlp_only_layer = -1,
		.sliding_window = 1024, .swa_pattern = 6, .rope_local_theta = 10000, .vocab = 262144,
		.config_only = 1, .global_head_dim = 512, .global_kv_heads = 2, .k_eq_v = 1,
		.global_partial_rotary = 0.25, .final_softcap = 30.0, .n_experts = 128, .n_experts_per_tok = 8,
		.moe_intermediate = 704,
	},
	{
		/* gemma-4-26b-a4b at full width, 6 of its 30 layers: its MoE at real
		 * size where the whole model does not fit this machine (docs/peer.md) */
		.name = "gemma-4-26b-a4b-l6",
		.summary = "gemma-4-26B-A4B's full width with 6 of its 30 layers (5 sliding : 1 global), 5.6B parameters: "
			   "config only, or --large (11 GB)",
		.arch = KV_ARCH_GEMMA4,
		.hidden = 2816, .n_layers = 6, .n_heads = 16, .n_kv_heads = 8, .head_dim = 256,
		.intermediate = 2112, .partial_rotary = 1.0, .rope_theta = 1000000, .rms_eps = 1e-6,
		.tie_embeddings = 1, .max_positions = 262144, .mlp_only_layer = -1,
		.sliding_window = 1024, .swa_pattern = 6, .rope_local_theta = 10000, .vocab = 262144,
		.config_only = 1, .global_head_dim = 512, .global_kv_heads = 2, .k_eq_v = 1,
		.global_partial_rotary = 0.25, .final_softcap = 30.0, .n_experts = 128, .n_experts_per_tok = 8,
		.moe_intermediate = 704,
	},
	{
		/* openai/gpt-oss-20b config.json */
		.name = "gpt-oss-20b",
		.summary = "the real gpt-oss-20b geometry (32 MXFP4 experts top-4): config only, or --large (13 GB)",
		.arch = KV_ARCH_GPT_OSS,
		.hidden = 2880, .n_layers = 24, .n_heads = 64, .n_kv_heads = 8, .head_dim = 64,
		.intermediate = 2880, .partial_rotary = 1.0, .rope_theta = 150000, .rms_eps = 1e-5,
		.max_positions = 131072, .n_experts = 32, .n_experts_per_tok = 4, .mlp_only_layer = -1,
		.sliding_window = 128, .swa_pattern = 2, .vocab = 201088, .config_only = 1,
	},
	{
		/* meta-llama/Llama-3.1-8B-Instruct config.json */
		.name = "llama-3.1-8b",
		.summary = "the real Llama-3.1-8B geometry: config only, or --large for 16 GB of weights",
		.arch = KV_ARCH_LLAMA,
		.hidden = 4096, .n_layers = 32, .n_heads = 32, .n_kv_heads = 8, .head_dim = 128,
		.intermediate = 14336, .partial_rotary = 1.0, .rope_theta = 500000, .rms_eps = 1e-5,
		.max_positions = 131072, .mlp_only_layer = -1, .vocab = 128256, .config_only = 1,
	},
	/* The Mamba-2 hybrids (config_ssm.c, synth_ssm.c). */
	{
		.name = "tiny-granite-h",
		.summary = "Granite 4.0-H shape (MoE + shared expert): 3 Mamba-2 layers + 1 attention, 8 experts top 2",
		.arch = KV_ARCH_GRANITE_HYBRID, .pattern = "MM*M",
		.hidden = 64, .n_layers = 4, .n_heads = 4, .n_kv_heads = 2, .head_dim = 16, .intermediate = 32,
		.n_experts = 8, .n_experts_per_tok = 2, .shared_intermediate = 48,
		.ssm_heads = 4, .ssm_head_dim = 32, .ssm_state = 16, .ssm_groups = 1, .conv_kernel = 4,
		.embed_mult = 2.0, .residual_mult = 0.5, .attn_mult = 0.0625, .logits_scaling = 1.25,
		.rope_theta = 10000, .rms_eps = 1e-5, .tie_embeddings = 1, .max_positions = 131072,
	},
	{
		.name = "tiny-granite-h-dense",
		.summary = "Granite 4.0-H dense shape (no experts: shared_mlp alone), 3 Mamba-2 layers + 1 attention",
		.arch = KV_ARCH_GRANITE_HYBRID, .pattern = "M*MM",
		.hidden = 64, .n_layers = 4, .n_heads = 4, .n_kv_heads = 2, .head_dim = 16, .intermediate = 32,
		.shared_intermediate = 96,
		.ssm_heads = 4, .ssm_head_dim = 32, .ssm_state = 16, .ssm_groups = 1, .conv_kernel = 4,
		.embed_mult = 2.0, .residual_mult = 0.5, .attn_mult = 0.0625, .logits_scaling = 1.25,
		.rope_theta = 10000, .rms_eps = 1e-5, .tie_embeddings = 1, .max_positions = 131072,
	},
	{
		/* Granite derives head_dim = hidden / heads: 2 heads give the 32
		 * that q8_0 KV needs (engine/kvq8.h), for its tests on a hybrid */
		.name = "tiny-granite-h-q8kv",
		.summary = "tiny-granite-h with 2 attention heads of 32 (head_dim a multiple of 32: --kv-dtype q8_0 tests)",
		.arch = KV_ARCH_GRANITE_HYBRID, .pattern = "MM*M",
		.hidden = 64, .n_layers = 4, .n_heads = 2, .n_kv_heads = 1, .head_dim = 32, .intermediate = 32,
		.n_experts = 8, .n_experts_per_tok = 2, .shared_intermediate = 48,
		.ssm_heads = 4, .ssm_head_dim = 32, .ssm_state = 16, .ssm_groups = 1, .conv_kernel = 4,
		.embed_mult = 2.0, .residual_mult = 0.5, .attn_mult = 0.03125, .logits_scaling = 1.25,
		.rope_theta = 10000, .rms_eps = 1e-5, .tie_embeddings = 1, .max_positions = 131072,
	},
	{
		.name = "tiny-nemotron-h",
		.summary = "Nemotron-H shape: Mamba-2 (2 groups), attention and squared-ReLU MLP layers, M-M*-M",
		.arch = KV_ARCH_NEMOTRON_H, .pattern = "M-M*-M",
		.hidden = 64, .n_layers = 6, .n_heads = 4, .n_kv_heads = 2, .head_dim = 16, .intermediate = 128,
		.ssm_heads = 8, .ssm_head_dim = 16, .ssm_state = 16, .ssm_groups = 2, .conv_kernel = 4,
		.rope_theta = 10000, .rms_eps = 1e-5, .max_positions = 131072,
	},
	{
		.name = "bench-granite-h",
		.summary = "benchmarks: Granite 4.0-H MoE shape, 6 Mamba-2 (16 heads x 64, state 128) + 2 attention, "
			   "32 experts top 4",
		.arch = KV_ARCH_GRANITE_HYBRID, .pattern = "MMM*MMM*",
		.hidden = 512, .n_layers = 8, .n_heads = 8, .n_kv_heads = 2, .head_dim = 64, .intermediate = 64,
		.n_experts = 32, .n_experts_per_tok = 4, .shared_intermediate = 256,
		.ssm_heads = 16, .ssm_head_dim = 64, .ssm_state = 128, .ssm_groups = 1, .conv_kernel = 4,
		.embed_mult = 2.0, .residual_mult = 0.5, .attn_mult = 0.015625, .logits_scaling = 1.25,
		.rope_theta = 10000, .rms_eps = 1e-5, .tie_embeddings = 1, .max_positions = 131072,
	},
	{
		.name = "bench-nemotron-h",
		.summary = "benchmarks: Nemotron Nano 2 shape, 7 Mamba-2 (32 heads x 80, 8 groups, state 128) + 7 MLP "
			   "+ 2 attention",
		.arch = KV_ARCH_NEMOTRON_H, .pattern = "M-M-M*-M-M-M*-M-",
		.hidden = 512, .n_layers = 16, .n_heads = 8, .n_kv_heads = 2, .head_dim = 64, .intermediate = 2048,
		.ssm_heads = 32, .ssm_head_dim = 80, .ssm_state = 128, .ssm_groups = 8, .conv_kernel = 4,
		.rope_theta = 10000, .rms_eps = 1e-5, .max_positions = 131072,
	},
	{
		/* ibm-granite/granite-4.0-h-small config.json (32B total, 9B active) */
		.name = "granite-4.0-h-small",
		.summary = "the released Granite 4.0-H Small geometry (config only; weights with --large)",
		.arch = KV_ARCH_GRANITE_HYBRID, .pattern = "MMMMM*MMMMMMMMM*MMMMMMMMM*MMMMMMMMM*MMMM",
		.hidden = 4096, .n_layers = 40, .n_heads = 32, .n_kv_heads = 8, .head_dim = 128, .intermediate = 768,
		.n_experts = 72, .n_experts_per_tok = 10, .shared_intermediate = 1024,
		.ssm_heads = 128, .ssm_head_dim = 64, .ssm_state = 128, .ssm_groups = 1, .conv_kernel = 4,
		.embed_mult = 12.0, .residual_mult = 0.22, .attn_mult = 0.0078125, .logits_scaling = 16.0,
		.rope_theta = 10000, .rms_eps = 1e-5, .tie_embeddings = 1, .max_positions = 131072,
		.config_only = 1, .vocab = 100352,
	},
	{
		/* nvidia/NVIDIA-Nemotron-Nano-9B-v2 config.json (8.89B) */
		.name = "nemotron-nano-9b-v2",
		.summary = "the released Nemotron Nano 9B v2 geometry (config only; weights with --large)",
		.arch = KV_ARCH_NEMOTRON_H, .pattern = "M-M-M-MM-M-M-M*-M-M-M*-M-M-M-M*-M-M-M-M*-M-MM-M-M-M-M-M-",
		.hidden = 4480, .n_layers = 56, .n_heads = 40, .n_kv_heads = 8, .head_dim = 128, .intermediate = 15680,
		.ssm_heads = 128, .ssm_head_dim = 80, .ssm_state = 128, .ssm_groups = 8, .conv_kernel = 4,
		.rope_theta = 10000, .rms_eps = 1e-5, .max_positions = 131072,
		.config_only = 1, .vocab = 131072,
	},
};

size_t kv_synth_preset_count(void)
{
	return sizeof g_presets / sizeof g_presets[0];
}

const struct kv_synth_preset *kv_synth_preset_at(size_t i)
{
	return i < kv_synth_preset_count() ? &g_presets[i] : NULL;
}

const struct kv_synth_preset *kv_synth_preset_find(const char *name)
{
	for (size_t i = 0; name && i < kv_synth_preset_count(); i++)
		if (!strcmp(g_presets[i].name, name))
			return &g_presets[i];
	return NULL;
}

/* --- config.json --------------------------------------------------------- */

static const char *dtype_torch(int dt)
{
	return dt == KV_DT_F32 ? "float32" : dt == KV_DT_F16 ? "float16" : "bfloat16";
}

/* Fields shared by both families, in the order real configs list them. */
static void cfg_common(json_t *o, const struct kv_synth_preset *p, int vocab, int bos, int eos, int dtype)
{
	json_object_set_new(o, "attention_bias", json_false());
	json_object_set_new(o, "attention_dropout", json_real(0.0));
	if (bos >= 0)
		json_object_set_new(o, "bos_token_id", json_integer(bos));
	if (eos >= 0)
		json_object_set_new(o, "eos_token_id", json_integer(eos));
	json_object_set_new(o, "head_dim", json_integer(p->head_dim));
	json_object_set_new(o, "hidden_act", json_string("silu"));
	json_object_set_new(o, "hidden_size", json_integer(p->hidden));
	json_object_set_new(o, "initializer_range", json_real(0.02));
	json_object_set_new(o, "intermediate_size", json_integer(p->intermediate));
	json_object_set_new(o, "max_position_embeddings", json_integer(p->max_positions));
	(void)dtype;
	(void)vocab;
}

/* llama, gemma3_text and gpt_oss, as their released config.json files
 * write them (Llama-3.1-8B-Instruct, gemma-3-1b-it, gpt-oss-20b). */
static void window_family_config(json_t *root, const struct kv_synth_preset *p, int vocab, int bos, int eos,
				 int dtype)
{
	static const char *const arch[] = {"LlamaForCausalLM", "Gemma3ForCausalLM", "GptOssForCausalLM",
					   "Gemma4ForCausalLM"};
	static const char *const mt[] = {"llama", "gemma3_text", "gpt_oss", "gemma4_text"};
	int k = p->arch - KV_ARCH_LLAMA;
	json_t *a = json_array(), *rs = json_object();
	json_array_append_new(a, json_string(arch[k]));
	json_object_set_new(root, "architectures", a);
	cfg_common(root, p, vocab, bos, eos, dtype);
	json_object_set_new(root, "attention_bias", json_boolean(p->arch == KV_ARCH_GPT_OSS));
	if (p->sliding_window) {
		json_t *lt = json_array();
		for (int l = 0; l < p->n_layers; l++)
			json_array_append_new(lt, json_string((l + 1) % p->swa_pattern ? "sliding_attention" : "full_attention"));
		json_object_set_new(root, "layer_types", lt);
		json_object_set_new(root, "sliding_window", json_integer(p->sliding_window));
	}
	json_object_set_new(root, "model_type", json_string(mt[k]));
	json_object_set_new(root, "num_attention_heads", json_integer(p->n_heads));
	json_object_set_new(root, "num_hidden_layers", json_integer(p->n_layers));
	json_object_set_new(root, "num_key_value_heads", json_integer(p->n_kv_heads));
	json_object_set_new(root, "rms_norm_eps", json_real(p->rms_eps));
	json_object_set_new(root, "rope_theta", json_real(p->rope_theta));
	json_object_set_new(root, "tie_word_embeddings", json_boolean(p->tie_embeddings));
	json_object_set_new(root, "torch_dtype", json_string(dtype_torch(dtype)));
	json_object_set_new(root, "use_cache", json_true());
	json_object_set_new(root, "vocab_size", json_integer(vocab));
	if (p->arch == KV_ARCH_LLAMA) {
		json_object_set_new(root, "mlp_bias", json_false());
		json_object_set_new(rs, "factor", json_real(8.0));
		json_object_set_new(rs, "high_freq_factor", json_real(4.0));
		json_object_set_new(rs, "low_freq_factor", json_real(1.0));
		json_object_set_new(rs, "original_max_position_embeddings", json_integer(8192));
		json_object_set_new(rs, "rope_type", json_string("llama3"));
		json_object_set_new(root, "rope_scaling", rs);
		json_object_set_new(root, "transformers_version", json_string("4.43.0"));
	} else if (p->arch == KV_ARCH_GEMMA4) {
		/* Gemma4TextConfig: the sliding layers' head_dim and
		 * num_key_value_heads, the global layers' own, RoPE per layer type */
		json_t *rp = json_object(), *fa = json_object(), *sa = json_object();
		json_object_del(root, "hidden_act");
		json_object_del(root, "rope_theta");
		json_object_set_new(root, "attention_k_eq_v", json_boolean(p->k_eq_v));
		json_object_set_new(root, "enable_moe_block", json_boolean(p->n_experts > 0));
		if (p->n_experts > 0) {
			json_object_set_new(root, "moe_intermediate_size", json_integer(p->moe_intermediate));
			json_object_set_new(root, "num_experts", json_integer(p->n_experts));
			json_object_set_new(root, "top_k_experts", json_integer(p->n_experts_per_tok));
		}
		json_object_set_new(root, "final_logit_softcapping", p->final_softcap > 0 ? json_real(p->final_softcap)
											  : json_null());
		json_object_set_new(root, "global_head_dim", json_integer(p->global_head_dim));
		json_object_set_new(root, "hidden_activation", json_string("gelu_pytorch_tanh"));
		json_object_set_new(root, "hidden_size_per_layer_input", json_integer(p->ple_dim));
		json_object_set_new(root, "num_global_key_value_heads", json_integer(p->global_kv_heads));
		json_object_set_new(root, "num_kv_shared_layers", json_integer(p->kv_shared));
		json_object_set_new(fa, "partial_rotary_factor", json_real(p->global_partial_rotary));
		json_object_set_new(fa, "rope_theta", json_real(p->rope_theta));
		json_object_set_new(fa, "rope_type", json_string("proportional"));
		json_object_set_new(sa, "rope_theta", json_real(p->rope_local_theta));
		json_object_set_new(sa, "rope_type", json_string("default"));
		json_object_set_new(rp, "full_attention", fa);
		json_object_set_new(rp, "sliding_attention", sa);
		json_object_set_new(root, "rope_parameters", rp);
		json_object_set_new(root, "transformers_version", json_string("5.5.0"));
		json_object_set_new(root, "use_double_wide_mlp", json_boolean(p->double_wide));
		if (p->ple_dim)
			json_object_set_new(root, "vocab_size_per_layer_input", json_integer(vocab));
		json_decref(rs);
	} else if (p->arch == KV_ARCH_GEMMA3) {
		json_object_del(root, "hidden_act");
		json_object_set_new(root, "attn_logit_softcapping", json_null());
		json_object_set_new(root, "final_logit_softcapping", json_null());
		json_object_set_new(root, "hidden_activation", json_string("gelu_pytorch_tanh"));
		json_object_set_new(root, "query_pre_attn_scalar", json_integer(p->head_dim));
		json_object_set_new(root, "rope_local_base_freq", json_real(p->rope_local_theta));
		json_object_set_new(root, "rope_scaling", json_null());
		json_object_set_new(root, "sliding_window_pattern", json_integer(p->swa_pattern));
		json_object_set_new(root, "transformers_version", json_string("4.50.0"));
		json_decref(rs);
	} else {
		json_t *q = json_object(), *nc = json_array();
		json_object_set_new(root, "experts_per_token", json_integer(p->n_experts_per_tok));
		json_object_set_new(root, "initial_context_length", json_integer(4096));
		json_object_set_new(root, "num_experts_per_tok", json_integer(p->n_experts_per_tok));
		json_object_set_new(root, "num_local_experts", json_integer(p->n_experts));
		json_object_set_new(root, "output_router_logits", json_false());
		json_array_append_new(nc, json_string("model.layers.*.self_attn"));
		json_array_append_new(nc, json_string("model.layers.*.mlp.router"));
		json_array_append_new(nc, json_string("model.embed_tokens"));
		json_array_append_new(nc, json_string("lm_head"));
		json_object_set_new(q, "modules_to_not_convert", nc);
		json_object_set_new(q, "quant_method", json_string("mxfp4"));
		json_object_set_new(root, "quantization_config", q);
		json_object_set_new(rs, "beta_fast", json_real(32.0));
		json_object_set_new(rs, "beta_slow", json_real(1.0));
		json_object_set_new(rs, "factor", json_real(32.0));
		json_object_set_new(rs, "original_max_position_embeddings", json_integer(4096));
		json_object_set_new(rs, "rope_type", json_string("yarn"));
		json_object_set_new(rs, "truncate", json_false());
		json_object_set_new(root, "rope_scaling", rs);
		json_object_set_new(root, "router_aux_loss_coef", json_real(0.9));
		json_object_set_new(root, "swiglu_limit", json_real(7.0));
		json_object_set_new(root, "transformers_version", json_string("4.55.0"));
	}
}

int kv_synth_config_json(const struct kv_synth_preset *p, int vocab, int bos, int eos, int dtype, char **out,
			 size_t *len)
{
	json_t *root = json_object(), *o;
	char *s;

	if (p->vocab > 0 && p->config_only)
		vocab = p->vocab; /* the real geometry: its embeddings count */
	*out = NULL;
	if (len)
		*len = 0;
	if (!root)
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	if (p->arch == KV_ARCH_GRANITE_HYBRID || p->arch == KV_ARCH_NEMOTRON_H) {
		json_decref(root);
		return kv_synth_ssm_config_json(p, vocab, bos, eos, dtype, out, len);
	}
	if (p->arch == KV_ARCH_QWEN3) {
		/* Qwen3ForCausalLM, as in the released Qwen3 config.json files. */
		json_t *a = json_array();
		json_array_append_new(a, json_string("Qwen3ForCausalLM"));
		json_object_set_new(root, "architectures", a);
		cfg_common(root, p, vocab, bos, eos, dtype);
		json_object_set_new(root, "max_window_layers", json_integer(p->n_layers));
		json_object_set_new(root, "model_type", json_string("qwen3"));
		json_object_set_new(root, "num_attention_heads", json_integer(p->n_heads));
		json_object_set_new(root, "num_hidden_layers", json_integer(p->n_layers));
		json_object_set_new(root, "num_key_value_heads", json_integer(p->n_kv_heads));
		json_object_set_new(root, "rms_norm_eps", json_real(p->rms_eps));
		json_object_set_new(root, "rope_scaling", json_null());
		json_object_set_new(root, "rope_theta", json_integer((json_int_t)p->rope_theta));
		json_object_set_new(root, "sliding_window", json_null());
		json_object_set_new(root, "tie_word_embeddings", json_boolean(p->tie_embeddings));
		json_object_set_new(root, "torch_dtype", json_string(dtype_torch(dtype)));
		json_object_set_new(root, "transformers_version", json_string("4.51.0"));
		json_object_set_new(root, "use_cache", json_true());
		json_object_set_new(root, "use_sliding_window", json_false());
		json_object_set_new(root, "vocab_size", json_integer(vocab));
	} else if (kv_arch_window_family(p->arch)) {
		window_family_config(root, p, vocab, bos, eos, dtype);
	} else if (p->arch == KV_ARCH_QWEN3_NEXT) {
		/* Qwen3NextForCausalLM: one flat config, as in the released
		 * Qwen3-Next config.json. */
		json_t *a = json_array(), *lt = json_array(), *mol = json_array();
		json_array_append_new(a, json_string("Qwen3NextForCausalLM"));
		json_object_set_new(root, "architectures", a);
		cfg_common(root, p, vocab, bos, eos, dtype);
		json_object_set_new(root, "decoder_sparse_step", json_integer(1));
		json_object_set_new(root, "full_attention_interval", json_integer(p->full_attention_interval));
		for (int l = 0; l < p->n_layers; l++)
			json_array_append_new(lt, json_string((l + 1) % p->full_attention_interval == 0 ? "full_attention"
												      : "linear_attention"));
		json_object_set_new(root, "layer_types", lt);
		json_object_set_new(root, "linear_conv_kernel_dim", json_integer(p->conv_kernel));
		json_object_set_new(root, "linear_key_head_dim", json_integer(p->lin_k_dim));
		json_object_set_new(root, "linear_num_key_heads", json_integer(p->lin_k_heads));
		json_object_set_new(root, "linear_num_value_heads", json_integer(p->lin_v_heads));
		json_object_set_new(root, "linear_value_head_dim", json_integer(p->lin_v_dim));
		if (p->mlp_only_layer >= 0)
			json_array_append_new(mol, json_integer(p->mlp_only_layer));
		json_object_set_new(root, "mlp_only_layers", mol);
		json_object_set_new(root, "model_type", json_string("qwen3_next"));
		json_object_set_new(root, "moe_intermediate_size", json_integer(p->moe_intermediate));
		json_object_set_new(root, "norm_topk_prob", json_boolean(p->norm_topk_prob));
		json_object_set_new(root, "num_attention_heads", json_integer(p->n_heads));
		json_object_set_new(root, "num_experts", json_integer(p->n_experts));
		json_object_set_new(root, "num_experts_per_tok", json_integer(p->n_experts_per_tok));
		json_object_set_new(root, "num_hidden_layers", json_integer(p->n_layers));
		json_object_set_new(root, "num_key_value_heads", json_integer(p->n_kv_heads));
		json_object_set_new(root, "partial_rotary_factor", json_real(p->partial_rotary));
		json_object_set_new(root, "rms_norm_eps", json_real(p->rms_eps));
		json_object_set_new(root, "rope_scaling", json_null());
		json_object_set_new(root, "rope_theta", json_integer((json_int_t)p->rope_theta));
		json_object_set_new(root, "shared_expert_intermediate_size", json_integer(p->shared_intermediate));
		json_object_set_new(root, "tie_word_embeddings", json_boolean(p->tie_embeddings));
		json_object_set_new(root, "torch_dtype", json_string(dtype_torch(dtype)));
		json_object_set_new(root, "transformers_version", json_string("4.57.0"));
		json_object_set_new(root, "use_cache", json_true());
		json_object_set_new(root, "vocab_size", json_integer(vocab));
	} else {
		/* Qwen3_5ForConditionalGeneration with the text model nested under
		 * text_config, as in the released Qwen3.5 checkpoints (the vision
		 * tower is left out: these folders are text-only). */
		json_t *a = json_array(), *lt = json_array(), *rp = json_object(), *ms = json_array();
		int moe = p->n_experts > 0;
		json_array_append_new(a, json_string(moe ? "Qwen3_5MoeForConditionalGeneration"
							 : "Qwen3_5ForConditionalGeneration"));
		json_object_set_new(root, "architectures", a);
		json_object_set_new(root, "model_type", json_string(moe ? "qwen3_5_moe" : "qwen3_5"));
		o = json_object();
		cfg_common(o, p, vocab, bos, eos, dtype);
		json_object_set_new(o, "dtype", json_string(dtype_torch(dtype)));
		json_object_set_new(o, "full_attention_interval", json_integer(p->full_attention_interval));
		for (int l = 0; l < p->n_layers; l++)
			json_array_append_new(lt, json_string((l + 1) % p->full_attention_interval == 0 ? "full_attention"
												      : "linear_attention"));
		json_object_set_new(o, "layer_types", lt);
		json_object_set_new(o, "linear_conv_kernel_dim", json_integer(p->conv_kernel));
		json_object_set_new(o, "linear_key_head_dim", json_integer(p->lin_k_dim));
		json_object_set_new(o, "linear_num_key_heads", json_integer(p->lin_k_heads));
		json_object_set_new(o, "linear_num_value_heads", json_integer(p->lin_v_heads));
		json_object_set_new(o, "linear_value_head_dim", json_integer(p->lin_v_dim));
		json_object_set_new(o, "model_type", json_string(moe ? "qwen3_5_moe_text" : "qwen3_5_text"));
		if (moe) {
			json_object_set_new(o, "moe_intermediate_size", json_integer(p->moe_intermediate));
			json_object_set_new(o, "num_experts", json_integer(p->n_experts));
			json_object_set_new(o, "num_experts_per_tok", json_integer(p->n_experts_per_tok));
			json_object_set_new(o, "shared_expert_intermediate_size", json_integer(p->shared_intermediate));
		}
		json_object_set_new(o, "num_attention_heads", json_integer(p->n_heads));
		json_object_set_new(o, "num_hidden_layers", json_integer(p->n_layers));
		json_object_set_new(o, "num_key_value_heads", json_integer(p->n_kv_heads));
		json_object_set_new(o, "rms_norm_eps", json_real(p->rms_eps));
		json_array_append_new(ms, json_integer(11));
		json_array_append_new(ms, json_integer(11));
		json_array_append_new(ms, json_integer(10));
		json_object_set_new(rp, "mrope_interleaved", json_true());
		json_object_set_new(rp, "mrope_section", ms);
		json_object_set_new(rp, "partial_rotary_factor", json_real(p->partial_rotary));
		json_object_set_new(rp, "rope_theta", json_integer((json_int_t)p->rope_theta));
		json_object_set_new(rp, "rope_type", json_string("default"));
		json_object_set_new(o, "rope_parameters", rp);
		json_object_set_new(o, "tie_word_embeddings", json_boolean(p->tie_embeddings));
		json_object_set_new(o, "use_cache", json_true());
		json_object_set_new(o, "vocab_size", json_integer(vocab));
		json_object_set_new(root, "text_config", o);
		json_object_set_new(root, "tie_word_embeddings", json_boolean(p->tie_embeddings));
		json_object_set_new(root, "torch_dtype", json_string(dtype_torch(dtype)));
		json_object_set_new(root, "transformers_version", json_string("4.57.0"));
	}
	s = json_dumps(root, JSON_INDENT(2) | JSON_REAL_PRECISION(10));
	json_decref(root);
	if (!s)
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	*out = s;
	if (len)
		*len = strlen(s);
	return KV_OK;
}

/* --- the built-in tokenizer ---------------------------------------------- */

/* Training text for the merges (our own words): prose and code of the kind
 * an agent prompt holds, so common pieces become single tokens. */
static const char g_corpus[] =
	"The server keeps the prompt cache on disk, so a long conversation does not start from zero after a "
	"restart. When a new request arrives, the server looks for the longest prefix that it has already "
	"computed, restores the state of every layer at that position, and then reads only the tokens that "
	"follow. The first message of a session is usually the system prompt with the list of tools, and it is "
	"the same for every turn of the session and for many sessions at once. That is why the end of the "
	"system prompt is the most valuable place to keep a snapshot of the state.\n"
	"A tool is a function that the model may call. Each tool has a name, a description and a list of "
	"parameters with their types. The model answers with a tool call, the client runs the function, and "
	"the result comes back as a tool message. Then the model reads the result and writes the final answer "
	"for the user.\n"
	"You are a helpful assistant. Answer the question of the user in a clear and short way. If you do not "
	"know the answer, say that you do not know it. Think step by step before you answer, and check the "
	"result when you are done. Use the tools when they help, and explain what you found.\n"
	"What is the weather in the city today? Please find the file that contains the error and show me the "
	"line where the function returns the wrong value. Can you write a test for this case?\n"
	"The quick brown fox jumps over the lazy dog. She sells sea shells by the sea shore. It was the best "
	"of times, it was the worst of times, and the people in the town were waiting for the news.\n"
	"In the morning the team reviewed the changes, ran the tests again and measured the time of each "
	"step. The numbers were better than before: the restore took less than one second, and the output "
	"was the same as the output of a cold start, bit for bit.\n"
	"{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Get the current "
	"weather for a city\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": "
	"\"string\", \"description\": \"The name of the city\"}, \"unit\": {\"type\": \"string\", \"enum\": "
	"[\"celsius\", \"fahrenheit\"]}}, \"required\": [\"city\"]}}}\n"
	"{\"type\": \"function\", \"function\": {\"name\": \"read_file\", \"description\": \"Read a file from the "
	"project and return its content\", \"parameters\": {\"type\": \"object\", \"properties\": {\"path\": "
	"{\"type\": \"string\", \"description\": \"The path of the file\"}, \"offset\": {\"type\": \"integer\"}, "
	"\"limit\": {\"type\": \"integer\"}}, \"required\": [\"path\"]}}}\n"
	"{\"name\": \"search_code\", \"arguments\": {\"query\": \"open the file and read the header\", "
	"\"max_results\": 10}}\n"
	"def read_config(path):\n"
	"    with open(path, \"r\", encoding=\"utf-8\") as f:\n"
	"        data = json.load(f)\n"
	"    if \"model_type\" not in data:\n"
	"        raise ValueError(\"missing model_type in \" + path)\n"
	"    return data\n"
	"\n"
	"class Cache:\n"
	"    def __init__(self, size):\n"
	"        self.size = size\n"
	"        self.items = {}\n"
	"\n"
	"    def get(self, key, default=None):\n"
	"        return self.items.get(key, default)\n"
	"\n"
	"    def put(self, key, value):\n"
	"        if len(self.items) >= self.size:\n"
	"            self.items.pop(next(iter(self.items)))\n"
	"        self.items[key] = value\n"
	"\n"
	"for i in range(10):\n"
	"    print(i, i * i)\n"
	"\n"
	"static int read_header(int fd, struct header *h)\n"
	"{\n"
	"\tuint64_t len = 0;\n"
	"\tif (pread(fd, &len, sizeof len, 0) != sizeof len)\n"
	"\t\treturn -1;\n"
	"\tif (len > MAX_HEADER)\n"
	"\t\treturn -1;\n"
	"\th->len = len;\n"
	"\treturn 0;\n"
	"}\n"
	"\n"
	"int main(int argc, char **argv)\n"
	"{\n"
	"\tfor (int i = 1; i < argc; i++)\n"
	"\t\tprintf(\"%s\\n\", argv[i]);\n"
	"\treturn 0;\n"
	"}\n"
	"const result = await client.chat.completions.create({ model: \"local\", messages: [{ role: \"user\", "
	"content: \"Hello world\" }], stream: true });\n"
	"for await (const chunk of result) { process.stdout.write(chunk.choices[0].delta.content || \"\"); }\n"
	"The numbers 0 1 2 3 4 5 6 7 8 9 10 100 1000 2048 4096 32768 and the dates 2025-01-31 and 12:30 appear "
	"in logs, while paths such as /home/user/project/src/main.c and URLs such as https://example.com/docs "
	"appear in prompts. Errors look like: error: file not found, or: warning: unused variable.\n"
	"Hello world! Hello, how are you? I am fine, thank you. Let me check the logs and get back to you. "
	"Here is the summary of the changes: the parser now rejects bad input with a clear message, the writer "
	"syncs the file before it renames it, and the tests cover every error path.\n";

/* GPT-2 byte-level alphabet: printable bytes map to themselves, the rest
 * to U+0100.. in byte order; token id i is the i-th byte of this order
 * (the real Qwen3 vocabulary starts the same way). */
static void byte_alphabet(int byte_of_id[256], uint32_t cp_of_byte[256])
{
	int n = 0, extra = 0;
	uint8_t printable[256] = {0};
	for (int b = 33; b <= 126; b++)
		printable[b] = 1;
	for (int b = 161; b <= 172; b++)
		printable[b] = 1;
	for (int b = 174; b <= 255; b++)
		printable[b] = 1;
	for (int b = 0; b < 256; b++)
		if (printable[b]) {
			byte_of_id[n++] = b;
			cp_of_byte[b] = (uint32_t)b;
		}
	for (int b = 0; b < 256; b++)
		if (!printable[b]) {
			byte_of_id[n++] = b;
			cp_of_byte[b] = 256u + (uint32_t)extra++;
		}
}

#define TOK_MAX_MERGES 480
#define TOK_MAX_IDS (256 + TOK_MAX_MERGES)
#define TOK_MAX_PIECE 64

struct bpe {
	char *str[TOK_MAX_IDS];       /* byte-level string of each id (malloc'd) */
	int n_ids;
	int merge_l[TOK_MAX_MERGES], merge_r[TOK_MAX_MERGES];
	int n_merges;
	/* words: symbol sequences with counts */
	int (*sym)[TOK_MAX_PIECE];
	int *len, *count;
	int n_words;
	struct kv_map *word_idx;
};

static void bpe_free(struct bpe *b)
{
	for (int i = 0; i < b->n_ids; i++)
		free(b->str[i]);
	free(b->sym);
	free(b->len);
	free(b->count);
	kv_map_destroy(b->word_idx);
}

static int bpe_add_word(struct bpe *b, const uint8_t *p, size_t n, const int id_of_byte[256])
{
	uint64_t w;
	if (n == 0 || n > TOK_MAX_PIECE)
		return KV_OK; /* long pieces (none in the corpus) are not worth merging */
	if (kv_map_get(b->word_idx, p, n, &w)) {
		b->count[w]++;
		return KV_OK;
	}
	w = (uint64_t)b->n_words++;
	if (kv_map_put(b->word_idx, p, n, w))
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	for (size_t i = 0; i < n; i++)
		b->sym[w][i] = id_of_byte[p[i]];
	b->len[w] = (int)n;
	b->count[w] = 1;
	return KV_OK;
}

/* The Qwen3 pre-tokenizer regex (tokenizer.json "Split" pattern). */
static const char g_qwen3_regex[] =
	"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
	"\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

static int bpe_train(struct bpe *b)
{
	int byte_of_id[256], id_of_byte[256];
	uint32_t cp_of_byte[256];
	pcre2_code *re;
	pcre2_match_data *md;
	int errc, rc = KV_OK;
	PCRE2_SIZE erroff, pos = 0, n = sizeof g_corpus - 1;
	size_t max_words = n + 1;

	memset(b, 0, sizeof *b);
	byte_alphabet(byte_of_id, cp_of_byte);
	for (int i = 0; i < 256; i++) {
		char s[4];
		size_t k = (size_t)kv_utf8_encode(cp_of_byte[byte_of_id[i]], s);
		id_of_byte[byte_of_id[i]] = i;
		if (!(b->str[i] = strndup(s, k)))
			return kv_fail(KV_ERR_NOMEM, "out of memory");
		b->n_ids = i + 1;
	}
	b->sym = malloc(max_words * sizeof *b->sym);
	b->len = malloc(max_words * sizeof *b->len);
	b->count = malloc(max_words * sizeof *b->count);
	b->word_idx = kv_map_create(1024);
	if (!b->sym || !b->len || !b->count || !b->word_idx)
		return kv_fail(KV_ERR_NOMEM, "out of memory");

	re = pcre2_compile((PCRE2_SPTR)g_qwen3_regex, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &errc, &erroff,
			   NULL);
	if (!re)
		return kv_fail(KV_ERR_INVALID, "synthetic tokenizer: regex does not compile at %zu", (size_t)erroff);
	md = pcre2_match_data_create_from_pattern(re, NULL);
	if (!md) {
		pcre2_code_free(re);
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	}
	/* Split into pieces the way "Split, Isolated" does: matches and the
	 * gaps between them are pieces. The regex matches every character
	 * class, so gaps do not occur for this text; they are kept anyway. */
	while (pos < n && !rc) {
		int m = pcre2_match(re, (PCRE2_SPTR)g_corpus, n, pos, 0, md, NULL);
		PCRE2_SIZE *ov;
		if (m < 0) {
			rc = bpe_add_word(b, (const uint8_t *)g_corpus + pos, n - pos, id_of_byte);
			break;
		}
		ov = pcre2_get_ovector_pointer(md);
		if (ov[0] > pos)
			rc = bpe_add_word(b, (const uint8_t *)g_corpus + pos, ov[0] - pos, id_of_byte);
		if (!rc)
			rc = bpe_add_word(b, (const uint8_t *)g_corpus + ov[0], ov[1] - ov[0], id_of_byte);
		pos = ov[1] > ov[0] ? ov[1] : ov[0] + 1;
	}
	pcre2_match_data_free(md);
	pcre2_code_free(re);
	if (rc)
		return rc;

	/* Greedy BPE: merge the most frequent adjacent pair; ties go to the
	 * smallest (left id, right id), so the result is fully determined. */
	struct kv_map *pairs = kv_map_create(4096);
	struct kv_map *strs = kv_map_create(1024);
	if (!pairs || !strs) {
		kv_map_destroy(pairs);
		kv_map_destroy(strs);
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	}
	for (int i = 0; i < b->n_ids; i++)
		kv_map_put(strs, b->str[i], strlen(b->str[i]), (uint64_t)i);
	while (b->n_merges < TOK_MAX_MERGES) {
		uint64_t best_cnt = 0, best_key = 0;
		size_t it = 0;
		const void *k;
		size_t kl;
		uint64_t v;
		kv_map_clear(pairs);
		for (int w = 0; w < b->n_words; w++)
			for (int i = 0; i + 1 < b->len[w]; i++) {
				uint64_t key = ((uint64_t)b->sym[w][i] << 32) | (uint32_t)b->sym[w][i + 1], c = 0;
				kv_map_get(pairs, &key, sizeof key, &c);
				if (kv_map_put(pairs, &key, sizeof key, c + (uint64_t)b->count[w])) {
					rc = kv_fail(KV_ERR_NOMEM, "out of memory");
					goto done;
				}
			}
		while (kv_map_next(pairs, &it, &k, &kl, &v)) {
			uint64_t key;
			memcpy(&key, k, sizeof key);
			if (v > best_cnt || (v == best_cnt && key < best_key)) {
				best_cnt = v;
				best_key = key;
			}
		}
		if (best_cnt < 2)
			break;
		int l = (int)(best_key >> 32), r = (int)(uint32_t)best_key, id;
		size_t ll = strlen(b->str[l]), rl = strlen(b->str[r]);
		char *s = malloc(ll + rl + 1);
		if (!s) {
			rc = kv_fail(KV_ERR_NOMEM, "out of memory");
			goto done;
		}
		memcpy(s, b->str[l], ll);
		memcpy(s + ll, b->str[r], rl + 1);
		if (kv_map_get(strs, s, ll + rl, &v)) {
			id = (int)v; /* another pair already made this string */
			free(s);
		} else {
			id = b->n_ids++;
			b->str[id] = s;
			kv_map_put(strs, s, ll + rl, (uint64_t)id);
		}
		b->merge_l[b->n_merges] = l;
		b->merge_r[b->n_merges] = r;
		b->n_merges++;
		for (int w = 0; w < b->n_words; w++) {
			int o = 0;
			for (int i = 0; i < b->len[w]; i++) {
				if (i + 1 < b->len[w] && b->sym[w][i] == l && b->sym[w][i + 1] == r) {
					b->sym[w][o++] = id;
					i++;
				} else {
					b->sym[w][o++] = b->sym[w][i];
				}
			}
			b->len[w] = o;
		}
	}
done:
	kv_map_destroy(pairs);
	kv_map_destroy(strs);
	return rc;
}

/* Added tokens with the flags of the real Qwen3 tokenizer.json. */
static const struct {
	const char *content;
	int special;
} g_added[] = {
	{"<|endoftext|>", 1}, {"<|im_start|>", 1},     {"<|im_end|>", 1},
	{"<think>", 0},	      {"</think>", 0},	       {"<tool_call>", 0},
	{"</tool_call>", 0},  {"<tool_response>", 0}, {"</tool_response>", 0},
};
#define N_ADDED (sizeof g_added / sizeof g_added[0])

static const char g_chat_template[] =
	"{%- if tools %}\n"
	"    {{- '<|im_start|>system\\n' }}\n"
	"    {%- if messages and messages[0].role == 'system' %}\n"
	"        {{- messages[0].content + '\\n\\n' }}\n"
	"    {%- endif %}\n"
	"    {{- '# Tools\\n\\nYou can call the functions listed below. Each one is described by a JSON "
	"signature inside <tools></tools>:\\n<tools>' }}\n"
	"    {%- for tool in tools %}\n"
	"        {{- '\\n' }}\n"
	"        {{- tool | tojson }}\n"
	"    {%- endfor %}\n"
	"    {{- '\\n</tools>\\n\\nTo call a function, write a JSON object with its name and arguments between "
	"<tool_call></tool_call> tags:\\n<tool_call>\\n{\"name\": <function-name>, \"arguments\": "
	"<args-json-object>}\\n</tool_call><|im_end|>\\n' }}\n"
	"{%- elif messages and messages[0].role == 'system' %}\n"
	"    {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}\n"
	"{%- endif %}\n"
	"{%- for message in messages %}\n"
	"    {%- if message.role == 'system' %}\n"
	"        {%- if not loop.first %}\n"
	"            {{- '<|im_start|>system\\n' + message.content + '<|im_end|>\\n' }}\n"
	"        {%- endif %}\n"
	"    {%- elif message.role == 'user' %}\n"
	"        {{- '<|im_start|>user\\n' + message.content + '<|im_end|>\\n' }}\n"
	"    {%- elif message.role == 'assistant' %}\n"
	"        {{- '<|im_start|>assistant\\n' }}\n"
	"        {%- if message.content %}\n"
	"            {{- message.content }}\n"
	"        {%- endif %}\n"
	"        {%- if message.tool_calls %}\n"
	"            {%- for call in message.tool_calls %}\n"
	"                {%- if call.function %}\n"
	"                    {%- set fn = call.function %}\n"
	"                {%- else %}\n"
	"                    {%- set fn = call %}\n"
	"                {%- endif %}\n"
	"                {%- if message.content or not loop.first %}\n"
	"                    {{- '\\n' }}\n"
	"                {%- endif %}\n"
	"                {{- '<tool_call>\\n{\"name\": \"' + fn.name + '\", \"arguments\": ' }}\n"
	"                {%- if fn.arguments is string %}\n"
	"                    {{- fn.arguments }}\n"
	"                {%- else %}\n"
	"                    {{- fn.arguments | tojson }}\n"
	"                {%- endif %}\n"
	"                {{- '}\\n</tool_call>' }}\n"
	"            {%- endfor %}\n"
	"        {%- endif %}\n"
	"        {{- '<|im_end|>\\n' }}\n"
	"    {%- elif message.role == 'tool' %}\n"
	"        {{- '<|im_start|>user\\n<tool_response>\\n' + message.content + '\\n</tool_response><|im_end|>\\n' "
	"}}\n"
	"    {%- endif %}\n"
	"{%- endfor %}\n"
	"{%- if add_generation_prompt %}\n"
	"    {{- '<|im_start|>assistant\\n' }}\n"
	"    {%- if enable_thinking is defined and enable_thinking is false %}\n"
	"        {{- '<think>\\n\\n</think>\\n\\n' }}\n"
	"    {%- endif %}\n"
	"{%- endif %}\n";

const char *kv_synth_chat_template(void)
{
	return g_chat_template;
}

static json_t *added_token_obj(int id, const char *content, int special, int with_id)
{
	json_t *o = json_object();
	if (with_id)
		json_object_set_new(o, "id", json_integer(id));
	json_object_set_new(o, "content", json_string(content));
	json_object_set_new(o, "single_word", json_false());
	json_object_set_new(o, "lstrip", json_false());
	json_object_set_new(o, "rstrip", json_false());
	json_object_set_new(o, "normalized", json_false());
	json_object_set_new(o, "special", json_boolean(special));
	return o;
}

static json_t *byte_level(int with_regex_flag)
{
	json_t *o = json_object();
	json_object_set_new(o, "type", json_string("ByteLevel"));
	json_object_set_new(o, "add_prefix_space", json_false());
	json_object_set_new(o, "trim_offsets", json_false());
	if (with_regex_flag)
		json_object_set_new(o, "use_regex", json_false());
	return o;
}

int kv_synth_tokenizer(char **tok_json, size_t *tok_len, char **cfg_json, size_t *cfg_len)
{
	struct bpe b;
	json_t *root = NULL, *cfg = NULL, *added, *vocab, *merges, *model, *pre, *seq, *split, *pat, *norm, *dec,
	       *atd, *ast;
	int rc;

	*tok_json = *cfg_json = NULL;
	rc = bpe_train(&b);
	if (rc) {
		bpe_free(&b);
		return rc;
	}
	root = json_object();
	json_object_set_new(root, "version", json_string("1.0"));
	json_object_set_new(root, "truncation", json_null());
	json_object_set_new(root, "padding", json_null());
	added = json_array();
	for (size_t i = 0; i < N_ADDED; i++)
		json_array_append_new(added, added_token_obj(b.n_ids + (int)i, g_added[i].content, g_added[i].special, 1));
	json_object_set_new(root, "added_tokens", added);
	norm = json_object();
	json_object_set_new(norm, "type", json_string("NFC"));
	json_object_set_new(root, "normalizer", norm);
	pre = json_object();
	json_object_set_new(pre, "type", json_string("Sequence"));
	seq = json_array();
	split = json_object();
	json_object_set_new(split, "type", json_string("Split"));
	pat = json_object();
	json_object_set_new(pat, "Regex", json_string(g_qwen3_regex));
	json_object_set_new(split, "pattern", pat);
	json_object_set_new(split, "behavior", json_string("Isolated"));
	json_object_set_new(split, "invert", json_false());
	json_array_append_new(seq, split);
	json_array_append_new(seq, byte_level(1));
	json_object_set_new(pre, "pretokenizers", seq);
	json_object_set_new(root, "pre_tokenizer", pre);
	json_object_set_new(root, "post_processor", byte_level(1));
	dec = byte_level(1);
	json_object_set_new(root, "decoder", dec);
	model = json_object();
	json_object_set_new(model, "type", json_string("BPE"));
	json_object_set_new(model, "dropout", json_null());
	json_object_set_new(model, "unk_token", json_null());
	json_object_set_new(model, "continuing_subword_prefix", json_string(""));
	json_object_set_new(model, "end_of_word_suffix", json_string(""));
	json_object_set_new(model, "fuse_unk", json_false());
	json_object_set_new(model, "byte_fallback", json_false());
	json_object_set_new(model, "ignore_merges", json_false());
	vocab = json_object();
	for (int i = 0; i < b.n_ids; i++)
		json_object_set_new(vocab, b.str[i], json_integer(i));
	json_object_set_new(model, "vocab", vocab);
	merges = json_array();
	for (int i = 0; i < b.n_merges; i++) {
		json_t *pair = json_array();
		json_array_append_new(pair, json_string(b.str[b.merge_l[i]]));
		json_array_append_new(pair, json_string(b.str[b.merge_r[i]]));
		json_array_append_new(merges, pair);
	}
	json_object_set_new(model, "merges", merges);
	json_object_set_new(root, "model", model);

	/* tokenizer_config.json, shaped like the real Qwen3 one. */
	cfg = json_object();
	json_object_set_new(cfg, "add_bos_token", json_false());
	json_object_set_new(cfg, "add_prefix_space", json_false());
	atd = json_object();
	for (size_t i = 0; i < N_ADDED; i++) {
		char key[16];
		snprintf(key, sizeof key, "%d", b.n_ids + (int)i);
		json_object_set_new(atd, key, added_token_obj(0, g_added[i].content, g_added[i].special, 0));
	}
	json_object_set_new(cfg, "added_tokens_decoder", atd);
	ast = json_array();
	json_array_append_new(ast, json_string("<|im_start|>"));
	json_array_append_new(ast, json_string("<|im_end|>"));
	json_object_set_new(cfg, "additional_special_tokens", ast);
	json_object_set_new(cfg, "bos_token", json_null());
	json_object_set_new(cfg, "chat_template", json_string(g_chat_template));
	json_object_set_new(cfg, "clean_up_tokenization_spaces", json_false());
	json_object_set_new(cfg, "eos_token", json_string("<|im_end|>"));
	json_object_set_new(cfg, "errors", json_string("replace"));
	json_object_set_new(cfg, "model_max_length", json_integer(131072));
	json_object_set_new(cfg, "pad_token", json_string("<|endoftext|>"));
	json_object_set_new(cfg, "split_special_tokens", json_false());
	json_object_set_new(cfg, "tokenizer_class", json_string("Qwen2Tokenizer"));
	json_object_set_new(cfg, "unk_token", json_null());

	*tok_json = json_dumps(root, JSON_INDENT(2));
	*cfg_json = json_dumps(cfg, JSON_INDENT(2));
	json_decref(root);
	json_decref(cfg);
	bpe_free(&b);
	if (!*tok_json || !*cfg_json) {
		free(*tok_json);
		free(*cfg_json);
		*tok_json = *cfg_json = NULL;
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	}
	if (tok_len)
		*tok_len = strlen(*tok_json);
	if (cfg_len)
		*cfg_len = strlen(*cfg_json);
	return KV_OK;
}

/*
 * The begin and end tokens of the tokenizers kvkeep ships presets for, by
 * family, the first name of each list that the tokenizer has winning:
 * GPT-OSS (harmony: the answer ends with <|return|>), Llama 3 and Gemma 3
 * (end of turn), Qwen (ChatML; its <|endoftext|> is last because GPT-OSS
 * has one too).
 */
static const char *const bos_names[] = {"<|startoftext|>", "<|begin_of_text|>", "<bos>", "<|endoftext|>"};
static const char *const eos_names[] = {"<|im_end|>", "<|return|>", "<|eot_id|>", "<end_of_turn>"};

static void note_special(const char *name, int id, int *bos_rank, int *bos_id, int *eos_rank, int *eos_id)
{
	for (int i = 0; i < (int)(sizeof bos_names / sizeof bos_names[0]); i++)
		if (!strcmp(name, bos_names[i]) && i < *bos_rank) {
			*bos_rank = i;
			*bos_id = id;
		}
	for (int i = 0; i < (int)(sizeof eos_names / sizeof eos_names[0]); i++)
		if (!strcmp(name, eos_names[i]) && i < *eos_rank) {
			*eos_rank = i;
			*eos_id = id;
		}
}

int kv_synth_tokenizer_ids(const char *json, size_t len, const char *what, int *n_ids, int *bos_id, int *eos_id)
{
	json_t *root, *model, *vocab, *added, *v;
	int bos_rank = 99, eos_rank = 99;
	const char *k;
	int64_t max_id = -1;
	size_t i;
	int rc = kv_json_parse(what, json, len, KV_JSON_MAX_DEPTH, &root);

	*n_ids = 0;
	*bos_id = *eos_id = -1;
	if (rc)
		return rc;
	model = json_object_get(root, "model");
	vocab = json_object_get(model, "vocab");
	added = json_object_get(root, "added_tokens");
	if (!json_is_object(vocab) || (added && !json_is_array(added))) {
		json_decref(root);
		return kv_fail(KV_ERR_INVALID, "%s: not a tokenizer.json (model.vocab or added_tokens missing)", what);
	}
	json_object_foreach(vocab, k, v) {
		if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= (1 << 24)) {
			json_decref(root);
			return kv_fail(KV_ERR_INVALID, "%s: model.vocab['%s'] is not a valid id", what, k);
		}
		if (json_integer_value(v) > max_id)
			max_id = json_integer_value(v);
		note_special(k, (int)json_integer_value(v), &bos_rank, bos_id, &eos_rank, eos_id);
	}
	json_array_foreach(added, i, v) {
		json_t *id = json_object_get(v, "id");
		const char *c = json_string_value(json_object_get(v, "content"));
		if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) >= (1 << 24) || !c) {
			json_decref(root);
			return kv_fail(KV_ERR_INVALID, "%s: added_tokens[%zu] lacks a valid id or content", what, i);
		}
		if (json_integer_value(id) > max_id)
			max_id = json_integer_value(id);
		note_special(c, (int)json_integer_value(id), &bos_rank, bos_id, &eos_rank, eos_id);
	}
	json_decref(root);
	if (max_id < 0)
		return kv_fail(KV_ERR_INVALID, "%s: the tokenizer has no ids", what);
	*n_ids = (int)(max_id + 1);
	return KV_OK;
}

/* --- weights ------------------------------------------------------------- */

static uint64_t splitmix(uint64_t *s)
{
	uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
	return z ^ (z >> 31);
}

/* A standard normal deviate, approximately: the sum of four uniforms on
 * 16-bit grids has mean 2 and variance 1/3. Only exact IEEE operations,
 * so every machine makes the same bytes. Range about +-3.46. */
static double gauss(uint64_t *s)
{
	uint64_t x = splitmix(s);
	double u = 0;
	for (int i = 0; i < 4; i++)
		u += ((double)((x >> (16 * i)) & 0xffff) + 0.5) * (1.0 / 65536.0);
	return (u - 2.0) * 1.7320508075688772; /* sqrt(3) */
}

static double uniform01(uint64_t *s)
{
	return ((double)(splitmix(s) >> 11) + 0.5) * 0x1p-53;
}

static float store_round(float v, int dtype)
{
	return dtype == KV_DT_BF16 ? kv_bf16_to_f32(kv_f32_to_bf16(v)) : v;
}

/* DeltaNet decay of value head h (see docs/models.md): dt_bias near 1,
 * A_log chosen so that alpha = exp(-exp(A_log) * softplus(dt_bias)) lands
 * log-uniformly in [0.9, 0.999] across heads when the input a is 0. */
static float dt_bias_value(uint64_t seed, int layer, int h, int dtype)
{
	uint64_t s = seed ^ (0xD7B1A5ull * (uint64_t)(layer + 1)) ^ ((uint64_t)h << 40);
	return store_round((float)(1.0 + 0.25 * (uniform01(&s) - 0.5)), dtype);
}

static float a_log_value(uint64_t seed, int layer, int h, int n_heads, int dtype)
{
	uint64_t s = seed ^ (0xA10C5ull * (uint64_t)(layer + 1)) ^ ((uint64_t)h << 40);
	double t = ((double)h + uniform01(&s)) / (double)n_heads;
	double lo = log(-log(0.999)), hi = log(-log(0.9));
	double rate = exp(lo + t * (hi - lo));          /* -log(alpha) at a = 0 */
	double dt = dt_bias_value(seed, layer, h, dtype); /* the stored value */
	double sp = log1p(exp(dt));
	return store_round((float)log(rate / sp), dtype);
}

/* E2M1 codes' values (OCP MX): code & 7 indexes the magnitude, bit 3 the
 * sign. */
static const float g_e2m1[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

/* gpt_oss expert blocks / scales (U8, the release layout: per 32-element
 * block one E8M0 scale 2^(e - 127) and 16 bytes of codes, element 2j in
 * the low nibble of byte j, 2j + 1 in the high one). The values are the
 * float matrix the tensor stands for ("..._blocks" / "..._scales" without
 * the suffix, its own normal stream), each block quantized with the
 * scale 2^(floor(log2 amax) - 2) (6 = 1.5 x 4: the largest code fits)
 * and every element the nearest code, ties to the smaller magnitude. */
static int fill_mxfp4(const struct kv_model_config *c, const struct kv_tensor_spec *sp, uint64_t seed, void *dst,
		      uint64_t nbytes)
{
	int blocks = sp->role == KV_ROLE_MXFP4_BLOCKS;
	uint64_t rows = (uint64_t)sp->shape[0] * (uint64_t)sp->shape[1], nb = (uint64_t)sp->shape[2];
	char base[96];
	snprintf(base, sizeof base, "%.*s", (int)(strlen(sp->name) - 7), sp->name); /* "_blocks" / "_scales" */
	if (nbytes != rows * nb * (blocks ? 16 : 1))
		return kv_fail(KV_ERR_INVALID, "tensor '%s': %llu bytes asked", sp->name, (unsigned long long)nbytes);
	double fan_in = (double)nb * 32, std = 1.0 / sqrt(fan_in);
	if (strstr(base, "down_proj"))
		std = std / sqrt(2.0 * c->n_layers);
	uint64_t s = kv_xxh3_64(base, strlen(base), seed);
	uint8_t *o = dst;
	for (uint64_t b = 0; b < rows * nb; b++) {
		float x[32], amax = 0;
		for (int i = 0; i < 32; i++) {
			x[i] = (float)(std * gauss(&s));
			amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
		}
		int e = amax > 0 ? (int)floorf(log2f(amax)) - 2 + 127 : 0;
		e = e < 1 ? 1 : e > 254 ? 254 : e;
		if (!blocks) {
			o[b] = (uint8_t)e;
			continue;
		}
		float d = ldexpf(1.0f, e - 127);
		for (int j = 0; j < 16; j++) {
			uint8_t q[2];
			for (int h = 0; h < 2; h++) {
				float v = x[2 * j + h] / d, a = fabsf(v);
				int best = 0;
				for (int k = 1; k < 8; k++)
					if (fabsf(g_e2m1[k] - a) < fabsf(g_e2m1[best] - a))
						best = k;
				q[h] = (uint8_t)(best | (v < 0 && best ? 8 : 0));
			}
			o[b * 16 + (uint64_t)j] = (uint8_t)(q[0] | q[1] << 4);
		}
	}
	return KV_OK;
}

int kv_synth_fill(const struct kv_model_config *c, const struct kv_tensor_spec *sp, uint64_t seed, int dtype,
		  void *dst, uint64_t nbytes)
{
	uint64_t numel = 1, s;
	if (sp->role == KV_ROLE_MXFP4_BLOCKS || sp->role == KV_ROLE_MXFP4_SCALES)
		return fill_mxfp4(c, sp, seed, dst, nbytes);
	double std = 0, mean = 0, fan_in = sp->ndim >= 2 ? (double)sp->shape[sp->ndim - 1] : 1;
	size_t es = kv_dtype_size(dtype);

	if (dtype != KV_DT_F32 && dtype != KV_DT_BF16)
		return kv_fail(KV_ERR_INVALID, "synthetic weights are F32 or BF16");
	for (int d = 0; d < sp->ndim; d++)
		numel *= (uint64_t)sp->shape[d];
	if (numel * es != nbytes)
		return kv_fail(KV_ERR_INVALID, "tensor '%s': %llu bytes asked, %llu expected", sp->name,
			       (unsigned long long)nbytes, (unsigned long long)(numel * es));
	/* Each tensor has its own stream, keyed by its name: adding a tensor
	 * never changes the others. */
	s = kv_xxh3_64(sp->name, strlen(sp->name), seed);
	switch (sp->role) {
	case KV_ROLE_EMBED:
		/* Tied: the same matrix makes the logits, so keep their std ~2. */
		std = c->tie_embeddings ? 2.0 / sqrt((double)c->hidden) : 1.0;
		break;
	case KV_ROLE_LM_HEAD:
		std = 2.0 / sqrt((double)c->hidden);
		break;
	case KV_ROLE_NORM:
		mean = 1.0, std = 0.05;
		/* gemma4's softmax scale is 1: its q/k norms carry the
		 * temperature, so they start at head_dim^-1/4 each (scores with
		 * the spread of a head_dim^-1/2 scale, as a trained model keeps
		 * them; weights of 1 would make every softmax nearly one-hot) */
		if (c->arch == KV_ARCH_GEMMA4 && (strstr(sp->name, "q_norm.weight") || strstr(sp->name, "k_norm.weight")))
			mean = pow((double)sp->shape[0], -0.25), std = 0.05 * mean;
		/* its router reads rmsnorm(x) / sqrt(hidden) * router.scale: a
		 * scale of sqrt(hidden) gives logits ~ N(0, 1) like the other
		 * presets' routers (1 would leave near-ties everywhere) */
		if (c->arch == KV_ARCH_GEMMA4 && strstr(sp->name, "router.scale"))
			mean = sqrt((double)c->hidden), std = 0.05 * mean;
		break;
	case KV_ROLE_NORM_OFFSET:
		mean = 0.0, std = 0.05;
		break;
	case KV_ROLE_LINEAR:
	case KV_ROLE_ROUTER: /* router logits ~ N(0, 1): routing well separated */
		std = 1.0 / sqrt(fan_in);
		break;
	case KV_ROLE_LINEAR_OUT:
		std = 1.0 / sqrt(fan_in) / sqrt(2.0 * c->n_layers);
		break;
	case KV_ROLE_LINEAR_A:
		std = 0.5 / sqrt(fan_in);
		break;
	case KV_ROLE_CONV:
		std = 1.0 / sqrt((double)c->conv_kernel);
		break;
	case KV_ROLE_DT_BIAS:
	case KV_ROLE_A_LOG:
		break;
	case KV_ROLE_BIAS:
		std = 0.1;
		break;
	case KV_ROLE_SINKS: /* about the size of a row's largest scores */
		mean = 1.0, std = 1.0;
		break;
	case KV_ROLE_CONV_BIAS: /* conv bias: small */
		std = 0.05;
		break;
	case KV_ROLE_SSM_D: /* Mamba's D skip: near 1 (transformers initialises ones) */
		mean = 1.0, std = 0.05;
		break;
	default:
		return kv_fail(KV_ERR_INVALID, "tensor '%s': unknown role %d", sp->name, sp->role);
	}
	for (uint64_t i = 0; i < numel; i++) {
		float v;
		if (sp->role == KV_ROLE_DT_BIAS)
			v = dt_bias_value(seed, sp->layer, (int)i, dtype);
		else if (sp->role == KV_ROLE_A_LOG)
			v = a_log_value(seed, sp->layer, (int)i, (int)numel, dtype);
		else
			v = (float)(mean + std * gauss(&s));
		if (dtype == KV_DT_F32) {
			memcpy((uint8_t *)dst + 4 * i, &v, 4);
		} else {
			uint16_t h = kv_f32_to_bf16(v);
			memcpy((uint8_t *)dst + 2 * i, &h, 2);
		}
	}
	return KV_OK;
}

struct fill_ctx {
	const struct kv_model_config *c;
	const struct kv_tensor_spec *s;
	uint64_t seed;
	int dtype;
};

static int fill_cb(void *ctx, void *dst, uint64_t nbytes)
{
	struct fill_ctx *f = ctx;
	return kv_synth_fill(f->c, f->s, f->seed, f->dtype, dst, nbytes);
}

static int write_weights(const struct kv_model_config *c, const char *path, uint64_t seed, int dtype,
			 const char *preset, unsigned flags)
{
	struct kv_tensor_spec *sp = NULL;
	struct fill_ctx *fc = NULL;
	struct kv_stw *w = NULL;
	size_t n = 0;
	char buf[32];
	int rc;

	if ((rc = kv_config_tensors(c, NULL, &sp, &n)))
		return rc;
	if (c->n_mtp_layers > 0) { /* the MTP head after the text model's tensors */
		struct kv_tensor_spec *mt = NULL, *all;
		size_t nm = 0;
		if ((rc = kv_config_mtp_tensors(c, c->n_moe_layers > 0, &mt, &nm)))
			goto out;
		all = realloc(sp, (n + nm) * sizeof *sp);
		if (!all) {
			free(mt);
			rc = kv_fail(KV_ERR_NOMEM, "out of memory");
			goto out;
		}
		sp = all;
		memcpy(sp + n, mt, nm * sizeof *mt);
		n += nm;
		free(mt);
	}
	fc = calloc(n ? n : 1, sizeof *fc);
	w = kv_stw_create();
	if (!fc || !w) {
		rc = kv_fail(KV_ERR_NOMEM, "out of memory");
		goto out;
	}
	/* "format": "pt" is what transformers writes and checks for. */
	if ((rc = kv_stw_meta(w, "format", "pt")) || (rc = kv_stw_meta(w, "kvkeep_synth_preset", preset)))
		goto out;
	snprintf(buf, sizeof buf, "%llu", (unsigned long long)seed);
	if ((rc = kv_stw_meta(w, "kvkeep_synth_seed", buf)))
		goto out;
	for (size_t i = 0; i < n; i++) {
		fc[i] = (struct fill_ctx){c, &sp[i], seed, dtype};
		int mx = sp[i].role == KV_ROLE_MXFP4_BLOCKS || sp[i].role == KV_ROLE_MXFP4_SCALES;
		if ((rc = kv_stw_add_fill(w, sp[i].name, mx ? KV_DT_U8 : dtype, sp[i].ndim, sp[i].shape, fill_cb, &fc[i])))
			goto out;
	}
	rc = kv_stw_write(w, path, flags);
out:
	kv_stw_destroy(w);
	free(fc);
	free(sp);
	return rc;
}

/* --- the folder ---------------------------------------------------------- */

static int read_tok_file(const char *dir, const char *name, char **out, size_t *len)
{
	char path[4096];
	json_t *j;
	int rc;
	if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, name) >= sizeof path)
		return kv_fail(KV_ERR_INVALID, "tokenizer folder path too long");
	if ((rc = kv_io_read_file(path, 256u << 20, out, len)))
		return rc;
	if ((rc = kv_json_parse(path, *out, *len, KV_JSON_MAX_DEPTH, &j))) {
		free(*out);
		*out = NULL;
		return rc;
	}
	json_decref(j);
	return KV_OK;
}

static int write_file(const char *dir, const char *name, const char *p, size_t n, unsigned flags)
{
	char path[4096];
	if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, name) >= sizeof path)
		return kv_fail(KV_ERR_INVALID, "output path too long");
	return kv_durable_write(path, p, n, flags | KV_DW_PUBLIC);
}

/* chat_template.jinja of the tokenizer folder, when there is one. */
static int copy_template(const char *from, const char *to, unsigned flags)
{
	char path[4096];
	char *t = NULL;
	size_t n = 0;
	if ((size_t)snprintf(path, sizeof path, "%s/chat_template.jinja", from) >= sizeof path)
		return kv_fail(KV_ERR_INVALID, "tokenizer folder path too long");
	if (access(path, F_OK))
		return KV_OK;
	int rc = kv_io_read_file(path, 16u << 20, &t, &n);
	if (!rc)
		rc = write_file(to, "chat_template.jinja", t, n, flags);
	free(t);
	return rc;
}

int kv_synth_write(const struct kv_synth_opts *o)
{
	const struct kv_synth_preset *p = kv_synth_preset_find(o->preset);
	char *tok = NULL, *tcfg = NULL, *cfg = NULL, path[4096];
	size_t tok_len = 0, tcfg_len = 0, cfg_len = 0;
	struct kv_model_config c;
	int rc, n_ids, bos, eos;

	if (!p) {
		struct kv_buf names = KV_BUF_INIT;
		for (size_t i = 0; i < kv_synth_preset_count(); i++)
			kv_buf_printf(&names, "%s%s", i ? ", " : "", g_presets[i].name);
		rc = kv_fail(KV_ERR_INVALID, "unknown preset '%s' (presets: %s)", o->preset ? o->preset : "",
			     names.p ? names.p : "");
		kv_buf_free(&names);
		return rc;
	}
	if (o->dtype != KV_DT_BF16 && o->dtype != KV_DT_F32)
		return kv_fail(KV_ERR_INVALID, "dtype must be bf16 or f32");
	if (p->config_only && !o->config_only && !o->large)
		return kv_fail(KV_ERR_INVALID,
			       "preset '%s' is a real model's size; use --config-only, or --large to write its weights "
			       "anyway (benchmarks)",
			       p->name);
	if (!o->out_dir || !o->out_dir[0])
		return kv_fail(KV_ERR_INVALID, "no output folder");

	if (o->tokenizer_dir) {
		if ((rc = read_tok_file(o->tokenizer_dir, "tokenizer.json", &tok, &tok_len)) ||
		    (rc = read_tok_file(o->tokenizer_dir, "tokenizer_config.json", &tcfg, &tcfg_len)))
			goto out;
	} else if ((rc = kv_synth_tokenizer(&tok, &tok_len, &tcfg, &tcfg_len))) {
		goto out;
	}
	if ((rc = kv_synth_tokenizer_ids(tok, tok_len, o->tokenizer_dir ? "tokenizer.json" : "synthetic tokenizer",
					 &n_ids, &bos, &eos)))
		goto out;
	if ((rc = kv_synth_config_json(p, n_ids, bos, p->release_files && bos >= 0 ? bos : eos, o->dtype, &cfg,
					&cfg_len)))
		goto out;
	if (o->mtp) {
		/* mtp_num_hidden_layers: 1 where the release has it (text_config) */
		json_t *root = json_loadb(cfg, cfg_len, 0, NULL), *tc;
		char *t2;
		if (p->arch == KV_ARCH_QWEN3) {
			json_decref(root);
			rc = kv_fail(KV_ERR_INVALID, "--mtp: preset '%s' is not a hybrid (Qwen3.5 / Qwen3-Next) model", p->name);
			goto out;
		}
		tc = root ? json_object_get(root, "text_config") : NULL;
		if (!root || json_object_set_new(tc ? tc : root, "mtp_num_hidden_layers", json_integer(1)) ||
		    !(t2 = json_dumps(root, JSON_INDENT(2) | JSON_REAL_PRECISION(10)))) {
			json_decref(root);
			rc = kv_fail(KV_ERR_NOMEM, "out of memory");
			goto out;
		}
		json_decref(root);
		free(cfg);
		cfg = t2;
		cfg_len = strlen(cfg);
	}
	/* What we write must be what we read: parse it back. */
	if ((rc = kv_config_parse(cfg, cfg_len, "generated config.json", &c))) {
		kv_fail_ctx(rc, "preset '%s'", p->name);
		goto out;
	}
	if ((rc = kv_io_mkdirs(o->out_dir, 0755)))
		goto out;
	if ((rc = write_file(o->out_dir, "tokenizer.json", tok, tok_len, o->dw_flags)) ||
	    (rc = write_file(o->out_dir, "tokenizer_config.json", tcfg, tcfg_len, o->dw_flags)))
		goto out;
	/* a template that ships beside the tokenizer (GPT-OSS's release keeps
	 * it in chat_template.jinja, not in tokenizer_config.json) */
	if (o->tokenizer_dir && (rc = copy_template(o->tokenizer_dir, o->out_dir, o->dw_flags)))
		goto out;
	if (!o->config_only) {
		if ((size_t)snprintf(path, sizeof path, "%s/model.safetensors", o->out_dir) >= sizeof path) {
			rc = kv_fail(KV_ERR_INVALID, "output path too long");
			goto out;
		}
		if ((rc = write_weights(&c, path, o->seed, o->dtype, p->name, o->dw_flags)))
			goto out;
	}
	if (p->release_files) {
		char gc[256];
		int n = snprintf(gc, sizeof gc,
				 "{\n  \"bos_token_id\": %d,\n  \"do_sample\": true,\n  \"eos_token_id\": [%d, %d],\n"
				 "  \"pad_token_id\": %d,\n  \"temperature\": 0.6,\n  \"top_k\": 20,\n  \"top_p\": 0.95,\n"
				 "  \"transformers_version\": \"4.57.0\"\n}\n",
				 bos, eos, bos, bos);
		if ((rc = write_file(o->out_dir, "generation_config.json", gc, (size_t)n, o->dw_flags)))
			goto out;
	}
	/* config.json last: a folder with a config is complete. */
	rc = write_file(o->out_dir, "config.json", cfg, cfg_len, o->dw_flags);
out:
	free(tok);
	free(tcfg);
	free(cfg);
	return rc;
}
