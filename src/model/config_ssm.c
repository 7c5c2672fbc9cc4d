/*
 * config_ssm.c - config.json of the Mamba-2 hybrids, and their tensors.
 *
 *   granitemoehybrid  IBM Granite 4.0-H (GraniteMoeHybridForCausalLM):
 *               layer_types "mamba" / "attention"; every layer has an
 *               input norm, its mixer, a post-attention norm and an FFN:
 *               with num_local_experts > 0 a softmax top-k MoE
 *               (block_sparse_moe) plus an ungated shared expert
 *               (shared_mlp), else shared_mlp alone; embeddings x
 *               embedding_multiplier, each residual branch x
 *               residual_multiplier, attention scale attention_multiplier,
 *               logits / logits_scaling; position_embedding_type "nope"
 *               (no RoPE). The Mamba width is mamba_expand x hidden_size =
 *               mamba_n_heads x mamba_d_head.
 *   nemotron_h  NVIDIA Nemotron-H / Nemotron Nano 2 (NemotronHForCausalLM):
 *               hybrid_override_pattern, one character per layer: 'M' a
 *               Mamba-2 mixer, '*' attention (no RoPE), '-' an MLP
 *               down(relu(up h)^2); each layer is x + mixer(norm(x)). The
 *               Mamba width is mamba_num_heads x mamba_head_dim; the gated
 *               norm works in n_groups groups.
 *
 * The Mamba-2 mixer (docs/engine.md): in_proj -> [z (H P) | xBC (H P +
 * 2 G N) | dt (H)]; causal depthwise conv of kernel d_conv (+ bias) over
 * xBC, SiLU; x, B, C split; per head h (group h / (H / G)) the state S
 * [P][N] runs S = S exp(dt A) + dt x B^T, y = S C + D x with dt =
 * softplus(dt + dt_bias), A = -exp(A_log); gated RMSNorm of y * silu(z);
 * out_proj. Its state per layer is the conv's last d_conv - 1 inputs
 * [H P + 2 G N][d_conv - 1] and S [H][P][N], f32: the same two arrays as
 * a DeltaNet layer, so the prefix cache and the disk tier keep it under
 * the same rules (engine/layout.h).
 *
 * What the engine does not run is refused naming the field: RoPE on
 * granite attention, projection biases, attention biases, activations
 * other than silu / relu2, MoE layers of nemotron_h ('E'), a
 * time_step_limit other than (0, inf).
 */
#include "model/config_ssm.h"
#include "model/tspec.h"
#include "base/err.h"
#include "base/json.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DIM (1 << 20)
#define MAX_HEADS 4096

int kv_config_is_ssm_type(const char *mt)
{
	return mt && (!strcmp(mt, "granitemoehybrid") || !strcmp(mt, "nemotron_h"));
}

/* --- bare NaN / Infinity --------------------------------------------------- */

int kv_config_json_relax(const char *t, size_t n, char **out, size_t *out_len)
{
	static const char *const lits[] = {"-Infinity", "Infinity", "NaN"};
	size_t found = 0, cap = 0, o = 0;
	char *b = NULL;
	for (int pass = 0; pass < 2; pass++) {
		int in_str = 0, esc = 0;
		o = 0;
		for (size_t i = 0; i < n;) {
			char ch = t[i];
			size_t lit = 0;
			if (in_str) {
				if (esc)
					esc = 0;
				else if (ch == '\\')
					esc = 1;
				else if (ch == '"')
					in_str = 0;
			} else if (ch == '"') {
				in_str = 1;
			} else {
				for (int k = 0; k < 3 && !lit; k++) {
					size_t L = strlen(lits[k]);
					if (n - i >= L && !memcmp(t + i, lits[k], L))
						lit = L;
				}
			}
			if (lit) {
				/* written as "Infinity" / "-Infinity" / "NaN" */
				if (pass) {
					b[o] = '"';
					memcpy(b + o + 1, t + i, lit);
					b[o + 1 + lit] = '"';
				}
				o += lit + 2;
				i += lit;
				found++;
				continue;
			}
			if (pass)
				b[o] = ch;
			o++;
			i++;
		}
		if (!pass) {
			if (!found)
				return KV_OK;
			cap = o + 1;
			if (!(b = malloc(cap)))
				return kv_fail(KV_ERR_NOMEM, "out of memory");
		}
	}
	b[o] = 0;
	*out = b;
	*out_len = o;
	return KV_OK;
}

