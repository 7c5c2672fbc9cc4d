/*
 * test_config.c - config.json parsing for qwen3, qwen3_5 (nested and flat,
 * layer_types and full_attention_interval, rope_parameters) and qwen3_next
 * (dense accepted, MoE refused), the rejection messages, the derived byte
 * counts and the implied tensor table.
 */
#include "kt.h"
#include "model/config.h"
#include "model/open.h"
#include "model/synth.h"
#include "model/dtype.h"
#include "base/err.h"

#include <stdlib.h>
#include <math.h>
#include <string.h>

static int parse(const char *json, struct kv_model_config *c)
{
	return kv_config_parse(json, strlen(json), "cfg.json", c);
}

/* Expect rc and every fragment (NULL-terminated) in the message. */
static int rejects(const char *json, int want, const char *frag1, const char *frag2)
{
	struct kv_model_config c;
	int rc = parse(json, &c);
	int ok = rc == want && strstr(kv_errmsg(), "cfg.json") && (!frag1 || strstr(kv_errmsg(), frag1)) &&
		 (!frag2 || strstr(kv_errmsg(), frag2));
	if (!ok)
		fprintf(stderr, "  %s\n    -> rc %d (want %d): %s\n", json, rc, want, kv_errmsg());
	return ok;
}

/* Qwen3-8B's config.json, fields as released. */
static const char *qwen3_8b =
	"{\"architectures\": [\"Qwen3ForCausalLM\"], \"attention_bias\": false, \"attention_dropout\": 0.0,"
	" \"bos_token_id\": 151643, \"eos_token_id\": 151645, \"head_dim\": 128, \"hidden_act\": \"silu\","
	" \"hidden_size\": 4096, \"initializer_range\": 0.02, \"intermediate_size\": 12288,"
	" \"max_position_embeddings\": 40960, \"max_window_layers\": 36, \"model_type\": \"qwen3\","
	" \"num_attention_heads\": 32, \"num_hidden_layers\": 36, \"num_key_value_heads\": 8,"
	" \"rms_norm_eps\": 1e-06, \"rope_scaling\": null, \"rope_theta\": 1000000, \"sliding_window\": null,"
	" \"tie_word_embeddings\": false, \"torch_dtype\": \"bfloat16\", \"transformers_version\": \"4.51.0\","
	" \"use_cache\": true, \"use_sliding_window\": false, \"vocab_size\": 151936}";

KT_CASE(qwen3_dense)
{
	struct kv_model_config c;
	KT_OK(parse(qwen3_8b, &c));
	KT_EQ_INT(c.arch, KV_ARCH_QWEN3);
	KT_EQ_STR(c.model_type, "qwen3");
	KT_EQ_STR(c.architecture, "Qwen3ForCausalLM");
	KT_EQ_INT(c.hidden, 4096);
	KT_EQ_INT(c.n_layers, 36);
	KT_EQ_INT(c.n_heads, 32);
	KT_EQ_INT(c.n_kv_heads, 8);
	KT_EQ_INT(c.head_dim, 128);
	KT_EQ_INT(c.intermediate, 12288);
	KT_EQ_INT(c.vocab, 151936);
	KT_CHECK(c.rms_eps == 1e-6);
	KT_CHECK(c.rope_theta == 1e6);
	KT_CHECK(c.partial_rotary == 1.0);
	KT_EQ_INT(c.rotary_dim, 128);
	KT_EQ_INT(c.tie_embeddings, 0);
	KT_EQ_INT(c.max_positions, 40960);
	KT_EQ_INT(c.hybrid, 0);
	KT_EQ_INT(c.attn_output_gate, 0);
	KT_EQ_INT(c.norm_plus_one, 0);
	KT_EQ_INT(c.n_attn_layers, 36);
	KT_EQ_INT(c.n_deltanet_layers, 0);
	KT_EQ_INT(c.n_eos, 1);
	KT_EQ_INT(c.eos_ids[0], 151645);
	KT_EQ_INT(c.eos_ids[1], -1);
	KT_EQ_INT(c.bos_id, 151643);
	KT_EQ_STR(c.torch_dtype, "bfloat16");
	KT_EQ_STR(kv_config_default_prefix(&c), "model.");
	/* 36 layers x 2 x 8 heads x 128 x 2 bytes. */
	KT_EQ_U64(kv_config_kv_bytes_per_token(&c, 2), 36ull * 2 * 8 * 128 * 2);
	KT_EQ_U64(kv_config_recurrent_state_bytes(&c), 0);
	KT_EQ_U64(kv_config_conv_state_bytes(&c), 0);
	/* Qwen3-8B: about 8.2 B parameters with an untied lm_head. */
	uint64_t p = kv_config_param_count(&c);
	KT_CHECKF(p > 8100000000ull && p < 8300000000ull, "params %llu", (unsigned long long)p);
}

KT_CASE(qwen3_defaults)
{
	/* Missing fields take the transformers defaults: head_dim 128 (not
	 * hidden / heads), kv heads = heads, rope_theta 10000. */
	struct kv_model_config c;
	KT_OK(parse("{\"model_type\": \"qwen3\", \"hidden_size\": 256, \"num_attention_heads\": 4,"
		    " \"num_hidden_layers\": 2, \"eos_token_id\": [5, 7], \"tie_word_embeddings\": true}",
		    &c));
	KT_EQ_INT(c.head_dim, 128);
	KT_EQ_INT(c.n_kv_heads, 4);
	KT_CHECK(c.rope_theta == 10000.0);
	KT_EQ_INT(c.vocab, 151936);
	KT_EQ_INT(c.intermediate, 22016);
	KT_EQ_INT(c.max_positions, 32768);
	KT_CHECK(c.rms_eps == 1e-6);
	KT_EQ_INT(c.n_eos, 2);
	KT_EQ_INT(c.eos_ids[1], 7);
	KT_EQ_INT(c.bos_id, -1);
	KT_EQ_INT(c.tie_embeddings, 1);
	KT_EQ_STR(c.torch_dtype, "");
	/* New transformers writes rope_parameters and "dtype". */
	KT_OK(parse("{\"model_type\": \"qwen3\", \"num_hidden_layers\": 2, \"dtype\": \"float32\","
		    " \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 5000000}}",
		    &c));
	KT_CHECK(c.rope_theta == 5e6);
	KT_EQ_STR(c.torch_dtype, "float32");
	/* Integral reals are integers. */
	KT_OK(parse("{\"model_type\": \"qwen3\", \"num_hidden_layers\": 2.0, \"hidden_size\": 64.0}", &c));
	KT_EQ_INT(c.hidden, 64);
	/* A sliding window that applies to no layer is fine. */
	KT_OK(parse("{\"model_type\": \"qwen3\", \"num_hidden_layers\": 4, \"use_sliding_window\": true,"
		    " \"sliding_window\": 4096, \"max_window_layers\": 4}",
		    &c));
}

