/*
 * mlx.c - MLX quantized folders, see mlx.h and docs/models.md.
 */
#include "model/mlx.h"
#include "model/config.h"
#include "model/safetensors.h"
#include "base/durable.h"
#include "base/err.h"
#include "base/io.h"
#include "base/json.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MLX_CFG_MAX (16u * 1024 * 1024)

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
	int rc;
	*out = NULL;
	if ((rc = kv_json_parse(what, text, len, 64, &root)))
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
	if ((rc = kv_io_read_file(path, MLX_CFG_MAX, &buf, &len)))
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

/* --- writer ----------------------------------------------------------------- */

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
	for (size_t i = 0; i < kv_weights_count(w); i++)
		if (kv_weights_at(w, i)->dtype == KV_DT_U32) {
			rc = kv_fail(KV_ERR_INVALID, "%s is already quantized (tensor '%s' is U32)", o->hf_dir,
				     kv_weights_at(w, i)->name);
			goto out;
		}
	/* mlx-lm's names: Qwen3.5 lives under language_model (its sanitize()
	 * maps model.language_model.* and model.* there); the others keep the
	 * Hugging Face names. */
	int lm = c.arch == KV_ARCH_QWEN3_5;
	const char *dprefix = lm ? "language_model.model." : "model.";
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
		if (rest && (s->expert >= 0 || strstr(rest, ".mlp.experts.") || strstr(rest, ".mlp.switch_mlp."))) {
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
			} else if (strstr(rest, "gate_up_proj")) {
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
				snprintf(base, sizeof base, "%slayers.%d.mlp.switch_mlp.%s_proj", dprefix, s->layer, which[k]);
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
		if (s->role == KV_ROLE_NORM_OFFSET)
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
	if ((rc = kv_json_load_file(path, MLX_CFG_MAX, &cfg)))
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
