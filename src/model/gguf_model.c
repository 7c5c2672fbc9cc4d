/*
 * gguf_model.c - see gguf_model.h: a GGUF file read as the Hugging Face
 * model it was converted from (its config, its tensors under HF names,
 * its tokenizer as tokenizer.json text), through the one name table of
 * model/gguf_map.c that the converter uses too.
 */
#include "model/gguf_model.h"
#include "model/gguf_map.h"
#include "model/gguf_ssm.h"
#include "model/quant.h"
#include "base/corrupt.h"
#include "base/err.h"
#include "base/io.h"
#include "base/json.h"
#include "base/mem.h"
#include "base/pool.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* --- loading ------------------------------------------------------------------- */

/* <arch>.<key> as an integer; a per-layer array (hybrid GGUFs may write
 * head counts per layer, 0 on recurrent layers) gives its largest value. */
static int get_u(const struct kv_gguf *g, const char *arch, const char *key, int64_t *v)
{
	char k[128];
	snprintf(k, sizeof k, "%s.%s", arch, key);
	const struct kv_gguf_kv *kv = kv_gguf_kv_find(g, k);
	if (kv && kv->type == KV_GGUF_ARR && kv->n > 0 && kv->arr_type != KV_GGUF_STR && kv->arr_type != KV_GGUF_F32 &&
	    kv->arr_type != KV_GGUF_F64) {
		int64_t best = 0, x;
		for (uint64_t i = 0; i < kv->n; i++)
			if (kv_gguf_arr_int(kv, i, &x) == KV_OK && x > best)
				best = x;
		*v = best;
		return KV_OK;
	}
	return kv_gguf_get_int(g, k, v);
}

/* Every MoE layer's tensors present with llama.cpp's shapes (row-major
 * here, ggml's ne reversed), so a broken file fails naming the GGUF
 * tensor rather than the Hugging Face name the engine looks up. */
static int check_moe(const struct kv_gguf *g, const struct kv_model_config *c)
{
	const int64_t E = c->n_experts, I = c->moe_intermediate, Is = c->shared_intermediate, D = c->hidden;
	for (int l = 0; l < c->n_layers; l++) {
		if (!c->layer_moe[l])
			continue;
		char n[96];
		snprintf(n, sizeof n, "blk.%d.ffn_gate_up_exps.weight", l);
		int fused = kv_gguf_tensor_find(g, n) != NULL;
		const struct {
			const char *name;
			int ndim;
			int64_t s0, s1, s2;
		} want[] = {
			{"ffn_gate_inp.weight", 2, E, D, 0},
			{fused ? "ffn_gate_up_exps.weight" : "ffn_gate_exps.weight", 3, E, fused ? 2 * I : I, D},
			{fused ? NULL : "ffn_up_exps.weight", 3, E, I, D},
			{"ffn_down_exps.weight", 3, E, D, I},
			{"ffn_gate_shexp.weight", 2, Is, D, 0},
			{"ffn_up_shexp.weight", 2, Is, D, 0},
			{"ffn_down_shexp.weight", 2, D, Is, 0},
			{"ffn_gate_inp_shexp.weight", 1, D, 0, 0},
		};
		for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
			if (!want[i].name)
				continue;
			int64_t ws[3] = {want[i].s0, want[i].s1, want[i].s2};
			char a[96], b[96];
			snprintf(n, sizeof n, "blk.%d.%s", l, want[i].name);
			const struct kv_tensor *t = kv_gguf_tensor_find(g, n);
			if (!t)
				return kv_fail(KV_ERR_INCOMPATIBLE, "%s: GGUF lacks expert tensor '%s' (expected shape %s)",
					       kv_gguf_path(g), n, kv_shape_str(want[i].ndim, ws, a, sizeof a));
			int ok = t->ndim == want[i].ndim;
			for (int d = 0; ok && d < t->ndim; d++)
				ok = t->shape[d] == ws[d];
			if (want[i].ndim == 1 && t->ndim == 2 && t->shape[0] == 1 && t->shape[1] == ws[0])
				ok = 1; /* ffn_gate_inp_shexp written as {n_embd, 1}: the same values */
			if (!ok)
				return kv_fail(KV_ERR_INCOMPATIBLE, "%s: expert tensor '%s' has shape %s, expected %s",
					       kv_gguf_path(g), n, kv_shape_str(t->ndim, t->shape, b, sizeof b),
					       kv_shape_str(want[i].ndim, ws, a, sizeof a));
		}
	}
	return KV_OK;
}

/*
 * llama, gemma3 and gpt-oss files: the keys llama.cpp's loaders read, as
 * the config.json fields kv_config_parse reads (docs/gguf.md). Where
 * llama.cpp decides something the file does not say, kvkeep decides it the
 * same way: gemma3's softmax scale (head_dim^-0.5, or (hidden / heads)^-0.5
 * for the 62-layer 27B), the sliding pattern when absent (every 6th layer
 * global for gemma3, every 2nd for gpt-oss), the sliding layers' RoPE base
 * (10000 unless rope.freq_base_swa), YaRN's correction range always
 * rounded (ggml_rope_yarn_corr_dims floors and ceils).
 */
/* An int metadata value, or def when absent. */
static int64_t meta_int(const struct kv_gguf *g, const char *arch, const char *key, int64_t def)
{
	char k[128];
	int64_t v;
	snprintf(k, sizeof k, "%s.%s", arch, key);
	if (kv_gguf_get_int(g, k, &v) != KV_OK) {
		kv_errclear();
		return def;
	}
	return v;
}

/*
 * gemma4 (llama.cpp's gemma4 loader): key_length is the global layers'
 * head size and key_length_swa the sliding layers', head_count_kv a
 * per-layer array (one value per layer type), rope_freqs the global
 * layers' "proportional" RoPE (factor 1 for the frequencies that rotate,
 * 1e30 for the ones that do not: any other factor is refused),
 * attention_k_eq_v when a global layer has no attn_v. The features kvkeep
 * does not run are refused by name in kv_config_parse.
 */
