/*
 * gguf_ssm.c - see gguf_ssm.h. The keys are those llama.cpp's converter
 * writes (docs/gguf.md "Mamba-2 hybrids"): the layer pattern comes from
 * the per-layer arrays (attention.head_count_kv 0 on a Mamba layer;
 * nemotron_h: feed_forward_length non-zero on an MLP layer), the mixer
 * from ssm.*, Granite's multipliers from embedding_scale, residual_scale,
 * attention.scale and logit_scale. The config is built as config.json
 * text and parsed by the one parser (config_ssm.c), so a GGUF gets the
 * same checks as a folder.
 */
#include "model/gguf_ssm.h"
#include "base/corrupt.h"
#include "base/err.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int kv_gguf_is_ssm_arch(const char *arch)
{
	return arch && (!strcmp(arch, "granitehybrid") || !strcmp(arch, "nemotron_h"));
}

/* <arch>.<key>: a scalar, or element l of a per-layer array (l < 0: the
 * array's largest element). *v untouched and KV_ERR_NOT_FOUND if absent. */
static int key_int(const struct kv_gguf *g, const char *arch, const char *key, int l, int64_t *v)
{
	char k[128];
	snprintf(k, sizeof k, "%s.%s", arch, key);
	const struct kv_gguf_kv *kv = kv_gguf_kv_find(g, k);
	if (!kv)
		return KV_ERR_NOT_FOUND;
	if (kv->type == KV_GGUF_ARR) {
		int64_t best = 0, x;
		if (kv->arr_type == KV_GGUF_STR || kv->arr_type == KV_GGUF_F32 || kv->arr_type == KV_GGUF_F64 || !kv->n)
			return KV_CORRUPT(kv_gguf_path(g), 0, "%s is not an integer array", k);
		if (l >= 0) {
			if ((uint64_t)l >= kv->n)
				return KV_CORRUPT(kv_gguf_path(g), 0, "%s has %llu entries, layer %d asked", k,
						  (unsigned long long)kv->n, l);
			return kv_gguf_arr_int(kv, (uint64_t)l, v);
		}
		for (uint64_t i = 0; i < kv->n; i++)
			if (kv_gguf_arr_int(kv, i, &x) == KV_OK && x > best)
				best = x;
		*v = best;
		return KV_OK;
	}
	return kv_gguf_get_int(g, k, v);
}

static int need_int(const struct kv_gguf *g, const char *arch, const char *key, int64_t *v)
{
	int rc = key_int(g, arch, key, -1, v);
	if (rc == KV_ERR_NOT_FOUND)
		return KV_CORRUPT(kv_gguf_path(g), 0, "%s.%s is missing", arch, key);
	return rc;
}

static double key_float(const struct kv_gguf *g, const char *arch, const char *key, double def)
{
	char k[128];
	double f;
	snprintf(k, sizeof k, "%s.%s", arch, key);
	if (kv_gguf_get_float(g, k, &f) == KV_OK)
		return f;
	kv_errclear();
	return def;
}