/* Qwen3.5-9B as released: the text model under text_config. */
static const char *qwen35_9b =
	"{\"architectures\": [\"Qwen3_5ForConditionalGeneration\"], \"image_token_id\": 248056,"
	" \"model_type\": \"qwen3_5\", \"text_config\": {\"attention_bias\": false, \"attention_dropout\": 0.0,"
	" \"attn_output_gate\": true, \"dtype\": \"bfloat16\", \"eos_token_id\": 248044,"
	" \"full_attention_interval\": 4, \"head_dim\": 256, \"hidden_act\": \"silu\", \"hidden_size\": 4096,"
	" \"initializer_range\": 0.02, \"intermediate_size\": 12288, \"layer_types\": [%s],"
	" \"linear_conv_kernel_dim\": 4, \"linear_key_head_dim\": 128, \"linear_num_key_heads\": 16,"
	" \"linear_num_value_heads\": 32, \"linear_value_head_dim\": 128, \"max_position_embeddings\": 262144,"
	" \"mamba_ssm_dtype\": \"float32\", \"model_type\": \"qwen3_5_text\", \"mtp_num_hidden_layers\": 1,"
	" \"num_attention_heads\": 16, \"num_hidden_layers\": 32, \"num_key_value_heads\": 4,"
	" \"rms_norm_eps\": 1e-06, \"rope_parameters\": {\"mrope_interleaved\": true, \"mrope_section\": [11, 11, 10],"
	" \"rope_type\": \"default\", \"rope_theta\": 10000000, \"partial_rotary_factor\": 0.25},"
	" \"tie_word_embeddings\": false, \"use_cache\": true, \"vocab_size\": 248320},"
	" \"tie_word_embeddings\": false, \"transformers_version\": \"4.57.0.dev0\","
	" \"vision_config\": {\"depth\": 27, \"hidden_size\": 1152}}";

static char *with_layer_types(const char *fmt, int n, int interval)
{
	char lt[4096] = "";
	size_t o = 0;
	char *out = malloc(strlen(fmt) + sizeof lt);
	for (int i = 0; i < n; i++)
		o += (size_t)snprintf(lt + o, sizeof lt - o, "%s\"%s\"", i ? ", " : "",
				      (i + 1) % interval ? "linear_attention" : "full_attention");
	sprintf(out, fmt, lt);
	return out;
}

KT_CASE(qwen35_nested)
{
	struct kv_model_config c;
	char *j = with_layer_types(qwen35_9b, 32, 4);
	KT_OK(parse(j, &c));
	free(j);
	KT_EQ_INT(c.arch, KV_ARCH_QWEN3_5);
	KT_EQ_INT(c.text_nested, 1);
	KT_EQ_INT(c.fused_deltanet, 0);
	KT_EQ_INT(c.hybrid, 1);
	KT_EQ_INT(c.attn_output_gate, 1);
	KT_EQ_INT(c.norm_plus_one, 1);
	KT_EQ_INT(c.hidden, 4096);
	KT_EQ_INT(c.n_layers, 32);
	KT_EQ_INT(c.n_heads, 16);
	KT_EQ_INT(c.n_kv_heads, 4);
	KT_EQ_INT(c.head_dim, 256);
	KT_EQ_INT(c.intermediate, 12288);
	KT_EQ_INT(c.vocab, 248320);
	KT_CHECK(c.rope_theta == 1e7);
	KT_CHECK(c.partial_rotary == 0.25);
	KT_EQ_INT(c.rotary_dim, 64);
	KT_EQ_INT(c.lin_k_heads, 16);
	KT_EQ_INT(c.lin_v_heads, 32);
	KT_EQ_INT(c.lin_k_dim, 128);
	KT_EQ_INT(c.lin_v_dim, 128);
	KT_EQ_INT(c.conv_kernel, 4);
	KT_EQ_INT(c.n_attn_layers, 8);
	KT_EQ_INT(c.n_deltanet_layers, 24);
	for (int l = 0; l < 32; l++)
		KT_EQ_INT(c.layer_type[l], (l % 4 == 3) ? KV_LAYER_ATTN : KV_LAYER_DELTANET);
	KT_EQ_INT(c.eos_ids[0], 248044);
	KT_EQ_STR(c.torch_dtype, "bfloat16");
	KT_EQ_STR(kv_config_default_prefix(&c), "model.language_model.");
	/* The figures of docs/models.md: 32 KiB of KV per token,
	 * 2 MiB of delta-rule state per layer. */
	KT_EQ_U64(kv_config_kv_bytes_per_token(&c, 2), 32768);
	KT_EQ_U64(kv_config_recurrent_state_bytes(&c), 2097152);
	KT_EQ_U64(kv_config_conv_dim(&c), 2 * 16 * 128 + 32 * 128);
	KT_EQ_U64(kv_config_conv_state_bytes(&c), (2 * 16 * 128 + 32 * 128) * 3 * 4);
	/* Text model of the 9B: about 8.9 B parameters (the rest is vision). */
	uint64_t p = kv_config_param_count(&c);
	KT_CHECKF(p > 8700000000ull && p < 9100000000ull, "params %llu", (unsigned long long)p);
}

KT_CASE(qwen35_flat_and_interval)
{
	struct kv_model_config c;
	/* Flat, no layer_types: full_attention_interval decides. */
	KT_OK(parse("{\"model_type\": \"qwen3_5_text\", \"num_hidden_layers\": 6, \"hidden_size\": 64,"
		    " \"full_attention_interval\": 3, \"linear_num_key_heads\": 2, \"linear_num_value_heads\": 4,"
		    " \"rope_theta\": 1000, \"partial_rotary_factor\": 0.5, \"head_dim\": 32}",
		    &c));
	KT_EQ_INT(c.text_nested, 0);
	KT_EQ_STR(kv_config_default_prefix(&c), "model.");
	KT_EQ_INT(c.n_attn_layers, 2);
	KT_EQ_INT(c.layer_type[2], KV_LAYER_ATTN);
	KT_EQ_INT(c.layer_type[5], KV_LAYER_ATTN);
	KT_EQ_INT(c.layer_type[0], KV_LAYER_DELTANET);
	KT_CHECK(c.rope_theta == 1000.0);
	KT_EQ_INT(c.rotary_dim, 16);
	/* Defaults: interval 4, partial 0.25, Qwen3.5 sizes. */
	KT_OK(parse("{\"model_type\": \"qwen3_5\", \"num_hidden_layers\": 8}", &c));
	KT_EQ_INT(c.n_attn_layers, 2);
	KT_EQ_INT(c.layer_type[3], KV_LAYER_ATTN);
	KT_EQ_INT(c.layer_type[7], KV_LAYER_ATTN);
	KT_CHECK(c.partial_rotary == 0.25);
	KT_EQ_INT(c.head_dim, 256);
	KT_EQ_INT(c.rotary_dim, 64);
	KT_EQ_INT(c.lin_v_heads, 32);
	KT_EQ_INT(c.vocab, 248320);
	/* layer_types wins over the interval, legacy names accepted. */
	KT_OK(parse("{\"model_type\": \"qwen3_5\", \"text_config\": {\"num_hidden_layers\": 3,"
		    " \"full_attention_interval\": 1, \"layer_types\": [\"attention\", \"mamba\", \"linear_attention\"]}}",
		    &c));
	KT_EQ_INT(c.layer_type[0], KV_LAYER_ATTN);
	KT_EQ_INT(c.layer_type[1], KV_LAYER_DELTANET);
	KT_EQ_INT(c.n_attn_layers, 1);
	/* tie_word_embeddings at the top level of a nested config. */
	KT_OK(parse("{\"model_type\": \"qwen3_5\", \"tie_word_embeddings\": true, \"eos_token_id\": 3,"
		    " \"text_config\": {\"num_hidden_layers\": 4}}",
		    &c));
	KT_EQ_INT(c.tie_embeddings, 1);
	KT_EQ_INT(c.eos_ids[0], 3);
	/* rope_parameters win over top-level fields. */
	KT_OK(parse("{\"model_type\": \"qwen3_5\", \"rope_theta\": 5, \"partial_rotary_factor\": 1.0,"
		    " \"rope_parameters\": {\"rope_theta\": 7, \"partial_rotary_factor\": 0.5}}",
		    &c));
	KT_CHECK(c.rope_theta == 7.0);
	KT_EQ_INT(c.rotary_dim, 128);
}

