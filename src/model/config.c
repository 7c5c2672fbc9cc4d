/*
 * config.c - config.json of qwen3 / qwen3_5 / qwen3_next, see config.h.
 *
 * The parser reads the fields the engine needs, applies the defaults of
 * the Hugging Face configuration classes, and then checks every shape
 * relation the engine relies on, so the engine can size buffers from the
 * struct without re-checking. Messages name the field with its JSON path
 * ("text_config.num_key_value_heads") and the file.
 */
#include "model/config.h"
#include "model/tspec.h"
#include "model/config_ssm.h"
#include "base/err.h"
#include "base/json.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CFG_MAX_DIM (1 << 20)     /* hidden, intermediate */
#define CFG_MAX_HEADS 4096
#define CFG_MAX_HEAD_DIM 4096
#define CFG_MAX_VOCAB (1 << 24)
#define CFG_MAX_KERNEL 64

struct cfgp {
	const char *what;     /* file name for messages */
	json_t *root;
	json_t *text;         /* text_config or root */
	const char *tprefix;  /* "text_config." or "" */
	double local_theta;   /* rope_parameters.sliding_attention.rope_theta, 0 if absent */
};

/* Integer field of the text config in [lo, hi]; def when absent/null. */
static int get_int(struct cfgp *p, json_t *obj, const char *pre, const char *key, int64_t def, int64_t lo,
		   int64_t hi, int *out)
{
	int64_t v;
	json_t *j = json_object_get(obj, key);
	/* Reals are accepted when integral (4096.0); huge ones are refused
	 * before any conversion to an integer type. */
	if (j && !json_is_null(j) && (!json_is_number(j) || (json_is_real(j) && !(fabs(json_real_value(j)) < 0x1p53))))
		return kv_fail(KV_ERR_INVALID, "%s: %s%s must be an integer", p->what, pre, key);
	if (kv_json_get_int(obj, key, def, &v, p->what))
		return kv_fail(KV_ERR_INVALID, "%s: %s%s must be an integer", p->what, pre, key);
	if (v < lo || v > hi)
		return kv_fail(KV_ERR_INVALID, "%s: %s%s is %lld, must be in [%lld, %lld]", p->what, pre, key,
			       (long long)v, (long long)lo, (long long)hi);
	*out = (int)v;
	return KV_OK;
}

static int get_num(struct cfgp *p, json_t *obj, const char *pre, const char *key, double def, double *out)
{
	if (kv_json_get_num(obj, key, def, out, p->what))
		return kv_fail(KV_ERR_INVALID, "%s: %s%s must be a number", p->what, pre, key);
	if (!isfinite(*out))
		return kv_fail(KV_ERR_INVALID, "%s: %s%s is not finite", p->what, pre, key);
	return KV_OK;
}

static int get_bool(struct cfgp *p, json_t *obj, const char *pre, const char *key, int def, int *out)
{
	if (kv_json_get_bool(obj, key, def, out, p->what))
		return kv_fail(KV_ERR_INVALID, "%s: %s%s must be true or false", p->what, pre, key);
	return KV_OK;
}

/* A key of the text config, else of the root (fields Qwen3.5 may keep at
 * either level: tie_word_embeddings, eos/bos ids, dtype). */
static json_t *text_or_root(struct cfgp *p, const char *key, const char **pre)
{
	json_t *v = json_object_get(p->text, key);
	*pre = p->tprefix;
	if (v && !json_is_null(v))
		return p->text;
	*pre = "";
	return p->root;
}

static int parse_eos(struct cfgp *p, struct kv_model_config *c)
{
	const char *pre;
	json_t *obj = text_or_root(p, "eos_token_id", &pre), *v = json_object_get(obj, "eos_token_id"), *e;
	size_t i;
	for (i = 0; i < 8; i++)
		c->eos_ids[i] = -1;
	c->n_eos = 0;
	if (!v || json_is_null(v))
		return KV_OK;
	if (json_is_integer(v)) {
		if (json_integer_value(v) < 0 || json_integer_value(v) >= CFG_MAX_VOCAB)
			return kv_fail(KV_ERR_INVALID, "%s: %seos_token_id %lld out of range", p->what, pre,
				       (long long)json_integer_value(v));
		c->eos_ids[0] = (int)json_integer_value(v);
		c->n_eos = 1;
		return KV_OK;
	}
	if (!json_is_array(v))
		return kv_fail(KV_ERR_INVALID, "%s: %seos_token_id must be an integer or a list", p->what, pre);
	if (json_array_size(v) > 8)
		return kv_fail(KV_ERR_UNSUPPORTED, "%s: %seos_token_id lists %zu ids, at most 8 are supported", p->what,
			       pre, json_array_size(v));
	json_array_foreach(v, i, e) {
		if (!json_is_integer(e) || json_integer_value(e) < 0 || json_integer_value(e) >= CFG_MAX_VOCAB)
			return kv_fail(KV_ERR_INVALID, "%s: %seos_token_id[%zu] is not a valid token id", p->what, pre, i);
		c->eos_ids[c->n_eos++] = (int)json_integer_value(e);
	}
	return KV_OK;
}

/* What every family ends with: the eos ids, bos_token_id and the
 * checkpoint's torch_dtype (or dtype). */
static int parse_ids_dtype(struct cfgp *p, struct kv_model_config *c)
{
	const char *s;
	int rc;
	if ((rc = parse_eos(p, c)))
		return rc;
	{
		json_t *o = text_or_root(p, "bos_token_id", &s);
		int bos;
		if ((rc = get_int(p, o, s, "bos_token_id", -1, -1, CFG_MAX_VOCAB - 1, &bos)))
			return rc;
		c->bos_id = bos;
	}
	json_t *d = json_object_get(text_or_root(p, "torch_dtype", &s), "torch_dtype");
	if (!d || json_is_null(d))
		d = json_object_get(text_or_root(p, "dtype", &s), "dtype");
	if (json_is_string(d))
		snprintf(c->torch_dtype, sizeof c->torch_dtype, "%s", json_string_value(d));
	return KV_OK;
}

