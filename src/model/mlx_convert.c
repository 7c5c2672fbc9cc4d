/*
 * mlx_convert.c - see mlx_convert.h: a Hugging Face folder written as an
 * MLX quantized folder, one output tensor at a time (each produced while
 * the safetensors writer writes it, so one tensor is in memory at once).
 */
#include "model/mlx_convert.h"
#include "model/config.h"
#include "model/mlx.h"
#include "model/open.h"
#include "model/safetensors.h"
#include "model/weights.h"
#include "base/durable.h"
#include "base/err.h"
#include "base/io.h"
#include "base/json.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { J_COPY, J_SHIFT, J_CODES, J_SCALES, J_BIASES, J_ROWS };

/* Output row r of a job reads source row src_row(r): plain tensors row r;
 * an expert stack (per > 0) row (r / per) * stride + off + r % per of src,
 * or row r % per of srcs[r / per] (one tensor per expert). J_ROWS copies
 * those rows' bytes (an unquantized stack). */
struct job {
	const struct kv_tensor *src;
	int kind, bits, group;
	int64_t rows, cols;
	int64_t per, stride, off;
	const struct kv_tensor **srcs;
};

static const struct kv_tensor *src_row(const struct job *j, int64_t r, int64_t *row)
{
	if (j->per <= 0) {
		*row = r;
		return j->src;
	}
	if (j->srcs) {
		*row = r % j->per;
		return j->srcs[r / j->per];
	}
	*row = (r / j->per) * j->stride + j->off + r % j->per;
	return j->src;
}

static float round_to(int dt, float f)
{
	if (dt == KV_DT_BF16)
		return kv_bf16_to_f32(kv_f32_to_bf16(f));
	if (dt == KV_DT_F16)
		return kv_f16_to_f32(kv_f32_to_f16(f));
	return f;
}

static void store_as(int dt, void *dst, size_t i, float f)
{
	if (dt == KV_DT_F32) {
		memcpy((char *)dst + i * 4, &f, 4);
		return;
	}
	uint16_t h = dt == KV_DT_BF16 ? kv_f32_to_bf16(f) : kv_f32_to_f16(f);
	memcpy((char *)dst + i * 2, &h, 2);
}

static int fill_job(void *ctx, void *dst, uint64_t nbytes)
{
	const struct job *j = ctx;
	const struct kv_tensor *t = j->src;
	int rc;
	if (j->kind == J_COPY) {
		if (nbytes != t->nbytes)
			return kv_fail(KV_ERR_INVALID, "internal: size of '%s'", t->name);
		memcpy(dst, t->data, nbytes);
		return KV_OK;
	}
	if (j->kind == J_SHIFT) {
		for (uint64_t i = 0; i < t->numel; i++)
			store_as(t->dtype, dst, i, kv_tensor_getf(t, i) + 1.0f);
		return KV_OK;
	}
	if (j->kind == J_ROWS) {
		uint64_t rb = kv_dtype_row_bytes(t->dtype, (uint64_t)j->cols);
		if (rb * (uint64_t)j->rows != nbytes)
			return kv_fail(KV_ERR_INVALID, "internal: size of the stack of '%s'", t->name);
		for (int64_t r = 0; r < j->rows; r++) {
			int64_t sr;
			const struct kv_tensor *ts = src_row(j, r, &sr);
			memcpy((uint8_t *)dst + (size_t)r * rb, (const uint8_t *)ts->data + (size_t)sr * rb, (size_t)rb);
		}
		return KV_OK;
	}
	int G = j->group, ng = (int)(j->cols / G);
	float *row = malloc((size_t)j->cols * sizeof *row);
	uint8_t *codes = malloc((size_t)j->cols);
	if (!row || !codes) {
		free(row);
		free(codes);
		return kv_fail(KV_ERR_NOMEM, "out of memory quantizing '%s'", t->name);
	}
	size_t row_bytes = (size_t)j->cols * (size_t)j->bits / 8;
	for (int64_t r = 0; r < j->rows; r++) {
		int64_t sr;
		const struct kv_tensor *ts = src_row(j, r, &sr);
		if ((rc = kv_tensor_to_f32(ts, row, (uint64_t)sr * (uint64_t)j->cols, (uint64_t)j->cols))) {
			free(row);
			free(codes);
			return rc;
		}
		for (int g = 0; g < ng; g++) {
			float s, b;
			kv_mlx_quant_params(row + (size_t)g * G, G, j->bits, &s, &b);
			s = round_to(t->dtype, s);
			b = round_to(t->dtype, b);
			size_t gi = (size_t)r * (size_t)ng + (size_t)g;
			if (j->kind == J_SCALES)
				store_as(t->dtype, dst, gi, s);
			else if (j->kind == J_BIASES)
				store_as(t->dtype, dst, gi, b);
			else
				kv_mlx_quant_codes(row + (size_t)g * G, G, j->bits, s, b, codes + (size_t)g * G);
		}
		if (j->kind == J_CODES)
			kv_mlx_pack(codes, (int)j->cols, j->bits, (uint8_t *)dst + (size_t)r * row_bytes);
	}
	free(row);
	free(codes);
	return KV_OK;
}

