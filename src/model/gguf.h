/*
 * gguf.h - reader (mmap) and writer of GGUF v3, llama.cpp's model format.
 *
 * Format (little endian; "str" is u64 length + that many bytes of UTF-8,
 * no NUL):
 *   u32  magic            "GGUF" (0x46554747 read as u32)
 *   u32  version          KV_GGUF_VERSION (3; 2 is read too: same layout)
 *   u64  n_tensors
 *   u64  n_kv
 *   n_kv times:  str key; u32 value type; value
 *        value types: 0 u8, 1 i8, 2 u16, 3 i16, 4 u32, 5 i32, 6 f32,
 *        7 bool (u8 0/1), 8 str, 9 array (u32 element type, u64 count,
 *        count elements; arrays of arrays are refused), 10 u64, 11 i64,
 *        12 f64
 *   n_tensors times:  str name; u32 n_dims (1..4); u64 ne[n_dims]
 *        (ne[0] = elements of a row, innermost); u32 ggml type; u64 offset
 *        (from the start of the data section, a multiple of the alignment)
 *   padding to a multiple of general.alignment (u32 key, default 32)
 *   data section          tensor data, each tensor ne[0] / QK blocks per
 *                         row, rows contiguous (model/quant.h)
 * Split sets: "<stem>-00001-of-0000N.gguf" ... each a full GGUF file with
 * split.no (u16, 0-based), split.count (u16) and split.tensors.count
 * (i32); metadata is read from the first, tensors from all.
 *
 * Rules checked on open (KV_ERR_CORRUPT via KV_CORRUPT with the file and
 * byte offset, unless said otherwise): magic (else KV_ERR_NOT_OURS),
 * version 2 or 3 (else KV_ERR_VERSION); every length and count fits in
 * the bytes left (so a huge string length or an array "bomb" is refused
 * before anything is allocated); key length <= 65535; no duplicate key or
 * tensor name; known value types; general.alignment a power of two <= 1 MiB;
 * n_dims 1..4, each ne >= 1 and < 2^62, products without overflow; a ggml
 * type kvkeep reads (else KV_ERR_UNSUPPORTED naming the tensor and the
 * type, e.g. "tensor 'blk.0.ffn_up.weight' has ggml type IQ2_XXS (16),
 * which kvkeep does not read"); ne[0] a multiple of the type's block
 * ("... 100 elements per row do not divide into Q4_K blocks of 256");
 * offset aligned; data inside the file; tensors do not overlap.
 *
 * Tensors keep GGUF's names and its shape order reversed into the row-
 * major order used everywhere else in kvkeep (shape[0] = rows = ne[1]).
 *
 * The writer records metadata and tensors (data borrowed, or produced at
 * write time by a fill callback, one tensor in memory at a time), lays
 * tensors out in the order added, each at an offset aligned to 32, and
 * writes through the durable write helper (temp file, fdatasync, rename).
 */
#ifndef KV_MODEL_GGUF_H
#define KV_MODEL_GGUF_H

#include <stddef.h>
#include <stdint.h>

#include "model/tensor.h"

#define KV_GGUF_MAGIC 0x46554747u /* "GGUF" */
#define KV_GGUF_VERSION 3u
#define KV_GGUF_ALIGN 32u
#define KV_GGUF_MAX_DIMS 4
#define KV_GGUF_MAX_SPLITS 256

enum kv_gguf_vtype {
	KV_GGUF_U8 = 0, KV_GGUF_I8 = 1, KV_GGUF_U16 = 2, KV_GGUF_I16 = 3, KV_GGUF_U32 = 4, KV_GGUF_I32 = 5,
	KV_GGUF_F32 = 6, KV_GGUF_BOOL = 7, KV_GGUF_STR = 8, KV_GGUF_ARR = 9, KV_GGUF_U64 = 10, KV_GGUF_I64 = 11,
	KV_GGUF_F64 = 12, KV_GGUF__NTYPES
};

/* One metadata entry. Strings point into the mapping (not NUL-ended). */
struct kv_gguf_kv {
	const char *key;       /* NUL-terminated copy */
	int type;              /* enum kv_gguf_vtype */
	int arr_type;          /* element type when type == KV_GGUF_ARR */
	uint64_t n;            /* array length (1 for scalars) */
	union {
		uint64_t u;
		int64_t i;
		double f;
	} v;                   /* scalar value, widened */
	const char *s;         /* string value */
	uint64_t slen;
	const uint8_t *arr;    /* array of fixed-size elements, in the mapping */
	const char **astr;     /* string arrays: n pointers ... */
	uint64_t *alen;        /* ... and n lengths (malloc'd) */
};

struct kv_gguf;

/*
 * Open a .gguf file, the first (or any) file of a split set, or a folder
 * holding one .gguf file or one split set. Errors as listed above;
 * KV_ERR_NOT_FOUND for a folder without one. Mapped bytes are noted under
 * KV_MEM_WEIGHTS while the handle is open.
 */
int kv_gguf_open(const char *path, struct kv_gguf **out);
/* Validate bytes in memory (p must outlive the handle); no split sets. */
int kv_gguf_open_mem(const void *p, size_t n, const char *what, struct kv_gguf **out);
void kv_gguf_close(struct kv_gguf *g);
/* 1 if path names a GGUF model: a file ending in .gguf or starting with
 * the GGUF magic (an Ollama blob has no suffix), or a folder without
 * config.json that holds a .gguf file. */