KT_CASE(rope_scaling_linear_and_yarn)
{
	struct kv_model_config c;
	/* The Qwen3 model card's YaRN block: attention factor 0.1 ln 4 + 1. */
	KT_OK(parse("{\"model_type\": \"qwen3\", \"max_position_embeddings\": 40960, \"rope_scaling\": {\"rope_type\":"
		    " \"yarn\", \"factor\": 4.0, \"original_max_position_embeddings\": 32768}}",
		    &c));
	KT_EQ_INT(c.rope_scaling, KV_ROPE_YARN);
	KT_CHECK(c.rope_factor == 4.0);
	KT_EQ_INT(c.rope_orig_max_pos, 32768);
	KT_CHECK(fabs(c.rope_attn_factor - (0.1 * log(4.0) + 1.0)) < 1e-12);
	KT_CHECK(c.rope_beta_fast == 32.0 && c.rope_beta_slow == 1.0 && c.rope_truncate == 1);
	/* mscale / mscale_all_dim, explicit betas, rope_parameters, no original: max_position_embeddings */
	KT_OK(parse("{\"model_type\": \"qwen3_5\", \"max_position_embeddings\": 4096, \"rope_parameters\": {\"rope_type\":"
		    " \"yarn\", \"rope_theta\": 10000, \"factor\": 8, \"mscale\": 2, \"mscale_all_dim\": 1, \"beta_fast\": 16,"
		    " \"beta_slow\": 2, \"truncate\": false}}",
		    &c));
	KT_EQ_INT(c.rope_orig_max_pos, 4096);
	KT_CHECK(fabs(c.rope_attn_factor - (0.2 * log(8.0) + 1.0) / (0.1 * log(8.0) + 1.0)) < 1e-12);
	KT_CHECK(c.rope_beta_fast == 16.0 && c.rope_beta_slow == 2.0 && c.rope_truncate == 0);
	/* yarn without a factor: max_position_embeddings / original */
	KT_OK(parse("{\"model_type\": \"qwen3\", \"max_position_embeddings\": 8192, \"rope_scaling\": {\"rope_type\":"
		    " \"yarn\", \"original_max_position_embeddings\": 2048}}",
		    &c));
	KT_CHECK(c.rope_factor == 4.0);
	/* an explicit attention factor wins */
	KT_OK(parse("{\"model_type\": \"qwen3\", \"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 2,"
		    " \"attention_factor\": 1.5}}",
		    &c));
	KT_CHECK(c.rope_attn_factor == 1.5);
	KT_OK(parse("{\"model_type\": \"qwen3\", \"rope_scaling\": {\"type\": \"linear\", \"factor\": 2.5}}", &c));
	KT_EQ_INT(c.rope_scaling, KV_ROPE_LINEAR);
	KT_CHECK(c.rope_factor == 2.5 && c.rope_attn_factor == 1.0);
	KT_OK(parse("{\"model_type\": \"qwen3\", \"rope_scaling\": null}", &c));
	KT_EQ_INT(c.rope_scaling, KV_ROPE_NONE);
	KT_CHECK(c.rope_factor == 1.0 && c.rope_attn_factor == 1.0);
}

KT_CASE(qwen3_next)
{
	struct kv_model_config c;
	const char *dense = "{\"model_type\": \"qwen3_next\", \"num_hidden_layers\": 8, \"hidden_size\": 256,"
			    " \"num_experts\": 0, \"intermediate_size\": 512, \"linear_num_key_heads\": 4,"
			    " \"linear_num_value_heads\": 8, \"linear_key_head_dim\": 32, \"linear_value_head_dim\": 32}";
	KT_OK(parse(dense, &c));
	KT_EQ_INT(c.arch, KV_ARCH_QWEN3_NEXT);
	KT_EQ_INT(c.fused_deltanet, 1);
	KT_EQ_INT(c.hybrid, 1);
	KT_EQ_INT(c.n_attn_layers, 2);
	KT_EQ_INT(c.head_dim, 256);
	KT_EQ_INT(c.n_kv_heads, 2);
	KT_EQ_INT(c.rotary_dim, 64);
	KT_EQ_INT(c.vocab, 151936);
	/* Fused projections in the tensor table. */
	struct kv_tensor_spec *v;
	size_t n;
	int seen_qkvz = 0, seen_ba = 0;
	KT_OK(kv_config_tensors(&c, NULL, &v, &n));
	for (size_t i = 0; i < n; i++) {
		if (!strcmp(v[i].name, "model.layers.0.linear_attn.in_proj_qkvz.weight")) {
			seen_qkvz = 1;
			KT_EQ_INT(v[i].shape[0], 2 * 4 * 32 + 2 * 8 * 32);
			KT_EQ_INT(v[i].shape[1], 256);
		}
		if (!strcmp(v[i].name, "model.layers.0.linear_attn.in_proj_ba.weight")) {
			seen_ba = 1;
			KT_EQ_INT(v[i].shape[0], 16);
		}
		KT_CHECK(!strstr(v[i].name, "in_proj_qkv.") && !strstr(v[i].name, "in_proj_z"));
	}
	free(v);
	KT_CHECK(seen_qkvz && seen_ba);
	/* MoE: the released Qwen3-Next config, and the transformers defaults
	 * (512 experts, top 10, norm_topk_prob, 512 / 512 intermediate). */
	KT_OK(parse("{\"model_type\": \"qwen3_next\", \"num_hidden_layers\": 48, \"num_experts\": 512,"
		    " \"num_experts_per_tok\": 10, \"decoder_sparse_step\": 1, \"mlp_only_layers\": [],"
		    " \"moe_intermediate_size\": 512, \"shared_expert_intermediate_size\": 512, \"intermediate_size\": 5120}",
		    &c));
	KT_EQ_INT(c.n_experts, 512);
	KT_EQ_INT(c.n_moe_layers, 48);
	KT_EQ_INT(c.expert_layout, KV_EXPERTS_SPLIT);
	KT_OK(parse("{\"model_type\": \"qwen3_next\", \"num_hidden_layers\": 4}", &c));
	KT_EQ_INT(c.n_experts, 512);
	KT_EQ_INT(c.n_experts_per_tok, 10);
	KT_EQ_INT(c.norm_topk_prob, 1);
	KT_EQ_INT(c.moe_intermediate, 512);
	KT_EQ_INT(c.shared_intermediate, 512);
	/* Per-expert tensors in the table, router and shared expert. */
	KT_OK(kv_config_tensors(&c, NULL, &v, &n));
	int seen_e = 0, seen_dense = 0, seen_sg = 0;
	for (size_t i = 0; i < n; i++) {
		if (!strcmp(v[i].name, "model.layers.2.mlp.experts.511.down_proj.weight"))
			seen_e = v[i].shape[0] == 2048 && v[i].shape[1] == 512 && v[i].expert == 511;
		if (!strcmp(v[i].name, "model.layers.2.mlp.shared_expert_gate.weight"))
			seen_sg = v[i].shape[0] == 1 && v[i].shape[1] == 2048;
		seen_dense |= strstr(v[i].name, "mlp.gate_proj") != NULL;
	}
	free(v);
	KT_CHECK(seen_e && seen_sg && !seen_dense);
	/* Experts declared but every layer dense: accepted, no MoE. */
	KT_OK(parse("{\"model_type\": \"qwen3_next\", \"num_hidden_layers\": 4, \"num_experts\": 64,"
		    " \"mlp_only_layers\": [0, 1, 2, 3]}",
		    &c));
	KT_EQ_INT(c.n_moe_layers, 0);
	/* decoder_sparse_step 3 with 2 layers: no layer is sparse. */
	KT_OK(parse("{\"model_type\": \"qwen3_next\", \"num_hidden_layers\": 2, \"decoder_sparse_step\": 3}", &c));
	KT_EQ_INT(c.n_moe_layers, 0);
	/* step 2 and mlp_only_layers [3]: only layer 1 is sparse. */
	KT_OK(parse("{\"model_type\": \"qwen3_next\", \"num_hidden_layers\": 4, \"decoder_sparse_step\": 2,"
		    " \"mlp_only_layers\": [3], \"norm_topk_prob\": false}",
		    &c));
	KT_EQ_INT(c.n_moe_layers, 1);
	KT_EQ_INT(c.layer_moe[1], 1);
	KT_EQ_INT(c.layer_moe[3], 0);
	KT_EQ_INT(c.norm_topk_prob, 0);
	/* Impossible values. */
	KT_CHECK(rejects("{\"model_type\": \"qwen3_next\", \"num_experts\": 8, \"num_experts_per_tok\": 9}",
			 KV_ERR_INVALID, "num_experts_per_tok 9", "num_experts 8"));
	KT_CHECK(rejects("{\"model_type\": \"qwen3_next\", \"num_experts\": 8, \"num_experts_per_tok\": 0}",
			 KV_ERR_INVALID, "num_experts_per_tok", NULL));
	KT_CHECK(rejects("{\"model_type\": \"qwen3_next\", \"num_experts\": -1}", KV_ERR_INVALID, "num_experts",
			 NULL));
	KT_CHECK(rejects("{\"model_type\": \"qwen3_next\", \"moe_intermediate_size\": 0}", KV_ERR_INVALID,
			 "moe_intermediate_size", NULL));
	KT_CHECK(rejects("{\"model_type\": \"qwen3_next\", \"shared_expert_intermediate_size\": 0}",
			 KV_ERR_INVALID, "shared_expert_intermediate_size", NULL));
	KT_CHECK(rejects("{\"model_type\": \"qwen3_next\", \"norm_topk_prob\": 3}", KV_ERR_INVALID,
			 "norm_topk_prob", NULL));
	KT_CHECK(rejects("{\"model_type\": \"qwen3_next\", \"decoder_sparse_step\": 0}", KV_ERR_INVALID,
			 "decoder_sparse_step", NULL));
	KT_CHECK(rejects("{\"model_type\": \"qwen3_next\", \"num_hidden_layers\": 4, \"mlp_only_layers\": [9]}",
			 KV_ERR_INVALID, "mlp_only_layers[0]", NULL));
}

