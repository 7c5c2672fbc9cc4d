/*
 * tensor.h - one tensor of a weight file, whatever the file's format: its
 * name, dtype, shape and mapped bytes, and the ways to read them (typed
 * views, conversion to f32, checks of dtype and shape).
 *
 * Readers fill struct kv_tensor (model/safetensors.c for safetensors,
 * model/gguf.c for GGUF, model/gguf_model.c under Hugging Face names) and
 * own its strings and data. Data may be unaligned (other writers do not
 * pad their headers): views are plain pointers and readers must use
 * memcpy-safe access for unaligned data (kv_tensor_is_aligned says whether
 * a view is naturally aligned; kv_tensor_view refuses unaligned data,
 * kv_tensor_to_f32 and kv_tensor_dup work on any).
 */
#ifndef KV_MODEL_TENSOR_H
#define KV_MODEL_TENSOR_H

#include <stddef.h>
#include <stdint.h>

#include "model/dtype.h"

#define KV_TENSOR_MAX_DIMS 8

struct kv_tensor {
	const char *name;             /* owned by the file handle */
	int dtype;                    /* enum kv_dtype */
	int ndim;
	int64_t shape[KV_TENSOR_MAX_DIMS];
	uint64_t numel;
	uint64_t nbytes;
	uint64_t offset;              /* from the start of the file */
	const void *data;             /* inside the mapping; may be unaligned */
	const char *file;             /* path of the file holding it */
};

/* 1 if t's data is naturally aligned for its element type. */
int kv_tensor_is_aligned(const struct kv_tensor *t);

/* Element i of a tensor as float: float dtypes converted, integer and
 * BOOL dtypes by value, F8 types and i >= numel give 0. Unaligned-safe. */
float kv_tensor_getf(const struct kv_tensor *t, uint64_t i);

/*
 * Typed views. kv_tensor_view returns the data pointer when the tensor
 * has dtype `dt` and its data is naturally aligned for it, else NULL with
 * a kv_fail message naming the tensor, its file and what differed. The
 * pointer lives as long as the file/weights handle.
 */
const void *kv_tensor_view(const struct kv_tensor *t, int dt);
const float *kv_tensor_f32(const struct kv_tensor *t);
const uint16_t *kv_tensor_bf16(const struct kv_tensor *t);
const uint16_t *kv_tensor_f16(const struct kv_tensor *t);
const int32_t *kv_tensor_i32(const struct kv_tensor *t);
const int64_t *kv_tensor_i64(const struct kv_tensor *t);
const uint8_t *kv_tensor_u8(const struct kv_tensor *t);
/* Convert elements [start, start + n) of an F32/BF16/F16/F64 tensor to f32
 * into dst (any alignment of the source). KV_ERR_INVALID for another dtype
 * or a range past numel. */
int kv_tensor_to_f32(const struct kv_tensor *t, float *dst, uint64_t start, uint64_t n);
/* A 64-byte aligned copy of the raw bytes, from kv_alloc(cat, nbytes)
 * (free with kv_free). For unaligned tensors the engine wants in place. */
void *kv_tensor_dup(const struct kv_tensor *t, int mem_cat);
/* Check dtype class and shape: KV_ERR_INCOMPATIBLE naming the tensor, its
 * file, the expected and the found shape. dt < 0 accepts any dtype. */
int kv_tensor_expect(const struct kv_tensor *t, int dt, int ndim, const int64_t *shape);
/* "[d0, d1, ...]" into buf (always NUL-terminated); returns buf. */
const char *kv_shape_str(int ndim, const int64_t *shape, char *buf, size_t cap);

#endif