int kv_gguf_is_model_path(const char *path);
/* Path of the (first) file; valid while open. */
const char *kv_gguf_path(const struct kv_gguf *g);
uint32_t kv_gguf_version(const struct kv_gguf *g);
size_t kv_gguf_nfiles(const struct kv_gguf *g);
uint64_t kv_gguf_file_bytes(const struct kv_gguf *g);
/* The header bytes (magic up to the data section: metadata and tensor
 * table) of file i of the set, inside the mapping; for fingerprints. */
int kv_gguf_header(const struct kv_gguf *g, size_t i, const void **p, size_t *n);

size_t kv_gguf_kv_count(const struct kv_gguf *g);
const struct kv_gguf_kv *kv_gguf_kv_at(const struct kv_gguf *g, size_t i);
const struct kv_gguf_kv *kv_gguf_kv_find(const struct kv_gguf *g, const char *key);
/* Typed getters: KV_ERR_NOT_FOUND if absent, KV_ERR_INCOMPATIBLE if the
 * value has another type (integers convert between widths when the value
 * fits; floats accept f32/f64). */
int kv_gguf_get_int(const struct kv_gguf *g, const char *key, int64_t *out);
int kv_gguf_get_float(const struct kv_gguf *g, const char *key, double *out);
int kv_gguf_get_bool(const struct kv_gguf *g, const char *key, int *out);
/* A malloc'd NUL-terminated copy (free()). */
int kv_gguf_get_str(const struct kv_gguf *g, const char *key, char **out);
/* Element i of an integer array (any integer element type). */
int kv_gguf_arr_int(const struct kv_gguf_kv *kv, uint64_t i, int64_t *out);

size_t kv_gguf_tensor_count(const struct kv_gguf *g);
/* Tensors with GGUF names and row-major shapes; dtype is a kv_dtype;
 * data inside the mapping. Valid while g is open. */
const struct kv_tensor *kv_gguf_tensor_at(const struct kv_gguf *g, size_t i);
const struct kv_tensor *kv_gguf_tensor_find(const struct kv_gguf *g, const char *name);

/* --- writer ---------------------------------------------------------------- */

struct kv_ggufw;
struct kv_ggufw *kv_ggufw_create(void);
void kv_ggufw_destroy(struct kv_ggufw *w);
/* Metadata setters; a key set twice keeps the last value (order of first
 * setting). Strings are copied. */
int kv_ggufw_set_u16(struct kv_ggufw *w, const char *key, uint16_t v);
int kv_ggufw_set_u32(struct kv_ggufw *w, const char *key, uint32_t v);
int kv_ggufw_set_i32(struct kv_ggufw *w, const char *key, int32_t v);
int kv_ggufw_set_u64(struct kv_ggufw *w, const char *key, uint64_t v);
int kv_ggufw_set_f32(struct kv_ggufw *w, const char *key, float v);
int kv_ggufw_set_bool(struct kv_ggufw *w, const char *key, int v);
int kv_ggufw_set_str(struct kv_ggufw *w, const char *key, const char *v);
/* Arrays: strings (n NUL-terminated strings, copied) and i32 (copied). */
int kv_ggufw_set_arr_str(struct kv_ggufw *w, const char *key, size_t n, const char *const *v);
int kv_ggufw_set_arr_i32(struct kv_ggufw *w, const char *key, size_t n, const int32_t *v);
/* A tensor of kv_dtype dt and row-major shape (shape[ndim-1] = row
 * length, a multiple of the block). data is borrowed until write. */
int kv_ggufw_add(struct kv_ggufw *w, const char *name, int dt, int ndim, const int64_t *shape, const void *data,
		 uint64_t nbytes);
typedef int (*kv_ggufw_fill_fn)(void *ctx, void *dst, uint64_t nbytes);
int kv_ggufw_add_fill(struct kv_ggufw *w, const char *name, int dt, int ndim, const int64_t *shape,
		      kv_ggufw_fill_fn fill, void *ctx);
/* flags: KV_DW_* (base/durable.h). */
int kv_ggufw_write(struct kv_ggufw *w, const char *path, unsigned flags);
/* A split set "<prefix>-00001-of-0000N.gguf" ... as llama.cpp's
 * gguf-split writes it: a new file when the next tensor would take the
 * current file's tensor bytes past max_bytes (0: no limit) or after every
 * max_tensors tensors (0: no limit); file 1 holds the metadata; all files
 * split.no / split.count / split.tensors.count. All or nothing: on failure
 * no file of the set is left. *n_files (may be NULL) gets N. At most
 * KV_GGUF_MAX_SPLITS files (KV_ERR_INVALID beyond). */
int kv_ggufw_write_split(struct kv_ggufw *w, const char *prefix, uint64_t max_bytes, uint32_t max_tensors,
			 unsigned flags, int *n_files);
/* Into one malloc'd buffer (free()), for tests. */
int kv_ggufw_to_mem(struct kv_ggufw *w, void **out, size_t *len);

#endif