/* --- parsing ----------------------------------------------------------------- */

struct sp {
	const char *what;
	json_t *root;
};

static int geti(struct sp *p, const char *key, int64_t def, int64_t lo, int64_t hi, int *out)
{
	int64_t v;
	json_t *j = json_object_get(p->root, key);
	if (j && !json_is_null(j) && (!json_is_number(j) || (json_is_real(j) && !(fabs(json_real_value(j)) < 0x1p53))))
		return kv_fail(KV_ERR_INVALID, "%s: %s must be an integer", p->what, key);
	if (kv_json_get_int(p->root, key, def, &v, p->what))
		return kv_fail(KV_ERR_INVALID, "%s: %s must be an integer", p->what, key);
	if (v < lo || v > hi)
		return kv_fail(KV_ERR_INVALID, "%s: %s is %lld, must be in [%lld, %lld]", p->what, key, (long long)v,
			       (long long)lo, (long long)hi);
	*out = (int)v;
	return KV_OK;
}

static int getn(struct sp *p, const char *key, double def, double *out)
{
	if (kv_json_get_num(p->root, key, def, out, p->what) || !isfinite(*out))
		return kv_fail(KV_ERR_INVALID, "%s: %s must be a finite number", p->what, key);
	return KV_OK;
}

static int getb(struct sp *p, const char *key, int def, int *out)
{
	if (kv_json_get_bool(p->root, key, def, out, p->what))
		return kv_fail(KV_ERR_INVALID, "%s: %s must be true or false", p->what, key);
	return KV_OK;
}

/* A string field that must be one of the values the engine runs. */
static int gets_only(struct sp *p, const char *key, const char *def, const char *ok1, const char *ok2)
{
	const char *s = def;
	json_t *j = json_object_get(p->root, key);
	if (j && !json_is_null(j) && !json_is_string(j))
		return kv_fail(KV_ERR_INVALID, "%s: %s must be a string", p->what, key);
	if (j && json_is_string(j))
		s = json_string_value(j);
	if (s && strcmp(s, ok1) && (!ok2 || strcmp(s, ok2)))
		return kv_fail(KV_ERR_UNSUPPORTED, "%s: %s '%s' is not supported (only %s)", p->what, key, s, ok1);
	return KV_OK;
}

static int refuse_true(struct sp *p, const char *key, const char *why)
{
	int v = 0, rc;
	if ((rc = getb(p, key, 0, &v)))
		return rc;
	if (v)
		return kv_fail(KV_ERR_UNSUPPORTED, "%s: %s true is not supported (%s)", p->what, key, why);
	return KV_OK;
}

/* time_step_limit: absent, null, or (0, inf), as Hugging Face's default;
 * llama.cpp clamps nothing either. */
static int time_step_limit(struct sp *p)
{
	json_t *v = json_object_get(p->root, "time_step_limit"), *a, *b;
	if (!v || json_is_null(v))
		return KV_OK;
	if (!json_is_array(v) || json_array_size(v) != 2)
		return kv_fail(KV_ERR_INVALID, "%s: time_step_limit must be a pair", p->what);
	a = json_array_get(v, 0);
	b = json_array_get(v, 1);
	int lo0 = json_is_number(a) && json_number_value(a) == 0.0;
	int hiinf = json_is_string(b) && !strcmp(json_string_value(b), "Infinity");
	if (!lo0 || !hiinf)
		return kv_fail(KV_ERR_UNSUPPORTED, "%s: time_step_limit other than [0.0, Infinity] is not supported "
			       "(dt is not clamped)", p->what);
	return KV_OK;
}

