/*
 * mlx.c - MLX quantized folders, see mlx.h and docs/models.md: the
 * quantization block, the quantized matrices of a weights handle, and
 * mlx's affine quantization of a group (the writer is mlx_convert.c).
 */
#include "model/mlx.h"
#include "model/config.h"
#include "model/weights.h"
#include "base/err.h"
#include "base/io.h"
#include "base/json.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct mlx_override {
	char *module;
	int quantized, bits, group;
};

struct kv_mlx_qcfg {
	int bits, group;
	struct mlx_override *ov;
	size_t n_ov;
};

void kv_mlx_qcfg_free(struct kv_mlx_qcfg *q)
{
	if (!q)
		return;
	for (size_t i = 0; i < q->n_ov; i++)
		free(q->ov[i].module);
	free(q->ov);
	free(q);
}

static int check_bits_group(const char *what, const char *key, int64_t bits, int64_t group)
{
	if (bits != 4 && bits != 8)
		return kv_fail(KV_ERR_UNSUPPORTED, "%s: %sbits is %lld; the engine runs MLX 4- and 8-bit weights", what,
			       key, (long long)bits);
	if (group != 32 && group != 64 && group != 128)
		return kv_fail(KV_ERR_UNSUPPORTED, "%s: %sgroup_size is %lld; the engine runs groups of 32, 64 or 128",
			       what, key, (long long)group);
	return KV_OK;
}

static int get_bg(const json_t *o, const char *what, const char *key, int64_t *bits, int64_t *group)
{
	json_t *b = json_object_get(o, "bits"), *g = json_object_get(o, "group_size"), *mode = json_object_get(o, "mode");
	if (!json_is_integer(b) || !json_is_integer(g))
		return kv_fail(KV_ERR_INVALID, "%s: %s needs integer \"bits\" and \"group_size\"", what, key);
	if (mode && (!json_is_string(mode) || strcmp(json_string_value(mode), "affine")))
		return kv_fail(KV_ERR_UNSUPPORTED, "%s: %s.mode is %s; the engine runs MLX \"affine\" quantization", what,
			       key, json_is_string(mode) ? json_string_value(mode) : "not a string");
	*bits = json_integer_value(b);
	*group = json_integer_value(g);
	return KV_OK;
}

