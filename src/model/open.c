/*
 * open.c - see open.h.
 */
#include "model/open.h"
#include "model/gguf.h"
#include "model/gguf_model.h"
#include "model/mlx.h"
#include "model/weights.h"
#include "base/err.h"
#include "base/io.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int kv_config_load(const char *model_dir, struct kv_model_config *out)
{
	char path[4096], *buf;
	size_t len;
	int rc;
	if (kv_gguf_is_model_path(model_dir)) {
		struct kv_gguf *g = NULL;
		if ((rc = kv_gguf_open(model_dir, &g))) {
			memset(out, 0, sizeof *out);
			return rc;
		}
		rc = kv_gguf_config(g, out);
		kv_gguf_close(g);
		return rc;
	}
	if ((size_t)snprintf(path, sizeof path, "%s/config.json", model_dir) >= sizeof path)
		return kv_fail(KV_ERR_INVALID, "model folder path too long");
	if ((rc = kv_io_read_file(path, KV_CONFIG_MAX_BYTES, &buf, &len))) {
		memset(out, 0, sizeof *out);
		return rc;
	}
	rc = kv_config_parse(buf, len, path, out);
	free(buf);
	return rc;
}

void kv_config_detect_experts(struct kv_model_config *c, const struct kv_weights *w, const char *prefix)
{
	char name[160];
	if (c->arch == KV_ARCH_GRANITE_HYBRID) {
		/* HF: block_sparse_moe.input_linear (stacked gate|up) or shared_mlp
		 * alone; mlx-lm: block_sparse_moe.switch_mlp.*, or mlp.* when dense */
		if (c->n_moe_layers)
			snprintf(name, sizeof name, "%slayers.0.block_sparse_moe.switch_mlp.gate_proj.weight", prefix);
		else
			snprintf(name, sizeof name, "%slayers.0.mlp.gate_proj.weight", prefix);
		c->expert_layout = !kv_weights_find(w, name) ? KV_EXPERTS_STACKED
				   : c->n_moe_layers	     ? KV_EXPERTS_SWITCH
							     : KV_EXPERTS_SPLIT;
		return;
	}
	for (int l = 0; l < c->n_layers; l++) {
		if (!c->layer_moe[l])
			continue;
		if (c->moe_kind == KV_MOE_GEMMA4)
			return; /* one layout: experts.gate_up_proj / down_proj stacks */
		if (c->moe_kind == KV_MOE_OAI) {
			/* gpt_oss: the MXFP4 release, or switch_mlp stacks (GGUF, MLX) */
			snprintf(name, sizeof name, "%slayers.%d.mlp.switch_mlp.gate_proj.weight", prefix, l);
			c->expert_layout = kv_weights_find(w, name) ? KV_EXPERTS_SWITCH : KV_EXPERTS_OAI_MXFP4;
			return;
		}
		snprintf(name, sizeof name, "%slayers.%d.mlp.experts.gate_up_proj", prefix, l);
		c->expert_layout = KV_EXPERTS_SPLIT;
		if (kv_weights_find(w, name)) {
			c->expert_layout = KV_EXPERTS_STACKED;
		} else {
			snprintf(name, sizeof name, "%slayers.%d.mlp.switch_mlp.gate_proj.weight", prefix, l);
			if (kv_weights_find(w, name))
				c->expert_layout = KV_EXPERTS_SWITCH;
		}
		return;
	}
}