KT_CASE(rejections)
{
	const int I = KV_ERR_INVALID, U = KV_ERR_UNSUPPORTED;
	KT_CHECK(rejects("{\"model_type\": \"phi3\"}", U, "'phi3'", "gpt_oss"));
	KT_CHECK(rejects("{\"model_type\": \"qwen3_moe\"}", U, "mixture-of-experts", NULL));
	KT_CHECK(rejects("{\"hidden_size\": 8}", I, "model_type", NULL));
	KT_CHECK(rejects("{\"model_type\": 3}", I, "model_type", NULL));
	KT_CHECK(rejects("[1, 2]", I, "not a JSON object", NULL));
	KT_CHECK(rejects("{\"model_type\": \"qwen3\",", I, NULL, NULL));
	KT_CHECK(rejects("{\"model_type\": \"qwen3\", \"hidden_size\": 0}", I, "hidden_size", NULL));
	KT_CHECK(rejects("{\"model_type\": \"qwen3\", \"hidden_size\": -4}", I, "hidden_size", NULL));
	KT_CHECK(rejects("{\"model_type\": \"qwen3\", \"hidden_size\": \"4096\"}", I, "hidden_size", NULL));
	KT_CHECK(rejects("{\"model_type\": \"qwen3\", \"hidden_size\": 1e300}", I, "hidden_size", NULL));
	KT_CHECK(rejects("{\"model_type\": \"qwen3\", \"hidden_size\": 64.5}", I, "hidden_size", NULL));
	KT_CHECK(rejects("{\"model_type\": \"qwen3\", \"vocab_size\": 0}", I, "vocab_size", NULL));
	KT_CHECK(rejects("{\"model_type\": \"qwen3\", \"intermediate_size\": 0}", I, "intermediate_size", NULL));
	KT_CHECK(rejects("{\"model_type\": \"qwen3\", \"num_hidden_layers\": 0}", I, "num_hidden_layers", NULL));
	KT_CHECK(rejects("{\"model_type\": \"qwen3\", \"num_hidden_layers\": 300}", U, "num_hidden_layers", NULL));
	KT_CHECK(rejects("{\"model_type\": \"qwen3\", \"num_attention_heads\": 16, \"num_key_value_heads\": 3}", I,
			 "num_key_value_heads 3", "num_attention_heads 16"));
	KT_CHECK(rejects("{\"model_type\": \"qwen3\", \"num_attention_heads\": 4, \"num_key_value_heads\": 8}", I,
			 "num_key_value_heads", NULL));
	KT_CHECK(rejects("{\"model_type\": \"qwen3\", \"head_dim\": 0}", I, "head_dim", NULL));
	KT_CHECK(rejects("{\"model_type\": \"qwen3\", \"head_dim\": 7}", I, "rotary dim 7", NULL));
	KT_CHECK(rejects("{\"model_type\": \"qwen3\", \"rms_norm_eps\": -1}", I, "rms_norm_eps", NULL));
	KT_CHECK(rejects("{\"model_type\": \"qwen3\", \"rope_theta\": 0}", I, "rope_theta", NULL));
	KT_CHECK(rejects("{\"model_type\": \"qwen3\", \"rope_scaling\": {\"rope_type\": \"dynamic\", \"factor\": 4}}", U,
			 "rope_scaling.rope_type 'dynamic'", "cut"));
	KT_CHECK(rejects("{\"model_type\": \"qwen3\", \"rope_scaling\": {\"rope_type\": \"longrope\"}}", U, "'longrope'",
			 NULL));
	KT_CHECK(rejects("{\"model_type\": \"qwen3\", \"rope_scaling\": {\"type\": \"linear\"}}", I,
			 "rope_scaling.factor is required", NULL));
	KT_CHECK(rejects("{\"model_type\": \"qwen3\", \"rope_scaling\": {\"type\": \"linear\", \"factor\": -2}}", I,
			 "factor -2", NULL));
	KT_CHECK(rejects("{\"model_type\": \"qwen3\", \"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": \"4\"}}", I,
			 "rope_scaling.factor must be a number", NULL));
	KT_CHECK(rejects("{\"model_type\": \"qwen3\", \"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4,"
			 " \"original_max_position_embeddings\": 0}}",
			 I, "original_max_position_embeddings", NULL));
	KT_CHECK(rejects("{\"model_type\": \"qwen3_5\", \"rope_parameters\": {\"rope_type\": \"yarn\", \"factor\": 4},"
			 " \"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": 2}}",
			 I, "different rope types", NULL));
	KT_CHECK(rejects("{\"model_type\": \"qwen3\", \"use_sliding_window\": true, \"sliding_window\": 4096,"
			 " \"max_window_layers\": 1, \"num_hidden_layers\": 4}",
			 U, "use_sliding_window", NULL));
	KT_CHECK(rejects("{\"model_type\": \"qwen3\", \"num_hidden_layers\": 2, \"layer_types\": [\"full_attention\","
			 " \"sliding_attention\"]}",
			 U, "layer_types[1]", NULL));
	KT_CHECK(rejects("{\"model_type\": \"qwen3\", \"attention_bias\": true}", U, "attention_bias", NULL));
	KT_CHECK(rejects("{\"model_type\": \"qwen3\", \"hidden_act\": \"gelu\"}", U, "hidden_act 'gelu'", NULL));
	KT_CHECK(rejects("{\"model_type\": \"qwen3\", \"tie_word_embeddings\": 1}", I, "tie_word_embeddings", NULL));
	KT_CHECK(rejects("{\"model_type\": \"qwen3\", \"eos_token_id\": \"x\"}", I, "eos_token_id", NULL));
	KT_CHECK(rejects("{\"model_type\": \"qwen3\", \"eos_token_id\": [1, -2]}", I, "eos_token_id[1]", NULL));
	KT_CHECK(rejects("{\"model_type\": \"qwen3\", \"eos_token_id\": [1,2,3,4,5,6,7,8,9]}", U, "eos_token_id",
			 NULL));
	KT_CHECK(rejects("{\"model_type\": \"qwen3\", \"partial_rotary_factor\": 0.5}", U, "partial_rotary_factor",
			 NULL));
	/* Hybrid shapes. */
	KT_CHECK(rejects("{\"model_type\": \"qwen3_5\", \"text_config\": 5}", I, "text_config", NULL));
	KT_CHECK(rejects("{\"model_type\": \"qwen3_5\", \"text_config\": {\"linear_num_key_heads\": 3}}", I,
			 "text_config.linear_num_key_heads 3", NULL));
	KT_CHECK(rejects("{\"model_type\": \"qwen3_5\", \"text_config\": {\"linear_conv_kernel_dim\": 0}}", I,
			 "text_config.linear_conv_kernel_dim", NULL));
	KT_CHECK(rejects("{\"model_type\": \"qwen3_5\", \"text_config\": {\"num_hidden_layers\": 2,"
			 " \"layer_types\": [\"full_attention\"]}}",
			 I, "text_config.layer_types has 1 entries", NULL));
	KT_CHECK(rejects("{\"model_type\": \"qwen3_5\", \"num_hidden_layers\": 1, \"layer_types\": [\"conv\"]}", I,
			 "layer_types[0] 'conv'", NULL));
	KT_CHECK(rejects("{\"model_type\": \"qwen3_5\", \"num_hidden_layers\": 1, \"layer_types\": [3]}", I,
			 "layer_types[0]", NULL));
	KT_CHECK(rejects("{\"model_type\": \"qwen3_5\", \"full_attention_interval\": 0}", I,
			 "full_attention_interval", NULL));
	KT_CHECK(rejects("{\"model_type\": \"qwen3_5\", \"partial_rotary_factor\": 0.001}", I, "rotary dim 0", NULL));
	KT_CHECK(rejects("{\"model_type\": \"qwen3_5\", \"head_dim\": 20}", I, "rotary dim 5", NULL));
	KT_CHECK(rejects("{\"model_type\": \"qwen3_5\", \"partial_rotary_factor\": 1.5}", I, "partial_rotary_factor",
			 NULL));
	KT_CHECK(rejects("{\"model_type\": \"qwen3_5\", \"rope_parameters\": {\"rope_type\": \"yarn\"}}", I,
			 "rope_parameters.factor is required", NULL));
	KT_CHECK(rejects("{\"model_type\": \"qwen3_5\", \"rope_parameters\": {\"rope_type\": \"llama3\"}}", U,
			 "rope_parameters.rope_type 'llama3'", NULL));
	KT_CHECK(rejects("{\"model_type\": \"qwen3_5\", \"rope_parameters\": []}", I, "rope_parameters", NULL));
	KT_CHECK(rejects("{\"model_type\": \"qwen3_5\", \"num_experts\": 8}", U, "qwen3_5_moe", NULL));
}