static void count_layers(struct kv_model_config *c)
{
	c->n_attn_layers = c->n_deltanet_layers = c->n_ssm_layers = c->n_mlp_layers = 0;
	for (int l = 0; l < c->n_layers; l++) {
		if (c->layer_type[l] == KV_LAYER_ATTN)
			c->n_attn_layers++;
		else if (c->layer_type[l] == KV_LAYER_MAMBA)
			c->n_ssm_layers++;
		else
			c->n_mlp_layers++;
	}
}

static void common(struct sp *p, struct kv_model_config *c)
{
	json_t *arch = json_object_get(p->root, "architectures");
	if (json_is_array(arch) && json_is_string(json_array_get(arch, 0)))
		snprintf(c->architecture, sizeof c->architecture, "%s", json_string_value(json_array_get(arch, 0)));
	json_t *d = json_object_get(p->root, "torch_dtype");
	if (!json_is_string(d))
		d = json_object_get(p->root, "dtype");
	if (json_is_string(d))
		snprintf(c->torch_dtype, sizeof c->torch_dtype, "%s", json_string_value(d));
	c->ssm = 1;
	c->embed_mult = c->residual_mult = c->logits_div = 1.0;
	c->rope_theta = 10000;
	c->rope_factor = c->rope_attn_factor = 1.0;
}

static int ids(struct sp *p, struct kv_model_config *c)
{
	json_t *v = json_object_get(p->root, "eos_token_id"), *e;
	size_t i;
	int rc, bos;
	for (i = 0; i < 8; i++)
		c->eos_ids[i] = -1;
	c->n_eos = 0;
	if (json_is_integer(v)) {
		c->eos_ids[c->n_eos++] = (int)json_integer_value(v);
	} else if (json_is_array(v)) {
		json_array_foreach(v, i, e) {
			if (!json_is_integer(e))
				return kv_fail(KV_ERR_INVALID, "%s: eos_token_id[%zu] must be an integer", p->what, i);
			if (c->n_eos < 8)
				c->eos_ids[c->n_eos++] = (int)json_integer_value(e);
		}
	} else if (v && !json_is_null(v)) {
		return kv_fail(KV_ERR_INVALID, "%s: eos_token_id must be an integer or a list", p->what);
	}
	for (int k = 0; k < c->n_eos; k++)
		if (c->eos_ids[k] < 0 || c->eos_ids[k] >= c->vocab)
			return kv_fail(KV_ERR_INVALID, "%s: eos_token_id %d is outside the vocabulary", p->what,
				       c->eos_ids[k]);
	if ((rc = geti(p, "bos_token_id", -1, -1, c->vocab - 1, &bos)))
		return rc;
	c->bos_id = bos;
	return KV_OK;
}

/* The Mamba geometry both families share, after H, P, N, G, K are read. */
static int check_mamba(struct sp *p, struct kv_model_config *c)
{
	if (c->ssm_heads % c->ssm_groups)
		return kv_fail(KV_ERR_INVALID, "%s: the %d Mamba groups do not divide the %d Mamba heads", p->what,
			       c->ssm_groups, c->ssm_heads);
	if ((c->ssm_heads * c->ssm_head_dim) % c->ssm_norm_groups)
		return kv_fail(KV_ERR_INVALID, "%s: the %d norm groups do not divide the Mamba width %d", p->what,
			       c->ssm_norm_groups, c->ssm_heads * c->ssm_head_dim);
	if (c->conv_kernel < 2)
		return kv_fail(KV_ERR_INVALID, "%s: the Mamba conv kernel must be at least 2", p->what);
	return KV_OK;
}