int kv_mlx_qcfg_parse(const char *text, size_t len, const char *what, struct kv_mlx_qcfg **out)
{
	json_t *root = NULL;
	char *relaxed = NULL;
	size_t rlen = 0;
	int rc;
	*out = NULL;
	if ((rc = kv_config_json_relax(text, len, &relaxed, &rlen))) /* Python's bare Infinity */
		return rc;
	rc = kv_json_parse(what, relaxed ? relaxed : text, relaxed ? rlen : len, 64, &root);
	free(relaxed);
	if (rc)
		return rc;
	const char *key = "quantization";
	json_t *qo = json_object_get(root, key);
	if (!qo || json_is_null(qo)) {
		key = "quantization_config";
		qo = json_object_get(root, key);
		/* Hugging Face quantizers (GPTQ, AWQ, FP8) carry a quant_method;
		 * only mlx's block (bits + group_size, no method) is read here. */
		if (qo && json_is_object(qo) && json_object_get(qo, "quant_method")) {
			json_t *m = json_object_get(qo, "quant_method");
			json_t *mt = json_object_get(root, "model_type");
			if (json_is_string(m) && !strcmp(json_string_value(m), "mxfp4") && json_is_string(mt) &&
			    !strcmp(json_string_value(mt), "gpt_oss")) {
				/* GPT-OSS's release: its MXFP4 experts are read by
				 * engine/moe.c from the _blocks / _scales tensors */
				json_decref(root);
				return KV_OK;
			}
			rc = kv_fail(KV_ERR_UNSUPPORTED, "%s: quantization_config.quant_method %s is not supported (the "
				     "engine runs MLX affine folders)", what, json_is_string(m) ? json_string_value(m) : "?");
			json_decref(root);
			return rc;
		}
	}
	if (!qo || json_is_null(qo)) {
		json_decref(root);
		return KV_OK;
	}
	if (!json_is_object(qo)) {
		json_decref(root);
		return kv_fail(KV_ERR_INVALID, "%s: %s must be an object", what, key);
	}
	int64_t bits, group;
	char k2[160];
	snprintf(k2, sizeof k2, "%s.", key);
	if ((rc = get_bg(qo, what, key, &bits, &group)) || (rc = check_bits_group(what, k2, bits, group))) {
		json_decref(root);
		return rc;
	}
	struct kv_mlx_qcfg *q = calloc(1, sizeof *q);
	if (!q) {
		json_decref(root);
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	}
	q->bits = (int)bits;
	q->group = (int)group;
	size_t cap = json_object_size(qo);
	q->ov = calloc(cap ? cap : 1, sizeof *q->ov);
	if (!q->ov) {
		kv_mlx_qcfg_free(q);
		json_decref(root);
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	}
	const char *name;
	json_t *v;
	json_object_foreach(qo, name, v) {
		if (!strcmp(name, "bits") || !strcmp(name, "group_size") || !strcmp(name, "mode"))
			continue;
		struct mlx_override *o = &q->ov[q->n_ov];
		if (json_is_false(v)) {
			o->quantized = 0;
		} else if (json_is_object(v)) {
			snprintf(k2, sizeof k2, "%s.%s", key, name);
			if ((rc = get_bg(v, what, k2, &bits, &group)))
				break;
			snprintf(k2, sizeof k2, "%s.%s.", key, name);
			if ((rc = check_bits_group(what, k2, bits, group)))
				break;
			o->quantized = 1;
			o->bits = (int)bits;
			o->group = (int)group;
		} else if (json_is_true(v)) {
			o->quantized = 1;
			o->bits = q->bits;
			o->group = q->group;
		} else {
			continue; /* other scalar settings of newer mlx versions */
		}
		if (!(o->module = strdup(name))) {
			rc = kv_fail(KV_ERR_NOMEM, "out of memory");
			break;
		}
		q->n_ov++;
	}
	json_decref(root);
	if (rc) {
		kv_mlx_qcfg_free(q);
		return rc;
	}
	*out = q;
	return KV_OK;
}

int kv_mlx_qcfg_load(const char *dir, struct kv_mlx_qcfg **out)
{
	char path[4096];
	char *buf = NULL;
	size_t len = 0;
	int rc;
	*out = NULL;
	if ((size_t)snprintf(path, sizeof path, "%s/config.json", dir) >= sizeof path)
		return kv_fail(KV_ERR_INVALID, "model folder path too long");
	if ((rc = kv_io_read_file(path, KV_CONFIG_MAX_BYTES, &buf, &len)))
		return rc;
	rc = kv_mlx_qcfg_parse(buf, len, path, out);
	free(buf);
	return rc;
}

int kv_mlx_qcfg_lookup(const struct kv_mlx_qcfg *q, const char *module, int *bits, int *group)
{
	for (size_t i = 0; i < q->n_ov; i++)
		if (!strcmp(q->ov[i].module, module)) {
			*bits = q->ov[i].bits;
			*group = q->ov[i].group;
			return q->ov[i].quantized;
		}
	*bits = q->bits;
	*group = q->group;
	return 1;
}

void kv_mlx_qcfg_default(const struct kv_mlx_qcfg *q, int *bits, int *group)
{
	*bits = q->bits;
	*group = q->group;
}

/* --- matrices in a weights handle -------------------------------------------- */

static int is_float_dt(int dt)
{
	return dt == KV_DT_F32 || dt == KV_DT_BF16 || dt == KV_DT_F16;
}