/* rope_theta, partial_rotary_factor and the rope type. */
static int parse_rope(struct cfgp *p, struct kv_model_config *c, double def_partial)
{
	json_t *rp = json_object_get(p->text, "rope_parameters");
	json_t *rs = json_object_get(p->text, "rope_scaling");
	const char *pre = p->tprefix;
	int rc;

	if ((rc = get_num(p, p->text, pre, "rope_theta", 10000.0, &c->rope_theta)))
		return rc;
	/* transformers 4.57+ writes Gemma's as {"full_attention": {...},
	 * "sliding_attention": {...}}: the global layers' block is the
	 * model's RoPE, the sliding layers' theta is rope_local_theta */
	if (rp && json_is_object(rp) && json_is_object(json_object_get(rp, "full_attention"))) {
		json_t *sl = json_object_get(rp, "sliding_attention");
		double lt = 0;
		if (json_is_object(sl) && !kv_json_get_num(sl, "rope_theta", 0, &lt, p->what) && lt > 0)
			p->local_theta = lt;
		rp = json_object_get(rp, "full_attention");
	}
	if ((rc = get_num(p, p->text, pre, "partial_rotary_factor", def_partial, &c->partial_rotary)))
		return rc;
	if (rp && !json_is_null(rp)) {
		char pp[64];
		if (!json_is_object(rp))
			return kv_fail(KV_ERR_INVALID, "%s: %srope_parameters must be an object", p->what, pre);
		snprintf(pp, sizeof pp, "%srope_parameters.", pre);
		if ((rc = get_num(p, rp, pp, "rope_theta", c->rope_theta, &c->rope_theta)) ||
		    (rc = get_num(p, rp, pp, "partial_rotary_factor", c->partial_rotary, &c->partial_rotary)))
			return rc;
	}
	/* "default" and "mrope" (the multimodal variant, which reduces to it
	 * for text) are plain RoPE; "linear" and "yarn" rescale the
	 * frequencies. The scaling keys sit in whichever object names the
	 * type (transformers moved rope_scaling into rope_parameters). */
	json_t *objs[2] = {rp, rs};
	const char *names[2] = {"rope_parameters", "rope_scaling"};
	json_t *so = NULL;
	const char *sname = NULL;
	c->rope_scaling = KV_ROPE_NONE;
	c->rope_factor = 1.0;
	c->rope_attn_factor = 1.0;
	c->rope_beta_fast = 32.0;
	c->rope_beta_slow = 1.0;
	c->rope_orig_max_pos = c->max_positions;
	c->rope_truncate = 1;
	for (int i = 0; i < 2; i++) {
		json_t *o = objs[i], *t;
		if (!o || json_is_null(o))
			continue;
		if (!json_is_object(o))
			return kv_fail(KV_ERR_INVALID, "%s: %s%s must be an object or null", p->what, pre, names[i]);
		t = json_object_get(o, "rope_type");
		if (!t)
			t = json_object_get(o, "type");
		if (t && !json_is_null(t)) {
			const char *s = json_string_value(t);
			int kind;
			if (!s)
				return kv_fail(KV_ERR_INVALID, "%s: %s%s.rope_type must be a string", p->what, pre,
					       names[i]);
			if (!strcmp(s, "default") || !strcmp(s, "mrope"))
				continue;
			if (!strcmp(s, "linear"))
				kind = KV_ROPE_LINEAR;
			else if (!strcmp(s, "yarn"))
				kind = KV_ROPE_YARN;
			else if (!strcmp(s, "llama3") && c->arch == KV_ARCH_LLAMA)
				kind = KV_ROPE_LLAMA3;
			else if (!strcmp(s, "proportional") && c->arch == KV_ARCH_GEMMA4)
				continue; /* gemma4's global layers: parse_gemma4 */
			else if (!strcmp(s, "dynamic"))
				return kv_fail(KV_ERR_UNSUPPORTED,
					       "%s: %s%s.rope_type 'dynamic' is not supported: its frequencies change with "
					       "the length of each batch, so a token's KV would depend on how the prompt "
					       "was cut (use 'yarn' or 'linear')", p->what, pre, names[i]);
			else
				return kv_fail(KV_ERR_UNSUPPORTED,
					       "%s: %s%s.rope_type '%s' is not supported (default, linear or yarn; llama3 "
					       "for llama)",
					       p->what, pre, names[i], s);
			if (so && kind != c->rope_scaling)
				return kv_fail(KV_ERR_INVALID, "%s: %srope_parameters and rope_scaling name different "
					       "rope types", p->what, pre);
			c->rope_scaling = kind;
			so = o;
			sname = names[i];
		}
	}
	if (so) {
		char sp[64];
		snprintf(sp, sizeof sp, "%s%s.", pre, sname);
		json_t *f = json_object_get(so, "factor");
		int has_orig = json_object_get(so, "original_max_position_embeddings") != NULL &&
			       !json_is_null(json_object_get(so, "original_max_position_embeddings"));
		if ((rc = get_int(p, so, sp, "original_max_position_embeddings", c->max_positions, 1, 1 << 30,
				  &c->rope_orig_max_pos)))
			return rc;
		if ((!f || json_is_null(f)) && !(c->rope_scaling == KV_ROPE_YARN && has_orig))
			return kv_fail(KV_ERR_INVALID, "%s: %sfactor is required", p->what, sp);
		/* yarn without a factor: max_position_embeddings / original */
		double def_f = c->rope_orig_max_pos > 0 ? (double)c->max_positions / c->rope_orig_max_pos : 1.0;
		if ((rc = get_num(p, so, sp, "factor", def_f, &c->rope_factor)))
			return rc;
		if (!(c->rope_factor > 0 && c->rope_factor <= 1e6))
			return kv_fail(KV_ERR_INVALID, "%s: %sfactor %g must be in (0, 1e6]", p->what, sp, c->rope_factor);
		if (c->rope_scaling == KV_ROPE_LLAMA3) {
			/* transformers' _compute_llama3_parameters */
			if ((rc = get_num(p, so, sp, "low_freq_factor", 1.0, &c->rope_low_freq)) ||
			    (rc = get_num(p, so, sp, "high_freq_factor", 4.0, &c->rope_high_freq)))
				return rc;
			if (!(c->rope_low_freq > 0 && c->rope_high_freq > c->rope_low_freq && c->rope_orig_max_pos > 0))
				return kv_fail(KV_ERR_INVALID, "%s: %shigh_freq_factor must exceed low_freq_factor > 0, with "
					       "original_max_position_embeddings", p->what, sp);
		}
		if (c->rope_scaling == KV_ROPE_YARN) {
			double mscale = 0, mscale_all = 0, af = -1;
			if ((rc = get_num(p, so, sp, "beta_fast", 32.0, &c->rope_beta_fast)) ||
			    (rc = get_num(p, so, sp, "beta_slow", 1.0, &c->rope_beta_slow)) ||
			    (rc = get_num(p, so, sp, "mscale", 0.0, &mscale)) ||
			    (rc = get_num(p, so, sp, "mscale_all_dim", 0.0, &mscale_all)) ||
			    (rc = get_num(p, so, sp, "attention_factor", -1.0, &af)) ||
			    (rc = get_bool(p, so, sp, "truncate", 1, &c->rope_truncate)))
				return rc;
			/* transformers: "beta_fast or 32" (0 means the default) */
			if (c->rope_beta_fast == 0)
				c->rope_beta_fast = 32.0;
			if (c->rope_beta_slow == 0)
				c->rope_beta_slow = 1.0;
			if (!(c->rope_beta_fast > 0 && c->rope_beta_slow > 0))
				return kv_fail(KV_ERR_INVALID, "%s: %sbeta_fast and beta_slow must be positive", p->what, sp);
			if (af >= 0) {
				c->rope_attn_factor = af;
			} else {
				/* get_mscale(s, m) = 1 if s <= 1 else 0.1 m ln(s) + 1 */
				double s = c->rope_factor;
#define MSCALE(m) (s <= 1 ? 1.0 : 0.1 * (m) * log(s) + 1.0)
				if (mscale != 0 && mscale_all != 0)
					c->rope_attn_factor = MSCALE(mscale) / MSCALE(mscale_all);
				else
					c->rope_attn_factor = MSCALE(1.0);
#undef MSCALE
			}
			if (!(c->rope_attn_factor > 0 && c->rope_attn_factor < 1e3))
				return kv_fail(KV_ERR_INVALID, "%s: %sattention factor %g must be in (0, 1000)", p->what, sp,
					       c->rope_attn_factor);
		}
	}
	if (!(c->rope_theta > 0))
		return kv_fail(KV_ERR_INVALID, "%s: %srope_theta must be positive", p->what, pre);
	if (!(c->partial_rotary > 0 && c->partial_rotary <= 1))
		return kv_fail(KV_ERR_INVALID, "%s: %spartial_rotary_factor %g must be in (0, 1]", p->what, pre,
			       c->partial_rotary);
	/* transformers: dim = int(head_dim * partial_rotary_factor). */
	c->rotary_dim = (int)((double)c->head_dim * c->partial_rotary);
	if (c->rotary_dim < 2 || (c->rotary_dim & 1))
		return kv_fail(KV_ERR_INVALID,
			       "%s: %spartial_rotary_factor %g x head_dim %d gives rotary dim %d, which must be even "
			       "and >= 2",
			       p->what, pre, c->partial_rotary, c->head_dim, c->rotary_dim);
	return KV_OK;
}

static int parse_layer_types(struct cfgp *p, struct kv_model_config *c)
{
	const char *pre = p->tprefix;
	json_t *lt = json_object_get(p->text, "layer_types"), *v;
	size_t i;
	int rc;

	if (lt && !json_is_null(lt)) {
		if (!json_is_array(lt))
			return kv_fail(KV_ERR_INVALID, "%s: %slayer_types must be a list", p->what, pre);
		if (json_array_size(lt) != (size_t)c->n_layers)
			return kv_fail(KV_ERR_INVALID, "%s: %slayer_types has %zu entries, num_hidden_layers is %d",
				       p->what, pre, json_array_size(lt), c->n_layers);
		json_array_foreach(lt, i, v) {
			const char *s = json_string_value(v);
			if (!s)
				return kv_fail(KV_ERR_INVALID, "%s: %slayer_types[%zu] must be a string", p->what, pre, i);
			/* "attention" / "mamba" are the legacy names transformers remaps. */
			if (!strcmp(s, "full_attention") || !strcmp(s, "attention"))
				c->layer_type[i] = KV_LAYER_ATTN;
			else if (c->sliding_window > 0 && !strcmp(s, "sliding_attention")) {
				c->layer_type[i] = KV_LAYER_ATTN;
				c->layer_window[i] = 1;
			} else if (c->hybrid && (!strcmp(s, "linear_attention") || !strcmp(s, "mamba")))
				c->layer_type[i] = KV_LAYER_DELTANET;
			else if (!strcmp(s, "sliding_attention") || !strcmp(s, "linear_attention"))
				return kv_fail(KV_ERR_UNSUPPORTED, "%s: %slayer_types[%zu] '%s' is not supported for %s",
					       p->what, pre, i, s, c->model_type);
			else
				return kv_fail(KV_ERR_INVALID, "%s: %slayer_types[%zu] '%s' is not a known layer type",
					       p->what, pre, i, s);
		}
	} else if (c->arch == KV_ARCH_GEMMA3 || c->arch == KV_ARCH_GEMMA4 || c->arch == KV_ARCH_GPT_OSS) {
		/* transformers' defaults: gemma3 every sliding_window_pattern-th
		 * layer global (6), gpt_oss even layers sliding (pattern 2) */
		int pat;
		if ((rc = get_int(p, p->text, pre, "sliding_window_pattern", c->arch == KV_ARCH_GPT_OSS ? 2 : 6, 1,
				  1 << 20, &pat)))
			return rc;
		for (int l = 0; l < c->n_layers; l++) {
			c->layer_type[l] = KV_LAYER_ATTN;
			c->layer_window[l] = c->sliding_window > 0 && (l + 1) % pat != 0;
		}
	} else if (c->arch == KV_ARCH_LLAMA) {
		for (int l = 0; l < c->n_layers; l++)
			c->layer_type[l] = KV_LAYER_ATTN;
	} else if (c->hybrid) {
		int interval;
		if ((rc = get_int(p, p->text, pre, "full_attention_interval", 4, 1, 1 << 20, &interval)))
			return rc;
		for (int l = 0; l < c->n_layers; l++)
			c->layer_type[l] = (l + 1) % interval == 0 ? KV_LAYER_ATTN : KV_LAYER_DELTANET;
	} else {
		int sw = 0, mwl;
		json_t *swv = json_object_get(p->text, "sliding_window");
		if ((rc = get_bool(p, p->text, pre, "use_sliding_window", 0, &sw)) ||
		    (rc = get_int(p, p->text, pre, "max_window_layers", 28, 0, 1 << 20, &mwl)))
			return rc;
		for (int l = 0; l < c->n_layers; l++) {
			/* transformers: sliding iff a window is set and l >= max_window_layers. */
			if (sw && swv && !json_is_null(swv) && l >= mwl)
				return kv_fail(KV_ERR_UNSUPPORTED,
					       "%s: %suse_sliding_window makes layer %d sliding-window attention, which is "
					       "not supported",
					       p->what, pre, l);
			c->layer_type[l] = KV_LAYER_ATTN;
		}
	}
	c->n_attn_layers = c->n_deltanet_layers = c->n_swa_layers = 0;
	for (int l = 0; l < c->n_layers; l++) {
		if (c->layer_type[l] == KV_LAYER_ATTN)
			c->n_attn_layers++;
		else
			c->n_deltanet_layers++;
		c->n_swa_layers += c->layer_window[l];
	}
	if (c->sliding_window > 0 && !c->n_swa_layers)
		c->sliding_window = 0; /* a window no layer uses (gemma3 sliding_window_pattern 1) */
	return KV_OK;
}