/* Qwen3.5-35B-A3B's config.json text part (as released), nested. */
KT_CASE(qwen35_moe)
{
	struct kv_model_config c;
	const char *j =
		"{\"architectures\": [\"Qwen3_5MoeForConditionalGeneration\"], \"model_type\": \"qwen3_5_moe\","
		" \"text_config\": {\"model_type\": \"qwen3_5_moe_text\", \"hidden_size\": 2048,"
		" \"num_hidden_layers\": 40, \"num_attention_heads\": 16, \"num_key_value_heads\": 2,"
		" \"head_dim\": 256, \"num_experts\": 256, \"num_experts_per_tok\": 8,"
		" \"moe_intermediate_size\": 512, \"shared_expert_intermediate_size\": 512,"
		" \"full_attention_interval\": 4, \"vocab_size\": 248320,"
		" \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 10000000,"
		" \"partial_rotary_factor\": 0.25}}, \"tie_word_embeddings\": false}";
	KT_OK(parse(j, &c));
	KT_EQ_INT(c.arch, KV_ARCH_QWEN3_5);
	KT_EQ_STR(c.model_type, "qwen3_5_moe");
	KT_EQ_INT(c.text_nested, 1);
	KT_EQ_INT(c.n_experts, 256);
	KT_EQ_INT(c.n_experts_per_tok, 8);
	KT_EQ_INT(c.n_moe_layers, 40);
	KT_EQ_INT(c.norm_topk_prob, 1);
	KT_EQ_INT(c.n_attn_layers, 10);
	KT_EQ_INT(c.expert_layout, KV_EXPERTS_STACKED);
	/* ~35B total, ~3B active (embeddings counted in both). */
	KT_CHECKF(kv_config_param_count(&c) > 34000000000ull && kv_config_param_count(&c) < 36000000000ull, "%llu",
		  (unsigned long long)kv_config_param_count(&c));
	KT_CHECKF(kv_config_active_param_count(&c) > 2500000000ull && kv_config_active_param_count(&c) < 3600000000ull,
		  "%llu", (unsigned long long)kv_config_active_param_count(&c));
	struct kv_tensor_spec *v;
	size_t n;
	int seen = 0;
	KT_OK(kv_config_tensors(&c, NULL, &v, &n));
	for (size_t i = 0; i < n; i++)
		if (!strcmp(v[i].name, "model.language_model.layers.3.mlp.experts.gate_up_proj"))
			seen = v[i].ndim == 3 && v[i].shape[0] == 256 && v[i].shape[1] == 1024 && v[i].shape[2] == 2048;
	free(v);
	KT_CHECK(seen);
	/* mlx-lm's switch_mlp stacks: gate and up [E, I, D], down [E, D, I]. */
	c.expert_layout = KV_EXPERTS_SWITCH;
	KT_OK(kv_config_tensors(&c, NULL, &v, &n));
	seen = 0;
	for (size_t i = 0; i < n; i++) {
		if (!strcmp(v[i].name, "model.language_model.layers.3.mlp.switch_mlp.up_proj.weight"))
			seen += v[i].ndim == 3 && v[i].shape[0] == 256 && v[i].shape[1] == 512 && v[i].shape[2] == 2048;
		if (!strcmp(v[i].name, "model.language_model.layers.3.mlp.switch_mlp.down_proj.weight"))
			seen += v[i].ndim == 3 && v[i].shape[0] == 256 && v[i].shape[1] == 2048 && v[i].shape[2] == 512;
		KT_CHECK(!strstr(v[i].name, "experts."));
	}
	free(v);
	KT_EQ_INT(seen, 2);
	/* Defaults of Qwen3_5MoeTextConfig; the flat text config too. */
	KT_OK(parse("{\"model_type\": \"qwen3_5_moe_text\"}", &c));
	KT_EQ_INT(c.hidden, 2048);
	KT_EQ_INT(c.n_layers, 40);
	KT_EQ_INT(c.n_kv_heads, 2);
	KT_EQ_INT(c.n_experts, 256);
	KT_EQ_INT(c.n_experts_per_tok, 8);
	KT_EQ_INT(c.text_nested, 0);
	KT_CHECK(rejects("{\"model_type\": \"qwen3_5_moe\", \"text_config\": {\"num_experts\": 0}}", KV_ERR_INVALID,
			 "text_config.num_experts", NULL));
	KT_CHECK(rejects("{\"model_type\": \"qwen3_5_moe\", \"text_config\": {\"num_experts_per_tok\": 300}}",
			 KV_ERR_INVALID, "text_config.num_experts_per_tok 300", NULL));
}