int kv_mlx_matrix(const struct kv_weights *w, const char *weight_name, const struct kv_mlx_qcfg *q, int64_t rows,
		  int64_t cols, struct kv_mlx_qmat *out)
{
	char base[192], sname[200], bname[200], a[96], b[96];
	size_t L = strlen(weight_name);
	memset(out, 0, sizeof *out);
	const struct kv_tensor *t = kv_weights_find(w, weight_name);
	if (!t || t->dtype != KV_DT_U32)
		return KV_OK;
	if (L < 7 || strcmp(weight_name + L - 7, ".weight") || L - 7 >= sizeof base)
		return kv_fail(KV_ERR_INCOMPATIBLE, "%s: tensor '%s' is U32 but not a quantized '.weight'", t->file,
			       weight_name);
	memcpy(base, weight_name, L - 7);
	base[L - 7] = 0;
	snprintf(sname, sizeof sname, "%s.scales", base);
	snprintf(bname, sizeof bname, "%s.biases", base);
	const struct kv_tensor *s = kv_weights_find(w, sname), *bi = kv_weights_find(w, bname);
	if (!s || !bi)
		return kv_fail(KV_ERR_INCOMPATIBLE, "%s: quantized tensor '%s' has no '%s' beside it", t->file, weight_name,
			       s ? bname : sname);
	/* 2-D, or the [E, rows, ...] stacks of mlx-lm's SwitchGLU experts: the
	 * expert dimension is folded into the rows (rows = E x per-expert
	 * rows), the three tensors stacked alike */
	if (t->ndim != s->ndim || t->ndim != bi->ndim || (t->ndim != 2 && t->ndim != 3) ||
	    (t->ndim == 3 && (t->shape[0] != s->shape[0] || t->shape[0] != bi->shape[0])))
		return kv_fail(KV_ERR_INCOMPATIBLE, "%s: quantized matrix '%s': weight, scales and biases must be 2-D "
			       "or 3-D stacks alike (found %s, %s, %s)", t->file, base,
			       kv_shape_str(t->ndim, t->shape, a, sizeof a), kv_shape_str(s->ndim, s->shape, b, sizeof b),
			       kv_shape_str(bi->ndim, bi->shape, sname, sizeof sname));
	struct kv_tensor t2 = *t, s2 = *s, b2 = *bi;
	if (t->ndim == 3) {
		struct kv_tensor *f[3] = {&t2, &s2, &b2};
		for (int i = 0; i < 3; i++) {
			if (f[i]->shape[0] <= 0 || f[i]->shape[1] > INT64_MAX / f[i]->shape[0])
				return kv_fail(KV_ERR_INCOMPATIBLE, "%s: quantized stack '%s' has an unusable shape", t->file,
					       base);
			f[i]->ndim = 2;
			f[i]->shape[0] *= f[i]->shape[1];
			f[i]->shape[1] = f[i]->shape[2];
		}
		t = &t2;
		s = &s2;
		bi = &b2;
	}
	if (t->shape[0] <= 0 || t->shape[1] <= 0 || t->shape[1] > INT32_MAX / 32 || s->shape[0] <= 0 ||
	    s->shape[1] <= 0 || s->shape[1] > INT32_MAX || rows > INT32_MAX || cols > INT32_MAX)
		return kv_fail(KV_ERR_INCOMPATIBLE, "%s: quantized matrix '%s' has an unusable shape (weight %s, scales %s)",
			       t->file, base, kv_shape_str(t->ndim, t->shape, a, sizeof a),
			       kv_shape_str(s->ndim, s->shape, b, sizeof b));
	if (!is_float_dt(s->dtype) || s->dtype != bi->dtype)
		return kv_fail(KV_ERR_INCOMPATIBLE, "%s: quantized matrix '%s': scales (%s) and biases (%s) must share "
			       "one of F32, BF16, F16", s->file, base, kv_dtype_name(s->dtype), kv_dtype_name(bi->dtype));
	int bits, group;
	if (q) {
		if (!kv_mlx_qcfg_lookup(q, base, &bits, &group))
			return kv_fail(KV_ERR_INCOMPATIBLE, "%s: tensor '%s' is quantized but config.json's quantization "
				       "says '%s': false", t->file, weight_name, base);
		if (cols < 0)
			cols = t->shape[1] * 32 / bits;
		if (rows < 0)
			rows = t->shape[0];
	} else {
		/* Derive from the shapes the config implies. */
		if (rows <= 0 || cols <= 0 || t->shape[1] <= 0 || s->shape[1] <= 0 || (t->shape[1] * 32) % cols ||
		    cols % s->shape[1])
			return kv_fail(KV_ERR_INCOMPATIBLE, "%s: quantized matrix '%s' [%lld, %lld]: weight %s and scales "
				       "%s fit no bits / group_size", t->file, base, (long long)rows, (long long)cols,
				       kv_shape_str(t->ndim, t->shape, a, sizeof a),
				       kv_shape_str(s->ndim, s->shape, b, sizeof b));
		bits = (int)(t->shape[1] * 32 / cols);
		group = (int)(cols / s->shape[1]);
		int rc = check_bits_group(t->file, base, bits, group);
		if (rc)
			return rc;
	}
	if (cols <= 0 || cols % group || cols > INT32_MAX || rows <= 0 || rows > INT32_MAX)
		return kv_fail(KV_ERR_INCOMPATIBLE, "%s: quantized matrix '%s': input size %lld is not a multiple of the "
			       "group size %d", t->file, base, (long long)cols, group);
	int64_t want[2] = {rows, cols * bits / 32}, wsb[2] = {rows, cols / group};
	if (t->shape[0] != want[0] || t->shape[1] != want[1])
		return kv_fail(KV_ERR_INCOMPATIBLE, "%s: tensor '%s' has shape %s, expected %s (%lld x %lld at %d bits)",
			       t->file, weight_name, kv_shape_str(t->ndim, t->shape, a, sizeof a),
			       kv_shape_str(2, want, b, sizeof b), (long long)rows, (long long)cols, bits);
	for (int i = 0; i < 2; i++) {
		const struct kv_tensor *x = i ? bi : s;
		if (x->shape[0] != wsb[0] || x->shape[1] != wsb[1])
			return kv_fail(KV_ERR_INCOMPATIBLE, "%s: tensor '%s' has shape %s, expected %s (groups of %d)",
				       x->file, x->name, kv_shape_str(x->ndim, x->shape, a, sizeof a),
				       kv_shape_str(2, wsb, b, sizeof b), group);
	}
	out->codes = kv_weights_find(w, weight_name);
	out->scales = kv_weights_find(w, sname);
	out->biases = kv_weights_find(w, bname);
	out->bits = bits;
	out->group = group;
	out->rows = rows;
	out->cols = cols;
	return KV_OK;
}