/* qwen3_next: refuse MoE, by transformers' own rule for which layers are
 * sparse: not in mlp_only_layers and num_experts > 0 and
 * (l + 1) % decoder_sparse_step == 0. */
/*
 * Mixture-of-experts fields (qwen3_next, qwen3_5_moe). Which layers are
 * sparse follows the Hugging Face decoder layers: qwen3_next layer l is
 * sparse iff num_experts > 0, l is not in mlp_only_layers and (l + 1) %
 * decoder_sparse_step == 0; qwen3_5_moe layers are all sparse (its
 * configuration class has neither field, so they are not read).
 */
static int parse_moe(struct cfgp *p, struct kv_model_config *c, int all_sparse, int def_experts, int def_k)
{
	const char *pre = p->tprefix;
	json_t *mol = json_object_get(p->text, "mlp_only_layers"), *v;
	int step = 1, rc;
	uint8_t dense_only[KV_MAX_LAYERS] = {0};
	size_t i;

	if ((rc = get_int(p, p->text, pre, "num_experts", def_experts, 0, 1 << 16, &c->n_experts)))
		return rc;
	c->expert_layout = c->arch == KV_ARCH_QWEN3_NEXT ? KV_EXPERTS_SPLIT : KV_EXPERTS_STACKED;
	if (c->n_experts == 0) {
		if (all_sparse)
			return kv_fail(KV_ERR_INVALID, "%s: %snum_experts is 0, a %s model needs experts", p->what, pre,
				       c->model_type);
		return KV_OK;
	}
	if ((rc = get_int(p, p->text, pre, "num_experts_per_tok", def_k, 1, 1 << 16, &c->n_experts_per_tok)) ||
	    (rc = get_int(p, p->text, pre, "moe_intermediate_size", 512, 1, CFG_MAX_DIM, &c->moe_intermediate)) ||
	    (rc = get_int(p, p->text, pre, "shared_expert_intermediate_size", 512, 1, CFG_MAX_DIM,
			  &c->shared_intermediate)))
		return rc;
	if (c->n_experts_per_tok > c->n_experts)
		return kv_fail(KV_ERR_INVALID, "%s: %snum_experts_per_tok %d is more than num_experts %d", p->what, pre,
			       c->n_experts_per_tok, c->n_experts);
	/* Qwen3_5MoeTopKRouter always divides by the sum of the top k. */
	c->norm_topk_prob = 1;
	if (!all_sparse) {
		if ((rc = get_bool(p, p->text, pre, "norm_topk_prob", 1, &c->norm_topk_prob)))
			return rc;
		if (mol && !json_is_null(mol)) {
			if (!json_is_array(mol))
				return kv_fail(KV_ERR_INVALID, "%s: %smlp_only_layers must be a list", p->what, pre);
			json_array_foreach(mol, i, v) {
				if (!json_is_integer(v) || json_integer_value(v) < 0 ||
				    json_integer_value(v) >= c->n_layers)
					return kv_fail(KV_ERR_INVALID, "%s: %smlp_only_layers[%zu] is not a layer index",
						       p->what, pre, i);
				dense_only[json_integer_value(v)] = 1;
			}
		}
		if ((rc = get_int(p, p->text, pre, "decoder_sparse_step", 1, 1, 1 << 20, &step)))
			return rc;
	}
	c->n_moe_layers = 0;
	for (int l = 0; l < c->n_layers; l++) {
		c->layer_moe[l] = !dense_only[l] && (l + 1) % step == 0;
		c->n_moe_layers += c->layer_moe[l];
	}
	if (!c->n_moe_layers)
		c->n_experts = c->n_experts_per_tok = c->moe_intermediate = c->shared_intermediate = 0;
	return KV_OK;
}

/* The activation name of the MLP (hidden_activation wins, as in
 * Gemma3TextConfig). */
static int parse_act(struct cfgp *p, struct kv_model_config *c, const char *def)
{
	const char *pre = p->tprefix, *s = def, *key = "hidden_act";
	json_t *v = json_object_get(p->text, "hidden_activation");
	if (v && !json_is_null(v))
		key = "hidden_activation";
	else
		v = json_object_get(p->text, "hidden_act");
	if (v && !json_is_null(v)) {
		if (!json_is_string(v))
			return kv_fail(KV_ERR_INVALID, "%s: %s%s must be a string", p->what, pre, key);
		s = json_string_value(v);
	}
	if (!strcmp(s, "silu"))
		c->mlp_act = KV_ACT_SILU;
	else if (!strcmp(s, "gelu_pytorch_tanh") || !strcmp(s, "gelu_tanh"))
		c->mlp_act = KV_ACT_GELU_TANH;
	else
		return kv_fail(KV_ERR_UNSUPPORTED, "%s: %s%s '%s' is not supported (silu, gelu_pytorch_tanh)", p->what,
			       pre, key, s);
	return KV_OK;
}

/* A boolean feature that must be off: 'what' names it. */
static int refuse_true(struct cfgp *p, const char *key, const char *what)
{
	int on = 0, rc;
	if ((rc = get_bool(p, p->text, p->tprefix, key, 0, &on)))
		return rc;
	if (on)
		return kv_fail(KV_ERR_UNSUPPORTED, "%s: %s%s true (%s) is not supported", p->what, p->tprefix, key, what);
	return KV_OK;
}

/*
 * Gemma 4 (Gemma4TextConfig, llama.cpp's gemma4 graph): after the shared
 * fields, whose head_dim and num_key_value_heads are the sliding layers'.
 * The global layers have global_head_dim and num_global_key_value_heads,
 * "proportional" RoPE (rope_parameters.full_attention: the frequencies of
 * the whole global head, the first partial_rotary_factor of them rotating)
 * and, with attention_k_eq_v, no v_proj. Softmax scale 1 (the q/k norms
 * carry it), V normed without a weight, sandwich norms stored as w (not
 * 1 + w), GeGLU, the embedding times sqrt(hidden), layer_scalar,
 * final_logit_softcapping; with enable_moe_block (26B-A4B) the routed
 * experts beside the dense MLP on every layer; per-layer embeddings
 * (hidden_size_per_layer_input), KV shared by the last
 * num_kv_shared_layers and use_double_wide_mlp (E2B / E4B). Refused by
 * name: per_layer_config, vocab_size_per_layer_input other than
 * vocab_size, MoE together with the E2B / E4B features.
 */