KT_CASE(load_from_folder)
{
	struct kv_model_config c;
	char path[600];
	FILE *f;
	KT_EQ_INT(kv_config_load(kt_tmpdir(), &c), KV_ERR_NOT_FOUND);
	KT_CHECK(strstr(kv_errmsg(), "config.json") != NULL);
	snprintf(path, sizeof path, "%s/config.json", kt_tmpdir());
	f = fopen(path, "w");
	KT_REQUIRE(f != NULL);
	fputs(qwen3_8b, f);
	fclose(f);
	KT_OK(kv_config_load(kt_tmpdir(), &c));
	KT_EQ_INT(c.n_layers, 36);
	f = fopen(path, "w");
	fputs("{\"model_type\": \"qwen3\", \"hidden_size\": -1}", f);
	fclose(f);
	KT_EQ_INT(kv_config_load(kt_tmpdir(), &c), KV_ERR_INVALID);
	KT_CHECK(strstr(kv_errmsg(), path) && strstr(kv_errmsg(), "hidden_size"));
}

static int64_t numel(const struct kv_tensor_spec *s)
{
	int64_t n = 1;
	for (int d = 0; d < s->ndim; d++)
		n *= s->shape[d];
	return n;
}

KT_CASE(tensor_table)
{
	struct kv_model_config c;
	struct kv_tensor_spec *v;
	size_t n;
	/* A small hybrid: 4 layers, attention last, gate in q_proj. */
	KT_OK(parse("{\"model_type\": \"qwen3_5\", \"text_config\": {\"vocab_size\": 100, \"hidden_size\": 64,"
		    " \"intermediate_size\": 96, \"num_hidden_layers\": 4, \"num_attention_heads\": 4,"
		    " \"num_key_value_heads\": 2, \"head_dim\": 32, \"linear_num_key_heads\": 2,"
		    " \"linear_num_value_heads\": 4, \"linear_key_head_dim\": 16, \"linear_value_head_dim\": 8,"
		    " \"linear_conv_kernel_dim\": 4}}",
		    &c));
	KT_OK(kv_config_tensors(&c, NULL, &v, &n));
	/* embed + 3 x (2 norms + 9 DeltaNet + 3 mlp) + (2 + 6 + 3) + norm + lm_head */
	KT_EQ_INT(n, 1 + 3 * 14 + 11 + 1 + 1);
	KT_EQ_STR(v[0].name, "model.language_model.embed_tokens.weight");
	KT_EQ_STR(v[n - 1].name, "lm_head.weight");
	int64_t total = 0;
	int found = 0;
	for (size_t i = 0; i < n; i++) {
		total += numel(&v[i]);
		if (!strcmp(v[i].name, "model.language_model.layers.3.self_attn.q_proj.weight")) {
			found++;
			KT_EQ_INT(v[i].shape[0], 4 * 32 * 2);
			KT_EQ_INT(v[i].shape[1], 64);
			KT_EQ_INT(v[i].role, KV_ROLE_LINEAR);
		}
		if (!strcmp(v[i].name, "model.language_model.layers.0.linear_attn.conv1d.weight")) {
			found++;
			KT_EQ_INT(v[i].ndim, 3);
			KT_EQ_INT(v[i].shape[0], 2 * 2 * 16 + 4 * 8);
			KT_EQ_INT(v[i].shape[1], 1);
			KT_EQ_INT(v[i].shape[2], 4);
		}
		if (!strcmp(v[i].name, "model.language_model.layers.0.linear_attn.norm.weight")) {
			found++;
			KT_EQ_INT(v[i].shape[0], 8);
			KT_EQ_INT(v[i].role, KV_ROLE_NORM); /* plain w, no +1 */
		}
		if (!strcmp(v[i].name, "model.language_model.layers.0.input_layernorm.weight")) {
			found++;
			KT_EQ_INT(v[i].role, KV_ROLE_NORM_OFFSET);
		}
		if (!strcmp(v[i].name, "model.language_model.layers.1.linear_attn.out_proj.weight")) {
			found++;
			KT_EQ_INT(v[i].shape[0], 64);
			KT_EQ_INT(v[i].shape[1], 32);
			KT_EQ_INT(v[i].role, KV_ROLE_LINEAR_OUT);
		}
		KT_CHECK(!strstr(v[i].name, "layers.3.linear_attn") && !strstr(v[i].name, "layers.0.self_attn"));
	}
	KT_EQ_INT(found, 5);
	KT_EQ_U64(kv_config_param_count(&c), (uint64_t)total);
	free(v);
	/* Prefix override and a tied dense model: no lm_head. */
	KT_OK(parse("{\"model_type\": \"qwen3\", \"vocab_size\": 10, \"hidden_size\": 8, \"num_hidden_layers\": 1,"
		    " \"num_attention_heads\": 2, \"num_key_value_heads\": 1, \"head_dim\": 4, \"intermediate_size\": 16,"
		    " \"tie_word_embeddings\": true}",
		    &c));
	KT_OK(kv_config_tensors(&c, "x.", &v, &n));
	KT_EQ_INT(n, 1 + 2 + 6 + 3 + 1);
	KT_EQ_STR(v[0].name, "x.embed_tokens.weight");
	for (size_t i = 0; i < n; i++)
		KT_CHECK(strcmp(v[i].name, "lm_head.weight"));
	free(v);
	/* By hand: embed 80 + norms 16 + q 64 + k 32 + v 32 + o 64 + qk norms 8
	 * + mlp 3 x 128 + final norm 8. */
	KT_EQ_U64(kv_config_param_count(&c), 80 + 16 + 64 + 32 + 32 + 64 + 8 + 384 + 8);
}

/* The Mamba-2 hybrids: the released geometries' numbers (what `model
 * info`, the budget and admission see through the layout), Python's bare
 * Infinity, and what the engine does not run, refused naming the field. */