static int parse_granite(struct sp *p, struct kv_model_config *c)
{
	int rc, expand, n_experts = 0, dh = 0;
	double am;
	json_t *lt = json_object_get(p->root, "layer_types"), *v;
	size_t i;
	c->arch = KV_ARCH_GRANITE_HYBRID;
	c->layer_ffn = 1;
	c->shared_ungated = 1;
	if ((rc = geti(p, "vocab_size", 32000, 1, 1 << 24, &c->vocab)) ||
	    (rc = geti(p, "hidden_size", 4096, 1, MAX_DIM, &c->hidden)) ||
	    (rc = geti(p, "intermediate_size", 11008, 1, MAX_DIM, &c->intermediate)) ||
	    (rc = geti(p, "num_hidden_layers", 32, 1, KV_MAX_LAYERS, &c->n_layers)) ||
	    (rc = geti(p, "num_attention_heads", 32, 1, MAX_HEADS, &c->n_heads)) ||
	    (rc = geti(p, "num_key_value_heads", c->n_heads, 1, MAX_HEADS, &c->n_kv_heads)) ||
	    (rc = geti(p, "max_position_embeddings", 2048, 0, 1 << 30, &c->max_positions)) ||
	    (rc = getn(p, "rms_norm_eps", 1e-6, &c->rms_eps)) ||
	    (rc = getb(p, "tie_word_embeddings", 0, &c->tie_embeddings)) ||
	    (rc = getn(p, "embedding_multiplier", 1.0, &c->embed_mult)) ||
	    (rc = getn(p, "residual_multiplier", 1.0, &c->residual_mult)) ||
	    (rc = getn(p, "logits_scaling", 1.0, &c->logits_div)) ||
	    (rc = getn(p, "attention_multiplier", 1.0, &am)) ||
	    (rc = geti(p, "num_local_experts", 8, 0, 1 << 16, &n_experts)) ||
	    (rc = geti(p, "shared_intermediate_size", 1024, 1, MAX_DIM, &c->shared_intermediate)) ||
	    (rc = geti(p, "mamba_n_heads", 128, 1, MAX_HEADS, &c->ssm_heads)) ||
	    (rc = geti(p, "mamba_n_groups", 1, 1, MAX_HEADS, &c->ssm_groups)) ||
	    (rc = geti(p, "mamba_d_state", 256, 1, 4096, &c->ssm_state)) ||
	    (rc = geti(p, "mamba_d_conv", 4, 1, 64, &c->conv_kernel)) ||
	    (rc = geti(p, "mamba_expand", 2, 1, 64, &expand)) ||
	    (rc = getb(p, "mamba_conv_bias", 1, &c->ssm_conv_bias)))
		return rc;
	/* mamba_d_head may be "auto": the width over the heads */
	v = json_object_get(p->root, "mamba_d_head");
	if (v && json_is_string(v) && !strcmp(json_string_value(v), "auto"))
		dh = expand * c->hidden / c->ssm_heads;
	else if ((rc = geti(p, "mamba_d_head", (int64_t)expand * c->hidden / c->ssm_heads, 1, 4096, &dh)))
		return rc;
	c->ssm_head_dim = dh;
	if ((int64_t)c->ssm_heads * dh != (int64_t)expand * c->hidden)
		return kv_fail(KV_ERR_INVALID, "%s: mamba_n_heads %d x mamba_d_head %d is not mamba_expand %d x "
			       "hidden_size %d", p->what, c->ssm_heads, dh, expand, c->hidden);
	c->ssm_norm_groups = 1; /* GraniteMoeHybridRMSNormGated: one norm over the whole width */
	if (c->n_heads % c->n_kv_heads)
		return kv_fail(KV_ERR_INVALID, "%s: num_key_value_heads %d does not divide num_attention_heads %d",
			       p->what, c->n_kv_heads, c->n_heads);
	if (c->hidden % c->n_heads)
		return kv_fail(KV_ERR_INVALID, "%s: num_attention_heads %d does not divide hidden_size %d", p->what,
			       c->n_heads, c->hidden);
	c->head_dim = c->hidden / c->n_heads; /* GraniteMoeHybridAttention */
	if (!(am > 0 && am < 1e3) || !(c->logits_div > 0) || !(c->rms_eps > 0 && c->rms_eps < 1))
		return kv_fail(KV_ERR_INVALID, "%s: attention_multiplier, logits_scaling and rms_norm_eps must be "
			       "positive (rms_norm_eps below 1)", p->what);
	c->attn_scale = am;
	/* transformers' default (None) is no RoPE too: only "rope" turns it on */
	if ((rc = gets_only(p, "position_embedding_type", "nope", "nope", NULL)))
		return kv_fail_ctx(rc, "RoPE on Granite hybrid attention is not implemented (the 4.0-H releases "
				   "use nope)");
	if ((rc = gets_only(p, "hidden_act", "silu", "silu", NULL)) ||
	    (rc = refuse_true(p, "mamba_proj_bias", "projection biases")) ||
	    (rc = refuse_true(p, "attention_bias", "attention biases")) || (rc = time_step_limit(p)))
		return rc;
	if (!lt || !json_is_array(lt))
		return kv_fail(KV_ERR_INVALID, "%s: layer_types (a list of \"mamba\" / \"attention\") is missing",
			       p->what);
	if (json_array_size(lt) != (size_t)c->n_layers)
		return kv_fail(KV_ERR_INVALID, "%s: layer_types has %zu entries, num_hidden_layers is %d", p->what,
			       json_array_size(lt), c->n_layers);
	json_array_foreach(lt, i, v) {
		const char *s = json_string_value(v);
		if (s && !strcmp(s, "mamba"))
			c->layer_type[i] = KV_LAYER_MAMBA;
		else if (s && !strcmp(s, "attention"))
			c->layer_type[i] = KV_LAYER_ATTN;
		else
			return kv_fail(KV_ERR_INVALID, "%s: layer_types[%zu] must be \"mamba\" or \"attention\"", p->what, i);
	}
	if (n_experts > 0) {
		c->n_experts = n_experts;
		if ((rc = geti(p, "num_experts_per_tok", 2, 1, n_experts, &c->n_experts_per_tok)))
			return rc;
		c->moe_intermediate = c->intermediate;
		c->norm_topk_prob = 1; /* softmax over the top-k logits */
		c->expert_layout = KV_EXPERTS_STACKED;
		c->n_moe_layers = c->n_layers;
		for (int l = 0; l < c->n_layers; l++)
			c->layer_moe[l] = 1;
	}
	return KV_OK;
}