static int parse_gemma4(struct cfgp *p, struct kv_model_config *c)
{
	const char *pre = p->tprefix;
	int ghd, gkv, moe = 0, rc;
	json_t *v;
	if ((rc = parse_act(p, c, "gelu_pytorch_tanh")) ||
	    (rc = get_int(p, p->text, pre, "sliding_window", 512, 0, 1 << 30, &c->sliding_window)) ||
	    (rc = get_int(p, p->text, pre, "global_head_dim", c->head_dim, 1, CFG_MAX_HEAD_DIM, &ghd)) ||
	    (rc = get_int(p, p->text, pre, "num_global_key_value_heads", c->n_kv_heads, 1, CFG_MAX_HEADS, &gkv)) ||
	    (rc = get_bool(p, p->text, pre, "attention_k_eq_v", 0, &c->k_eq_v)) ||
	    (rc = get_num(p, p->text, pre, "final_logit_softcapping", 0, &c->final_softcap)) ||
	    (rc = refuse_true(p, "attention_bias", "attention biases")) ||
	    (rc = get_int(p, p->text, pre, "hidden_size_per_layer_input", 0, 0, CFG_MAX_DIM, &c->ple_dim)) ||
	    (rc = get_int(p, p->text, pre, "num_kv_shared_layers", 0, 0, c->n_layers - 1, &c->n_kv_shared)) ||
	    (rc = get_bool(p, p->text, pre, "use_double_wide_mlp", 0, &c->double_wide)) ||
	    (rc = get_bool(p, p->text, pre, "enable_moe_block", 0, &moe)))
		return rc;
	if (c->ple_dim) {
		int vp;
		if ((rc = get_int(p, p->text, pre, "vocab_size_per_layer_input", c->vocab, 1, CFG_MAX_VOCAB, &vp)))
			return rc;
		if (vp != c->vocab)
			return kv_fail(KV_ERR_UNSUPPORTED, "%s: %svocab_size_per_layer_input %d: kvkeep runs per-layer "
				       "embeddings over the whole vocabulary (%d)", p->what, pre, vp, c->vocab);
	}
	if (!c->n_kv_shared)
		c->double_wide = 0; /* it widens only the KV-shared layers */
	if (moe) {
		/* 26B-A4B: every layer has the dense MLP and, beside it, the
		 * routed experts (softmax, top k renormalised, GeGLU experts from
		 * a fused gate_up stack, a per-expert output scale) */
		int E, k, I;
		const char *ek = json_object_get(p->text, "num_experts") ? "num_experts" : "num_local_experts";
		const char *kk = json_object_get(p->text, "top_k_experts") ? "top_k_experts" : "num_experts_per_tok";
		const char *ik = json_object_get(p->text, "moe_intermediate_size") ? "moe_intermediate_size"
										    : "expert_intermediate_size";
		if ((rc = get_int(p, p->text, pre, ek, 128, 1, 1 << 16, &E)) ||
		    (rc = get_int(p, p->text, pre, kk, 8, 1, 1 << 16, &k)) ||
		    (rc = get_int(p, p->text, pre, ik, 704, 1, CFG_MAX_DIM, &I)))
			return rc;
		if (k > E)
			return kv_fail(KV_ERR_INVALID, "%s: %s%s %d is more than %s %d", p->what, pre, kk, k, ek, E);
		c->n_experts = E;
		c->n_experts_per_tok = k;
		c->moe_intermediate = I;
		c->norm_topk_prob = 1;
		c->moe_kind = KV_MOE_GEMMA4;
		c->expert_layout = KV_EXPERTS_STACKED;
		c->n_moe_layers = c->n_layers;
		for (int l = 0; l < c->n_layers; l++)
			c->layer_moe[l] = 1;
	}
	if (moe && (c->ple_dim || c->n_kv_shared))
		return kv_fail(KV_ERR_UNSUPPORTED, "%s: %senable_moe_block with per-layer embeddings or shared KV "
			       "layers is not a Gemma 4 release kvkeep runs", p->what, pre);
	v = json_object_get(p->text, "per_layer_config");
	if (v && !json_is_null(v))
		return kv_fail(KV_ERR_UNSUPPORTED, "%s: %sper_layer_config: per-layer attention geometry is not run by "
			       "kvkeep (global_head_dim and num_global_key_value_heads are)", p->what, pre);
	if (c->n_heads % gkv)
		return kv_fail(KV_ERR_INVALID, "%s: %snum_global_key_value_heads %d does not divide "
			       "num_attention_heads %d", p->what, pre, gkv, c->n_heads);
	if (c->final_softcap < 0)
		return kv_fail(KV_ERR_INVALID, "%s: %sfinal_logit_softcapping must not be negative", p->what, pre);
	if (c->rope_scaling != KV_ROPE_NONE)
		return kv_fail(KV_ERR_UNSUPPORTED, "%s: %srope scaling on Gemma 4's global layers is not supported",
			       p->what, pre);
	/* the sliding layers' RoPE: its own theta, the whole head */
	json_t *rp = json_object_get(p->text, "rope_parameters");
	json_t *sl = json_is_object(rp) ? json_object_get(rp, "sliding_attention") : NULL;
	if (json_is_object(sl)) {
		double pr = 1.0;
		const char *t = NULL;
		if ((rc = get_num(p, sl, "rope_parameters.sliding_attention.", "partial_rotary_factor", 1.0, &pr)))
			return rc;
		json_t *tv = json_object_get(sl, "rope_type");
		if (tv && !json_is_null(tv) && (!(t = json_string_value(tv)) || strcmp(t, "default")))
			return kv_fail(KV_ERR_UNSUPPORTED, "%s: %srope_parameters.sliding_attention.rope_type must be "
				       "'default'", p->what, pre);
		if (pr != 1.0)
			return kv_fail(KV_ERR_UNSUPPORTED, "%s: %srope_parameters.sliding_attention.partial_rotary_factor "
				       "%g: the sliding layers rotate their whole head", p->what, pre, pr);
	}
	c->rope_local_theta = p->local_theta > 0 ? p->local_theta : 10000.0;
	c->swa_head_dim = c->head_dim;
	c->swa_kv_heads = c->n_kv_heads;
	c->local_rotary_dim = c->head_dim;
	c->head_dim = ghd;
	c->n_kv_heads = gkv;
	c->rotary_dim = ghd;
	c->rope_rot_pairs = (int)((double)ghd * c->partial_rotary / 2.0);
	if (ghd & 1 || c->swa_head_dim & 1 || c->rope_rot_pairs < 1)
		return kv_fail(KV_ERR_INVALID, "%s: %sglobal_head_dim %d, head_dim %d must be even and "
			       "partial_rotary_factor %g rotate at least one pair", p->what, pre, ghd, c->swa_head_dim,
			       c->partial_rotary);
	c->attn_scale = 1.0;
	c->sandwich_norm = 1;
	c->embed_scale = 1;
	c->v_norm = 1;
	c->layer_scalar = 1;
	return KV_OK;
}

/*
 * llama, gemma3 and gpt_oss after the shared fields (vocab, sizes, heads,
 * RoPE): their attention variant, windows, MLP or MoE, norms.
 */
static int parse_window_family(struct cfgp *p, struct kv_model_config *c)
{
	const char *pre = p->tprefix, *s;
	json_t *v;
	int rc;

	if (c->arch == KV_ARCH_LLAMA) {
		if ((rc = parse_act(p, c, "silu")) || (rc = refuse_true(p, "attention_bias", "attention biases")) ||
		    (rc = refuse_true(p, "mlp_bias", "MLP biases")))
			return rc;
		if (c->mlp_act != KV_ACT_SILU)
			return kv_fail(KV_ERR_UNSUPPORTED, "%s: %shidden_act: llama runs silu", p->what, pre);
	} else if (c->arch == KV_ARCH_GEMMA3) {
		double qpas = 256;
		if ((rc = parse_act(p, c, "gelu_pytorch_tanh")) ||
		    (rc = get_int(p, p->text, pre, "sliding_window", 4096, 0, 1 << 30, &c->sliding_window)) ||
		    (rc = get_num(p, p->text, pre, "query_pre_attn_scalar", 256, &qpas)) ||
		    (rc = get_num(p, p->text, pre, "rope_local_base_freq", p->local_theta > 0 ? p->local_theta : 10000,
				  &c->rope_local_theta)) ||
		    (rc = get_num(p, p->text, pre, "final_logit_softcapping", 0, &c->final_softcap)) ||
		    (rc = refuse_true(p, "attention_bias", "attention biases")))
			return rc;
		v = json_object_get(p->text, "attn_logit_softcapping");
		if (v && !json_is_null(v))
			return kv_fail(KV_ERR_UNSUPPORTED, "%s: %sattn_logit_softcapping (Gemma 2's) is not supported",
				       p->what, pre);
		if (!(qpas > 0) || !(c->rope_local_theta > 0) || c->final_softcap < 0)
			return kv_fail(KV_ERR_INVALID, "%s: %squery_pre_attn_scalar, rope_local_base_freq and "
				       "final_logit_softcapping must be positive", p->what, pre);
		c->attn_scale = 1.0 / sqrt(qpas);
		c->sandwich_norm = 1;
		c->embed_scale = 1;
	} else if (c->arch == KV_ARCH_GEMMA4) {
		if ((rc = parse_gemma4(p, c)))
			return rc;
	} else {
		int bias = 1;
		if ((rc = get_int(p, p->text, pre, "sliding_window", 128, 0, 1 << 30, &c->sliding_window)) ||
		    (rc = get_bool(p, p->text, pre, "attention_bias", 1, &bias)) ||
		    (rc = get_num(p, p->text, pre, "swiglu_limit", 7.0, &c->swiglu_limit)))
			return rc;
		if (!bias)
			return kv_fail(KV_ERR_UNSUPPORTED, "%s: %sattention_bias false: gpt_oss projections carry biases",
				       p->what, pre);
		if (!(c->swiglu_limit > 0))
			return kv_fail(KV_ERR_INVALID, "%s: %sswiglu_limit must be positive", p->what, pre);
		c->attn_bias = c->attn_sinks = 1;
		c->moe_kind = KV_MOE_OAI;
		c->expert_layout = KV_EXPERTS_OAI_MXFP4;
		int k = 4;
		if ((rc = get_int(p, p->text, pre, "num_local_experts", 128, 1, 1 << 16, &c->n_experts)) ||
		    (rc = get_int(p, p->text, pre, "experts_per_token", 4, 1, 1 << 16, &k)) ||
		    (rc = get_int(p, p->text, pre, "num_experts_per_tok", k, 1, 1 << 16, &c->n_experts_per_tok)))
			return rc;
		if (c->n_experts_per_tok > c->n_experts)
			return kv_fail(KV_ERR_INVALID, "%s: %snum_experts_per_tok %d is more than num_local_experts %d",
				       p->what, pre, c->n_experts_per_tok, c->n_experts);
		c->moe_intermediate = c->intermediate;
		c->norm_topk_prob = 1;
		if (c->hidden % 32 || c->intermediate % 32)
			return kv_fail(KV_ERR_INVALID, "%s: %shidden_size %d and intermediate_size %d must be multiples of 32 "
				       "(MXFP4 expert blocks)", p->what, pre, c->hidden, c->intermediate);
	}
	if ((rc = parse_layer_types(p, c)))
		return rc;
	for (int l = 0; l < c->n_layers; l++)
		if (kv_config_kv_layer(c, l) < 0)
			return kv_fail(KV_ERR_INVALID, "%s: %snum_kv_shared_layers %d: layer %d (%s) has no earlier %s layer "
				       "to read the KV of", p->what, pre, c->n_kv_shared, l,
				       c->layer_window[l] ? "sliding" : "global", c->layer_window[l] ? "sliding" : "global");
	if (c->moe_kind == KV_MOE_OAI) {
		c->n_moe_layers = c->n_layers;
		for (int l = 0; l < c->n_layers; l++)
			c->layer_moe[l] = 1;
	}
	{
		json_t *o = text_or_root(p, "tie_word_embeddings", &s);
		if ((rc = get_bool(p, o, s, "tie_word_embeddings", c->arch == KV_ARCH_GEMMA3 || c->arch == KV_ARCH_GEMMA4,
				   &c->tie_embeddings)))
			return rc;
	}
	return parse_ids_dtype(p, c);
}

