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
 * Data may be unaligned (other writers do not pad the header): the
 * tensors are struct kv_tensor (model/tensor.h), whose views say so.
 * A model's weights, one file or an index of shards, open through
 * model/weights.h.
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

#include "model/tensor.h"

#define KV_ST_MAX_HEADER (100u * 1024 * 1024)
#define KV_ST_MAX_DIMS KV_TENSOR_MAX_DIMS /* a tensor's own limit (model/tensor.h) */

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