int kv_gguf_config_ssm(const struct kv_gguf *g, const char *arch, struct kv_model_config *out)
{
	int granite = !strcmp(arch, "granitehybrid"), rc;
	int64_t L, D, heads, kv, ffn = 0, inner, H, N, G, K, hd = 0, E = 0, k = 0, Is = 0, v;
	json_t *o = json_object(), *lt = json_array();
	char *pat = NULL, *txt = NULL;
	if (!o || !lt) {
		rc = kv_fail(KV_ERR_NOMEM, "out of memory");
		goto out;
	}
	if ((rc = need_int(g, arch, "block_count", &L)) || (rc = need_int(g, arch, "embedding_length", &D)) ||
	    (rc = need_int(g, arch, "attention.head_count", &heads)) ||
	    (rc = need_int(g, arch, "attention.head_count_kv", &kv)) ||
	    (rc = need_int(g, arch, "ssm.inner_size", &inner)) || (rc = need_int(g, arch, "ssm.time_step_rank", &H)) ||
	    (rc = need_int(g, arch, "ssm.state_size", &N)) || (rc = need_int(g, arch, "ssm.group_count", &G)) ||
	    (rc = need_int(g, arch, "ssm.conv_kernel", &K)))
		goto out;
	key_int(g, arch, "feed_forward_length", -1, &ffn);
	key_int(g, arch, "attention.key_length", -1, &hd);
	key_int(g, arch, "expert_count", -1, &E);
	key_int(g, arch, "expert_used_count", -1, &k);
	key_int(g, arch, "expert_shared_feed_forward_length", -1, &Is);
	kv_errclear();
	if (L <= 0 || L > KV_MAX_LAYERS || H <= 0 || inner % H || D <= 0) {
		rc = KV_CORRUPT(kv_gguf_path(g), 0, "block_count %lld, ssm.inner_size %lld, ssm.time_step_rank %lld do not "
				"make a Mamba-2 model", (long long)L, (long long)inner, (long long)H);
		goto out;
	}
	if (!(pat = calloc((size_t)L + 1, 1))) {
		rc = kv_fail(KV_ERR_NOMEM, "out of memory");
		goto out;
	}
	for (int l = 0; l < L; l++) {
		int64_t kvl = 0, ffl = 0;
		if ((rc = key_int(g, arch, "attention.head_count_kv", l, &kvl)) && rc != KV_ERR_NOT_FOUND)
			goto out;
		/* a scalar head_count_kv names no Mamba layer */
		char kk[128];
		snprintf(kk, sizeof kk, "%s.attention.head_count_kv", arch);
		const struct kv_gguf_kv *a = kv_gguf_kv_find(g, kk);
		if (a && a->type != KV_GGUF_ARR)
			kvl = kv;
		if (!granite) {
			snprintf(kk, sizeof kk, "%s.feed_forward_length", arch);
			a = kv_gguf_kv_find(g, kk);
			if (a && a->type == KV_GGUF_ARR && (rc = key_int(g, arch, "feed_forward_length", l, &ffl)))
				goto out;
		}
		kv_errclear();
		rc = KV_OK;
		pat[l] = kvl > 0 ? '*' : ffl > 0 ? '-' : 'M';
		if (granite)
			json_array_append_new(lt, json_string(kvl > 0 ? "attention" : "mamba"));
	}
	json_object_set_new(o, "vocab_size", json_integer(0)); /* set below from token_embd */
	json_object_set_new(o, "hidden_size", json_integer(D));
	json_object_set_new(o, "num_hidden_layers", json_integer(L));
	json_object_set_new(o, "num_attention_heads", json_integer(heads));
	json_object_set_new(o, "num_key_value_heads", json_integer(kv > 0 ? kv : heads));
	json_object_set_new(o, "max_position_embeddings", json_integer(131072));
	const struct kv_tensor *emb = kv_gguf_tensor_find(g, "token_embd.weight");
	if (!emb || emb->ndim != 2) {
		rc = kv_fail(KV_ERR_INCOMPATIBLE, "%s: no 2-D token_embd.weight", kv_gguf_path(g));
		goto out;
	}
	json_object_set_new(o, "vocab_size", json_integer(emb->shape[0]));
	json_object_set_new(o, "tie_word_embeddings", json_boolean(!kv_gguf_tensor_find(g, "output.weight")));
	if (kv_gguf_get_int(g, "tokenizer.ggml.eos_token_id", &v) == KV_OK)
		json_object_set_new(o, "eos_token_id", json_integer(v));
	if (kv_gguf_get_int(g, "tokenizer.ggml.bos_token_id", &v) == KV_OK)
		json_object_set_new(o, "bos_token_id", json_integer(v));
	kv_errclear();
	{
		/* the conv bias is optional in llama.cpp: present on the first Mamba layer or not */
		char n[64];
		int first = (int)(strchr(pat, 'M') ? strchr(pat, 'M') - pat : 0);
		snprintf(n, sizeof n, "blk.%d.ssm_conv1d.bias", first);
		json_object_set_new(o, granite ? "mamba_conv_bias" : "use_conv_bias",
				    json_boolean(kv_gguf_tensor_find(g, n) != NULL));
	}
	double eps = key_float(g, arch, "attention.layer_norm_rms_epsilon", key_float(g, arch,
				"attention.layer_norm_epsilon", 1e-5));
	if (granite) {
		int fin = 1;
		char kk[128];
		snprintf(kk, sizeof kk, "%s.rope.scaling.finetuned", arch);
		if (kv_gguf_get_bool(g, kk, &fin) != KV_OK)
			fin = 1; /* llama.cpp's default: RoPE on */
		kv_errclear();
		json_object_set_new(o, "model_type", json_string("granitemoehybrid"));
		json_object_set_new(o, "layer_types", lt);
		lt = NULL;
		json_object_set_new(o, "rms_norm_eps", json_real(eps));
		json_object_set_new(o, "intermediate_size", json_integer(ffn > 0 ? ffn : 1));
		json_object_set_new(o, "mamba_n_heads", json_integer(H));
		json_object_set_new(o, "mamba_d_head", json_integer(inner / H));
		if (inner % D) {
			rc = kv_fail(KV_ERR_UNSUPPORTED, "%s: ssm.inner_size %lld is not a multiple of the width %lld",
				     kv_gguf_path(g), (long long)inner, (long long)D);
			goto out;
		}
		json_object_set_new(o, "mamba_expand", json_integer(inner / D));
		json_object_set_new(o, "mamba_d_state", json_integer(N));
		json_object_set_new(o, "mamba_n_groups", json_integer(G));
		json_object_set_new(o, "mamba_d_conv", json_integer(K));
		json_object_set_new(o, "num_local_experts", json_integer(E));
		json_object_set_new(o, "num_experts_per_tok", json_integer(k));
		json_object_set_new(o, "shared_intermediate_size", json_integer(E > 0 ? (Is > 0 ? Is : ffn) : ffn));
		json_object_set_new(o, "embedding_multiplier", json_real(key_float(g, arch, "embedding_scale", 1.0)));
		json_object_set_new(o, "residual_multiplier", json_real(key_float(g, arch, "residual_scale", 1.0)));
		double ls = key_float(g, arch, "logit_scale", 0.0), as = key_float(g, arch, "attention.scale", 0.0);
		json_object_set_new(o, "logits_scaling", json_real(ls != 0.0 ? ls : 1.0));
		/* llama.cpp: attention.scale 0 means head_dim^-0.5 */
		json_object_set_new(o, "attention_multiplier",
				    json_real(as != 0.0 ? as : 1.0 / sqrt((double)D / (double)(heads ? heads : 1))));
		json_object_set_new(o, "position_embedding_type", json_string(fin ? "rope" : "nope"));
	} else {
		int64_t ff = 0;
		for (int l = 0; l < L; l++)
			if (pat[l] == '-' && key_int(g, arch, "feed_forward_length", l, &v) == KV_OK && v > ff)
				ff = v;
		kv_errclear();
		json_object_set_new(o, "model_type", json_string("nemotron_h"));
		json_object_set_new(o, "hybrid_override_pattern", json_string(pat));
		json_object_set_new(o, "layer_norm_epsilon", json_real(eps));
		json_object_set_new(o, "intermediate_size", json_integer(ff > 0 ? ff : 1));
		json_object_set_new(o, "head_dim", json_integer(hd > 0 ? hd : D / (heads ? heads : 1)));
		json_object_set_new(o, "mamba_num_heads", json_integer(H));
		json_object_set_new(o, "mamba_head_dim", json_integer(inner / H));
		json_object_set_new(o, "ssm_state_size", json_integer(N));
		json_object_set_new(o, "n_groups", json_integer(G));
		json_object_set_new(o, "conv_kernel", json_integer(K));
	}
	if (!(txt = json_dumps(o, JSON_COMPACT))) {
		rc = kv_fail(KV_ERR_NOMEM, "out of memory");
		goto out;
	}
	if ((rc = kv_config_parse(txt, strlen(txt), kv_gguf_path(g), out)))
		goto out;
	snprintf(out->torch_dtype, sizeof out->torch_dtype, "gguf");
	out->gguf = 1;
	out->a_is_neg_exp = 1; /* ssm_a holds -exp(A_log) */
	/* llama.cpp normalises the gated output per group (ssm_norm [G][W / G]) */
	out->ssm_norm_groups = out->ssm_groups;
	if (out->n_moe_layers) { /* the names gguf_model.c gives the stacks and the shared expert */
		out->expert_layout = KV_EXPERTS_SWITCH;
		out->shared_split = 1;
	} else if (granite) {
		out->expert_layout = KV_EXPERTS_SPLIT; /* ffn_{gate,up,down} as mlp.* */
	}
out:
	free(pat);
	free(txt);
	json_decref(lt);
	json_decref(o);
	return rc;
}