static int gemma4_json(const struct kv_gguf *g, const char *arch, json_t *o)
{
	const char *path = kv_gguf_path(g);
	int64_t L = json_integer_value(json_object_get(o, "num_hidden_layers"));
	int64_t ghd = json_integer_value(json_object_get(o, "head_dim"));
	int64_t shd = meta_int(g, arch, "attention.key_length_swa", ghd);
	int64_t kvs = -1, kvg = -1, v;
	char k[128];
	double f;
	json_t *lt = json_object_get(o, "layer_types"), *rp, *fa, *sa;
	snprintf(k, sizeof k, "%s.attention.head_count_kv", arch);
	const struct kv_gguf_kv *hk = kv_gguf_kv_find(g, k);
	if (!hk)
		return kv_fail(KV_ERR_INCOMPATIBLE, "%s: gemma4 lacks %s", path, k);
	for (int64_t l = 0; l < L; l++) {
		int sw = !strcmp(json_string_value(json_array_get(lt, (size_t)l)), "sliding_attention");
		if (hk->type == KV_GGUF_ARR) {
			if ((int64_t)hk->n != L || kv_gguf_arr_int(hk, (uint64_t)l, &v))
				return kv_fail(KV_ERR_INCOMPATIBLE, "%s: %s must have one entry per layer", path, k);
		} else if (kv_gguf_get_int(g, k, &v))
			return kv_fail_ctx(KV_ERR_INCOMPATIBLE, "%s: %s", path, k);
		int64_t *dst = sw ? &kvs : &kvg;
		if (v < 1 || (*dst >= 0 && *dst != v))
			return kv_fail(KV_ERR_UNSUPPORTED, "%s: %s: layer %lld has %lld KV heads; kvkeep runs one count "
				       "for the sliding layers and one for the global ones", path, k, (long long)l,
				       (long long)v);
		*dst = v;
	}
	if (kvs < 0)
		kvs = kvg;
	if (kvg < 0)
		kvg = kvs;
	json_object_set_new(o, "head_dim", json_integer(shd));
	json_object_set_new(o, "global_head_dim", json_integer(ghd));
	json_object_set_new(o, "num_key_value_heads", json_integer(kvs));
	json_object_set_new(o, "num_global_key_value_heads", json_integer(kvg));
	json_object_set_new(o, "num_kv_shared_layers", json_integer(meta_int(g, arch, "attention.shared_kv_layers", 0)));
	json_object_set_new(o, "hidden_size_per_layer_input",
			    json_integer(meta_int(g, arch, "embedding_length_per_layer_input", 0)));
	int64_t ne = meta_int(g, arch, "expert_count", 0);
	json_object_set_new(o, "enable_moe_block", json_boolean(ne > 0));
	if (ne > 0) {
		int64_t k = meta_int(g, arch, "expert_used_count", 0), ie = meta_int(g, arch, "expert_feed_forward_length", 0);
		if (k < 1 || ie < 1)
			return kv_fail(KV_ERR_INCOMPATIBLE, "%s: gemma4 with %lld experts lacks expert_used_count or "
				       "expert_feed_forward_length", path, (long long)ne);
		json_object_set_new(o, "num_experts", json_integer(ne));
		json_object_set_new(o, "top_k_experts", json_integer(k));
		json_object_set_new(o, "moe_intermediate_size", json_integer(ie));
	}
	if (meta_int(g, arch, "rope.dimension_count_swa", shd) != shd || meta_int(g, arch, "rope.dimension_count", ghd) != ghd)
		return kv_fail(KV_ERR_UNSUPPORTED, "%s: gemma4 rope.dimension_count(_swa) other than the head sizes "
			       "is not supported", path);
	/* the global layers' rotated share from rope_freqs */
	int64_t half = ghd / 2, rot = half;
	const struct kv_tensor *rf = kv_gguf_tensor_find(g, "rope_freqs.weight");
	if (rf) {
		float *ff = malloc((size_t)half * sizeof *ff);
		if (!ff)
			return kv_fail(KV_ERR_NOMEM, "out of memory");
		int rc = rf->numel == (uint64_t)half ? kv_tensor_to_f32(rf, ff, 0, (uint64_t)half) : KV_ERR_INCOMPATIBLE;
		rot = 0;
		while (!rc && rot < half && ff[rot] == 1.0f)
			rot++;
		for (int64_t i = rot; !rc && i < half; i++)
			if (!(ff[i] >= 1e20f))
				rc = KV_ERR_UNSUPPORTED;
		free(ff);
		if (rc || rot < 1)
			return kv_fail(KV_ERR_UNSUPPORTED, "%s: gemma4 rope_freqs.weight must be %lld factors, 1 for the "
				       "rotated frequencies then 1e30 (proportional RoPE)", path, (long long)half);
	}
	rp = json_object();
	fa = json_object();
	sa = json_object();
	json_object_set_new(fa, "partial_rotary_factor", json_real((double)(2 * rot) / (double)ghd));
	json_t *th = json_object_get(o, "rope_theta");
	json_object_set_new(fa, "rope_theta", json_real(th ? json_number_value(th) : 1000000.0));
	json_object_set_new(fa, "rope_type", json_string("proportional"));
	snprintf(k, sizeof k, "%s.rope.freq_base_swa", arch);
	json_object_set_new(sa, "rope_theta", json_real(kv_gguf_get_float(g, k, &f) ? 10000.0 : f));
	json_object_set_new(sa, "rope_type", json_string("default"));
	json_object_set_new(rp, "full_attention", fa);
	json_object_set_new(rp, "sliding_attention", sa);
	json_object_set_new(o, "rope_parameters", rp);
	snprintf(k, sizeof k, "%s.final_logit_softcapping", arch);
	if (!kv_gguf_get_float(g, k, &f) && f > 0)
		json_object_set_new(o, "final_logit_softcapping", json_real(f));
	json_object_set_new(o, "hidden_activation", json_string("gelu_pytorch_tanh"));
	/* the MLP width: one value, or a per-layer array where the KV-shared
	 * layers may be twice as wide (use_double_wide_mlp) */
	int64_t nsh = meta_int(g, arch, "attention.shared_kv_layers", 0), ff = -1, dw = -1;
	snprintf(k, sizeof k, "%s.feed_forward_length", arch);
	const struct kv_gguf_kv *fk = kv_gguf_kv_find(g, k);
	if (!fk)
		return kv_fail(KV_ERR_INCOMPATIBLE, "%s: gemma4 lacks %s", path, k);
	for (int64_t l = 0; l < L; l++) {
		if (fk->type == KV_GGUF_ARR) {
			if ((int64_t)fk->n != L || kv_gguf_arr_int(fk, (uint64_t)l, &v))
				return kv_fail(KV_ERR_INCOMPATIBLE, "%s: %s must have one entry per layer", path, k);
		} else if (kv_gguf_get_int(g, k, &v))
			return kv_fail_ctx(KV_ERR_INCOMPATIBLE, "%s: %s", path, k);
		if (ff < 0)
			ff = v;
		int shared = l >= L - nsh, ok = v == ff;
		if (shared) { /* all as wide as the others, or all twice as wide */
			if (dw < 0)
				dw = v == 2 * ff && ff > 0;
			ok = v == (dw ? 2 * ff : ff);
		}
		if (!ok || v < 1)
			return kv_fail(KV_ERR_UNSUPPORTED, "%s: %s: layer %lld is %lld wide; kvkeep runs one width, or twice "
				       "it on every KV-shared layer (use_double_wide_mlp)", path, k, (long long)l, (long long)v);
	}
	dw = dw > 0;
	json_object_set_new(o, "intermediate_size", json_integer(ff));
	json_object_set_new(o, "use_double_wide_mlp", json_boolean(dw));
	/* attention_k_eq_v: the global layers (with KV of their own) have no attn_v */
	int keqv = -1;
	for (int64_t l = 0; l < L - nsh; l++) {
		if (!strcmp(json_string_value(json_array_get(lt, (size_t)l)), "sliding_attention"))
			continue;
		snprintf(k, sizeof k, "blk.%lld.attn_v.weight", (long long)l);
		int has = kv_gguf_tensor_find(g, k) != NULL;
		if (keqv >= 0 && keqv != !has)
			return kv_fail(KV_ERR_UNSUPPORTED, "%s: gemma4: some global layers have attn_v and some do not", path);
		keqv = !has;
	}
	json_object_set_new(o, "attention_k_eq_v", json_boolean(keqv > 0));
	kv_errclear();
	return KV_OK;
}