static int parse(struct cfgp *p, struct kv_model_config *c)
{
	const char *mt, *pre, *s;
	json_t *v, *arch;
	int rc, def_vocab, def_hidden, def_inter, def_layers, def_heads, def_kv, def_hd, moe = 0;

	memset(c, 0, sizeof *c);
	c->bos_id = -1;
	for (int i = 0; i < 8; i++)
		c->eos_ids[i] = -1;
	if (!json_is_object(p->root))
		return kv_fail(KV_ERR_INVALID, "%s: not a JSON object", p->what);
	v = json_object_get(p->root, "model_type");
	if (!v)
		return kv_fail(KV_ERR_INVALID, "%s: model_type missing", p->what);
	if (!(mt = json_string_value(v)))
		return kv_fail(KV_ERR_INVALID, "%s: model_type must be a string", p->what);
	snprintf(c->model_type, sizeof c->model_type, "%s", mt);
	p->text = p->root;
	p->tprefix = "";
	if (kv_config_is_ssm_type(mt)) /* the Mamba-2 hybrids: config_ssm.c */
		return kv_config_parse_ssm(p->root, p->what, c);
	if (!strcmp(mt, "qwen3")) {
		c->arch = KV_ARCH_QWEN3;
		def_vocab = 151936, def_hidden = 4096, def_inter = 22016, def_layers = 32, def_heads = 32;
		def_kv = -1, def_hd = 128;
	} else if (!strcmp(mt, "qwen3_5") || !strcmp(mt, "qwen3_5_text") || !strcmp(mt, "qwen3_5_moe") ||
		   !strcmp(mt, "qwen3_5_moe_text")) {
		c->arch = KV_ARCH_QWEN3_5;
		moe = !strncmp(mt, "qwen3_5_moe", 11);
		def_vocab = 248320, def_hidden = 4096, def_inter = 12288, def_layers = 32, def_heads = 16;
		def_kv = 4, def_hd = 256;
		if (moe) /* Qwen3_5MoeTextConfig; it has no dense MLP (intermediate_size unused) */
			def_hidden = 2048, def_inter = 512, def_layers = 40, def_kv = 2;
		v = json_object_get(p->root, "text_config");
		if (v && !json_is_null(v)) {
			if (!json_is_object(v))
				return kv_fail(KV_ERR_INVALID, "%s: text_config must be an object", p->what);
			p->text = v;
			p->tprefix = "text_config.";
			c->text_nested = 1;
		}
	} else if (!strcmp(mt, "qwen3_next")) {
		c->arch = KV_ARCH_QWEN3_NEXT;
		c->fused_deltanet = 1;
		def_vocab = 151936, def_hidden = 2048, def_inter = 5632, def_layers = 48, def_heads = 16;
		def_kv = 2, def_hd = 256;
	} else if (!strcmp(mt, "llama")) {
		/* LlamaConfig: head_dim = hidden / heads unless given */
		c->arch = KV_ARCH_LLAMA;
		def_vocab = 32000, def_hidden = 4096, def_inter = 11008, def_layers = 32, def_heads = 32;
		def_kv = -1, def_hd = -1;
	} else if (!strcmp(mt, "gemma3_text") || !strcmp(mt, "gemma3")) {
		/* Gemma3TextConfig; "gemma3" nests it under text_config */
		c->arch = KV_ARCH_GEMMA3;
		def_vocab = 262208, def_hidden = 2304, def_inter = 9216, def_layers = 26, def_heads = 8;
		def_kv = 4, def_hd = 256;
		v = json_object_get(p->root, "text_config");
		if (!strcmp(mt, "gemma3") && v && !json_is_null(v)) {
			if (!json_is_object(v))
				return kv_fail(KV_ERR_INVALID, "%s: text_config must be an object", p->what);
			p->text = v;
			p->tprefix = "text_config.";
			c->text_nested = 1;
		}
	} else if (!strcmp(mt, "gpt_oss")) {
		c->arch = KV_ARCH_GPT_OSS; /* GptOssConfig */
		def_vocab = 201088, def_hidden = 2880, def_inter = 2880, def_layers = 36, def_heads = 64;
		def_kv = 8, def_hd = 64;
	} else if (!strcmp(mt, "gemma4") || !strcmp(mt, "gemma4_text")) {
		/* Gemma4TextConfig; "gemma4" nests it under text_config */
		c->arch = KV_ARCH_GEMMA4;
		def_vocab = 262144, def_hidden = 2304, def_inter = 9216, def_layers = 30, def_heads = 8;
		def_kv = 4, def_hd = 256;
		v = json_object_get(p->root, "text_config");
		if (!strcmp(mt, "gemma4") && v && !json_is_null(v)) {
			if (!json_is_object(v))
				return kv_fail(KV_ERR_INVALID, "%s: text_config must be an object", p->what);
			p->text = v;
			p->tprefix = "text_config.";
			c->text_nested = 1;
		}
	} else if (strstr(mt, "moe")) {
		return kv_fail(KV_ERR_UNSUPPORTED, "%s: model_type '%s': mixture-of-experts models are not supported",
			       p->what, mt);
	} else {
		return kv_fail(KV_ERR_UNSUPPORTED,
			       "%s: model_type '%s' is not supported (supported: qwen3, qwen3_5, qwen3_5_moe, qwen3_next, "
			       "llama, gemma3, gemma3_text, gpt_oss, granitemoehybrid, nemotron_h)",
			       p->what,
			       mt);
	}
	c->hybrid = c->arch == KV_ARCH_QWEN3_5 || c->arch == KV_ARCH_QWEN3_NEXT;
	c->attn_output_gate = c->hybrid;
	c->norm_plus_one = c->hybrid || c->arch == KV_ARCH_GEMMA3;
	c->qk_norm = c->arch == KV_ARCH_QWEN3 || c->hybrid || c->arch == KV_ARCH_GEMMA3 || c->arch == KV_ARCH_GEMMA4;
	if (c->hybrid && (rc = get_int(p, p->text, p->tprefix, "mtp_num_hidden_layers", 0, 0, 8, &c->n_mtp_layers)))
		return rc;
	pre = p->tprefix;
	arch = json_object_get(p->root, "architectures");
	if (json_is_array(arch) && json_is_string(json_array_get(arch, 0)))
		snprintf(c->architecture, sizeof c->architecture, "%s", json_string_value(json_array_get(arch, 0)));

	if ((rc = get_int(p, p->text, pre, "vocab_size", def_vocab, 1, CFG_MAX_VOCAB, &c->vocab)) ||
	    (rc = get_int(p, p->text, pre, "hidden_size", def_hidden, 1, CFG_MAX_DIM, &c->hidden)) ||
	    (rc = get_int(p, p->text, pre, "intermediate_size", def_inter, 1, CFG_MAX_DIM, &c->intermediate)) ||
	    (rc = get_int(p, p->text, pre, "num_hidden_layers", def_layers, 1, 1 << 20, &c->n_layers)) ||
	    (rc = get_int(p, p->text, pre, "num_attention_heads", def_heads, 1, CFG_MAX_HEADS, &c->n_heads)))
		return rc;
	if (c->n_layers > KV_MAX_LAYERS)
		return kv_fail(KV_ERR_UNSUPPORTED, "%s: %snum_hidden_layers %d is more than the %d supported", p->what,
			       pre, c->n_layers, KV_MAX_LAYERS);
	if (def_hd < 0) /* llama: hidden / heads */
		def_hd = c->hidden / c->n_heads > 0 ? c->hidden / c->n_heads : 1;
	if ((rc = get_int(p, p->text, pre, "num_key_value_heads", def_kv < 0 ? c->n_heads : def_kv, 1,
			  CFG_MAX_HEADS, &c->n_kv_heads)) ||
	    (rc = get_int(p, p->text, pre, "head_dim", def_hd, 1, CFG_MAX_HEAD_DIM, &c->head_dim)) ||
	    (rc = get_int(p, p->text, pre, "max_position_embeddings", 32768, 0, 1 << 30, &c->max_positions)) ||
	    (rc = get_num(p, p->text, pre, "rms_norm_eps", 1e-6, &c->rms_eps)))
		return rc;
	if (c->n_kv_heads > c->n_heads || c->n_heads % c->n_kv_heads)
		return kv_fail(KV_ERR_INVALID, "%s: %snum_key_value_heads %d does not divide num_attention_heads %d",
			       p->what, pre, c->n_kv_heads, c->n_heads);
	if (!(c->rms_eps > 0 && c->rms_eps < 1))
		return kv_fail(KV_ERR_INVALID, "%s: %srms_norm_eps %g must be in (0, 1)", p->what, pre, c->rms_eps);
	if ((rc = parse_rope(p, c, c->hybrid ? 0.25 : 1.0)))
		return rc;
	if (!c->hybrid && c->arch != KV_ARCH_GEMMA4 && c->partial_rotary != 1.0)
		return kv_fail(KV_ERR_UNSUPPORTED, "%s: %spartial_rotary_factor %g: %s rotates all of head_dim",
			       p->what, pre, c->partial_rotary, c->model_type);
	c->rope_local_theta = c->rope_theta;
	if (kv_arch_window_family(c->arch))
		return parse_window_family(p, c);

	/* Features the engine does not implement. */
	{
		int bias = 0;
		json_t *o = text_or_root(p, "tie_word_embeddings", &s);
		if ((rc = get_bool(p, o, s, "tie_word_embeddings", 0, &c->tie_embeddings)) ||
		    (rc = get_bool(p, p->text, pre, "attention_bias", 0, &bias)))
			return rc;
		if (bias)
			return kv_fail(KV_ERR_UNSUPPORTED, "%s: %sattention_bias true is not supported", p->what, pre);
		if (!kv_json_get_str(p->text, "hidden_act", "silu", &s, p->what) && s && strcmp(s, "silu"))
			return kv_fail(KV_ERR_UNSUPPORTED, "%s: %shidden_act '%s' is not supported (only silu)", p->what,
				       pre, s);
		v = json_object_get(p->text, "hidden_act");
		if (v && !json_is_null(v) && !json_is_string(v))
			return kv_fail(KV_ERR_INVALID, "%s: %shidden_act must be a string", p->what, pre);
	}

	if (c->hybrid) {
		if ((rc = get_int(p, p->text, pre, "linear_num_key_heads", 16, 1, CFG_MAX_HEADS, &c->lin_k_heads)) ||
		    (rc = get_int(p, p->text, pre, "linear_num_value_heads", 32, 1, CFG_MAX_HEADS, &c->lin_v_heads)) ||
		    (rc = get_int(p, p->text, pre, "linear_key_head_dim", 128, 1, CFG_MAX_HEAD_DIM, &c->lin_k_dim)) ||
		    (rc = get_int(p, p->text, pre, "linear_value_head_dim", 128, 1, CFG_MAX_HEAD_DIM, &c->lin_v_dim)) ||
		    (rc = get_int(p, p->text, pre, "linear_conv_kernel_dim", 4, 1, CFG_MAX_KERNEL, &c->conv_kernel)))
			return rc;
		if (c->lin_v_heads % c->lin_k_heads)
			return kv_fail(KV_ERR_INVALID,
				       "%s: %slinear_num_key_heads %d does not divide linear_num_value_heads %d", p->what,
				       pre, c->lin_k_heads, c->lin_v_heads);
	}
	if ((rc = parse_layer_types(p, c)))
		return rc;
	if (c->arch == KV_ARCH_QWEN3_NEXT && (rc = parse_moe(p, c, 0, 512, 10)))
		return rc;
	if (moe && (rc = parse_moe(p, c, 1, 256, 8)))
		return rc;
	if (c->arch == KV_ARCH_QWEN3_5 && !moe && json_object_get(p->text, "num_experts") &&
	    json_integer_value(json_object_get(p->text, "num_experts")) > 0)
		return kv_fail(KV_ERR_UNSUPPORTED,
			       "%s: %snum_experts: a qwen3_5 config with experts must say model_type qwen3_5_moe",
			       p->what, pre);

	return parse_ids_dtype(p, c);
}