static int copy_file(const char *from_dir, const char *to_dir, const char *name, unsigned flags)
{
	char a[4096], b[4096];
	char *buf = NULL;
	size_t len = 0;
	snprintf(a, sizeof a, "%s/%s", from_dir, name);
	snprintf(b, sizeof b, "%s/%s", to_dir, name);
	if (kv_io_read_file(a, 512u << 20, &buf, &len))
		return KV_OK; /* absent: nothing to copy */
	int rc = kv_durable_write(b, buf, len, flags | KV_DW_PUBLIC);
	free(buf);
	return rc;
}

/* The override for module `mod` in a "M=B:G,M=float" list: 1 and bits /
 * group set, 0 for float, -1 when the list does not name it. */
static int find_override(const char *list, const char *mod, int *bits, int *group)
{
	size_t ml = strlen(mod);
	for (const char *p = list; p && *p;) {
		const char *e = strchr(p, ','), *eq = strchr(p, '=');
		size_t len = e ? (size_t)(e - p) : strlen(p);
		if (eq && (size_t)(eq - p) == ml && !strncmp(p, mod, ml) && eq < p + len) {
			if (!strncmp(eq + 1, "float", 5))
				return 0;
			if (sscanf(eq + 1, "%d:%d", bits, group) == 2)
				return 1;
			return -2;
		}
		p = e ? e + 1 : NULL;
	}
	return -1;
}

/* Every entry of the list names a module of the model and a valid format. */
static int check_overrides(const char *list, const struct kv_tensor_spec *dv, size_t n, const char *lm_name)
{
	for (const char *p = list; p && *p;) {
		const char *e = strchr(p, ','), *eq = strchr(p, '=');
		size_t len = e ? (size_t)(e - p) : strlen(p);
		int bits = 0, group = 0, found = 0;
		if (!eq || eq >= p + len)
			return kv_fail(KV_ERR_INVALID, "MLX override '%.*s': expected MODULE=BITS:GROUP or MODULE=float",
				       (int)len, p);
		for (size_t i = 0; i < n && !found; i++) {
			const char *nm = dv[i].role == KV_ROLE_LM_HEAD ? lm_name : dv[i].name;
			size_t ml = (size_t)(eq - p);
			found = strlen(nm) == ml + 7 && !strncmp(nm, p, ml) && !strcmp(nm + ml, ".weight") && dv[i].ndim == 2 &&
				dv[i].role != KV_ROLE_CONV;
		}
		if (!found)
			return kv_fail(KV_ERR_INVALID, "MLX override '%.*s': the model has no matrix of that name", (int)len, p);
		if (strncmp(eq + 1, "float", 5) &&
		    (sscanf(eq + 1, "%d:%d", &bits, &group) != 2 || (bits != 4 && bits != 8) ||
		     (group != 32 && group != 64 && group != 128)))
			return kv_fail(KV_ERR_INVALID, "MLX override '%.*s': bits must be 4 or 8, group 32, 64 or 128",
				       (int)len, p);
		p = e ? e + 1 : NULL;
	}
	return KV_OK;
}

/* config.json as JSON; Python's bare Infinity (Nemotron-H's
 * time_step_limit) is read as a string and written back as one, which
 * the reader takes too. */
static int read_config(const char *path, json_t **cfg)
{
	char *text = NULL, *relaxed = NULL;
	size_t len = 0, rlen = 0;
	int rc = kv_io_read_file(path, KV_CONFIG_MAX_BYTES, &text, &len);
	if (!rc && !(rc = kv_config_json_relax(text, len, &relaxed, &rlen)))
		rc = kv_json_parse(path, relaxed ? relaxed : text, relaxed ? rlen : len, KV_JSON_MAX_DEPTH, cfg);
	free(text);
	free(relaxed);
	return rc;
}