static int parse_nemotron(struct sp *p, struct kv_model_config *c)
{
	int rc, mlp_bias = 0;
	json_t *pat = json_object_get(p->root, "hybrid_override_pattern");
	json_t *lbt = json_object_get(p->root, "layers_block_type");
	c->arch = KV_ARCH_NEMOTRON_H;
	c->mlp_relu2 = 1;
	if ((rc = geti(p, "vocab_size", 131072, 1, 1 << 24, &c->vocab)) ||
	    (rc = geti(p, "hidden_size", 4096, 1, MAX_DIM, &c->hidden)) ||
	    (rc = geti(p, "intermediate_size", 21504, 1, MAX_DIM, &c->intermediate)) ||
	    (rc = geti(p, "num_hidden_layers", 52, 1, KV_MAX_LAYERS, &c->n_layers)) ||
	    (rc = geti(p, "num_attention_heads", 32, 1, MAX_HEADS, &c->n_heads)) ||
	    (rc = geti(p, "num_key_value_heads", 8, 1, MAX_HEADS, &c->n_kv_heads)) ||
	    (rc = geti(p, "head_dim", 128, 1, 4096, &c->head_dim)) ||
	    (rc = geti(p, "max_position_embeddings", 4096, 0, 1 << 30, &c->max_positions)) ||
	    (rc = getn(p, "layer_norm_epsilon", 1e-5, &c->rms_eps)) ||
	    (rc = getb(p, "tie_word_embeddings", 0, &c->tie_embeddings)) ||
	    (rc = geti(p, "mamba_num_heads", 128, 1, MAX_HEADS, &c->ssm_heads)) ||
	    (rc = geti(p, "mamba_head_dim", 64, 1, 4096, &c->ssm_head_dim)) ||
	    (rc = geti(p, "n_groups", 8, 1, MAX_HEADS, &c->ssm_groups)) ||
	    (rc = geti(p, "ssm_state_size", 128, 1, 4096, &c->ssm_state)) ||
	    (rc = geti(p, "conv_kernel", 4, 1, 64, &c->conv_kernel)) ||
	    (rc = getb(p, "use_conv_bias", 1, &c->ssm_conv_bias)) || (rc = getb(p, "mlp_bias", 0, &mlp_bias)))
		return rc;
	c->ssm_norm_groups = c->ssm_groups; /* MambaRMSNormGated(group_size = width / n_groups) */
	if (c->n_heads % c->n_kv_heads)
		return kv_fail(KV_ERR_INVALID, "%s: num_key_value_heads %d does not divide num_attention_heads %d",
			       p->what, c->n_kv_heads, c->n_heads);
	if (!(c->rms_eps > 0 && c->rms_eps < 1))
		return kv_fail(KV_ERR_INVALID, "%s: layer_norm_epsilon %g must be in (0, 1)", p->what, c->rms_eps);
	if (mlp_bias)
		return kv_fail(KV_ERR_UNSUPPORTED, "%s: mlp_bias true is not supported", p->what);
	if ((rc = gets_only(p, "mlp_hidden_act", "relu2", "relu2", NULL)) ||
	    (rc = gets_only(p, "mamba_hidden_act", "silu", "silu", NULL)) ||
	    (rc = refuse_true(p, "use_bias", "projection biases")) ||
	    (rc = refuse_true(p, "attention_bias", "attention biases")) || (rc = time_step_limit(p)))
		return rc;
	if (lbt && !json_is_null(lbt)) {
		size_t i;
		json_t *v;
		if (!json_is_array(lbt) || json_array_size(lbt) != (size_t)c->n_layers)
			return kv_fail(KV_ERR_INVALID, "%s: layers_block_type must list num_hidden_layers %d entries",
				       p->what, c->n_layers);
		json_array_foreach(lbt, i, v) {
			const char *s = json_string_value(v);
			if (s && !strcmp(s, "mamba"))
				c->layer_type[i] = KV_LAYER_MAMBA;
			else if (s && !strcmp(s, "attention"))
				c->layer_type[i] = KV_LAYER_ATTN;
			else if (s && !strcmp(s, "mlp"))
				c->layer_type[i] = KV_LAYER_MLP;
			else if (s && !strcmp(s, "moe"))
				return kv_fail(KV_ERR_UNSUPPORTED, "%s: layers_block_type[%zu] 'moe' (Nemotron-H MoE) is not "
					       "supported", p->what, i);
			else
				return kv_fail(KV_ERR_INVALID, "%s: layers_block_type[%zu] is not a known block", p->what, i);
		}
	} else {
		const char *s = json_string_value(pat);
		if (!s)
			return kv_fail(KV_ERR_INVALID, "%s: hybrid_override_pattern (a string, one of M * - per layer) is "
				       "missing", p->what);
		if (strlen(s) != (size_t)c->n_layers)
			return kv_fail(KV_ERR_INVALID, "%s: hybrid_override_pattern has %zu layers, num_hidden_layers is %d",
				       p->what, strlen(s), c->n_layers);
		for (int l = 0; l < c->n_layers; l++) {
			if (s[l] == 'M')
				c->layer_type[l] = KV_LAYER_MAMBA;
			else if (s[l] == '*')
				c->layer_type[l] = KV_LAYER_ATTN;
			else if (s[l] == '-')
				c->layer_type[l] = KV_LAYER_MLP;
			else if (s[l] == 'E')
				return kv_fail(KV_ERR_UNSUPPORTED, "%s: hybrid_override_pattern layer %d 'E' (Nemotron-H MoE) "
					       "is not supported", p->what, l);
			else
				return kv_fail(KV_ERR_INVALID, "%s: hybrid_override_pattern layer %d is '%c', not M, * or -",
					       p->what, l, s[l]);
		}
	}
	return KV_OK;
}