int kv_config_parse(const char *text, size_t len, const char *what, struct kv_model_config *out)
{
	struct cfgp p = {what ? what : "config.json", NULL, NULL, "", 0};
	char *relaxed = NULL;
	size_t rlen = 0;
	int rc = kv_config_json_relax(text, len, &relaxed, &rlen); /* Python's bare Infinity */
	if (!rc)
		rc = kv_json_parse(p.what, relaxed ? relaxed : text, relaxed ? rlen : len, KV_JSON_MAX_DEPTH, &p.root);
	free(relaxed);
	if (rc) {
		memset(out, 0, sizeof *out);
		return rc;
	}
	rc = parse(&p, out);
	json_decref(p.root);
	return rc;
}

/* --- derived numbers ----------------------------------------------------- */

uint64_t kv_config_conv_dim(const struct kv_model_config *c)
{
	if (c->ssm)
		return kv_config_ssm_conv_dim(c);
	if (!c->hybrid)
		return 0;
	return 2ull * (uint64_t)c->lin_k_heads * (uint64_t)c->lin_k_dim +
	       (uint64_t)c->lin_v_heads * (uint64_t)c->lin_v_dim;
}

uint64_t kv_config_kv_bytes_per_token(const struct kv_model_config *c, int elem_bytes)
{
	return (uint64_t)kv_config_kv_layers(c, 0) * 2 * (uint64_t)c->n_kv_heads * (uint64_t)c->head_dim *
	       (uint64_t)elem_bytes;
}

uint64_t kv_config_window_bytes(const struct kv_model_config *c, int elem_bytes)
{
	if (!c->n_swa_layers || c->sliding_window < 1)
		return 0;
	return (uint64_t)kv_config_kv_layers(c, 1) * 2 * (uint64_t)kv_config_swa_kv_heads(c) *
	       (uint64_t)kv_config_swa_head_dim(c) *
	       (uint64_t)(c->sliding_window - 1) * (uint64_t)elem_bytes;
}

uint64_t kv_config_recurrent_state_bytes(const struct kv_model_config *c)
{
	if (c->ssm) /* S [H][P][N] */
		return (uint64_t)c->ssm_heads * (uint64_t)c->ssm_head_dim * (uint64_t)c->ssm_state * 4;
	if (!c->hybrid)
		return 0;
	return (uint64_t)c->lin_v_heads * (uint64_t)c->lin_k_dim * (uint64_t)c->lin_v_dim * 4;
}

uint64_t kv_config_conv_state_bytes(const struct kv_model_config *c)
{
	if (!c->hybrid && !c->ssm)
		return 0;
	return kv_config_conv_dim(c) * (uint64_t)(c->conv_kernel - 1) * 4;
}

const char *kv_arch_name(int arch)
{
	switch (arch) {
	case KV_ARCH_QWEN3: return "qwen3";
	case KV_ARCH_QWEN3_5: return "qwen3_5";
	case KV_ARCH_QWEN3_NEXT: return "qwen3_next";
	case KV_ARCH_LLAMA: return "llama";
	case KV_ARCH_GEMMA3: return "gemma3";
	case KV_ARCH_GPT_OSS: return "gpt_oss";
	case KV_ARCH_GEMMA4: return "gemma4";
	case KV_ARCH_GRANITE_HYBRID: return "granitemoehybrid";
	case KV_ARCH_NEMOTRON_H: return "nemotron_h";
	}
	return "unknown";
}

const char *kv_config_default_prefix(const struct kv_model_config *c)
{
	if (c->ssm)
		return kv_config_ssm_prefix(c);
	return c->text_nested ? "model.language_model." : "model.";
}

/* --- tensor table -------------------------------------------------------- */

/* The sparse MoE block of layer l (docs/models.md, kv_expert_layout). */
static void moe_specs(struct kv_tspecs *s, const struct kv_model_config *c, const char *p, int l)
{
	const int64_t H = c->hidden, E = c->n_experts, I = c->moe_intermediate, Is = c->shared_intermediate;
	kv_tspec(s, l, KV_ROLE_ROUTER, 2, E, H, 0, "%slayers.%d.mlp.gate.weight", p, l);
	if (c->expert_layout == KV_EXPERTS_STACKED) {
		kv_tspec(s, l, KV_ROLE_LINEAR, 3, E, 2 * I, H, "%slayers.%d.mlp.experts.gate_up_proj", p, l);
		kv_tspec(s, l, KV_ROLE_LINEAR_OUT, 3, E, H, I, "%slayers.%d.mlp.experts.down_proj", p, l);
	} else if (c->expert_layout == KV_EXPERTS_SWITCH) {
		kv_tspec(s, l, KV_ROLE_LINEAR, 3, E, I, H, "%slayers.%d.mlp.switch_mlp.gate_proj.weight", p, l);
		kv_tspec(s, l, KV_ROLE_LINEAR, 3, E, I, H, "%slayers.%d.mlp.switch_mlp.up_proj.weight", p, l);
		kv_tspec(s, l, KV_ROLE_LINEAR_OUT, 3, E, H, I, "%slayers.%d.mlp.switch_mlp.down_proj.weight", p, l);
	} else {
		for (int e = 0; e < E && !s->oom; e++) {
			kv_tspec(s, l, KV_ROLE_LINEAR, 2, I, H, 0, "%slayers.%d.mlp.experts.%d.gate_proj.weight", p, l, e);
			s->v[s->n - 1].expert = e;
			kv_tspec(s, l, KV_ROLE_LINEAR, 2, I, H, 0, "%slayers.%d.mlp.experts.%d.up_proj.weight", p, l, e);
			s->v[s->n - 1].expert = e;
			kv_tspec(s, l, KV_ROLE_LINEAR_OUT, 2, H, I, 0, "%slayers.%d.mlp.experts.%d.down_proj.weight", p, l, e);
			s->v[s->n - 1].expert = e;
		}
	}
	kv_tspec(s, l, KV_ROLE_LINEAR, 2, Is, H, 0, "%slayers.%d.mlp.shared_expert.gate_proj.weight", p, l);
	kv_tspec(s, l, KV_ROLE_LINEAR, 2, Is, H, 0, "%slayers.%d.mlp.shared_expert.up_proj.weight", p, l);
	kv_tspec(s, l, KV_ROLE_LINEAR_OUT, 2, H, Is, 0, "%slayers.%d.mlp.shared_expert.down_proj.weight", p, l);
	kv_tspec(s, l, KV_ROLE_LINEAR, 2, 1, H, 0, "%slayers.%d.mlp.shared_expert_gate.weight", p, l);
}

