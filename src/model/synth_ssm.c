/*
 * synth_ssm.c - config.json of the Mamba-2 presets (Granite 4.0-H,
 * Nemotron-H), in the field order of the released files. The weights go
 * through synth.c's generator, which takes the tensor list from
 * kv_config_tensors like every other family.
 */
#include "model/synth.h"
#include "base/err.h"
#include "model/dtype.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

static const char *dtype_torch(int dt)
{
	return dt == KV_DT_F32 ? "float32" : dt == KV_DT_F16 ? "float16" : "bfloat16";
}

static void set(json_t *o, const char *k, json_t *v)
{
	json_object_set_new(o, k, v);
}

static void granite(json_t *o, const struct kv_synth_preset *p, int vocab, int bos, int eos, int dtype)
{
	json_t *a = json_array(), *lt = json_array();
	json_array_append_new(a, json_string("GraniteMoeHybridForCausalLM"));
	set(o, "architectures", a);
	set(o, "attention_bias", json_false());
	set(o, "attention_dropout", json_real(0.0));
	set(o, "attention_multiplier", json_real(p->attn_mult));
	if (bos >= 0)
		set(o, "bos_token_id", json_integer(bos));
	set(o, "embedding_multiplier", json_real(p->embed_mult));
	if (eos >= 0)
		set(o, "eos_token_id", json_integer(eos));
	set(o, "hidden_act", json_string("silu"));
	set(o, "hidden_size", json_integer(p->hidden));
	set(o, "init_method", json_string("mup"));
	set(o, "initializer_range", json_real(0.1));
	set(o, "intermediate_size", json_integer(p->intermediate));
	for (int l = 0; l < p->n_layers; l++)
		json_array_append_new(lt, json_string(p->pattern[l] == '*' ? "attention" : "mamba"));
	set(o, "layer_types", lt);
	set(o, "logits_scaling", json_real(p->logits_scaling));
	set(o, "mamba_chunk_size", json_integer(256));
	set(o, "mamba_conv_bias", json_true());
	set(o, "mamba_d_conv", json_integer(p->conv_kernel));
	set(o, "mamba_d_head", json_integer(p->ssm_head_dim));
	set(o, "mamba_d_state", json_integer(p->ssm_state));
	set(o, "mamba_expand", json_integer(p->ssm_heads * p->ssm_head_dim / p->hidden));
	set(o, "mamba_n_groups", json_integer(p->ssm_groups));
	set(o, "mamba_n_heads", json_integer(p->ssm_heads));
	set(o, "mamba_proj_bias", json_false());
	set(o, "max_position_embeddings", json_integer(p->max_positions));
	set(o, "model_type", json_string("granitemoehybrid"));
	set(o, "normalization_function", json_string("rmsnorm"));
	set(o, "num_attention_heads", json_integer(p->n_heads));
	set(o, "num_experts_per_tok", json_integer(p->n_experts ? p->n_experts_per_tok : 0));
	set(o, "num_hidden_layers", json_integer(p->n_layers));
	set(o, "num_key_value_heads", json_integer(p->n_kv_heads));
	set(o, "num_local_experts", json_integer(p->n_experts));
	set(o, "output_router_logits", json_false());
	set(o, "position_embedding_type", json_string("nope"));
	set(o, "residual_multiplier", json_real(p->residual_mult));
	set(o, "rms_norm_eps", json_real(p->rms_eps));
	set(o, "rope_scaling", json_null());
	set(o, "rope_theta", json_integer((json_int_t)p->rope_theta));
	set(o, "router_aux_loss_coef", json_real(0.0));
	set(o, "shared_intermediate_size", json_integer(p->shared_intermediate));
	set(o, "tie_word_embeddings", json_boolean(p->tie_embeddings));
	set(o, "torch_dtype", json_string(dtype_torch(dtype)));
	set(o, "transformers_version", json_string("4.56.0"));
	set(o, "use_cache", json_true());
	set(o, "vocab_size", json_integer(vocab));
}

/* "time_step_limit": [0.0, Infinity] is what Python's json writes for the
 * released configs; jansson cannot, so a marker string is replaced in the
 * text afterwards (the reader takes the bare literal back). */