static int window_family_json(const struct kv_gguf *g, const char *arch, json_t *o)
{
	int gemma = !strcmp(arch, "gemma3"), oss = !strcmp(arch, "gpt-oss"), g4 = !strcmp(arch, "gemma4");
	int64_t L = json_integer_value(json_object_get(o, "num_hidden_layers")), v;
	double f;
	char k[128];
	json_object_set_new(o, "model_type", json_string(gemma ? "gemma3_text" : oss ? "gpt_oss" : g4 ? "gemma4_text" : "llama"));
	if (gemma || oss || g4) {
		snprintf(k, sizeof k, "%s.attention.sliding_window", arch);
		if (kv_gguf_get_int(g, k, &v) || v < 1)
			return kv_fail(KV_ERR_INCOMPATIBLE, "%s: %s lacks %s", kv_gguf_path(g), arch, k);
		json_object_set_new(o, "sliding_window", json_integer(v));
		/* the pattern: an array of per-layer flags, a period, or the default */
		snprintf(k, sizeof k, "%s.attention.sliding_window_pattern", arch);
		const struct kv_gguf_kv *pk = kv_gguf_kv_find(g, k);
		int64_t per = gemma || g4 ? 6 : 2;
		json_t *lt = json_array();
		if (pk && pk->type == KV_GGUF_ARR && (int64_t)pk->n != L)
			return kv_fail(KV_ERR_INCOMPATIBLE, "%s: %s has %llu entries for %lld layers", kv_gguf_path(g), k,
				       (unsigned long long)pk->n, (long long)L);
		if (pk && pk->type != KV_GGUF_ARR && (kv_gguf_get_int(g, k, &per) || per < 1))
			return kv_fail(KV_ERR_INCOMPATIBLE, "%s: %s is not a layer period", kv_gguf_path(g), k);
		for (int64_t l = 0; l < L; l++) {
			int64_t s = 0;
			if (pk && pk->type == KV_GGUF_ARR)
				kv_gguf_arr_int(pk, (uint64_t)l, &s);
			else
				s = l % per < per - 1; /* llama.cpp's set_swa_pattern */
			json_array_append_new(lt, json_string(s ? "sliding_attention" : "full_attention"));
		}
		json_object_set_new(o, "layer_types", lt);
	}
	snprintf(k, sizeof k, "%s.rope.scaling.type", arch);
	char *st = NULL;
	double factor = 0;
	snprintf(k, sizeof k, "%s.rope.scaling.factor", arch);
	kv_gguf_get_float(g, k, &factor);
	snprintf(k, sizeof k, "%s.rope.scaling.type", arch);
	kv_gguf_get_str(g, k, &st);
	kv_errclear();
	if (st && strcmp(st, "none") && factor > 0 && factor != 1.0) {
		json_t *rs = json_object();
		json_object_set_new(rs, "rope_type", json_string(st));
		json_object_set_new(rs, "factor", json_real(factor));
		if (!strcmp(st, "yarn")) {
			snprintf(k, sizeof k, "%s.rope.scaling.original_context_length", arch);
			if (!kv_gguf_get_int(g, k, &v))
				json_object_set_new(rs, "original_max_position_embeddings", json_integer(v));
			snprintf(k, sizeof k, "%s.rope.scaling.yarn_beta_fast", arch);
			if (!kv_gguf_get_float(g, k, &f))
				json_object_set_new(rs, "beta_fast", json_real(f));
			snprintf(k, sizeof k, "%s.rope.scaling.yarn_beta_slow", arch);
			if (!kv_gguf_get_float(g, k, &f))
				json_object_set_new(rs, "beta_slow", json_real(f));
			json_object_set_new(rs, "truncate", json_true());
		}
		json_object_set_new(o, "rope_scaling", rs);
	}
	free(st);
	kv_errclear();
	if (gemma) {
		int64_t hd = json_integer_value(json_object_get(o, "head_dim")),
			D = json_integer_value(json_object_get(o, "hidden_size")),
			H = json_integer_value(json_object_get(o, "num_attention_heads"));
		json_object_set_new(o, "query_pre_attn_scalar", json_integer(L == 62 && H ? D / H : hd));
		snprintf(k, sizeof k, "%s.rope.freq_base_swa", arch);
		json_object_set_new(o, "rope_local_base_freq", json_real(kv_gguf_get_float(g, k, &f) ? 10000.0 : f));
		snprintf(k, sizeof k, "%s.final_logit_softcapping", arch);
		if (!kv_gguf_get_float(g, k, &f) && f > 0)
			json_object_set_new(o, "final_logit_softcapping", json_real(f));
		json_object_set_new(o, "hidden_activation", json_string("gelu_pytorch_tanh"));
	}
	if (g4) {
		int rc = gemma4_json(g, arch, o);
		if (rc)
			return rc;
	}
	if (oss) {
		static const char *const ek[3][2] = {{"expert_count", "num_local_experts"},
						     {"expert_used_count", "num_experts_per_tok"},
						     {"expert_feed_forward_length", "intermediate_size"}};
		for (int i = 0; i < 3; i++) {
			snprintf(k, sizeof k, "%s.%s", arch, ek[i][0]);
			if (get_u(g, arch, ek[i][0], &v))
				return kv_fail(KV_ERR_INCOMPATIBLE, "%s: gpt-oss lacks %s", kv_gguf_path(g), k);
			json_object_set_new(o, ek[i][1], json_integer(v));
		}
	}
	kv_errclear();
	return KV_OK;
}