/* gpt_oss's MoE block of layer l: router with bias, experts with biases
 * (kv_expert_layout: the MXFP4 release or switch_mlp stacks). */
static void oai_moe_specs(struct kv_tspecs *s, const struct kv_model_config *c, const char *p, int l)
{
	const int64_t D = c->hidden, E = c->n_experts, I = c->moe_intermediate;
	kv_tspec(s, l, KV_ROLE_ROUTER, 2, E, D, 0, "%slayers.%d.mlp.router.weight", p, l);
	kv_tspec(s, l, KV_ROLE_BIAS, 1, E, 0, 0, "%slayers.%d.mlp.router.bias", p, l);
	if (c->expert_layout == KV_EXPERTS_SWITCH) {
		static const char *const nm[3] = {"gate_proj", "up_proj", "down_proj"};
		for (int j = 0; j < 3; j++) {
			int64_t r = j == 2 ? D : I, k = j == 2 ? I : D;
			kv_tspec(s, l, j == 2 ? KV_ROLE_LINEAR_OUT : KV_ROLE_LINEAR, 3, E, r, k,
			         "%slayers.%d.mlp.switch_mlp.%s.weight", p, l, nm[j]);
			kv_tspec(s, l, KV_ROLE_BIAS, 2, E, r, 0, "%slayers.%d.mlp.switch_mlp.%s.bias", p, l, nm[j]);
		}
		return;
	}
	/* the release: U8 codes [E, rows, cols / 32, 16] and E8M0 scales */
	kv_tspec(s, l, KV_ROLE_MXFP4_BLOCKS, 4, E, 2 * I, D / 32, "%slayers.%d.mlp.experts.gate_up_proj_blocks", p, l);
	s->v[s->n - 1].shape[3] = 16;
	kv_tspec(s, l, KV_ROLE_MXFP4_SCALES, 3, E, 2 * I, D / 32, "%slayers.%d.mlp.experts.gate_up_proj_scales", p, l);
	kv_tspec(s, l, KV_ROLE_BIAS, 2, E, 2 * I, 0, "%slayers.%d.mlp.experts.gate_up_proj_bias", p, l);
	kv_tspec(s, l, KV_ROLE_MXFP4_BLOCKS, 4, E, D, I / 32, "%slayers.%d.mlp.experts.down_proj_blocks", p, l);
	s->v[s->n - 1].shape[3] = 16;
	kv_tspec(s, l, KV_ROLE_MXFP4_SCALES, 3, E, D, I / 32, "%slayers.%d.mlp.experts.down_proj_scales", p, l);
	kv_tspec(s, l, KV_ROLE_BIAS, 2, E, D, 0, "%slayers.%d.mlp.experts.down_proj_bias", p, l);
}

/* llama, gemma3, gpt_oss layer l (config.h lists the names). */
static void window_family_specs(struct kv_tspecs *s, const struct kv_model_config *c, const char *p, int l)
{
	const int64_t H = c->hidden, hd = kv_config_layer_head_dim(c, l), nh = c->n_heads,
		      nkv = kv_config_layer_kv_heads(c, l), I = kv_config_layer_intermediate(c, l);
	const int own_kv = kv_config_kv_layer(c, l) == l; /* gemma4's shared layers: q alone */
	const int norm = c->norm_plus_one ? KV_ROLE_NORM_OFFSET : KV_ROLE_NORM;
	static const char *const qkv[3] = {"q_proj", "k_proj", "v_proj"};
	kv_tspec(s, l, norm, 1, H, 0, 0, "%slayers.%d.input_layernorm.weight", p, l);
	if (c->layer_scalar)
		kv_tspec(s, l, KV_ROLE_NORM, 1, 1, 0, 0, "%slayers.%d.layer_scalar", p, l);
	for (int j = 0; j < 3; j++) {
		int64_t rows = (j ? nkv : nh) * hd;
		if ((j == 2 && kv_config_layer_v_is_k(c, l)) || (j && !own_kv))
			continue; /* gemma4 attention_k_eq_v: V is k_proj's output */
		kv_tspec(s, l, KV_ROLE_LINEAR, 2, rows, H, 0, "%slayers.%d.self_attn.%s.weight", p, l, qkv[j]);
		if (c->attn_bias)
			kv_tspec(s, l, KV_ROLE_BIAS, 1, rows, 0, 0, "%slayers.%d.self_attn.%s.bias", p, l, qkv[j]);
	}
	kv_tspec(s, l, KV_ROLE_LINEAR_OUT, 2, H, nh * hd, 0, "%slayers.%d.self_attn.o_proj.weight", p, l);
	if (c->attn_bias)
		kv_tspec(s, l, KV_ROLE_BIAS, 1, H, 0, 0, "%slayers.%d.self_attn.o_proj.bias", p, l);
	if (c->attn_sinks)
		kv_tspec(s, l, KV_ROLE_SINKS, 1, nh, 0, 0, "%slayers.%d.self_attn.sinks", p, l);
	if (c->qk_norm) {
		kv_tspec(s, l, norm, 1, hd, 0, 0, "%slayers.%d.self_attn.q_norm.weight", p, l);
		if (own_kv)
			kv_tspec(s, l, norm, 1, hd, 0, 0, "%slayers.%d.self_attn.k_norm.weight", p, l);
	}
	if (c->ple_dim) { /* gemma4's per-layer embedding block */
		kv_tspec(s, l, KV_ROLE_LINEAR, 2, c->ple_dim, H, 0, "%slayers.%d.per_layer_input_gate.weight", p, l);
		kv_tspec(s, l, KV_ROLE_LINEAR_OUT, 2, H, c->ple_dim, 0, "%slayers.%d.per_layer_projection.weight", p, l);
		kv_tspec(s, l, norm, 1, H, 0, 0, "%slayers.%d.post_per_layer_input_norm.weight", p, l);
	}
	kv_tspec(s, l, norm, 1, H, 0, 0, "%slayers.%d.post_attention_layernorm.weight", p, l);
	if (c->sandwich_norm) {
		kv_tspec(s, l, norm, 1, H, 0, 0, "%slayers.%d.pre_feedforward_layernorm.weight", p, l);
		kv_tspec(s, l, norm, 1, H, 0, 0, "%slayers.%d.post_feedforward_layernorm.weight", p, l);
	}
	if (c->layer_moe[l] && c->moe_kind == KV_MOE_OAI) {
		oai_moe_specs(s, c, p, l);
		return;
	}
	kv_tspec(s, l, KV_ROLE_LINEAR, 2, I, H, 0, "%slayers.%d.mlp.gate_proj.weight", p, l);
	kv_tspec(s, l, KV_ROLE_LINEAR, 2, I, H, 0, "%slayers.%d.mlp.up_proj.weight", p, l);
	kv_tspec(s, l, KV_ROLE_LINEAR_OUT, 2, H, I, 0, "%slayers.%d.mlp.down_proj.weight", p, l);
	if (c->layer_moe[l] && c->moe_kind == KV_MOE_GEMMA4) {
		/* gemma4's experts beside the dense MLP, each branch with its own
		 * norms (post_feedforward_layernorm then norms their sum) */
		const int64_t E = c->n_experts, Ie = c->moe_intermediate;
		kv_tspec(s, l, norm, 1, H, 0, 0, "%slayers.%d.pre_feedforward_layernorm_2.weight", p, l);
		kv_tspec(s, l, norm, 1, H, 0, 0, "%slayers.%d.post_feedforward_layernorm_1.weight", p, l);
		kv_tspec(s, l, norm, 1, H, 0, 0, "%slayers.%d.post_feedforward_layernorm_2.weight", p, l);
		kv_tspec(s, l, KV_ROLE_ROUTER, 2, E, H, 0, "%slayers.%d.router.proj.weight", p, l);
		kv_tspec(s, l, KV_ROLE_NORM, 1, H, 0, 0, "%slayers.%d.router.scale", p, l);
		kv_tspec(s, l, KV_ROLE_NORM, 1, E, 0, 0, "%slayers.%d.router.per_expert_scale", p, l);
		kv_tspec(s, l, KV_ROLE_LINEAR, 3, E, 2 * Ie, H, "%slayers.%d.experts.gate_up_proj", p, l);
		kv_tspec(s, l, KV_ROLE_LINEAR_OUT, 3, E, H, Ie, "%slayers.%d.experts.down_proj", p, l);
	}
}