/* A dense Granite 4.0-H's shared_mlp as mlx-lm writes it:
 * input_linear [2 Is][D] -> mlp.gate_proj + mlp.up_proj, output_linear ->
 * mlp.down_proj; quantized unless the group does not divide the input. */
static int granite_dense(struct kv_stw *st, struct job *jobs, size_t *nj, json_t *qo,
			 const struct kv_mlx_write_opts *o, const struct kv_model_config *c,
			 const struct kv_tensor_spec *s, const struct kv_tensor *t, const char *dprefix)
{
	int in = strstr(s->name, ".input_linear.") != NULL, rc = KV_OK;
	const int64_t Is = c->shared_intermediate, D = c->hidden;
	for (int k = 0; k < (in ? 2 : 1) && !rc; k++) {
		char base[200], nm[220];
		int64_t rows = in ? Is : D, cols = in ? D : Is;
		snprintf(base, sizeof base, "%slayers.%d.mlp.%s_proj", dprefix, s->layer, in ? (k ? "up" : "gate") : "down");
		int bits = o->bits, group = o->group_size;
		snprintf(nm, sizeof nm, "%s.weight", base);
		if (cols % group) {
			int64_t fs[2] = {rows, cols};
			struct job *j = &jobs[(*nj)++];
			*j = (struct job){t, J_ROWS, 0, 0, rows, cols, rows, 0, k * Is, NULL};
			json_object_set_new(qo, base, json_false());
			rc = kv_stw_add_fill(st, nm, t->dtype, 2, fs, fill_job, j);
			continue;
		}
		int64_t cs[2] = {rows, cols * bits / 32}, ss[2] = {rows, cols / group};
		struct job *jc = &jobs[(*nj)++], *js = &jobs[(*nj)++], *jb = &jobs[(*nj)++];
		*jc = (struct job){t, J_CODES, bits, group, rows, cols, rows, 0, k * Is, NULL};
		*js = *jc;
		js->kind = J_SCALES;
		*jb = *jc;
		jb->kind = J_BIASES;
		if ((rc = kv_stw_add_fill(st, nm, KV_DT_U32, 2, cs, fill_job, jc)))
			break;
		snprintf(nm, sizeof nm, "%s.scales", base);
		if ((rc = kv_stw_add_fill(st, nm, t->dtype, 2, ss, fill_job, js)))
			break;
		snprintf(nm, sizeof nm, "%s.biases", base);
		rc = kv_stw_add_fill(st, nm, t->dtype, 2, ss, fill_job, jb);
	}
	return rc;
}

/* A folder this writer can quantize: not quantized already, not gpt_oss
 * (kv_mlx_write). */
static int check_source(const struct kv_mlx_write_opts *o, const struct kv_model_config *c, struct kv_weights *w)
{
	for (size_t i = 0; i < kv_weights_count(w); i++)
		if (kv_weights_at(w, i)->dtype == KV_DT_U32)
			return kv_fail(KV_ERR_INVALID, "%s is already quantized (tensor '%s' is U32)", o->hf_dir,
				       kv_weights_at(w, i)->name);
	if (c->arch == KV_ARCH_GPT_OSS)
		/* mlx-lm writes GPT-OSS's experts in MLX's own mxfp4 mode (with
		 * their biases beside the SwitchGLU stacks), which this writer
		 * does not produce */
		return kv_fail(KV_ERR_UNSUPPORTED, "%s: MLX conversion of gpt_oss is not supported (its experts are "
			       "MXFP4 already: run the folder itself, or `kvkeep convert` to GGUF)", o->hf_dir);
	if (c->arch == KV_ARCH_GEMMA4 && c->n_moe_layers)
		/* how mlx-lm stores Gemma 4's fused expert stacks (names, which
		 * are quantized) is not known here: refuse rather than write a
		 * folder no other tool reads */
		return kv_fail(KV_ERR_UNSUPPORTED, "%s: MLX conversion of gemma4 with experts (enable_moe_block) is not "
			       "supported (mlx-lm's layout of its fused experts is not known to kvkeep: run the folder "
			       "itself, or `kvkeep convert` to GGUF)", o->hf_dir);
	return KV_OK;
}