int kv_gguf_config(const struct kv_gguf *g, struct kv_model_config *out)
{
	char *arch = NULL;
	json_t *o = json_object();
	int64_t v;
	double f;
	int rc, hybrid, moe, next;
	memset(out, 0, sizeof *out);
	if (!o)
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	if ((rc = kv_gguf_get_str(g, "general.architecture", &arch)))
		goto out;
	int g4 = !strcmp(arch, "gemma4");
	int win = !strcmp(arch, "llama") || !strcmp(arch, "gemma3") || !strcmp(arch, "gpt-oss") || g4;
	if (kv_gguf_is_ssm_arch(arch)) { /* the Mamba-2 hybrids: gguf_ssm.c */
		rc = kv_gguf_config_ssm(g, arch, out);
		goto out;
	}
	if (strcmp(arch, "qwen3") && strcmp(arch, "qwen35") && strcmp(arch, "qwen35moe") && strcmp(arch, "qwen3next") &&
	    !win) {
		rc = kv_fail(KV_ERR_UNSUPPORTED, "%s: GGUF architecture '%s' (kvkeep runs qwen3, qwen35, qwen35moe, "
			     "qwen3next, llama, gemma3, gpt-oss, granitehybrid and nemotron_h)", kv_gguf_path(g), arch);
		goto out;
	}
	hybrid = strcmp(arch, "qwen3") != 0 && !win;
	moe = !strcmp(arch, "qwen35moe") || !strcmp(arch, "qwen3next");
	next = !strcmp(arch, "qwen3next");
	json_object_set_new(o, "model_type", json_string(next ? "qwen3_next" : moe ? "qwen3_5_moe_text" : hybrid ? "qwen3_5_text" : "qwen3"));
	if (next) {
		/* llama.cpp's qwen3next graph: every layer sparse, top-k renormalised */
		json_object_set_new(o, "norm_topk_prob", json_true());
		json_object_set_new(o, "decoder_sparse_step", json_integer(1));
		json_object_set_new(o, "mlp_only_layers", json_array());
	}
	static const struct {
		const char *gg, *hf;
		int required;
	} ints[] = {
		{"block_count", "num_hidden_layers", 1},
		{"embedding_length", "hidden_size", 1},
		{"feed_forward_length", "intermediate_size", 5},
		{"attention.head_count", "num_attention_heads", 1},
		{"attention.head_count_kv", "num_key_value_heads", 1},
		{"attention.key_length", "head_dim", 0},
		{"context_length", "max_position_embeddings", 0},
		{"full_attention_interval", "full_attention_interval", 0},
		{"ssm.conv_kernel", "linear_conv_kernel_dim", 2},
		{"ssm.state_size", "linear_key_head_dim", 2},
		{"ssm.group_count", "linear_num_key_heads", 2},
		{"ssm.time_step_rank", "linear_num_value_heads", 2},
		{"expert_count", "num_experts", 3},
		{"expert_used_count", "num_experts_per_tok", 3},
		{"expert_feed_forward_length", "moe_intermediate_size", 4},
		{"expert_shared_feed_forward_length", "shared_expert_intermediate_size", 4},
	};
	for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
		if ((ints[i].required == 2 && !hybrid) || (ints[i].required >= 3 && ints[i].required <= 4 && !moe))
			continue;
		if (g4 && (!strcmp(ints[i].gg, "attention.head_count_kv") || !strcmp(ints[i].gg, "feed_forward_length")))
			continue; /* per-layer arrays: gemma4_json */
		rc = get_u(g, arch, ints[i].gg, &v);
		/* a MoE text config may have no dense intermediate_size; the expert
		 * sizes have llama.cpp's fallbacks below */
		/* gpt-oss has no dense feed_forward_length (its experts' size is
		 * expert_feed_forward_length) */
		if (rc == KV_ERR_NOT_FOUND && (!ints[i].required || ints[i].required == 4 ||
						 (ints[i].required == 5 && (moe || !strcmp(arch, "gpt-oss")))))
			continue;
		if (rc)
			goto out;
		json_object_set_new(o, ints[i].hf, json_integer(v));
	}
	kv_errclear();
	if (moe) {
		/* llama.cpp: n_ff_exp = n_ff / n_expert_used and n_ff_shexp = n_ff
		 * when the keys are absent */
		int64_t ff = json_integer_value(json_object_get(o, "intermediate_size")),
			k = json_integer_value(json_object_get(o, "num_experts_per_tok"));
		if (!json_object_get(o, "moe_intermediate_size") && ff > 0 && k > 0)
			json_object_set_new(o, "moe_intermediate_size", json_integer(ff / k));
		if (!json_object_get(o, "shared_expert_intermediate_size") && ff > 0)
			json_object_set_new(o, "shared_expert_intermediate_size", json_integer(ff));
	}
	/* llama.cpp counts multi-token-prediction layers (blk.<n_layers>.nextn.*)
	 * in block_count; the text model has block_count - nextn layers. */
	{
		int64_t nextn = 0, bc = json_integer_value(json_object_get(o, "num_hidden_layers"));
		if (get_u(g, arch, "nextn_predict_layers", &nextn) == KV_OK && nextn > 0 && nextn < bc) {
			json_object_set_new(o, "num_hidden_layers", json_integer(bc - nextn));
			json_object_set_new(o, "mtp_num_hidden_layers", json_integer(nextn));
		}
		kv_errclear();
	}
	if (hybrid) {
		int64_t inner, hv;
		if ((rc = get_u(g, arch, "ssm.inner_size", &inner)) || (rc = get_u(g, arch, "ssm.time_step_rank", &hv)))
			goto out;
		if (hv <= 0 || inner % hv) {
			rc = KV_CORRUPT(kv_gguf_path(g), 0, "ssm.inner_size %lld does not divide into %lld value heads",
					(long long)inner, (long long)hv);
			goto out;
		}
		json_object_set_new(o, "linear_value_head_dim", json_integer(inner / hv));
	}
	{
		char k[128];
		snprintf(k, sizeof k, "%s.rope.freq_base", arch);
		if (kv_gguf_get_float(g, k, &f) == KV_OK)
			json_object_set_new(o, "rope_theta", json_real(f));
		snprintf(k, sizeof k, "%s.attention.layer_norm_rms_epsilon", arch);
		if ((rc = kv_gguf_get_float(g, k, &f)))
			goto out;
		json_object_set_new(o, "rms_norm_eps", json_real(f));
		snprintf(k, sizeof k, "%s.rope.dimension_count", arch);
		int64_t hd = json_integer_value(json_object_get(o, "head_dim"));
		if (!hd) {
			int64_t e = json_integer_value(json_object_get(o, "hidden_size")),
				h = json_integer_value(json_object_get(o, "num_attention_heads"));
			hd = h ? e / h : 0;
			json_object_set_new(o, "head_dim", json_integer(hd));
		}
		if (g4)
			; /* gemma4_json: the rotated share comes from rope_freqs */
		else if (kv_gguf_get_int(g, k, &v) == KV_OK && hd > 0)
			json_object_set_new(o, "partial_rotary_factor", json_real((double)v / (double)hd));
		else if (hybrid)
			json_object_set_new(o, "partial_rotary_factor", json_real(0.25));
		kv_errclear();
	}
	const struct kv_tensor *emb = kv_gguf_tensor_find(g, "token_embd.weight");
	if (!emb || emb->ndim != 2) {
		rc = kv_fail(KV_ERR_INCOMPATIBLE, "%s: no 2-D token_embd.weight", kv_gguf_path(g));
		goto out;
	}
	json_object_set_new(o, "vocab_size", json_integer(emb->shape[0]));
	json_object_set_new(o, "tie_word_embeddings", json_boolean(!kv_gguf_tensor_find(g, "output.weight")));
	if (win && (rc = window_family_json(g, arch, o)))
		goto out;
	if (kv_gguf_get_int(g, "tokenizer.ggml.eos_token_id", &v) == KV_OK)
		json_object_set_new(o, "eos_token_id", json_integer(v));
	if (kv_gguf_get_int(g, "tokenizer.ggml.bos_token_id", &v) == KV_OK)
		json_object_set_new(o, "bos_token_id", json_integer(v));
	kv_errclear();
	{
		char *txt = json_dumps(o, JSON_COMPACT);
		if (!txt) {
			rc = kv_fail(KV_ERR_NOMEM, "out of memory");
			goto out;
		}
		rc = kv_config_parse(txt, strlen(txt), kv_gguf_path(g), out);
		free(txt);
		if (rc)
			goto out;
	}
	snprintf(out->torch_dtype, sizeof out->torch_dtype, "gguf");
	out->gguf = 1;
	if (out->arch == KV_ARCH_GEMMA3)
		out->norm_plus_one = 0; /* llama.cpp's converter stores Gemma's norms with the 1 added */
	if (out->arch == KV_ARCH_LLAMA) {
		out->rope_interleaved = 1; /* q/k rows permuted for llama.cpp's adjacent-pair RoPE */
		out->rope_freqs_tensor = kv_gguf_tensor_find(g, "rope_freqs.weight") != NULL;
	}
	if (out->arch == KV_ARCH_GPT_OSS)
		out->expert_layout = KV_EXPERTS_SWITCH;
	if (hybrid) {
		out->norm_plus_one = 0; /* stored with the 1 added */
		out->a_is_neg_exp = 1;
		out->out_proj_tiled = kv_gguf_out_tiled(g, out);
		out->vrows_tiled = kv_gguf_vperm(out);
	}
	if (next) {
		/* llama.cpp's converter splits in_proj_qkvz into attn_qkv + attn_gate
		 * (loaded as in_proj_qkv / in_proj_z) and kvkeep splits ssm_ba into
		 * in_proj_b / in_proj_a; only old files keep the fused ssm_in */
		out->fused_deltanet = 0;
		for (int l = 0; l < out->n_layers; l++)
			if (out->layer_type[l] == KV_LAYER_DELTANET) {
				char n[64];
				snprintf(n, sizeof n, "blk.%d.ssm_in.weight", l);
				out->fused_deltanet = kv_gguf_tensor_find(g, n) != NULL;
				break;
			}
	}
	if (out->n_moe_layers && out->moe_kind == KV_MOE_QWEN && (rc = check_moe(g, out)))
		goto out;
	if (out->n_moe_layers && out->moe_kind == KV_MOE_QWEN) {
		/* the names kv_gguf_hf_tensors gives the expert stacks */
		char n[64];
		for (int l = 0; l < out->n_layers; l++)
			if (out->layer_moe[l]) {
				snprintf(n, sizeof n, "blk.%d.ffn_gate_up_exps.weight", l);
				out->expert_layout = kv_gguf_tensor_find(g, n) ? KV_EXPERTS_STACKED : KV_EXPERTS_SWITCH;
				break;
			}
	}