int kv_config_tensors(const struct kv_model_config *c, const char *prefix, struct kv_tensor_spec **out,
		      size_t *n)
{
	struct kv_tspecs s = {0};
	const char *p = prefix ? prefix : kv_config_default_prefix(c);
	const int64_t H = c->hidden, hd = c->head_dim, nh = c->n_heads, nkv = c->n_kv_heads, I = c->intermediate;
	const int64_t Hk = c->lin_k_heads, Hv = c->lin_v_heads, dk = c->lin_k_dim, dv = c->lin_v_dim;
	const int64_t conv = (int64_t)kv_config_conv_dim(c);
	const int norm = c->norm_plus_one ? KV_ROLE_NORM_OFFSET : KV_ROLE_NORM;

	*out = NULL;
	*n = 0;
	if (c->ssm)
		return kv_config_tensors_ssm(c, p, out, n);
	kv_tspec(&s, -1, KV_ROLE_EMBED, 2, c->vocab, H, 0, "%sembed_tokens.weight", p);
	if (c->ple_dim) { /* gemma4's per-layer embeddings: a table, its projection from x, a norm */
		const int64_t LP = (int64_t)c->n_layers * c->ple_dim;
		kv_tspec(&s, -1, KV_ROLE_LINEAR, 2, c->vocab, LP, 0, "%sembed_tokens_per_layer.weight", p);
		kv_tspec(&s, -1, KV_ROLE_LINEAR, 2, LP, H, 0, "%sper_layer_model_projection.weight", p);
		kv_tspec(&s, -1, norm, 1, c->ple_dim, 0, 0, "%sper_layer_projection_norm.weight", p);
	}
	for (int l = 0; l < c->n_layers; l++) {
		if (kv_arch_window_family(c->arch)) {
			window_family_specs(&s, c, p, l);
			continue;
		}
		kv_tspec(&s, l, norm, 1, H, 0, 0, "%slayers.%d.input_layernorm.weight", p, l);
		if (c->layer_type[l] == KV_LAYER_ATTN) {
			int64_t qout = nh * hd * (c->attn_output_gate ? 2 : 1);
			kv_tspec(&s, l, KV_ROLE_LINEAR, 2, qout, H, 0, "%slayers.%d.self_attn.q_proj.weight", p, l);
			kv_tspec(&s, l, KV_ROLE_LINEAR, 2, nkv * hd, H, 0, "%slayers.%d.self_attn.k_proj.weight", p, l);
			kv_tspec(&s, l, KV_ROLE_LINEAR, 2, nkv * hd, H, 0, "%slayers.%d.self_attn.v_proj.weight", p, l);
			kv_tspec(&s, l, KV_ROLE_LINEAR_OUT, 2, H, nh * hd, 0, "%slayers.%d.self_attn.o_proj.weight", p, l);
			kv_tspec(&s, l, norm, 1, hd, 0, 0, "%slayers.%d.self_attn.q_norm.weight", p, l);
			kv_tspec(&s, l, norm, 1, hd, 0, 0, "%slayers.%d.self_attn.k_norm.weight", p, l);
		} else {
			if (c->fused_deltanet) {
				kv_tspec(&s, l, KV_ROLE_LINEAR, 2, 2 * Hk * dk + 2 * Hv * dv, H, 0,
				         "%slayers.%d.linear_attn.in_proj_qkvz.weight", p, l);
				kv_tspec(&s, l, KV_ROLE_LINEAR, 2, 2 * Hv, H, 0, "%slayers.%d.linear_attn.in_proj_ba.weight", p,
				         l);
			} else {
				kv_tspec(&s, l, KV_ROLE_LINEAR, 2, 2 * Hk * dk + Hv * dv, H, 0,
				         "%slayers.%d.linear_attn.in_proj_qkv.weight", p, l);
				kv_tspec(&s, l, KV_ROLE_LINEAR, 2, Hv * dv, H, 0, "%slayers.%d.linear_attn.in_proj_z.weight", p,
				         l);
				kv_tspec(&s, l, KV_ROLE_LINEAR, 2, Hv, H, 0, "%slayers.%d.linear_attn.in_proj_b.weight", p, l);
				kv_tspec(&s, l, KV_ROLE_LINEAR_A, 2, Hv, H, 0, "%slayers.%d.linear_attn.in_proj_a.weight", p, l);
			}
			kv_tspec(&s, l, KV_ROLE_CONV, 3, conv, 1, c->conv_kernel, "%slayers.%d.linear_attn.conv1d.weight", p,
			         l);
			kv_tspec(&s, l, KV_ROLE_DT_BIAS, 1, Hv, 0, 0, "%slayers.%d.linear_attn.dt_bias", p, l);
			kv_tspec(&s, l, KV_ROLE_A_LOG, 1, Hv, 0, 0, "%slayers.%d.linear_attn.A_log", p, l);
			kv_tspec(&s, l, KV_ROLE_NORM, 1, dv, 0, 0, "%slayers.%d.linear_attn.norm.weight", p, l);
			kv_tspec(&s, l, KV_ROLE_LINEAR_OUT, 2, H, Hv * dv, 0, "%slayers.%d.linear_attn.out_proj.weight", p, l);
		}
		kv_tspec(&s, l, norm, 1, H, 0, 0, "%slayers.%d.post_attention_layernorm.weight", p, l);
		if (c->layer_moe[l]) {
			moe_specs(&s, c, p, l);
			continue;
		}
		kv_tspec(&s, l, KV_ROLE_LINEAR, 2, I, H, 0, "%slayers.%d.mlp.gate_proj.weight", p, l);
		kv_tspec(&s, l, KV_ROLE_LINEAR, 2, I, H, 0, "%slayers.%d.mlp.up_proj.weight", p, l);
		kv_tspec(&s, l, KV_ROLE_LINEAR_OUT, 2, H, I, 0, "%slayers.%d.mlp.down_proj.weight", p, l);
	}
	kv_tspec(&s, -1, norm, 1, H, 0, 0, "%snorm.weight", p);
	if (!c->tie_embeddings)
		kv_tspec(&s, -1, KV_ROLE_LM_HEAD, 2, c->vocab, H, 0, "lm_head.weight");
	return kv_tspec_finish(&s, out, n);
}

int kv_config_mtp_tensors(const struct kv_model_config *c, int moe, struct kv_tensor_spec **out, size_t *n)
{
	struct kv_tspecs s = {0};
	const char *p = "mtp.";
	const int64_t H = c->hidden, hd = c->head_dim, nh = c->n_heads, nkv = c->n_kv_heads, I = c->intermediate;
	const int norm = c->norm_plus_one ? KV_ROLE_NORM_OFFSET : KV_ROLE_NORM;

	*out = NULL;
	*n = 0;
	kv_tspec(&s, 0, KV_ROLE_LINEAR, 2, H, 2 * H, 0, "%sfc.weight", p);
	kv_tspec(&s, 0, norm, 1, H, 0, 0, "%spre_fc_norm_embedding.weight", p);
	kv_tspec(&s, 0, norm, 1, H, 0, 0, "%spre_fc_norm_hidden.weight", p);
	kv_tspec(&s, 0, norm, 1, H, 0, 0, "%slayers.%d.input_layernorm.weight", p, 0);
	kv_tspec(&s, 0, KV_ROLE_LINEAR, 2, nh * hd * (c->attn_output_gate ? 2 : 1), H, 0,
	         "%slayers.%d.self_attn.q_proj.weight", p, 0);
	kv_tspec(&s, 0, KV_ROLE_LINEAR, 2, nkv * hd, H, 0, "%slayers.%d.self_attn.k_proj.weight", p, 0);
	kv_tspec(&s, 0, KV_ROLE_LINEAR, 2, nkv * hd, H, 0, "%slayers.%d.self_attn.v_proj.weight", p, 0);
	kv_tspec(&s, 0, KV_ROLE_LINEAR_OUT, 2, H, nh * hd, 0, "%slayers.%d.self_attn.o_proj.weight", p, 0);
	kv_tspec(&s, 0, norm, 1, hd, 0, 0, "%slayers.%d.self_attn.q_norm.weight", p, 0);
	kv_tspec(&s, 0, norm, 1, hd, 0, 0, "%slayers.%d.self_attn.k_norm.weight", p, 0);
	kv_tspec(&s, 0, norm, 1, H, 0, 0, "%slayers.%d.post_attention_layernorm.weight", p, 0);
	if (moe) {
		moe_specs(&s, c, p, 0);
	} else {
		kv_tspec(&s, 0, KV_ROLE_LINEAR, 2, I, H, 0, "%slayers.%d.mlp.gate_proj.weight", p, 0);
		kv_tspec(&s, 0, KV_ROLE_LINEAR, 2, I, H, 0, "%slayers.%d.mlp.up_proj.weight", p, 0);
		kv_tspec(&s, 0, KV_ROLE_LINEAR_OUT, 2, H, I, 0, "%slayers.%d.mlp.down_proj.weight", p, 0);
	}
	kv_tspec(&s, 0, norm, 1, H, 0, 0, "%snorm.weight", p);
	for (size_t i = 0; i < s.n; i++) /* an incomplete list (oom) is refused below */
		s.v[i].layer = c->n_layers;
	return kv_tspec_finish(&s, out, n);
}

uint64_t kv_config_param_count(const struct kv_model_config *c)
{
	struct kv_tensor_spec *v;
	size_t n;
	uint64_t total = 0;
	if (kv_config_tensors(c, NULL, &v, &n))
		return 0;
	for (size_t i = 0; i < n; i++) {
		uint64_t e = 1;
		if (v[i].role == KV_ROLE_MXFP4_SCALES)
			continue; /* a block's scale is not a parameter */
		for (int d = 0; d < v[i].ndim; d++)
			e *= (uint64_t)v[i].shape[d];
		total += v[i].role == KV_ROLE_MXFP4_BLOCKS ? 2 * e : e; /* two 4-bit codes a byte */
	}
	free(v);
	return total;
}

uint64_t kv_config_active_param_count(const struct kv_model_config *c)
{
	uint64_t per_expert = 3ull * (uint64_t)c->moe_intermediate * (uint64_t)c->hidden;
	uint64_t unused = (uint64_t)(c->n_experts - c->n_experts_per_tok) * per_expert * (uint64_t)c->n_moe_layers;
	return kv_config_param_count(c) - unused;
}

const char *kv_config_lm_head_name(const char *prefix)
{
	return prefix && !strcmp(prefix, "language_model.model.") ? "language_model.lm_head.weight" : "lm_head.weight";
}