int kv_config_check_weights(const struct kv_model_config *c, const struct kv_weights *w, char *prefix,
			    size_t cap)
{
	struct kv_tensor_spec *v;
	size_t n;
	const char *p = "model.";
	int rc;

	if (kv_weights_find(w, "model.language_model.embed_tokens.weight"))
		p = "model.language_model.";
	else if (kv_weights_find(w, "language_model.model.embed_tokens.weight"))
		p = "language_model.model."; /* mlx-lm's Qwen3.5 names */
	else if (c->ssm)
		p = kv_config_default_prefix(c); /* backbone. (nemotron_h) or model. */
	if (prefix && cap)
		snprintf(prefix, cap, "%s", p);
	struct kv_model_config cl = *c;
	kv_config_detect_experts(&cl, w, p);
	if ((rc = kv_config_tensors(&cl, p, &v, &n)))
		return rc;
	for (size_t i = 0; i < n && !rc; i++) {
		const char *name = v[i].role == KV_ROLE_LM_HEAD ? kv_config_lm_head_name(p) : v[i].name;
		const struct kv_tensor *t = kv_weights_find(w, name);
		char want[160];
		if (!t && v[i].role == KV_ROLE_MXFP4_BLOCKS) {
			char alt[160];
			snprintf(alt, sizeof alt, "%slayers.%d.mlp.experts.gate_up_proj", p, v[i].layer);
			rc = kv_fail(KV_ERR_INCOMPATIBLE, "weights lack tensor '%s'%s", name,
				     kv_weights_find(w, alt)
					     ? ": gpt_oss experts as float [E, hidden, 2 I] matrices (a dequantized "
					       "checkpoint) are not read; use the MXFP4 release (_blocks / _scales) or convert "
					       "it to GGUF"
					     : " (gpt_oss experts: the MXFP4 release's _blocks / _scales, or switch_mlp stacks)");
			break;
		}
		if (!t) {
			rc = kv_fail(KV_ERR_INCOMPATIBLE, "weights lack tensor '%s' (expected shape %s)%s", name,
				     kv_shape_str(v[i].ndim, v[i].shape, want, sizeof want),
				     strstr(name, ".mlp.experts.")
					     ? "; routed experts are read from mlp.experts.gate_up_proj + "
					       "mlp.experts.down_proj, mlp.switch_mlp.{gate,up,down}_proj.weight or "
					       "mlp.experts.N.{gate,up,down}_proj.weight"
					     : "");
			break;
		}
		if (t->dtype == KV_DT_U32 && (v[i].ndim == 2 || v[i].ndim == 3) && v[i].role != KV_ROLE_CONV) {
			/* An MLX quantized matrix (or mlx-lm's [E, rows, cols] SwitchGLU
			 * stack): codes, scales, biases checked together. */
			struct kv_mlx_qmat qm;
			int is3 = v[i].ndim == 3;
			rc = kv_mlx_matrix(w, name, NULL, is3 ? v[i].shape[0] * v[i].shape[1] : v[i].shape[0],
					   v[i].shape[v[i].ndim - 1], &qm);
			if (!rc && qm.codes && qm.codes->ndim != v[i].ndim)
				rc = kv_fail(KV_ERR_INCOMPATIBLE, "tensor '%s' has %d dims, expected %d", name, qm.codes->ndim,
					     v[i].ndim);
			if (rc)
				break;
			continue;
		}
		if (v[i].role == KV_ROLE_CONV && t->ndim == 3 && t->shape[0] == v[i].shape[0] && t->shape[1] == v[i].shape[2] &&
		    t->shape[2] == 1) {
			/* mlx-lm's sanitized [C, K, 1]: the same bytes as [C, 1, K]. */
		} else if ((rc = kv_tensor_expect(t, -1, v[i].ndim, v[i].shape))) {
			break;
		}
		if (v[i].role == KV_ROLE_MXFP4_BLOCKS || v[i].role == KV_ROLE_MXFP4_SCALES) {
			if (t->dtype != KV_DT_U8)
				rc = kv_fail(KV_ERR_INCOMPATIBLE, "%s: tensor '%s' is %s, MXFP4 %s are U8", t->file, t->name,
					     kv_dtype_name(t->dtype), v[i].role == KV_ROLE_MXFP4_BLOCKS ? "blocks" : "scales");
			continue;
		}
		int mat = v[i].role == KV_ROLE_EMBED || v[i].role == KV_ROLE_LM_HEAD || v[i].role == KV_ROLE_LINEAR ||
			  v[i].role == KV_ROLE_LINEAR_OUT || v[i].role == KV_ROLE_LINEAR_A;
		if (t->dtype != KV_DT_F32 && t->dtype != KV_DT_BF16 && t->dtype != KV_DT_F16 &&
		    !(mat && kv_dtype_is_quant(t->dtype)))
			rc = kv_fail(KV_ERR_INCOMPATIBLE, "%s: tensor '%s' is %s, expected F32, BF16 or F16%s", t->file,
				     t->name, kv_dtype_name(t->dtype), mat ? " or a ggml block type" : "");
	}
	free(v);
	return rc;
}