int kv_mlx_write(const struct kv_mlx_write_opts *o)
{
	struct kv_model_config c;
	struct kv_weights *w = NULL;
	struct kv_tensor_spec *sv = NULL, *dv = NULL;
	struct kv_stw *st = NULL;
	struct job *jobs = NULL;
	const struct kv_tensor **esrc = NULL; /* per-expert source tensors of SPLIT checkpoints */
	size_t n_esrc = 0;
	json_t *cfg = NULL, *qo = NULL;
	char prefix[64], path[4096];
	size_t n = 0, n2 = 0, nj = 0;
	int rc;

	if (o->bits != 4 && o->bits != 8)
		return kv_fail(KV_ERR_INVALID, "MLX bits must be 4 or 8, got %d", o->bits);
	if (o->group_size != 32 && o->group_size != 64 && o->group_size != 128)
		return kv_fail(KV_ERR_INVALID, "MLX group size must be 32, 64 or 128, got %d", o->group_size);
	if ((rc = kv_config_load(o->hf_dir, &c)))
		return rc;
	if ((rc = kv_weights_open(o->hf_dir, &w)))
		return rc;
	if ((rc = kv_config_check_weights(&c, w, prefix, sizeof prefix)))
		goto out;
	if ((rc = check_source(o, &c, w)))
		goto out;
	/* mlx-lm's names: Qwen3.5 lives under language_model (its sanitize()
	 * maps model.language_model.* and model.* there); the others keep the
	 * Hugging Face names. */
	int lm = c.arch == KV_ARCH_QWEN3_5;
	const char *dprefix = lm ? "language_model.model." : c.ssm ? prefix : "model.";
	/* mlx-lm's Granite 4.0-H sanitize(): the experts as
	 * block_sparse_moe.switch_mlp stacks, a dense shared_mlp as mlp.* */
	int granite = c.arch == KV_ARCH_GRANITE_HYBRID;
	if ((rc = kv_config_tensors(&c, prefix, &sv, &n)) || (rc = kv_config_tensors(&c, dprefix, &dv, &n2)))
		goto out;
	if ((rc = check_overrides(o->overrides, dv, n2, kv_config_lm_head_name(dprefix))))
		goto out;
	/* (6 jobs for a stacked gate_up_proj: two quantized stacks) */
	if (!(st = kv_stw_create()) || !(jobs = calloc(6 * n + 1, sizeof *jobs)) || !(qo = json_object()) ||
	    (c.n_experts && !(esrc = calloc(3 * (size_t)c.n_layers * (size_t)c.n_experts + 1, sizeof *esrc)))) {
		rc = kv_fail(KV_ERR_NOMEM, "out of memory");
		goto out;
	}
	json_object_set_new(qo, "group_size", json_integer(o->group_size));
	json_object_set_new(qo, "bits", json_integer(o->bits));
	json_object_set_new(qo, "mode", json_string("affine"));
	for (size_t i = 0; i < n && !rc; i++) {
		const struct kv_tensor_spec *s = &sv[i];
		const struct kv_tensor *t = kv_weights_find(w, s->role == KV_ROLE_LM_HEAD ? kv_config_lm_head_name(prefix)
											 : s->name);
		const char *dname = s->role == KV_ROLE_LM_HEAD ? kv_config_lm_head_name(dprefix) : dv[i].name;
		if (!t) {
			rc = kv_fail(KV_ERR_INCOMPATIBLE, "%s: weights lack '%s'", o->hf_dir, s->name);
			break;
		}
		/* The routed experts of a MoE layer: mlx-lm's SwitchGLU stacks
		 * mlp.switch_mlp.{gate,up,down}_proj [E, rows, cols] from any HF
		 * layout (stacked gate_up_proj split, per-expert tensors stacked). */
		const char *rest = s->layer >= 0 ? strstr(s->name, ".mlp.") : NULL;
		const char *sw = "mlp";
		if (granite && s->layer >= 0 && strstr(s->name, ".block_sparse_moe.") && s->role != KV_ROLE_ROUTER) {
			rest = strstr(s->name, ".block_sparse_moe.");
			sw = "block_sparse_moe";
		}
		if (granite && !c.n_moe_layers && s->layer >= 0 && strstr(s->name, ".shared_mlp.")) {
			rc = granite_dense(st, jobs, &nj, qo, o, &c, s, t, dprefix);
			continue;
		}
		if (rest && (s->expert >= 0 || strstr(rest, ".mlp.experts.") || strstr(rest, ".mlp.switch_mlp.") ||
			     !strcmp(sw, "block_sparse_moe"))) {
			if (s->expert > 0)
				continue; /* stacked with expert 0 */
			const int64_t E = c.n_experts, I = c.moe_intermediate, D = c.hidden;
			struct job tmpl[2];
			const char *which[2] = {NULL, NULL};
			int nst = 1;
			memset(tmpl, 0, sizeof tmpl);
			if (s->expert == 0) {
				which[0] = strstr(rest, "gate_proj") ? "gate" : strstr(rest, "up_proj") ? "up" : "down";
				const struct kv_tensor **es = esrc + n_esrc;
				for (int64_t e = 0; e < E && !rc; e++) {
					char en[220];
					snprintf(en, sizeof en, "%slayers.%d.mlp.experts.%lld.%s_proj.weight", prefix, s->layer,
						 (long long)e, which[0]);
					if (!(es[e] = kv_weights_find(w, en)))
						rc = kv_fail(KV_ERR_INCOMPATIBLE, "%s: weights lack '%s'", o->hf_dir, en);
				}
				n_esrc += (size_t)E;
				tmpl[0] = (struct job){t, 0, 0, 0, E * s->shape[0], s->shape[1], s->shape[0], 0, 0, es};
			} else if (strstr(rest, "gate_up_proj") || strstr(rest, ".input_linear.")) {
				which[0] = "gate";
				which[1] = "up";
				nst = 2;
				tmpl[0] = (struct job){t, 0, 0, 0, E * I, D, I, 2 * I, 0, NULL};
				tmpl[1] = (struct job){t, 0, 0, 0, E * I, D, I, 2 * I, I, NULL};
			} else {
				which[0] = strstr(rest, "gate_proj") ? "gate" : strstr(rest, "up_proj") ? "up" : "down";
				tmpl[0] = (struct job){t, 0, 0, 0, s->shape[0] * s->shape[1], s->shape[2], 0, 0, 0, NULL};
			}
			for (int k = 0; k < nst && !rc; k++) {
				char dn[220], base[200], nm[220];
				struct job *jt = &tmpl[k];
				int64_t per = jt->rows / E, cols = jt->cols;
				snprintf(base, sizeof base, "%slayers.%d.%s.switch_mlp.%s_proj", dprefix, s->layer, sw, which[k]);
				snprintf(dn, sizeof dn, "%s.weight", base);
				int bits = o->bits, group = o->group_size, ov = find_override(o->overrides, base, &bits, &group);
				if (ov == 1) {
					json_t *e = json_object();
					json_object_set_new(e, "group_size", json_integer(group));
					json_object_set_new(e, "bits", json_integer(bits));
					json_object_set_new(qo, base, e);
				}
				if (ov == 0 || cols % group) {
					/* mlx-lm leaves a module its group does not divide in floats */
					int64_t fs[3] = {E, per, cols};
					json_object_set_new(qo, base, json_false());
					struct job *j = &jobs[nj++];
					*j = *jt;
					j->kind = J_ROWS;
					rc = kv_stw_add_fill(st, dn, t->dtype, 3, fs, fill_job, j);
					continue;
				}
				int64_t cs[3] = {E, per, cols * bits / 32}, ss[3] = {E, per, cols / group};
				struct job *jc = &jobs[nj++], *js = &jobs[nj++], *jb = &jobs[nj++];
				*jc = *jt;
				jc->kind = J_CODES;
				jc->bits = bits;
				jc->group = group;
				*js = *jc;
				js->kind = J_SCALES;
				*jb = *jc;
				jb->kind = J_BIASES;
				if ((rc = kv_stw_add_fill(st, dn, KV_DT_U32, 3, cs, fill_job, jc)))
					break;
				snprintf(nm, sizeof nm, "%s.scales", base);
				if ((rc = kv_stw_add_fill(st, nm, t->dtype, 3, ss, fill_job, js)))
					break;
				snprintf(nm, sizeof nm, "%s.biases", base);
				rc = kv_stw_add_fill(st, nm, t->dtype, 3, ss, fill_job, jb);
			}
			continue;
		}
		/* the router and the shared expert's gate: 8 bits, groups of 64,
		 * unless an override says otherwise (mlx-lm's MoE recipes keep the
		 * routing gates at 8 bits) */
		int gate = s->role == KV_ROLE_ROUTER || (rest && strstr(rest, ".mlp.shared_expert_gate."));
		int matrix = s->role == KV_ROLE_EMBED || s->role == KV_ROLE_LM_HEAD || s->role == KV_ROLE_LINEAR ||
			     s->role == KV_ROLE_LINEAR_OUT || s->role == KV_ROLE_LINEAR_A || s->role == KV_ROLE_ROUTER;
		char base[200];
		snprintf(base, sizeof base, "%.*s", (int)(strlen(dname) - 7), dname); /* without ".weight" */
		int bits = o->bits, group = o->group_size, ov = matrix ? find_override(o->overrides, base, &bits, &group) : -1;
		if (gate && ov == -1 && s->shape[1] % 64 == 0) {
			bits = 8;
			group = 64;
			ov = 1;
		}
		if (ov == 1 && s->shape[1] % group) {
			rc = kv_fail(KV_ERR_INVALID, "MLX override for '%s': group %d does not divide its input size %lld",
				     base, group, (long long)s->shape[1]);
			break;
		}
		if (ov == 1) {
			json_t *e = json_object();
			json_object_set_new(e, "group_size", json_integer(group));
			json_object_set_new(e, "bits", json_integer(bits));
			json_object_set_new(qo, base, e);
		}
		if (matrix && ov != 0 && s->shape[1] % group == 0) {
			char nm[220];
			int64_t cs[2] = {s->shape[0], s->shape[1] * bits / 32};
			int64_t ss[2] = {s->shape[0], s->shape[1] / group};
			struct job *jc = &jobs[nj++], *js = &jobs[nj++], *jb = &jobs[nj++];
			*jc = (struct job){t, J_CODES, bits, group, s->shape[0], s->shape[1]};
			*js = *jc;
			js->kind = J_SCALES;
			*jb = *jc;
			jb->kind = J_BIASES;
			if ((rc = kv_stw_add_fill(st, dname, KV_DT_U32, 2, cs, fill_job, jc)))
				break;
			snprintf(nm, sizeof nm, "%s.scales", base);
			if ((rc = kv_stw_add_fill(st, nm, t->dtype, 2, ss, fill_job, js)))
				break;
			snprintf(nm, sizeof nm, "%s.biases", base);
			rc = kv_stw_add_fill(st, nm, t->dtype, 2, ss, fill_job, jb);
			continue;
		}
		if (matrix)
			json_object_set_new(qo, base, json_false());
		struct job *j = &jobs[nj++];
		*j = (struct job){t, J_COPY, 0, 0, 0, 0};
		int64_t shape[4];
		int nd = t->ndim;
		memcpy(shape, t->shape, sizeof shape);
		if (s->role == KV_ROLE_CONV) {
			/* mlx's Conv1d weight is [out, kernel, in / groups]. */
			nd = 3;
			shape[0] = s->shape[0];
			shape[1] = s->shape[2];
			shape[2] = 1;
		}
		/* mlx-lm's Qwen3.5 / Qwen3-Next sanitize() stores their (1 + w)
		 * norms as 1 + w; its Gemma 3 keeps w and adds 1 when it runs */
		if (s->role == KV_ROLE_NORM_OFFSET && c.hybrid)
			j->kind = J_SHIFT;
		rc = kv_stw_add_fill(st, dname, t->dtype, nd, shape, fill_job, j);
	}
	if (rc)
		goto out;
	kv_stw_meta(st, "format", "mlx");
	if ((rc = kv_io_mkdirs(o->out_dir, 0755)))
		goto out;
	snprintf(path, sizeof path, "%s/model.safetensors", o->out_dir);
	if ((rc = kv_stw_write(st, path, o->dw_flags)))
		goto out;
	snprintf(path, sizeof path, "%s/config.json", o->hf_dir);
	if ((rc = read_config(path, &cfg)))
		goto out;
	json_object_set(cfg, "quantization", qo);
	json_object_set_new(cfg, "quantization_config", json_deep_copy(qo));
	char *text = json_dumps(cfg, JSON_INDENT(2));
	if (!text) {
		rc = kv_fail(KV_ERR_NOMEM, "out of memory");
		goto out;
	}
	snprintf(path, sizeof path, "%s/config.json", o->out_dir);
	rc = kv_durable_write(path, text, strlen(text), o->dw_flags | KV_DW_PUBLIC);
	free(text);
	static const char *const files[] = {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
					    "special_tokens_map.json", "generation_config.json", "vocab.json",
					    "merges.txt", "added_tokens.json"};
	for (size_t i = 0; i < sizeof files / sizeof *files && !rc; i++)
		rc = copy_file(o->hf_dir, o->out_dir, files[i], o->dw_flags);
out:
	json_decref(cfg);
	json_decref(qo);
	kv_stw_destroy(st);
	free(jobs);
	free(esrc);
	free(sv);
	free(dv);
	kv_weights_close(w);
	return rc;
}
