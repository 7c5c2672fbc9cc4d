/*
 * tensor.c - see tensor.h. Block types convert through model/quant.c's
 * dequantizers, so a quantized tensor reads as exactly the values the
 * engine multiplies.
 */
#include "model/tensor.h"
#include "model/quant.h"
#include "base/err.h"
#include "base/mem.h"

#include <stdio.h>
#include <string.h>

float kv_tensor_getf(const struct kv_tensor *t, uint64_t i)
{
	const uint8_t *p;
	if (!t || i >= t->numel || !t->data)
		return 0.0f;
	p = (const uint8_t *)t->data + i * kv_dtype_size(t->dtype);
	switch (t->dtype) {
	case KV_DT_F32: { float v; memcpy(&v, p, 4); return v; }
	case KV_DT_F64: { double v; memcpy(&v, p, 8); return (float)v; }
	case KV_DT_BF16: { uint16_t v; memcpy(&v, p, 2); return kv_bf16_to_f32(v); }
	case KV_DT_F16: { uint16_t v; memcpy(&v, p, 2); return kv_f16_to_f32(v); }
	case KV_DT_I8: return (float)*(const int8_t *)p;
	case KV_DT_U8: return (float)*p;
	case KV_DT_BOOL: return *p ? 1.0f : 0.0f;
	case KV_DT_I16: { int16_t v; memcpy(&v, p, 2); return (float)v; }
	case KV_DT_U16: { uint16_t v; memcpy(&v, p, 2); return (float)v; }
	case KV_DT_I32: { int32_t v; memcpy(&v, p, 4); return (float)v; }
	case KV_DT_U32: { uint32_t v; memcpy(&v, p, 4); return (float)v; }
	case KV_DT_I64: { int64_t v; memcpy(&v, p, 8); return (float)v; }
	case KV_DT_U64: { uint64_t v; memcpy(&v, p, 8); return (float)v; }
	}
	return 0.0f;
}

int kv_tensor_is_aligned(const struct kv_tensor *t)
{
	size_t s = kv_dtype_size(t->dtype);
	return s && ((uintptr_t)t->data % s) == 0;
}

const void *kv_tensor_view(const struct kv_tensor *t, int dt)
{
	if (t->dtype != dt) {
		kv_fail(KV_ERR_INCOMPATIBLE, "%s: tensor '%s' is %s, wanted %s", t->file ? t->file : "?", t->name,
			kv_dtype_name(t->dtype), kv_dtype_name(dt) ? kv_dtype_name(dt) : "?");
		return NULL;
	}
	if (!kv_tensor_is_aligned(t)) {
		kv_fail(KV_ERR_INCOMPATIBLE, "%s: tensor '%s' data at file offset %llu is not %zu-byte aligned",
			t->file ? t->file : "?", t->name, (unsigned long long)t->offset, kv_dtype_size(dt));
		return NULL;
	}
	return t->data;
}

const float *kv_tensor_f32(const struct kv_tensor *t) { return kv_tensor_view(t, KV_DT_F32); }
const uint16_t *kv_tensor_bf16(const struct kv_tensor *t) { return kv_tensor_view(t, KV_DT_BF16); }
const uint16_t *kv_tensor_f16(const struct kv_tensor *t) { return kv_tensor_view(t, KV_DT_F16); }
const int32_t *kv_tensor_i32(const struct kv_tensor *t) { return kv_tensor_view(t, KV_DT_I32); }
const int64_t *kv_tensor_i64(const struct kv_tensor *t) { return kv_tensor_view(t, KV_DT_I64); }
const uint8_t *kv_tensor_u8(const struct kv_tensor *t) { return kv_tensor_view(t, KV_DT_U8); }

