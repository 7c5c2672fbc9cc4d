/*
 * safetensors.h - reader (mmap) and writer of the safetensors format.
 *
 * Format, as read here (docs/models.md):
 *   u64 LE  N                 header length, 2 <= N <= KV_ST_MAX_HEADER
 *   N bytes JSON object       { "__metadata__": {str: str, ...}?,
 *                               "<name>": {"dtype": "BF16",
 *                                          "shape": [d0, d1, ...],
 *                                          "data_offsets": [b, e]}, ... }
 *   data section              the rest of the file; offsets are relative
 *                             to its start, end exclusive.
 * Rules checked on open (each failure names the file and the rule):
 *   file at least 8 bytes; N within bounds and inside the file; header is
 *   a JSON object; no duplicate names; every dtype known; shape a list of
 *   non-negative integers, at most KV_ST_MAX_DIMS of them, whose product
 *   does not overflow; data_offsets two non-negative integers; e - b ==
 *   numel x dtype size; 0 <= b <= e <= data section size; no two tensors
 *   overlap; __metadata__ an object whose values are strings; the JSON
 *   nested at most 16 deep. Failures are KV_ERR_CORRUPT through
 *   KV_CORRUPT (logged and counted), e.g. "model.safetensors: tensor 'x':
 *   data_offsets [0, 40] past the data section of 32 bytes (offset 88)".
 * Tensors may leave gaps between them (we accept what other readers
 * accept); overlap is corruption. A tensor with zero elements has b == e.
 * Data may be unaligned (other writers do not pad the header): views are
 * plain pointers and readers must use memcpy-safe access for unaligned
 * data (kv_st_is_aligned says whether a view is naturally aligned;
 * kv_tensor_view refuses unaligned data, kv_tensor_to_f32 and
 * kv_tensor_dup work on any).
 *
 * The writer pads the header with spaces to a multiple of 8 -- more
 * precisely, so that the data section starts at a file offset that is a
 * multiple of 64 -- and lays tensors out contiguously, without gaps, in
 * the order they were added (the official safetensors library rejects
 * gaps, and the disk tier's objects must open in standard tools). So in
 * a file of ours every tensor of an element size s sits at a file offset
 * that is a multiple of s when all tensors before it have sizes that keep
 * it so (true for a file of one dtype). "__metadata__" comes first. The
 * writer goes through the durable write helper (temp file, fdatasync,
 * rename) and never copies large tensor data: it writes the header, then
 * each tensor's bytes straight from the caller's buffer (small tensors are
 * batched through one 1 MiB staging buffer to save syscalls).
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
	/* ggml block types (GGUF files; model/quant.h has the layouts). They
	 * have no per-element size: kv_dtype_size is 0 for them, rows are
	 * sized by kv_dtype_row_bytes. Never parsed from safetensors. */
	KV_DT_Q4_0,
	KV_DT_Q4_1,
	KV_DT_Q5_0,
	KV_DT_Q5_1,
	KV_DT_Q8_0,
	KV_DT_Q2_K,
	KV_DT_Q3_K,
	KV_DT_Q4_K,
	KV_DT_Q5_K,
	KV_DT_Q6_K,
	KV_DT_Q8_K,
	KV_DT__COUNT,
	/* Weight-matrix formats that are not safetensors element types (no
	 * size, no name; kv_dtype_parse never returns them): */
	KV_DT_MLX_AFFINE, /* MLX affine groups, engine/gemm.h struct ke_mat */
};

/* Bytes per element; 0 for an unknown dtype and for block types. */
size_t kv_dtype_size(int dt);
/* Bytes of a row of n elements of any dtype, block types included; 0 if
 * the dtype is unknown or n is not a multiple of its block. */
uint64_t kv_dtype_row_bytes(int dt, uint64_t n);
/* "F32", "BF16", "Q4_K", ... ; NULL for unknown. */
const char *kv_dtype_name(int dt);
/* Parse a safetensors dtype string; -1 if unknown (block types are not
 * safetensors dtypes and are not parsed). */
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
/* Errors: KV_ERR_NOT_FOUND when the folder has neither file, KV_ERR_CORRUPT
 * for a malformed file or index (message names the file and the rule).
 * The mapped bytes are counted under KV_MEM_WEIGHTS (kv_mem_note) while
 * the handle is open. Tensor pointers stay valid until kv_weights_close. */
int kv_weights_open(const char *model_dir, struct kv_weights **out);
void kv_weights_close(struct kv_weights *w);
const struct kv_tensor *kv_weights_find(const struct kv_weights *w, const char *name);
size_t kv_weights_count(const struct kv_weights *w);
const struct kv_tensor *kv_weights_at(const struct kv_weights *w, size_t i);
/* Total bytes of tensor data (what is mapped). */
uint64_t kv_weights_bytes(const struct kv_weights *w);

/* Number of shard files (1 for a single model.safetensors). */
size_t kv_weights_nfiles(const struct kv_weights *w);
/* The GGUF file behind the weights, or NULL for safetensors. A GGUF path
 * (a .gguf file, a split set or a folder holding one: model/gguf.h) opens
 * the same way; tensors come under their Hugging Face names
 * (model/gguf_model.h). */
struct kv_gguf;
const struct kv_gguf *kv_weights_gguf(const struct kv_weights *w);
/* Bytes of tensor copies the handle owns (GGUF value-head permutations),
 * on top of the mapped files. */
uint64_t kv_weights_owned_bytes(const struct kv_weights *w);

/*
 * Writer. Tensor data is borrowed until kv_stw_write / kv_stw_to_mem
 * returns (the writer keeps the pointer, not a copy). Names and metadata
 * are copied. Errors (KV_ERR_INVALID): unknown dtype, nbytes != numel x
 * dtype size, more than KV_ST_MAX_DIMS dims, negative dims, a duplicate
 * or empty name, "__metadata__" as a tensor name, invalid UTF-8.
 */
struct kv_stw;
struct kv_stw *kv_stw_create(void);
void kv_stw_destroy(struct kv_stw *w);
int kv_stw_add(struct kv_stw *w, const char *name, int dtype, int ndim, const int64_t *shape,
	       const void *data, uint64_t nbytes);
/*
 * Like kv_stw_add, but the bytes are produced at write time: fill(ctx,
 * dst, nbytes) must write exactly the tensor's nbytes into dst (a writer
 * scratch buffer, valid during the call) and return KV_OK or an error,
 * which aborts the write. Lets a generator write a large model with one
 * tensor in memory at a time. ctx is borrowed like data.
 */
typedef int (*kv_stw_fill_fn)(void *ctx, void *dst, uint64_t nbytes);
int kv_stw_add_fill(struct kv_stw *w, const char *name, int dtype, int ndim, const int64_t *shape,
		    kv_stw_fill_fn fill, void *ctx);
/* Add or replace a __metadata__ entry (both strings copied). */
int kv_stw_meta(struct kv_stw *w, const char *key, const char *val);
/* Size the file will have, known before writing. */
uint64_t kv_stw_size(const struct kv_stw *w);
/* flags: KV_DW_* from base/durable.h. */
int kv_stw_write(struct kv_stw *w, const char *path, unsigned flags);
/* Serialise into one malloc'd buffer (free()); for tests and small objects. */
int kv_stw_to_mem(struct kv_stw *w, void **out, size_t *len);

#endif