out:
	free(arch);
	json_decref(o);
	return rc;
}

/* Bytes of one value head of out_proj's rows, 0 if a block straddles. */
static size_t out_head_bytes(const struct kv_tensor *t, int dv)
{
	int qk = kv_dtype_block_elems(t->dtype);
	if (qk <= 0 || dv % qk)
		return 0;
	return (size_t)kv_dtype_row_bytes(t->dtype, (uint64_t)dv);
}

int kv_gguf_out_tiled(const struct kv_gguf *g, const struct kv_model_config *c)
{
	if (!kv_gguf_vperm(c))
		return 0;
	for (int l = 0; l < c->n_layers; l++) {
		char n[64];
		snprintf(n, sizeof n, "blk.%d.ssm_out.weight", l);
		const struct kv_tensor *t = kv_gguf_tensor_find(g, n);
		/* float types are permuted back (the HF summation order, so an F32
		 * GGUF gives the folder's logits bit for bit); block types never
		 * are (no copy of the matrix): the engine permutes the input */
		if (t && (kv_dtype_is_quant(t->dtype) || !out_head_bytes(t, c->lin_v_dim)))
			return 1;
	}
	return 0;
}

void kv_gguf_hf_free(struct kv_tensor *t, size_t n)
{
	for (size_t i = 0; t && i < n; i++)
		free((char *)t[i].name);
	free(t);
}