int kv_tensor_to_f32(const struct kv_tensor *t, float *dst, uint64_t start, uint64_t n)
{
	const uint8_t *p;
	size_t es = kv_dtype_size(t->dtype);
	if (start > t->numel || n > t->numel - start)
		return kv_fail(KV_ERR_INVALID, "%s: tensor '%s': elements [%llu, +%llu) past its %llu",
			       t->file ? t->file : "?", t->name, (unsigned long long)start, (unsigned long long)n,
			       (unsigned long long)t->numel);
	if (kv_dtype_is_quant(t->dtype)) {
		/* Whole blocks only: rows are whole blocks in a valid file. */
		uint64_t qk = (uint64_t)kv_dtype_block_elems(t->dtype);
		if (start % qk || n % qk)
			return kv_fail(KV_ERR_INVALID, "%s: tensor '%s': elements [%llu, +%llu) are not whole %s blocks",
				       t->file ? t->file : "?", t->name, (unsigned long long)start,
				       (unsigned long long)n, kv_dtype_name(t->dtype));
		return kq_dequant_row(t->dtype, (const uint8_t *)t->data + start / qk * kv_dtype_block_bytes(t->dtype), dst,
				      (size_t)n);
	}
	p = (const uint8_t *)t->data + start * es;
	switch (t->dtype) {
	case KV_DT_F32:
		memcpy(dst, p, n * 4);
		return KV_OK;
	case KV_DT_BF16:
		for (uint64_t i = 0; i < n; i++) {
			uint16_t v;
			memcpy(&v, p + 2 * i, 2);
			dst[i] = kv_bf16_to_f32(v);
		}
		return KV_OK;
	case KV_DT_F16:
		for (uint64_t i = 0; i < n; i++) {
			uint16_t v;
			memcpy(&v, p + 2 * i, 2);
			dst[i] = kv_f16_to_f32(v);
		}
		return KV_OK;
	case KV_DT_F64:
		for (uint64_t i = 0; i < n; i++) {
			double v;
			memcpy(&v, p + 8 * i, 8);
			dst[i] = (float)v;
		}
		return KV_OK;
	}
	return kv_fail(KV_ERR_INVALID, "%s: tensor '%s' is %s, not a float type", t->file ? t->file : "?", t->name,
		       kv_dtype_name(t->dtype));
}

void *kv_tensor_dup(const struct kv_tensor *t, int mem_cat)
{
	void *p = kv_alloc(mem_cat, t->nbytes ? (size_t)t->nbytes : 1);
	if (p && t->nbytes)
		memcpy(p, t->data, (size_t)t->nbytes);
	return p;
}

const char *kv_shape_str(int ndim, const int64_t *shape, char *buf, size_t cap)
{
	size_t o = 0;
	if (!cap)
		return buf;
	buf[0] = 0;
	o += (size_t)snprintf(buf + o, cap - o, "[");
	for (int i = 0; i < ndim && o < cap; i++)
		o += (size_t)snprintf(buf + o, cap - o, "%s%lld", i ? ", " : "", (long long)shape[i]);
	if (o < cap)
		snprintf(buf + o, cap - o, "]");
	return buf;
}

int kv_tensor_expect(const struct kv_tensor *t, int dt, int ndim, const int64_t *shape)
{
	char want[160], got[160];
	int same = t->ndim == ndim;
	for (int i = 0; same && i < ndim; i++)
		same = t->shape[i] == shape[i];
	if (!same)
		return kv_fail(KV_ERR_INCOMPATIBLE, "%s: tensor '%s' has shape %s, expected %s",
			       t->file ? t->file : "?", t->name, kv_shape_str(t->ndim, t->shape, got, sizeof got),
			       kv_shape_str(ndim, shape, want, sizeof want));
	if (dt >= 0 && t->dtype != dt)
		return kv_fail(KV_ERR_INCOMPATIBLE, "%s: tensor '%s' is %s, expected %s", t->file ? t->file : "?",
			       t->name, kv_dtype_name(t->dtype), kv_dtype_name(dt) ? kv_dtype_name(dt) : "?");
	return KV_OK;
}