int kv_config_parse_ssm(json_t *root, const char *what, struct kv_model_config *c)
{
	struct sp p = {what, root};
	const char *mt = json_string_value(json_object_get(root, "model_type"));
	int rc;
	common(&p, c);
	rc = !strcmp(mt, "granitemoehybrid") ? parse_granite(&p, c) : parse_nemotron(&p, c);
	if (rc)
		return rc;
	if ((rc = check_mamba(&p, c)))
		return rc;
	count_layers(c);
	/* no RoPE: rotary_dim 0 makes the attention rotate nothing */
	c->rotary_dim = 0;
	c->partial_rotary = 0;
	if (c->head_dim > 4096)
		return kv_fail(KV_ERR_UNSUPPORTED, "%s: head_dim %d is too large", what, c->head_dim);
	return ids(&p, c);
}

uint64_t kv_config_ssm_conv_dim(const struct kv_model_config *c)
{
	if (!c->ssm)
		return 0;
	return (uint64_t)c->ssm_heads * (uint64_t)c->ssm_head_dim +
	       2ull * (uint64_t)c->ssm_groups * (uint64_t)c->ssm_state;
}

/* --- tensors ----------------------------------------------------------------- */

const char *kv_config_ssm_prefix(const struct kv_model_config *c)
{
	return c->arch == KV_ARCH_NEMOTRON_H ? "backbone." : "model.";
}