#define INF_MARK "\"@kvkeep-infinity@\""

static void nemotron(json_t *o, const struct kv_synth_preset *p, int vocab, int bos, int eos, int dtype)
{
	json_t *a = json_array(), *tl = json_array();
	json_array_append_new(a, json_string("NemotronHForCausalLM"));
	set(o, "architectures", a);
	set(o, "attention_bias", json_false());
	set(o, "attention_dropout", json_real(0.0));
	if (bos >= 0)
		set(o, "bos_token_id", json_integer(bos));
	set(o, "chunk_size", json_integer(128));
	set(o, "conv_kernel", json_integer(p->conv_kernel));
	if (eos >= 0)
		set(o, "eos_token_id", json_integer(eos));
	set(o, "expand", json_integer(2));
	set(o, "head_dim", json_integer(p->head_dim));
	set(o, "hidden_dropout", json_real(0.0));
	set(o, "hidden_size", json_integer(p->hidden));
	set(o, "hybrid_override_pattern", json_string(p->pattern));
	set(o, "initializer_range", json_real(0.02));
	set(o, "intermediate_size", json_integer(p->intermediate));
	set(o, "layer_norm_epsilon", json_real(p->rms_eps));
	set(o, "mamba_head_dim", json_integer(p->ssm_head_dim));
	set(o, "mamba_hidden_act", json_string("silu"));
	set(o, "mamba_num_heads", json_integer(p->ssm_heads));
	set(o, "mamba_proj_bias", json_false());
	set(o, "max_position_embeddings", json_integer(p->max_positions));
	set(o, "mlp_bias", json_false());
	set(o, "mlp_hidden_act", json_string("relu2"));
	set(o, "model_type", json_string("nemotron_h"));
	set(o, "n_groups", json_integer(p->ssm_groups));
	set(o, "num_attention_heads", json_integer(p->n_heads));
	set(o, "num_hidden_layers", json_integer(p->n_layers));
	set(o, "num_key_value_heads", json_integer(p->n_kv_heads));
	set(o, "num_logits_to_keep", json_integer(1));
	set(o, "rescale_prenorm_residual", json_true());
	set(o, "residual_in_fp32", json_false());
	set(o, "ssm_state_size", json_integer(p->ssm_state));
	set(o, "tie_word_embeddings", json_boolean(p->tie_embeddings));
	set(o, "time_step_floor", json_real(1e-4));
	json_array_append_new(tl, json_real(0.0));
	json_array_append_new(tl, json_string("@kvkeep-infinity@"));
	set(o, "time_step_limit", tl);
	set(o, "time_step_max", json_real(0.1));
	set(o, "time_step_min", json_real(0.001));
	set(o, "torch_dtype", json_string(dtype_torch(dtype)));
	set(o, "transformers_version", json_string("4.56.0"));
	set(o, "use_bias", json_false());
	set(o, "use_cache", json_true());
	set(o, "use_conv_bias", json_true());
	set(o, "vocab_size", json_integer(vocab));
}

int kv_synth_ssm_config_json(const struct kv_synth_preset *p, int vocab, int bos, int eos, int dtype, char **out,
			     size_t *len)
{
	json_t *root = json_object();
	char *s, *m;
	*out = NULL;
	if (len)
		*len = 0;
	if (!root)
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	if (!p->pattern || strlen(p->pattern) != (size_t)p->n_layers) {
		json_decref(root);
		return kv_fail(KV_ERR_INVALID, "preset '%s': its layer pattern does not have %d layers", p->name,
			       p->n_layers);
	}
	if (p->arch == KV_ARCH_GRANITE_HYBRID)
		granite(root, p, vocab, bos, eos, dtype);
	else
		nemotron(root, p, vocab, bos, eos, dtype);
	s = json_dumps(root, JSON_INDENT(2) | JSON_REAL_PRECISION(10));
	json_decref(root);
	if (!s)
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	if ((m = strstr(s, INF_MARK))) {
		size_t ml = strlen(INF_MARK), il = strlen("Infinity");
		memcpy(m, "Infinity", il);
		memmove(m + il, m + ml, strlen(m + ml) + 1);
	}
	*out = s;
	if (len)
		*len = strlen(s);
	return KV_OK;
}