int kv_gguf_hf_tensors(const struct kv_gguf *g, const struct kv_model_config *c, struct kv_tensor **out, size_t *n,
		       void **blob)
{
	size_t nt = kv_gguf_tensor_count(g), k = 0;
	uint64_t owned = 0, off = 0, maxb = 0;
	/* one more entry per layer: qwen3next's ssm_ba gives in_proj_b and in_proj_a */
	struct kv_tensor *v = calloc(nt + (size_t)c->n_layers + 1, sizeof *v);
	uint8_t *b = NULL, *tmp = NULL;
	int rc = KV_OK, tiled_out = c->out_proj_tiled;
	*out = NULL;
	*n = 0;
	*blob = NULL;
	if (!v)
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	/* Pass 1: names, and bytes of the tensors that must be copied. */
	for (int pass = 0; pass < 2; pass++) {
		k = 0;
		for (size_t i = 0; i < nt; i++) {
			const struct kv_tensor *t = kv_gguf_tensor_at(g, i);
			char hf[160] = "";
			int xf = KV_GGUF_XF_NONE, layer = -1;
			if (c->ssm && kv_gguf_ssm_top_hf(c, t->name))
				snprintf(hf, sizeof hf, "%s", kv_gguf_ssm_top_hf(c, t->name));
			else if (c->ssm && sscanf(t->name, "blk.%d.", &layer) == 1 && layer >= 0 && layer < c->n_layers) {
				const char *h = kv_gguf_layer_hf(c, strchr(t->name + 4, '.') + 1, &xf);
				if (h)
					snprintf(hf, sizeof hf, "%slayers.%d.%s", kv_config_default_prefix(c), layer, h);
			} else if (!strcmp(t->name, "token_embd.weight"))
				snprintf(hf, sizeof hf, "model.embed_tokens.weight");
			else if (!strcmp(t->name, "output_norm.weight"))
				snprintf(hf, sizeof hf, "model.norm.weight");
			else if (!strcmp(t->name, "output.weight"))
				snprintf(hf, sizeof hf, "lm_head.weight");
			else if (!strcmp(t->name, "rope_freqs.weight"))
				snprintf(hf, sizeof hf, "rope_freqs.weight"); /* llama3: read by the engine as it is */
			else if (c->arch == KV_ARCH_GEMMA4 && !strncmp(t->name, "per_layer_", 10)) {
				for (int q = 0; q < 3; q++)
					if (!strcmp(t->name, kv_gguf_g4_top[q][1]))
						snprintf(hf, sizeof hf, "%s", kv_gguf_g4_top[q][0]);
			}
			else if (sscanf(t->name, "blk.%d.", &layer) == 1 && layer >= 0 && layer < c->n_layers) {
				const char *h = kv_gguf_layer_hf(c, strchr(t->name + 4, '.') + 1, &xf);
				if (h)
					snprintf(hf, sizeof hf, "model.layers.%d.%s", layer, h);
			}
			/* the MTP layer (llama.cpp's nextn, after the others): under the
			 * Hugging Face mtp.* names */
			int mtp = c->n_mtp_layers > 0 && layer == c->n_layers && !strncmp(t->name, "blk.", 4);
			if (mtp) {
				const char *rest = strchr(t->name + 4, '.') + 1, *h = kv_gguf_nextn_hf(rest);
				if (h)
					snprintf(hf, sizeof hf, "%s", h);
				else if ((h = kv_gguf_layer_hf(c, rest, NULL)))
					snprintf(hf, sizeof hf, "mtp.layers.0.%s", h);
			}
			int ba_split = 0;
			if (!hf[0] && layer >= 0 && (layer < c->n_layers || mtp) && !c->ssm) {
				const char *rest = strchr(t->name + 4, '.') + 1;
				const char *h = kv_gguf_moe_hf(rest);
				if (h && !strcmp(rest, "ffn_down_exps.weight")) {
					/* beside a fused ffn_gate_up_exps: the HF stacked pair */
					char fu[64];
					snprintf(fu, sizeof fu, "blk.%d.ffn_gate_up_exps.weight", layer);
					if (kv_gguf_tensor_find(g, fu))
						h = "mlp.experts.down_proj";
				}
				if (h && !strcmp(rest, "ssm_in.weight") && !c->fused_deltanet)
					h = NULL;
				if (h && !strcmp(rest, "ssm_ba.weight") && !c->fused_deltanet)
					ba_split = 1;
				if (h && mtp)
					snprintf(hf, sizeof hf, "mtp.layers.0.%s", h);
				else if (h)
					snprintf(hf, sizeof hf, "model.layers.%d.%s", layer, h);
			}
			if (!hf[0])
				continue; /* not a tensor of the text model (mtp, vision...) */
			if (ba_split) {
				/* qwen3next's ssm_ba [Hk][b per, a per] rows -> HF in_proj_b and
				 * in_proj_a [Hv] (rows are whole blocks, so any type copies) */
				int64_t per = c->lin_v_heads / c->lin_k_heads, rows = t->ndim == 2 ? t->shape[0] : 0;
				size_t rb = rows ? (size_t)kv_dtype_row_bytes(t->dtype, (uint64_t)t->shape[1]) : 0;
				if (rows != 2ll * c->lin_v_heads || !rb || rb * (size_t)rows != t->nbytes) {
					rc = kv_fail(KV_ERR_INCOMPATIBLE, "%s: tensor '%s' is not [%d, %d]", t->file, t->name,
						     2 * c->lin_v_heads, c->hidden);
					goto fail;
				}
				if (pass == 0) {
					owned += 2 * ((t->nbytes / 2 + 63) & ~(uint64_t)63);
					k += 2;
					continue;
				}
				for (int j = 0; j < 2; j++) {
					struct kv_tensor *d = &v[k++];
					*d = *t;
					snprintf(hf, sizeof hf, "model.layers.%d.linear_attn.in_proj_%s.weight", layer, j ? "a" : "b");
					if (!(d->name = strdup(hf))) {
						rc = kv_fail(KV_ERR_NOMEM, "out of memory");
						goto fail;
					}
					d->shape[0] = c->lin_v_heads;
					d->numel = t->numel / 2;
					d->nbytes = t->nbytes / 2;
					for (int64_t h = 0; h < c->lin_v_heads; h++)
						memcpy(b + off + (size_t)h * rb,
						       (const uint8_t *)t->data + (size_t)((h / per) * 2 * per + j * per + h % per) * rb, rb);
					d->data = b + off;
					off += (d->nbytes + 63) & ~(uint64_t)63;
				}
				continue;
			}
			/* the projections' rows stay tiled (the engine permutes their
			 * outputs, so no copy of the big matrices); the small conv,
			 * dt and A tensors are permuted back */
			int small_rows = t->ndim == 1 || strstr(t->name, "ssm_conv1d") != NULL;
			int perm = kv_gguf_vperm(c) && ((xf == KV_GGUF_XF_VROWS && (small_rows || !c->vrows_tiled)) ||
						       xf == KV_GGUF_XF_NEGEXP || (xf == KV_GGUF_XF_VCOLS && !tiled_out));
			if (pass == 0) {
				if (perm) {
					owned += (t->nbytes + 63) & ~(uint64_t)63;
					if (t->nbytes > maxb)
						maxb = t->nbytes;
				}
				k++;
				continue;
			}
			struct kv_tensor *d = &v[k++];
			*d = *t;
			if (!(d->name = strdup(hf))) {
				rc = kv_fail(KV_ERR_NOMEM, "out of memory");
				goto fail;
			}
			if (strstr(t->name, "ffn_gate_inp_shexp") && t->ndim == 1) {
				/* {n_embd} -> HF's shared_expert_gate [1, D] */
				d->ndim = 2;
				d->shape[1] = t->shape[0];
				d->shape[0] = 1;
			}
			size_t tl = strlen(t->name);
			if (c->ssm && t->ndim == 2 &&
			    ((tl > 6 && (!strcmp(t->name + tl - 6, ".ssm_a") || !strcmp(t->name + tl - 6, ".ssm_d"))) ||
			     strstr(t->name, ".ssm_norm."))) {
				/* [H, 1] and [G, W / G] -> HF's 1-D [H] and [W] */
				d->ndim = 1;
				d->shape[0] = (int64_t)t->numel;
				d->shape[1] = 0;
			}
			if ((xf == KV_GGUF_XF_VROWS || c->ssm) && strstr(t->name, "ssm_conv1d.weight") && t->ndim == 2) {
				/* [C, K] -> HF's [C, 1, K] */
				d->ndim = 3;
				d->shape[2] = t->shape[1];
				d->shape[1] = 1;
				d->shape[0] = t->shape[0];
			}
			if (!perm)
				continue;
			memcpy(b + off, t->data, (size_t)t->nbytes);
			if (xf == KV_GGUF_XF_VCOLS) {
				size_t rb = (size_t)kv_dtype_row_bytes(t->dtype, (uint64_t)t->shape[t->ndim - 1]);
				kv_gguf_perm_cols(c, b + off, t->numel / (uint64_t)t->shape[t->ndim - 1], rb,
					  out_head_bytes(t, c->lin_v_dim), 0, tmp);
			} else {
				int64_t voff, vrow, rows = t->ndim == 1 ? (int64_t)t->numel : t->shape[0];
				const char *rest = strchr(t->name + 4, '.') + 1;
				size_t rb = t->ndim == 1 ? (size_t)kv_dtype_row_bytes(t->dtype, 1)
							 : (size_t)kv_dtype_row_bytes(t->dtype, (uint64_t)t->shape[1]);
				kv_gguf_vrows(c, rest, &voff, &vrow);
				if (!rb || voff + vrow * c->lin_v_heads > rows) {
					rc = kv_fail(KV_ERR_INCOMPATIBLE, "%s: tensor '%s' has %lld rows, too few for %d value heads",
						     t->file, t->name, (long long)rows, c->lin_v_heads);
					goto fail;
				}
				kv_gguf_perm_rows(c, b + off, rb, voff, vrow, 0, tmp);
			}
			d->data = b + off;
			off += (t->nbytes + 63) & ~(uint64_t)63;
		}
		if (pass == 0 && owned) {
			b = kv_alloc(KV_MEM_WEIGHTS, (size_t)owned);
			tmp = malloc((size_t)maxb + 64);
			if (!b || !tmp) {
				rc = kv_fail(KV_ERR_NOMEM, "out of memory for %llu bytes of permuted tensors",
					     (unsigned long long)owned);
				goto fail;
			}
		}
	}
	free(tmp);
	*out = v;
	*n = k;
	*blob = b;
	return KV_OK;
fail:
	free(tmp);
	kv_free(b);
	kv_gguf_hf_free(v, nt + (size_t)c->n_layers + 1);
	return rc;
}

