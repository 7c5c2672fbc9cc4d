/*
 * safetensors.h - reader (mmap) and writer of the safetensors format.
 *
 * Format, as read here (MODELS.md):
 *   u64 LE  N                 header length, 8 <= ... <= KV_ST_MAX_HEADER
 *   N bytes JSON object       { "__metadata__": {str: str, ...}?,
 *                               "<name>": {"dtype": "BF16",
 *                                          "shape": [d0, d1, ...],
 *                                          "data_offsets": [b, e]}, ... }
 *   data section              the rest of the file; offsets are relative
 *                             to its start, end exclusive.
 * Rules checked on open (each failure names the file and the rule):
 *   file at least 8 bytes; N within bounds and inside the file; header is
 *   a JSON object; no duplicate names; every dtype known; shape a list of
 *   non-negative integers; e - b == numel x dtype size; 0 <= b <= e <= data
 *   section size; no two tensors overlap; __metadata__ values are strings.
 * Data may be unaligned (other writers do not pad the header): views are
 * plain pointers and readers must use memcpy-safe access for unaligned
 * data (kv_st_is_aligned says whether a view is naturally aligned).
 *
 * The writer pads the header with spaces to a multiple of 8 and lays
 * tensors out contiguously in the order they were added, each padded to
 * 64 bytes. It writes through the durable write helper.
 */
#ifndef KV_MODEL_SAFETENSORS_H
#define KV_MODEL_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#define KV_ST_MAX_HEADER (100u * 1024 * 1024)
#define KV_ST_MAX_DIMS 8

enum kv_dtype {
	KV_DT_F32 = 0,
	KV_DT_F16,
	KV_DT_BF16,
	KV_DT_F64,
	KV_DT_I8,
	KV_DT_U8,
	KV_DT_I16,
	KV_DT_U16,
	KV_DT_I32,
	KV_DT_U32,
	KV_DT_I64,
	KV_DT_U64,
	KV_DT_BOOL,
	KV_DT_F8_E4M3,
	KV_DT_F8_E5M2,
	KV_DT__COUNT
};

/* Bytes per element; 0 for an unknown dtype. */
size_t kv_dtype_size(int dt);
/* "F32", "BF16", ... ; NULL for unknown. */
const char *kv_dtype_name(int dt);
/* Parse a safetensors dtype string; -1 if unknown. */
int kv_dtype_parse(const char *s);

struct kv_tensor {
	const char *name;             /* owned by the file handle */
	int dtype;                    /* enum kv_dtype */
	int ndim;
	int64_t shape[KV_ST_MAX_DIMS];
	uint64_t numel;
	uint64_t nbytes;
	uint64_t offset;              /* from the start of the file */
	const void *data;             /* inside the mapping; may be unaligned */
	const char *file;             /* path of the file holding it */
};

struct kv_st;

/* Open and validate a file; maps it read-only. *out owns the mapping. */
int kv_st_open(const char *path, struct kv_st **out);
/* Validate bytes in memory (not copied: p must outlive the handle). */
int kv_st_open_mem(const void *p, size_t n, const char *what, struct kv_st **out);
void kv_st_close(struct kv_st *st);
size_t kv_st_count(const struct kv_st *st);
const struct kv_tensor *kv_st_tensor(const struct kv_st *st, size_t i);
const struct kv_tensor *kv_st_find(const struct kv_st *st, const char *name);
/* __metadata__ value for key, or NULL. Valid while st is open. */
const char *kv_st_meta(const struct kv_st *st, const char *key);
size_t kv_st_meta_count(const struct kv_st *st);
/* i-th metadata pair (insertion order of the file's JSON). */
int kv_st_meta_at(const struct kv_st *st, size_t i, const char **key, const char **val);
/* Size of the whole file / of the header JSON. */
uint64_t kv_st_file_size(const struct kv_st *st);
uint64_t kv_st_header_len(const struct kv_st *st);
int kv_st_is_aligned(const struct kv_tensor *t);

/* Element i of a tensor as float (F32, F16, BF16, F64; others return 0). */
float kv_tensor_getf(const struct kv_tensor *t, uint64_t i);
/* bf16 / f16 conversions. */
float kv_bf16_to_f32(uint16_t h);
uint16_t kv_f32_to_bf16(float f); /* round to nearest even, NaN kept */
float kv_f16_to_f32(uint16_t h);
uint16_t kv_f32_to_f16(float f);

/*
 * A model's weights: model.safetensors, or the shards listed by
 * model.safetensors.index.json ("weight_map": {tensor: file}). Every shard
 * is validated; a tensor the index names but its shard lacks is an error.
 */
struct kv_weights;
int kv_weights_open(const char *model_dir, struct kv_weights **out);
void kv_weights_close(struct kv_weights *w);
const struct kv_tensor *kv_weights_find(const struct kv_weights *w, const char *name);
size_t kv_weights_count(const struct kv_weights *w);
const struct kv_tensor *kv_weights_at(const struct kv_weights *w, size_t i);
/* Total bytes of tensor data (what is mapped). */
uint64_t kv_weights_bytes(const struct kv_weights *w);

/* Writer. Tensor data is borrowed until kv_stw_write returns. */
struct kv_stw;
struct kv_stw *kv_stw_create(void);
void kv_stw_destroy(struct kv_stw *w);
int kv_stw_add(struct kv_stw *w, const char *name, int dtype, int ndim, const int64_t *shape,
	       const void *data, uint64_t nbytes);
int kv_stw_meta(struct kv_stw *w, const char *key, const char *val);
/* flags: KV_DW_* from base/durable.h. */
int kv_stw_write(struct kv_stw *w, const char *path, unsigned flags);
/* Serialise into one malloc'd buffer (free()); for tests and small objects. */
int kv_stw_to_mem(struct kv_stw *w, void **out, size_t *len);

#endif