KT_CASE(mamba_hybrids)
{
	const char *names[] = {"granite-4.0-h-small", "nemotron-nano-9b-v2"};
	const uint64_t params[] = {31955679744ull, 8888227328ull};
	const int rec[] = {36, 27}, attn[] = {4, 4};
	const uint64_t state[] = {128ull * 64 * 128 * 4, 128ull * 80 * 128 * 4};
	const uint64_t conv[] = {(8192ull + 256) * 3 * 4, (10240ull + 2048) * 3 * 4};
	for (int i = 0; i < 2; i++) {
		char *j = NULL;
		size_t n = 0;
		struct kv_model_config c;
		const struct kv_synth_preset *p = kv_synth_preset_find(names[i]);
		KT_REQUIRE(p);
		KT_OK(kv_synth_config_json(p, 1000, 0, 1, KV_DT_BF16, &j, &n));
		KT_OK(parse(j, &c));
		KT_CHECK(c.ssm && !c.hybrid);
		KT_EQ_INT(c.n_ssm_layers, rec[i]);
		KT_EQ_INT(c.n_attn_layers, attn[i]);
		KT_CHECK(kv_config_param_count(&c) == params[i]);
		KT_CHECK(kv_config_recurrent_state_bytes(&c) == state[i]);
		KT_CHECK(kv_config_conv_state_bytes(&c) == conv[i]);
		KT_CHECK(kv_config_kv_bytes_per_token(&c, 2) == 16384);
		if (i == 1)
			KT_CHECK(strstr(j, "Infinity") != NULL); /* as Python writes it, read back */
		free(j);
	}
	const char *g = "{\"model_type\": \"granitemoehybrid\", \"hidden_size\": 64, \"num_hidden_layers\": 2, "
			"\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"mamba_n_heads\": 4, \"mamba_d_head\": 32, "
			"\"mamba_d_state\": 16, \"layer_types\": [\"mamba\", \"attention\"]%s}";
	char b[1024];
	struct kv_model_config c;
	snprintf(b, sizeof b, g, "");
	KT_OK(parse(b, &c));
	KT_EQ_INT(c.ssm_head_dim * c.ssm_heads, 2 * c.hidden);
	snprintf(b, sizeof b, g, ", \"position_embedding_type\": \"rope\"");
	KT_CHECK(rejects(b, KV_ERR_UNSUPPORTED, "position_embedding_type", "RoPE"));
	snprintf(b, sizeof b, g, ", \"mamba_proj_bias\": true");
	KT_CHECK(rejects(b, KV_ERR_UNSUPPORTED, "mamba_proj_bias", NULL));
	snprintf(b, sizeof b, g, ", \"mamba_n_groups\": 3");
	KT_CHECK(rejects(b, KV_ERR_INVALID, "groups", NULL));
	snprintf(b, sizeof b, g, ", \"mamba_d_head\": 16");
	KT_CHECK(rejects(b, KV_ERR_INVALID, "mamba_d_head", NULL));
	snprintf(b, sizeof b, g, ", \"time_step_limit\": [0.001, 100.0]");
	KT_CHECK(rejects(b, KV_ERR_UNSUPPORTED, "time_step_limit", NULL));
	const char *nm = "{\"model_type\": \"nemotron_h\", \"hidden_size\": 64, \"num_hidden_layers\": 3, "
			 "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 16, \"mamba_num_heads\": 4, "
			 "\"mamba_head_dim\": 16, \"n_groups\": 2, \"ssm_state_size\": 16, \"intermediate_size\": 32, "
			 "\"time_step_limit\": [0.0, Infinity], \"hybrid_override_pattern\": \"%s\"%s}";
	snprintf(b, sizeof b, nm, "M*-", "");
	KT_OK(parse(b, &c));
	KT_CHECK(c.layer_type[0] == KV_LAYER_MAMBA && c.layer_type[1] == KV_LAYER_ATTN && c.layer_type[2] == KV_LAYER_MLP);
	snprintf(b, sizeof b, nm, "M*E", "");
	KT_CHECK(rejects(b, KV_ERR_UNSUPPORTED, "'E'", NULL));
	snprintf(b, sizeof b, nm, "M*", "");
	KT_CHECK(rejects(b, KV_ERR_INVALID, "hybrid_override_pattern", NULL));
	snprintf(b, sizeof b, nm, "M*-", ", \"mlp_hidden_act\": \"silu\"");
	KT_CHECK(rejects(b, KV_ERR_UNSUPPORTED, "mlp_hidden_act", NULL));
	/* a bare Infinity inside a string is text, not the literal */
	char *out = NULL;
	size_t ol = 0;
	const char *t = "{\"a\": \"Infinity\", \"b\": [NaN, -Infinity]}";
	KT_OK(kv_config_json_relax(t, strlen(t), &out, &ol));
	KT_EQ_STR(out, "{\"a\": \"Infinity\", \"b\": [\"NaN\", \"-Infinity\"]}");
	free(out);
	out = NULL;
	KT_OK(kv_config_json_relax("{}", 2, &out, &ol));
	KT_CHECK(out == NULL);
}

/* Gemma 4 as gemma-4-31B-it nests it (Gemma4ForConditionalGeneration,
 * text_config): the sliding layers' head_dim / num_key_value_heads, the
 * global layers' own, "proportional" RoPE, K = V; and the features kvkeep
 * does not run refused by name. */
#define G4_TEXT \
	"\"attention_k_eq_v\": true, \"final_logit_softcapping\": 30.0, \"global_head_dim\": 512," \
	" \"head_dim\": 256, \"hidden_activation\": \"gelu_pytorch_tanh\", \"hidden_size\": 5376," \
	" \"intermediate_size\": 21504, \"layer_types\": [\"sliding_attention\", \"sliding_attention\"," \
	" \"sliding_attention\", \"sliding_attention\", \"sliding_attention\", \"full_attention\"]," \
	" \"model_type\": \"gemma4_text\", \"num_attention_heads\": 32, \"num_global_key_value_heads\": 4," \
	" \"num_hidden_layers\": 6, \"num_key_value_heads\": 16, \"rms_norm_eps\": 1e-06," \
	" \"rope_parameters\": {\"full_attention\": {\"partial_rotary_factor\": 0.25, \"rope_theta\": 1000000.0," \
	" \"rope_type\": \"proportional\"}, \"sliding_attention\": {\"rope_theta\": 10000.0," \
	" \"rope_type\": \"default\"}}, \"sliding_window\": 1024, \"vocab_size\": 262144"