/* --- tokenizer ----------------------------------------------------------------- */

static json_t *byte_level(void)
{
	json_t *o = json_object();
	json_object_set_new(o, "type", json_string("ByteLevel"));
	json_object_set_new(o, "add_prefix_space", json_false());
	json_object_set_new(o, "trim_offsets", json_false());
	json_object_set_new(o, "use_regex", json_false());
	return o;
}

int kv_gguf_tokenizer_json(const struct kv_gguf *g, char **json, size_t *len)
{
	char *model = NULL, *pre = NULL;
	const struct kv_gguf_kv *toks = kv_gguf_kv_find(g, "tokenizer.ggml.tokens"),
				*types = kv_gguf_kv_find(g, "tokenizer.ggml.token_type"),
				*merges = kv_gguf_kv_find(g, "tokenizer.ggml.merges");
	json_t *root = NULL;
	const char *re;
	char *own_re = NULL;
	int rc;
	*json = NULL;
	*len = 0;
	if ((rc = kv_gguf_get_str(g, "tokenizer.ggml.model", &model)))
		return rc;
	if (strcmp(model, "gpt2")) {
		rc = kv_fail(KV_ERR_UNSUPPORTED, "%s: tokenizer.ggml.model '%s' (kvkeep reads gpt2 BPE)", kv_gguf_path(g),
			     model);
		goto out;
	}
	if (kv_gguf_get_str(g, "tokenizer.ggml.pre", &pre))
		pre = strdup("qwen2");
	kv_gguf_get_str(g, "kvkeep.tokenizer.pre_regex", &own_re);
	kv_errclear();
	if (own_re)
		re = own_re;
	else if (!(re = kv_gguf_pre_regex(pre))) {
		rc = kv_fail(KV_ERR_UNSUPPORTED, "%s: tokenizer.ggml.pre '%s' has no pre-tokenizer in kvkeep",
			     kv_gguf_path(g), pre ? pre : "?");
		goto out;
	}
	if (!toks || toks->type != KV_GGUF_ARR || toks->arr_type != KV_GGUF_STR || !merges ||
	    merges->type != KV_GGUF_ARR || merges->arr_type != KV_GGUF_STR ||
	    (types && (types->type != KV_GGUF_ARR || types->n != toks->n))) {
		rc = KV_CORRUPT(kv_gguf_path(g), 0, "tokenizer.ggml.tokens / token_type / merges missing or mistyped");
		goto out;
	}
	root = json_object();
	json_t *added = json_array(), *vocab = json_object(), *mg = json_array(), *m = json_object(),
	       *pt = json_object(), *seq = json_array(), *split = json_object(), *pat = json_object(),
	       *norm = json_object();
	for (uint64_t i = 0; i < toks->n; i++) {
		int64_t ty = 1;
		json_t *s = json_stringn(toks->astr[i], (size_t)toks->alen[i]);
		if (!s) {
			rc = KV_CORRUPT(kv_gguf_path(g), 0, "token %llu is not UTF-8", (unsigned long long)i);
			goto out_json;
		}
		if (types)
			kv_gguf_arr_int(types, i, &ty);
		if (ty == 3 || ty == 4) {
			json_t *a = json_object();
			json_object_set_new(a, "id", json_integer((json_int_t)i));
			json_object_set(a, "content", s);
			json_object_set_new(a, "single_word", json_false());
			json_object_set_new(a, "lstrip", json_false());
			json_object_set_new(a, "rstrip", json_false());
			json_object_set_new(a, "normalized", json_false()); /* as Qwen's tokenizer.json */
			json_object_set_new(a, "special", json_boolean(ty == 3));
			json_array_append_new(added, a);
			json_decref(s);
		} else if (ty == 5) {
			json_decref(s); /* padding rows: no token */
		} else {
			json_object_set_new(vocab, json_string_value(s), json_integer((json_int_t)i));
			json_decref(s);
		}
	}
	for (uint64_t i = 0; i < merges->n; i++) {
		json_t *s = json_stringn(merges->astr[i], (size_t)merges->alen[i]);
		if (!s) {
			rc = KV_CORRUPT(kv_gguf_path(g), 0, "merge %llu is not UTF-8", (unsigned long long)i);
			goto out_json;
		}
		json_array_append_new(mg, s);
	}
	json_object_set_new(root, "version", json_string("1.0"));
	json_object_set_new(root, "added_tokens", added);
	added = NULL;
	json_object_set_new(norm, "type", json_string("NFC"));
	json_object_set_new(root, "normalizer", norm);
	norm = NULL;
	json_object_set_new(split, "type", json_string("Split"));
	json_object_set_new(pat, "Regex", json_string(re));
	json_object_set_new(split, "pattern", pat);
	pat = NULL;
	json_object_set_new(split, "behavior", json_string("Isolated"));
	json_object_set_new(split, "invert", json_false());
	json_array_append_new(seq, split);
	split = NULL;
	json_array_append_new(seq, byte_level());
	json_object_set_new(pt, "type", json_string("Sequence"));
	json_object_set_new(pt, "pretokenizers", seq);
	seq = NULL;
	json_object_set_new(root, "pre_tokenizer", pt);
	pt = NULL;
	json_object_set_new(root, "decoder", byte_level());
	json_object_set_new(m, "type", json_string("BPE"));
	json_object_set_new(m, "vocab", vocab);
	vocab = NULL;
	json_object_set_new(m, "merges", mg);
	mg = NULL;
	json_object_set_new(m, "byte_fallback", json_false());
	json_object_set_new(m, "ignore_merges", json_false());
	json_object_set_new(root, "model", m);
	m = NULL;
	*json = json_dumps(root, JSON_COMPACT);
	rc = *json ? KV_OK : kv_fail(KV_ERR_NOMEM, "out of memory");
	if (*json)
		*len = strlen(*json);
out_json:
	json_decref(added);
	json_decref(vocab);
	json_decref(mg);
	json_decref(m);
	json_decref(pt);
	json_decref(seq);
	json_decref(split);
	json_decref(pat);
	json_decref(norm);
out:
	json_decref(root);
	free(model);
	free(pre);
	free(own_re);
	return rc;
}