int kv_config_tensors_ssm(const struct kv_model_config *c, const char *p, struct kv_tensor_spec **out, size_t *n)
{
	struct kv_tspecs s = {0};
	const int nem = c->arch == KV_ARCH_NEMOTRON_H;
	const int64_t D = c->hidden, hd = c->head_dim, nh = c->n_heads, nkv = c->n_kv_heads;
	const int64_t W = (int64_t)c->ssm_heads * c->ssm_head_dim, H = c->ssm_heads;
	const int64_t C = (int64_t)kv_config_ssm_conv_dim(c);
	const char *mx = nem ? "mixer" : "mamba", *at = nem ? "mixer" : "self_attn";
	*out = NULL;
	*n = 0;
	kv_tspec(&s, -1, KV_ROLE_EMBED, 2, c->vocab, D, 0, nem ? "%sembeddings.weight" : "%sembed_tokens.weight", p);
	for (int l = 0; l < c->n_layers; l++) {
		kv_tspec(&s, l, KV_ROLE_NORM, 1, D, 0, 0, nem ? "%slayers.%d.norm.weight" : "%slayers.%d.input_layernorm.weight",
		         p, l);
		if (c->layer_type[l] == KV_LAYER_MAMBA) {
			kv_tspec(&s, l, KV_ROLE_LINEAR, 2, W + C + H, D, 0, "%slayers.%d.%s.in_proj.weight", p, l, mx);
			kv_tspec(&s, l, KV_ROLE_CONV, 3, C, 1, c->conv_kernel, "%slayers.%d.%s.conv1d.weight", p, l, mx);
			if (c->ssm_conv_bias)
				kv_tspec(&s, l, KV_ROLE_CONV_BIAS, 1, C, 0, 0, "%slayers.%d.%s.conv1d.bias", p, l, mx);
			kv_tspec(&s, l, KV_ROLE_DT_BIAS, 1, H, 0, 0, "%slayers.%d.%s.dt_bias", p, l, mx);
			kv_tspec(&s, l, KV_ROLE_A_LOG, 1, H, 0, 0, "%slayers.%d.%s.A_log", p, l, mx);
			kv_tspec(&s, l, KV_ROLE_SSM_D, 1, H, 0, 0, "%slayers.%d.%s.D", p, l, mx);
			kv_tspec(&s, l, KV_ROLE_NORM, 1, W, 0, 0, "%slayers.%d.%s.norm.weight", p, l, mx);
			kv_tspec(&s, l, KV_ROLE_LINEAR_OUT, 2, D, W, 0, "%slayers.%d.%s.out_proj.weight", p, l, mx);
		} else if (c->layer_type[l] == KV_LAYER_ATTN) {
			kv_tspec(&s, l, KV_ROLE_LINEAR, 2, nh * hd, D, 0, "%slayers.%d.%s.q_proj.weight", p, l, at);
			kv_tspec(&s, l, KV_ROLE_LINEAR, 2, nkv * hd, D, 0, "%slayers.%d.%s.k_proj.weight", p, l, at);
			kv_tspec(&s, l, KV_ROLE_LINEAR, 2, nkv * hd, D, 0, "%slayers.%d.%s.v_proj.weight", p, l, at);
			kv_tspec(&s, l, KV_ROLE_LINEAR_OUT, 2, D, nh * hd, 0, "%slayers.%d.%s.o_proj.weight", p, l, at);
		} else {
			kv_tspec(&s, l, KV_ROLE_LINEAR, 2, c->intermediate, D, 0, "%slayers.%d.mixer.up_proj.weight", p, l);
			kv_tspec(&s, l, KV_ROLE_LINEAR_OUT, 2, D, c->intermediate, 0, "%slayers.%d.mixer.down_proj.weight", p, l);
		}
		if (!c->layer_ffn)
			continue;
		kv_tspec(&s, l, KV_ROLE_NORM, 1, D, 0, 0, "%slayers.%d.post_attention_layernorm.weight", p, l);
		const int64_t Is = c->shared_intermediate, E = c->n_experts, I = c->moe_intermediate;
		if (c->layer_moe[l]) {
			kv_tspec(&s, l, KV_ROLE_ROUTER, 2, E, D, 0, "%slayers.%d.block_sparse_moe.router.layer.weight", p, l);
			if (c->expert_layout == KV_EXPERTS_SWITCH) {
				/* mlx-lm's sanitized SwitchGLU stacks (and a GGUF's, loaded under these names) */
				kv_tspec(&s, l, KV_ROLE_LINEAR, 3, E, I, D, "%slayers.%d.block_sparse_moe.switch_mlp.gate_proj.weight",
				         p, l);
				kv_tspec(&s, l, KV_ROLE_LINEAR, 3, E, I, D, "%slayers.%d.block_sparse_moe.switch_mlp.up_proj.weight", p,
				         l);
				kv_tspec(&s, l, KV_ROLE_LINEAR_OUT, 3, E, D, I,
				         "%slayers.%d.block_sparse_moe.switch_mlp.down_proj.weight", p, l);
			} else {
				kv_tspec(&s, l, KV_ROLE_LINEAR, 3, E, 2 * I, D, "%slayers.%d.block_sparse_moe.input_linear.weight", p, l);
				kv_tspec(&s, l, KV_ROLE_LINEAR_OUT, 3, E, D, I, "%slayers.%d.block_sparse_moe.output_linear.weight", p,
				         l);
			}
		}
		if (c->expert_layout == KV_EXPERTS_SPLIT && !c->layer_moe[l]) {
			/* a dense Granite as mlx-lm writes it: mlp.{gate,up,down}_proj */
			kv_tspec(&s, l, KV_ROLE_LINEAR, 2, Is, D, 0, "%slayers.%d.mlp.gate_proj.weight", p, l);
			kv_tspec(&s, l, KV_ROLE_LINEAR, 2, Is, D, 0, "%slayers.%d.mlp.up_proj.weight", p, l);
			kv_tspec(&s, l, KV_ROLE_LINEAR_OUT, 2, D, Is, 0, "%slayers.%d.mlp.down_proj.weight", p, l);
			continue;
		}
		if (c->shared_split) {
			kv_tspec(&s, l, KV_ROLE_LINEAR, 2, Is, D, 0, "%slayers.%d.shared_mlp.gate_proj.weight", p, l);
			kv_tspec(&s, l, KV_ROLE_LINEAR, 2, Is, D, 0, "%slayers.%d.shared_mlp.up_proj.weight", p, l);
		} else {
			kv_tspec(&s, l, KV_ROLE_LINEAR, 2, 2 * Is, D, 0, "%slayers.%d.shared_mlp.input_linear.weight", p, l);
		}
		kv_tspec(&s, l, KV_ROLE_LINEAR_OUT, 2, D, Is, 0, "%slayers.%d.shared_mlp.output_linear.weight", p, l);
	}
	kv_tspec(&s, -1, KV_ROLE_NORM, 1, D, 0, 0, nem ? "%snorm_f.weight" : "%snorm.weight", p);
	if (!c->tie_embeddings)
		kv_tspec(&s, -1, KV_ROLE_LM_HEAD, 2, c->vocab, D, 0, "lm_head.weight");
	return kv_tspec_finish(&s, out, n);
}