KT_CASE(gemma4)
{
	struct kv_model_config c;
	const char *nested = "{\"architectures\": [\"Gemma4ForConditionalGeneration\"], \"model_type\": \"gemma4\","
			     " \"text_config\": {" G4_TEXT "}, \"tie_word_embeddings\": true}";
	KT_EQ_INT(parse(nested, &c), KV_OK);
	KT_EQ_INT(c.arch, KV_ARCH_GEMMA4);
	KT_EQ_INT(c.text_nested, 1);
	KT_EQ_INT(c.head_dim, 512);
	KT_EQ_INT(c.n_kv_heads, 4);
	KT_EQ_INT(kv_config_swa_head_dim(&c), 256);
	KT_EQ_INT(kv_config_swa_kv_heads(&c), 16);
	KT_EQ_INT(kv_config_layer_head_dim(&c, 0), 256);
	KT_EQ_INT(kv_config_layer_head_dim(&c, 5), 512);
	KT_EQ_INT(kv_config_layer_v_is_k(&c, 5), 1);
	KT_EQ_INT(kv_config_layer_v_is_k(&c, 0), 0);
	KT_EQ_INT(c.rotary_dim, 512);
	KT_EQ_INT(c.rope_rot_pairs, 64);
	KT_EQ_INT(c.local_rotary_dim, 256);
	KT_CHECK(c.rope_theta == 1e6 && c.rope_local_theta == 1e4 && c.attn_scale == 1.0 && c.final_softcap == 30.0);
	KT_EQ_INT(c.norm_plus_one, 0);
	KT_EQ_INT(c.n_swa_layers, 5);
	KT_EQ_INT(c.tie_embeddings, 1);
	/* global: 1 layer x 2 x 4 heads x 512; windows: 5 x 2 x 16 x 256 x 1023 */
	KT_EQ_U64(kv_config_kv_bytes_per_token(&c, 2), 1u * 2 * 4 * 512 * 2);
	KT_EQ_U64(kv_config_window_bytes(&c, 2), 5ull * 2 * 16 * 256 * 1023 * 2);
	struct kv_tensor_spec *sp;
	size_t n;
	KT_EQ_INT(kv_config_tensors(&c, NULL, &sp, &n), KV_OK);
	int v5 = 0, v0 = 0, ls = 0;
	for (size_t i = 0; i < n; i++) {
		v5 += !strcmp(sp[i].name, "model.language_model.layers.5.self_attn.v_proj.weight");
		v0 += !strcmp(sp[i].name, "model.language_model.layers.0.self_attn.v_proj.weight");
		ls += strstr(sp[i].name, ".layer_scalar") != NULL;
		if (!strcmp(sp[i].name, "model.language_model.layers.5.self_attn.k_proj.weight"))
			KT_EQ_INT((int)sp[i].shape[0], 4 * 512);
		if (!strcmp(sp[i].name, "model.language_model.layers.0.self_attn.q_norm.weight"))
			KT_EQ_INT((int)sp[i].shape[0], 256);
	}
	KT_EQ_INT(v5, 0);
	KT_EQ_INT(v0, 1);
	KT_EQ_INT(ls, 6);
	free(sp);
	const int U = KV_ERR_UNSUPPORTED, I = KV_ERR_INVALID;
	/* 26B-A4B's experts beside the dense MLP on every layer */
	KT_EQ_INT(parse("{" G4_TEXT ", \"enable_moe_block\": true, \"num_experts\": 128, \"top_k_experts\": 8,"
			" \"moe_intermediate_size\": 704}", &c), KV_OK);
	KT_EQ_INT(c.moe_kind, KV_MOE_GEMMA4);
	KT_EQ_INT(c.n_moe_layers, 6);
	KT_EQ_INT(c.n_experts, 128);
	KT_EQ_INT(c.n_experts_per_tok, 8);
	KT_EQ_INT(c.moe_intermediate, 704);
	KT_EQ_INT(kv_config_tensors(&c, NULL, &sp, &n), KV_OK);
	int gu = 0, dense = 0;
	for (size_t i = 0; i < n; i++) {
		if (!strcmp(sp[i].name, "model.layers.3.experts.gate_up_proj"))
			gu = sp[i].ndim == 3 && sp[i].shape[0] == 128 && sp[i].shape[1] == 2 * 704 && sp[i].shape[2] == 5376;
		dense += !strcmp(sp[i].name, "model.layers.3.mlp.gate_proj.weight");
	}
	KT_EQ_INT(gu, 1);
	KT_EQ_INT(dense, 1);
	free(sp);
	KT_CHECK(rejects("{" G4_TEXT ", \"enable_moe_block\": true, \"num_experts\": 4, \"top_k_experts\": 8}", I,
			 "top_k_experts", NULL));
	KT_CHECK(rejects("{\"model_type\": \"gemma4_text\", \"num_attention_heads\": 8, \"num_key_value_heads\": 4,"
			 " \"num_global_key_value_heads\": 3}", I, "num_global_key_value_heads", NULL));
	KT_CHECK(rejects("{" G4_TEXT ", \"per_layer_config\": {}}", U, "per_layer_config", NULL));
	/* E2B / E4B: per-layer embeddings, the last layers reading earlier KV
	 * (layers s s g s s g: the last 3 read layers 1 and 2) */
	const char *e2b = "{\"model_type\": \"gemma4_text\", \"num_hidden_layers\": 6, \"num_attention_heads\": 8,"
			  " \"num_key_value_heads\": 1, \"head_dim\": 256, \"global_head_dim\": 512,"
			  " \"hidden_size\": 1536, \"intermediate_size\": 6144, \"sliding_window\": 512,"
			  " \"layer_types\": [\"sliding_attention\", \"sliding_attention\", \"full_attention\","
			  " \"sliding_attention\", \"sliding_attention\", \"full_attention\"],"
			  " \"hidden_size_per_layer_input\": 256, \"num_kv_shared_layers\": 3,"
			  " \"use_double_wide_mlp\": true}";
	KT_EQ_INT(parse(e2b, &c), KV_OK);
	KT_EQ_INT(c.ple_dim, 256);
	KT_EQ_INT(c.n_kv_shared, 3);
	KT_EQ_INT(kv_config_kv_layer(&c, 3), 1);
	KT_EQ_INT(kv_config_kv_layer(&c, 4), 1);
	KT_EQ_INT(kv_config_kv_layer(&c, 5), 2);
	KT_EQ_INT(kv_config_kv_layer(&c, 2), 2);
	KT_EQ_INT(kv_config_kv_layers(&c, 0), 1);
	KT_EQ_INT(kv_config_kv_layers(&c, 1), 2);
	KT_EQ_INT(kv_config_layer_intermediate(&c, 3), 2 * 6144);
	KT_EQ_INT(kv_config_layer_intermediate(&c, 2), 6144);
	KT_EQ_U64(kv_config_kv_bytes_per_token(&c, 2), 1u * 2 * 1 * 512 * 2);
	KT_EQ_INT(kv_config_tensors(&c, NULL, &sp, &n), KV_OK);
	int k3 = 0, k2 = 0, ple = 0, gate3 = 0;
	for (size_t i = 0; i < n; i++) {
		k3 += !strcmp(sp[i].name, "model.layers.3.self_attn.k_proj.weight");
		k2 += !strcmp(sp[i].name, "model.layers.2.self_attn.k_proj.weight");
		ple += !strcmp(sp[i].name, "model.embed_tokens_per_layer.weight") && sp[i].shape[1] == 6 * 256;
		if (!strcmp(sp[i].name, "model.layers.3.mlp.gate_proj.weight"))
			gate3 = (int)sp[i].shape[0];
	}
	KT_EQ_INT(k3, 0);
	KT_EQ_INT(k2, 1);
	KT_EQ_INT(ple, 1);
	KT_EQ_INT(gate3, 2 * 6144);
	free(sp);
	/* a shared global layer with no global layer before the shared ones */
	KT_CHECK(rejects("{" G4_TEXT ", \"num_kv_shared_layers\": 1}", I, "no earlier global layer", NULL));
	KT_CHECK(rejects("{" G4_TEXT ", \"num_kv_shared_layers\": 6}", I, "num_kv_shared_layers", NULL));
	KT_CHECK(rejects("{" G4_TEXT ", \"hidden_size_per_layer_input\": 8, \"vocab_size_per_layer_input\": 7}", U,
			 "vocab_size_per_layer_input", NULL));
}

KT_MAIN(qwen3_dense, qwen3_defaults, qwen35_nested, qwen35_flat_and_interval, rope_scaling_linear_and_yarn, qwen3_next,
	rejections, qwen35_moe,
	load_from_folder, tensor_table, mamba_hybrids, gemma4)