int kv_gguf_chat_template(const struct kv_gguf *g, char **out)
{
	return kv_gguf_get_str(g, "tokenizer.chat_template", out);
}

int kv_gguf_tokenizer_config_json(const struct kv_gguf *g, char **json, size_t *len)
{
	const struct kv_gguf_kv *toks = kv_gguf_kv_find(g, "tokenizer.ggml.tokens"),
				*types = kv_gguf_kv_find(g, "tokenizer.ggml.token_type");
	char *tmpl = NULL;
	json_t *cfg = json_object(), *dec = json_object();
	int rc;
	static const struct {
		const char *gg, *hf;
	} ids[] = {
		{"tokenizer.ggml.bos_token_id", "bos_token"},
		{"tokenizer.ggml.eos_token_id", "eos_token"},
		{"tokenizer.ggml.padding_token_id", "pad_token"},
	};
	*json = NULL;
	*len = 0;
	if ((rc = kv_gguf_chat_template(g, &tmpl)))
		goto out;
	if (!toks || toks->type != KV_GGUF_ARR || toks->arr_type != KV_GGUF_STR) {
		rc = KV_CORRUPT(kv_gguf_path(g), 0, "tokenizer.ggml.tokens missing or not a string array");
		goto out;
	}
	json_object_set_new(cfg, "chat_template", json_string(tmpl));
	for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++) {
		int64_t id;
		if (kv_gguf_get_int(g, ids[i].gg, &id) == KV_OK && id >= 0 && (uint64_t)id < toks->n)
			json_object_set_new(cfg, ids[i].hf, json_stringn(toks->astr[id], (size_t)toks->alen[id]));
	}
	kv_errclear();
	for (uint64_t i = 0; types && types->type == KV_GGUF_ARR && i < toks->n && i < types->n; i++) {
		int64_t ty = 1;
		kv_gguf_arr_int(types, i, &ty);
		if (ty != 3 && ty != 4)
			continue;
		json_t *a = json_object(), *s = json_stringn(toks->astr[i], (size_t)toks->alen[i]);
		char key[32];
		if (!s) {
			json_decref(a);
			continue;
		}
		json_object_set_new(a, "content", s);
		json_object_set_new(a, "lstrip", json_false());
		json_object_set_new(a, "normalized", json_false());
		json_object_set_new(a, "rstrip", json_false());
		json_object_set_new(a, "single_word", json_false());
		json_object_set_new(a, "special", json_boolean(ty == 3));
		snprintf(key, sizeof key, "%llu", (unsigned long long)i);
		json_object_set_new(dec, key, a);
	}
	json_object_set(cfg, "added_tokens_decoder", dec);
	*json = json_dumps(cfg, JSON_COMPACT);
	rc = *json ? KV_OK : kv_fail(KV_ERR_NOMEM, "out of memory");
	if (*json)
		*len = strlen(*json);
out:
	free(tmpl);
	json_decref(dec);
	json_decref(cfg);
	return rc;
}