/* --- quantization ----------------------------------------------------------- */

void kv_mlx_quant_params(const float *x, int n, int bits, float *scale, float *bias)
{
	float mn = x[0], mx = x[0];
	for (int i = 1; i < n; i++) {
		mn = x[i] < mn ? x[i] : mn;
		mx = x[i] > mx ? x[i] : mx;
	}
	const float nb = (float)((1 << bits) - 1), eps = 1e-7f;
	/* The endpoint of larger magnitude is the bias (q = 0); the step is
	 * then nudged so that zero falls on a code exactly (mlx's scheme). */
	int lo_edge = fabsf(mn) > fabsf(mx);
	float s = (mx - mn) / nb;
	s = s > eps ? s : eps;
	if (!lo_edge)
		s = -s;
	float edge = lo_edge ? mn : mx;
	float q0 = rintf(edge / s);
	if (q0 != 0.0f) {
		s = edge / q0;
		*bias = edge;
	} else {
		*bias = 0.0f;
	}
	*scale = s;
}

void kv_mlx_quant_codes(const float *x, int n, int bits, float scale, float bias, uint8_t *codes)
{
	const float nb = (float)((1 << bits) - 1);
	for (int i = 0; i < n; i++) {
		float q = scale != 0.0f ? rintf((x[i] - bias) / scale) : 0.0f;
		q = q < 0.0f ? 0.0f : q > nb ? nb : q;
		if (q != q)
			q = 0.0f;
		codes[i] = (uint8_t)q;
	}
}

void kv_mlx_pack(const uint8_t *codes, int n, int bits, uint8_t *out)
{
	if (bits == 8) {
		memcpy(out, codes, (size_t)n);
		return;
	}
	for (int i = 0; i < n; i += 2)
		out[i / 2] = (uint8_t)((codes[i] & 15u) | (uint8_t)((codes[i + 1] & 15u) << 4));
}
