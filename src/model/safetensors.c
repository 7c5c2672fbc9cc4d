/*
 * safetensors.c - see safetensors.h for the format and the rules.
 *
 * Reader: the file is mapped read-only once; the header JSON is parsed by
 * jansson (duplicate keys rejected by the parser itself), then every entry
 * is checked and copied into a flat kv_tensor table plus a name -> index
 * map. Nothing in the data section is read at open time, so opening a
 * 20 GB model costs the header only. Every failure goes through
 * KV_CORRUPT, which names the file, the byte offset and the rule.
 *
 * Writer: entries are recorded with borrowed data pointers; kv_stw_write
 * computes the header (offsets are known from the sizes), pads it so the
 * data section starts 64-byte aligned, and streams header + tensors into
 * a durable temp file. Host byte order is assumed little-endian (x86-64,
 * aarch64), which is what safetensors stores.
 */
#include "model/safetensors.h"
#include "base/buf.h"
#include "base/corrupt.h"
#include "base/durable.h"
#include "base/err.h"
#include "base/io.h"
#include "base/json.h"
#include "base/map.h"
#include "base/mem.h"
#include "base/utf8.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>

/* Deepest legitimate header: object -> entry object -> shape array. */
#define ST_MAX_DEPTH 16
/* Writer staging buffer for small tensors, and the size below which a
 * tensor is staged instead of written by its own syscall. */
#define STW_STAGE (1u << 20)
#define STW_SMALL (256u * 1024)

/* --- reader -------------------------------------------------------------- */

struct kv_st {
	char *path;               /* name used in messages (malloc'd) */
	const uint8_t *base;      /* whole file */
	size_t size;              /* bytes of the file */
	int mapped;               /* base is our mmap: munmap on close */
	uint64_t hdr_len;         /* N */
	struct kv_tensor *t;      /* n entries, file order of the JSON */
	size_t n;
	char **mkey, **mval;      /* __metadata__, n_meta pairs */
	size_t n_meta;
	struct kv_map *idx;       /* name -> index into t */
};

static void st_free(struct kv_st *st)
{
	if (!st)
		return;
	for (size_t i = 0; i < st->n; i++)
		free((char *)st->t[i].name);
	for (size_t i = 0; i < st->n_meta; i++) {
		free(st->mkey[i]);
		free(st->mval[i]);
	}
	free(st->t);
	free(st->mkey);
	free(st->mval);
	kv_map_destroy(st->idx);
	if (st->mapped && st->base)
		munmap((void *)st->base, st->size);
	free(st->path);
	free(st);
}

/* A JSON integer >= 0 (jansson gives int64). */
static int json_uint(const json_t *v, uint64_t *out)
{
	if (!json_is_integer(v) || json_integer_value(v) < 0)
		return 0;
	*out = (uint64_t)json_integer_value(v);
	return 1;
}

static int cmp_by_begin(const void *a, const void *b, void *ctx)
{
	const struct kv_tensor *t = ctx;
	uint64_t x = t[*(const size_t *)a].offset, y = t[*(const size_t *)b].offset;
	return x < y ? -1 : x > y;
}

static int st_meta(struct kv_st *st, json_t *m, uint64_t hoff)
{
	const char *k;
	json_t *v;
	size_t n = json_object_size(m), i = 0;
	if (!json_is_object(m))
		return KV_CORRUPT(st->path, hoff, "__metadata__ is not an object of strings");
	st->mkey = calloc(n ? n : 1, sizeof *st->mkey);
	st->mval = calloc(n ? n : 1, sizeof *st->mval);
	if (!st->mkey || !st->mval)
		return kv_fail(KV_ERR_NOMEM, "%s: out of memory reading __metadata__", st->path);
	json_object_foreach(m, k, v) {
		if (!json_is_string(v))
			return KV_CORRUPT(st->path, hoff, "__metadata__ value of '%s' is not a string", k);
		st->mkey[i] = strdup(k);
		st->mval[i] = strdup(json_string_value(v));
		st->n_meta = ++i;
		if (!st->mkey[i - 1] || !st->mval[i - 1])
			return kv_fail(KV_ERR_NOMEM, "%s: out of memory reading __metadata__", st->path);
	}
	return KV_OK;
}

/* Check one tensor entry and fill *t. data_size: bytes after the header. */
static int st_entry(struct kv_st *st, const char *name, json_t *e, uint64_t data_size, struct kv_tensor *t)
{
	const uint64_t hoff = 8; /* header issues are reported at the header */
	const uint64_t data_off = 8 + st->hdr_len;
	json_t *dt, *shape, *offs, *v;
	uint64_t b, end, numel = 1, nbytes, d;
	size_t i;

	if (!json_is_object(e))
		return KV_CORRUPT(st->path, hoff, "tensor '%s': entry is not an object", name);
	dt = json_object_get(e, "dtype");
	shape = json_object_get(e, "shape");
	offs = json_object_get(e, "data_offsets");
	if (!json_is_string(dt))
		return KV_CORRUPT(st->path, hoff, "tensor '%s': dtype missing or not a string", name);
	t->dtype = kv_dtype_parse(json_string_value(dt));
	if (t->dtype < 0)
		return KV_CORRUPT(st->path, hoff, "tensor '%s': unknown dtype '%.32s'", name, json_string_value(dt));
	if (!json_is_array(shape))
		return KV_CORRUPT(st->path, hoff, "tensor '%s': shape missing or not a list", name);
	if (json_array_size(shape) > KV_ST_MAX_DIMS)
		return KV_CORRUPT(st->path, hoff, "tensor '%s': shape has %zu dims, more than %d", name,
				  json_array_size(shape), KV_ST_MAX_DIMS);
	t->ndim = (int)json_array_size(shape);
	json_array_foreach(shape, i, v) {
		if (!json_uint(v, &d))
			return KV_CORRUPT(st->path, hoff, "tensor '%s': shape[%zu] is not a non-negative integer", name,
					  i);
		t->shape[i] = (int64_t)d;
		if (__builtin_mul_overflow(numel, d, &numel))
			return KV_CORRUPT(st->path, hoff, "tensor '%s': shape product overflows", name);
	}
	if (!json_is_array(offs) || json_array_size(offs) != 2 || !json_uint(json_array_get(offs, 0), &b) ||
	    !json_uint(json_array_get(offs, 1), &end))
		return KV_CORRUPT(st->path, hoff, "tensor '%s': data_offsets is not a list of two non-negative integers",
				  name);
	if (end < b)
		return KV_CORRUPT(st->path, data_off + b, "tensor '%s': data_offsets [%llu, %llu] end before begin",
				  name, (unsigned long long)b, (unsigned long long)end);
	if (end > data_size)
		return KV_CORRUPT(st->path, data_off + b,
				  "tensor '%s': data_offsets [%llu, %llu] past the data section of %llu bytes", name,
				  (unsigned long long)b, (unsigned long long)end, (unsigned long long)data_size);
	if (__builtin_mul_overflow(numel, (uint64_t)kv_dtype_size(t->dtype), &nbytes) || nbytes != end - b)
		return KV_CORRUPT(st->path, data_off + b,
				  "tensor '%s': %llu bytes in data_offsets but shape x %s needs %llu elements x %zu",
				  name, (unsigned long long)(end - b), kv_dtype_name(t->dtype),
				  (unsigned long long)numel, kv_dtype_size(t->dtype));
	t->numel = numel;
	t->nbytes = nbytes;
	t->offset = data_off + b;
	t->data = st->base + t->offset;
	t->file = st->path;
	return KV_OK;
}

static int st_parse(struct kv_st *st)
{
	const char *hdr, *key;
	json_t *root = NULL, *val;
	json_error_t jerr;
	uint64_t n, data_size;
	size_t i = 0, *order = NULL;
	int rc = KV_OK, depth;

	if (st->size < 8)
		return KV_CORRUPT(st->path, 0, "file is %zu bytes, too short for the 8-byte header length", st->size);
	n = 0;
	for (int b = 7; b >= 0; b--)
		n = (n << 8) | st->base[b];
	st->hdr_len = n;
	if (n < 2)
		return KV_CORRUPT(st->path, 0, "header length %llu is too small for a JSON object",
				  (unsigned long long)n);
	if (n > KV_ST_MAX_HEADER)
		return KV_CORRUPT(st->path, 0, "header length %llu exceeds the limit of %u bytes", (unsigned long long)n,
				  KV_ST_MAX_HEADER);
	if (n > st->size - 8)
		return KV_CORRUPT(st->path, 0, "header length %llu runs past the end of the %zu-byte file",
				  (unsigned long long)n, st->size);
	hdr = (const char *)st->base + 8;
	data_size = st->size - 8 - n;
	{
		/* Cheap first: anything but an object is refused before parsing. */
		uint64_t k = 0;
		while (k < n && (hdr[k] == ' ' || hdr[k] == '\t' || hdr[k] == '\n' || hdr[k] == '\r'))
			k++;
		if (k == n || hdr[k] != '{')
			return KV_CORRUPT(st->path, 8 + k, "header is not a JSON object");
	}
	depth = kv_json_text_depth(hdr, (size_t)n);
	if (depth > ST_MAX_DEPTH)
		return KV_CORRUPT(st->path, 8, "header JSON nested %d deep, limit is %d", depth, ST_MAX_DEPTH);
	root = json_loadb(hdr, (size_t)n, JSON_REJECT_DUPLICATES, &jerr);
	if (!root) {
		if (strstr(jerr.text, "duplicate"))
			return KV_CORRUPT(st->path, 8 + (uint64_t)(jerr.position > 0 ? jerr.position : 0),
					  "duplicate name in header: %s", jerr.text);
		return KV_CORRUPT(st->path, 8 + (uint64_t)(jerr.position > 0 ? jerr.position : 0),
				  "header is not valid JSON: line %d column %d: %s", jerr.line, jerr.column, jerr.text);
	}
	if (!json_is_object(root)) {
		json_decref(root);
		return KV_CORRUPT(st->path, 8, "header is not a JSON object");
	}
	n = json_object_size(root);
	st->t = calloc(n ? n : 1, sizeof *st->t);
	st->idx = kv_map_create(n);
	order = malloc((n ? n : 1) * sizeof *order);
	if (!st->t || !st->idx || !order) {
		rc = kv_fail(KV_ERR_NOMEM, "%s: out of memory for %llu header entries", st->path,
			     (unsigned long long)n);
		goto out;
	}
	json_object_foreach(root, key, val) {
		if (!strcmp(key, "__metadata__")) {
			if ((rc = st_meta(st, val, 8)))
				goto out;
			continue;
		}
		struct kv_tensor *t = &st->t[st->n];
		if ((rc = st_entry(st, key, val, data_size, t)))
			goto out;
		t->name = strdup(key);
		if (!t->name) {
			rc = kv_fail(KV_ERR_NOMEM, "%s: out of memory", st->path);
			goto out;
		}
		/* The parser already refused duplicate keys; the map is for lookups. */
		if (kv_map_put(st->idx, key, strlen(key), st->n)) {
			free((char *)t->name);
			rc = kv_fail(KV_ERR_NOMEM, "%s: out of memory", st->path);
			goto out;
		}
		st->n++;
	}
	/* No overlap: sort by begin and compare neighbours (empty tensors
	 * occupy nothing and may sit anywhere). */
	for (i = 0; i < st->n; i++)
		order[i] = i;
	qsort_r(order, st->n, sizeof *order, cmp_by_begin, st->t);
	{
		const struct kv_tensor *prev = NULL;
		for (i = 0; i < st->n; i++) {
			const struct kv_tensor *t = &st->t[order[i]];
			if (!t->nbytes)
				continue;
			if (prev && t->offset < prev->offset + prev->nbytes) {
				rc = KV_CORRUPT(st->path, t->offset,
						"tensors '%s' and '%s' overlap (data_offsets [%llu, %llu] and [%llu, %llu])",
						prev->name, t->name,
						(unsigned long long)(prev->offset - 8 - st->hdr_len),
						(unsigned long long)(prev->offset - 8 - st->hdr_len + prev->nbytes),
						(unsigned long long)(t->offset - 8 - st->hdr_len),
						(unsigned long long)(t->offset - 8 - st->hdr_len + t->nbytes));
				goto out;
			}
			prev = t;
		}
	}
out:
	free(order);
	json_decref(root);
	return rc;
}

int kv_st_open_mem(const void *p, size_t n, const char *what, struct kv_st **out)
{
	struct kv_st *st = calloc(1, sizeof *st);
	int rc;
	*out = NULL;
	if (!st || !(st->path = strdup(what ? what : "(memory)"))) {
		free(st);
		return kv_fail(KV_ERR_NOMEM, "out of memory opening %s", what ? what : "(memory)");
	}
	st->base = p;
	st->size = n;
	rc = st_parse(st);
	if (rc) {
		st_free(st);
		return rc;
	}
	*out = st;
	return KV_OK;
}

int kv_st_open(const char *path, struct kv_st **out)
{
	struct kv_st *st;
	struct stat sb;
	uint8_t lenbuf[8];
	void *m;
	int fd, rc;

	*out = NULL;
	fd = kv_io_open(path, O_RDONLY, 0);
	if (fd < 0)
		return kv_fail(kv_io_errno_code(errno), "%s: %s", path, strerror(errno));
	if (kv_io_fstat(fd, &sb) != 0) {
		rc = kv_fail(kv_io_errno_code(errno), "%s: stat: %s", path, strerror(errno));
		kv_io_close(fd);
		return rc;
	}
	if (!S_ISREG(sb.st_mode)) {
		kv_io_close(fd);
		return kv_fail(KV_ERR_INVALID, "%s: not a regular file", path);
	}
	if (sb.st_size < 8) {
		kv_io_close(fd);
		return KV_CORRUPT(path, 0, "file is %lld bytes, too short for the 8-byte header length",
				  (long long)sb.st_size);
	}
	/* The length word goes through the I/O table so tests can fail it. */
	if ((rc = kv_io_pread_full(fd, lenbuf, 8, 0, path))) {
		kv_io_close(fd);
		return rc;
	}
	m = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
	if (m == MAP_FAILED) {
		rc = kv_fail(kv_io_errno_code(errno), "%s: mmap %lld bytes: %s", path, (long long)sb.st_size,
			     strerror(errno));
		kv_io_close(fd);
		return rc;
	}
	kv_io_close(fd);
	kv_mem_advise_huge(m, (size_t)sb.st_size); /* base/mem.c: weights */
	st = calloc(1, sizeof *st);
	if (!st || !(st->path = strdup(path))) {
		free(st);
		munmap(m, (size_t)sb.st_size);
		return kv_fail(KV_ERR_NOMEM, "%s: out of memory", path);
	}
	st->base = m;
	st->size = (size_t)sb.st_size;
	st->mapped = 1;
	if (memcmp(lenbuf, st->base, 8)) {
		st_free(st);
		return kv_fail(KV_ERR_IO, "%s: file changed while opening", path);
	}
	rc = st_parse(st);
	if (rc) {
		st_free(st);
		return rc;
	}
	*out = st;
	return KV_OK;
}

void kv_st_close(struct kv_st *st)
{
	st_free(st);
}

size_t kv_st_count(const struct kv_st *st)
{
	return st->n;
}

const struct kv_tensor *kv_st_tensor(const struct kv_st *st, size_t i)
{
	return i < st->n ? &st->t[i] : NULL;
}

const struct kv_tensor *kv_st_find(const struct kv_st *st, const char *name)
{
	uint64_t i;
	if (!kv_map_get(st->idx, name, strlen(name), &i))
		return NULL;
	return &st->t[i];
}

const char *kv_st_meta(const struct kv_st *st, const char *key)
{
	for (size_t i = 0; i < st->n_meta; i++)
		if (!strcmp(st->mkey[i], key))
			return st->mval[i];
	return NULL;
}

size_t kv_st_meta_count(const struct kv_st *st)
{
	return st->n_meta;
}

int kv_st_meta_at(const struct kv_st *st, size_t i, const char **key, const char **val)
{
	if (i >= st->n_meta)
		return kv_fail(KV_ERR_NOT_FOUND, "%s: no metadata entry %zu", st->path, i);
	*key = st->mkey[i];
	*val = st->mval[i];
	return KV_OK;
}

uint64_t kv_st_file_size(const struct kv_st *st)
{
	return st->size;
}

uint64_t kv_st_header_len(const struct kv_st *st)
{
	return st->hdr_len;
}

/* --- writer -------------------------------------------------------------- */

struct stw_ent {
	char *name;
	int dtype;
	int ndim;
	int64_t shape[KV_ST_MAX_DIMS];
	uint64_t nbytes;
	const void *data;      /* borrowed, or NULL with fill */
	kv_stw_fill_fn fill;
	void *ctx;
};

struct kv_stw {
	struct stw_ent *e;
	size_t n, cap;
	char **mkey, **mval;
	size_t n_meta;
	struct kv_map *names;  /* tensor names already added */
};

struct kv_stw *kv_stw_create(void)
{
	struct kv_stw *w = calloc(1, sizeof *w);
	if (!w)
		return NULL;
	w->names = kv_map_create(64);
	if (!w->names) {
		free(w);
		return NULL;
	}
	return w;
}

void kv_stw_destroy(struct kv_stw *w)
{
	if (!w)
		return;
	for (size_t i = 0; i < w->n; i++)
		free(w->e[i].name);
	for (size_t i = 0; i < w->n_meta; i++) {
		free(w->mkey[i]);
		free(w->mval[i]);
	}
	free(w->e);
	free(w->mkey);
	free(w->mval);
	kv_map_destroy(w->names);
	free(w);
}

static int stw_add(struct kv_stw *w, const char *name, int dtype, int ndim, const int64_t *shape,
		   const void *data, uint64_t nbytes, kv_stw_fill_fn fill, void *ctx, int check_bytes)
{
	uint64_t numel = 1, need;
	struct stw_ent *e;

	if (!name || !name[0] || !strcmp(name, "__metadata__") || !kv_utf8_valid(name, strlen(name)))
		return kv_fail(KV_ERR_INVALID, "safetensors writer: bad tensor name '%s'", name ? name : "(null)");
	if (!kv_dtype_size(dtype))
		return kv_fail(KV_ERR_INVALID, "safetensors writer: tensor '%s': unknown dtype %d", name, dtype);
	if (ndim < 0 || ndim > KV_ST_MAX_DIMS)
		return kv_fail(KV_ERR_INVALID, "safetensors writer: tensor '%s': %d dims", name, ndim);
	for (int i = 0; i < ndim; i++)
		if (shape[i] < 0 || __builtin_mul_overflow(numel, (uint64_t)shape[i], &numel))
			return kv_fail(KV_ERR_INVALID, "safetensors writer: tensor '%s': bad dim %d", name, i);
	if (__builtin_mul_overflow(numel, (uint64_t)kv_dtype_size(dtype), &need))
		return kv_fail(KV_ERR_INVALID, "safetensors writer: tensor '%s': size overflows", name);
	if (check_bytes && need != nbytes)
		return kv_fail(KV_ERR_INVALID, "safetensors writer: tensor '%s': %llu bytes given, shape needs %llu",
			       name, (unsigned long long)nbytes, (unsigned long long)need);
	if (need && !data && !fill)
		return kv_fail(KV_ERR_INVALID, "safetensors writer: tensor '%s': no data", name);
	if (kv_map_get(w->names, name, strlen(name), NULL))
		return kv_fail(KV_ERR_INVALID, "safetensors writer: duplicate tensor name '%s'", name);
	if (w->n == w->cap) {
		size_t nc = w->cap ? w->cap * 2 : 64;
		struct stw_ent *ne = realloc(w->e, nc * sizeof *ne);
		if (!ne)
			return kv_fail(KV_ERR_NOMEM, "out of memory");
		w->e = ne;
		w->cap = nc;
	}
	e = &w->e[w->n];
	memset(e, 0, sizeof *e);
	e->name = strdup(name);
	if (!e->name || kv_map_put(w->names, name, strlen(name), w->n)) {
		free(e->name);
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	}
	e->dtype = dtype;
	e->ndim = ndim;
	for (int i = 0; i < ndim; i++)
		e->shape[i] = shape[i];
	e->nbytes = need;
	e->data = data;
	e->fill = fill;
	e->ctx = ctx;
	w->n++;
	return KV_OK;
}

int kv_stw_add(struct kv_stw *w, const char *name, int dtype, int ndim, const int64_t *shape,
	       const void *data, uint64_t nbytes)
{
	return stw_add(w, name, dtype, ndim, shape, data, nbytes, NULL, NULL, 1);
}

int kv_stw_add_fill(struct kv_stw *w, const char *name, int dtype, int ndim, const int64_t *shape,
		    kv_stw_fill_fn fill, void *ctx)
{
	if (!fill)
		return kv_fail(KV_ERR_INVALID, "safetensors writer: tensor '%s': no fill function", name ? name : "");
	return stw_add(w, name, dtype, ndim, shape, NULL, 0, fill, ctx, 0);
}

int kv_stw_meta(struct kv_stw *w, const char *key, const char *val)
{
	char **nk, **nv, *k, *v;
	if (!key || !val || !kv_utf8_valid(key, strlen(key)) || !kv_utf8_valid(val, strlen(val)))
		return kv_fail(KV_ERR_INVALID, "safetensors writer: metadata must be UTF-8 strings");
	for (size_t i = 0; i < w->n_meta; i++) {
		if (!strcmp(w->mkey[i], key)) {
			if (!(v = strdup(val)))
				return kv_fail(KV_ERR_NOMEM, "out of memory");
			free(w->mval[i]);
			w->mval[i] = v;
			return KV_OK;
		}
	}
	nk = realloc(w->mkey, (w->n_meta + 1) * sizeof *nk);
	if (nk)
		w->mkey = nk;
	nv = realloc(w->mval, (w->n_meta + 1) * sizeof *nv);
	if (nv)
		w->mval = nv;
	k = strdup(key);
	v = strdup(val);
	if (!nk || !nv || !k || !v) {
		free(k);
		free(v);
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	}
	w->mkey[w->n_meta] = k;
	w->mval[w->n_meta] = v;
	w->n_meta++;
	return KV_OK;
}

static void json_str(struct kv_buf *b, const char *s)
{
	kv_buf_addc(b, '"');
	for (; *s; s++) {
		unsigned char c = (unsigned char)*s;
		if (c == '"' || c == '\\') {
			kv_buf_addc(b, '\\');
			kv_buf_addc(b, (char)c);
		} else if (c < 0x20) {
			kv_buf_printf(b, "\\u%04x", c);
		} else {
			kv_buf_addc(b, (char)c);
		}
	}
	kv_buf_addc(b, '"');
}

/* Header JSON padded with spaces so that 8 + len is a multiple of 64. */
static int stw_header(const struct kv_stw *w, struct kv_buf *b)
{
	uint64_t off = 0;
	kv_buf_addc(b, '{');
	if (w->n_meta) {
		kv_buf_adds(b, "\"__metadata__\":{");
		for (size_t i = 0; i < w->n_meta; i++) {
			if (i)
				kv_buf_addc(b, ',');
			json_str(b, w->mkey[i]);
			kv_buf_addc(b, ':');
			json_str(b, w->mval[i]);
		}
		kv_buf_addc(b, '}');
	}
	for (size_t i = 0; i < w->n; i++) {
		const struct stw_ent *e = &w->e[i];
		if (i || w->n_meta)
			kv_buf_addc(b, ',');
		json_str(b, e->name);
		kv_buf_printf(b, ":{\"dtype\":\"%s\",\"shape\":[", kv_dtype_name(e->dtype));
		for (int d = 0; d < e->ndim; d++)
			kv_buf_printf(b, "%s%lld", d ? "," : "", (long long)e->shape[d]);
		kv_buf_printf(b, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off,
			      (unsigned long long)(off + e->nbytes));
		off += e->nbytes;
	}
	kv_buf_addc(b, '}');
	while ((8 + b->len) % 64)
		kv_buf_addc(b, ' ');
	if (b->oom)
		return kv_fail(KV_ERR_NOMEM, "safetensors writer: out of memory for the header");
	if (b->len > KV_ST_MAX_HEADER)
		return kv_fail(KV_ERR_INVALID, "safetensors writer: header of %zu bytes exceeds the limit", b->len);
	return KV_OK;
}

uint64_t kv_stw_size(const struct kv_stw *w)
{
	struct kv_buf b = KV_BUF_INIT;
	uint64_t n = 0;
	if (stw_header(w, &b) == KV_OK)
		n = 8 + b.len;
	kv_buf_free(&b);
	for (size_t i = 0; i < w->n; i++)
		n += w->e[i].nbytes;
	return n;
}

static void put_le64(uint8_t *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

int kv_stw_to_mem(struct kv_stw *w, void **out, size_t *len)
{
	struct kv_buf b = KV_BUF_INIT;
	uint64_t total;
	uint8_t *p;
	size_t o;
	int rc;

	*out = NULL;
	*len = 0;
	if ((rc = stw_header(w, &b))) {
		kv_buf_free(&b);
		return rc;
	}
	total = 8 + b.len;
	for (size_t i = 0; i < w->n; i++)
		total += w->e[i].nbytes;
	p = malloc(total ? (size_t)total : 1);
	if (!p) {
		kv_buf_free(&b);
		return kv_fail(KV_ERR_NOMEM, "safetensors writer: cannot allocate %llu bytes",
			       (unsigned long long)total);
	}
	put_le64(p, b.len);
	memcpy(p + 8, b.p, b.len);
	o = 8 + b.len;
	kv_buf_free(&b);
	for (size_t i = 0; i < w->n; i++) {
		const struct stw_ent *e = &w->e[i];
		if (e->fill) {
			if ((rc = e->fill(e->ctx, p + o, e->nbytes))) {
				free(p);
				return kv_fail_ctx(rc, "safetensors writer: tensor '%s'", e->name);
			}
		} else if (e->nbytes) {
			memcpy(p + o, e->data, (size_t)e->nbytes);
		}
		o += (size_t)e->nbytes;
	}
	*out = p;
	*len = (size_t)total;
	return KV_OK;
}

/* Small pieces go through the staging buffer, large ones straight out. */
struct stage {
	struct kv_dw *dw;
	uint8_t *buf;
	size_t len;
};

static int stage_flush(struct stage *s)
{
	int rc = KV_OK;
	if (s->len)
		rc = kv_dw_write(s->dw, s->buf, s->len);
	s->len = 0;
	return rc;
}

static int stage_put(struct stage *s, const void *p, size_t n)
{
	int rc;
	if (n >= STW_SMALL || !s->buf) {
		if ((rc = stage_flush(s)))
			return rc;
		return kv_dw_write(s->dw, p, n);
	}
	if (s->len + n > STW_STAGE && (rc = stage_flush(s)))
		return rc;
	memcpy(s->buf + s->len, p, n);
	s->len += n;
	return KV_OK;
}

int kv_stw_write(struct kv_stw *w, const char *path, unsigned flags)
{
	struct kv_buf b = KV_BUF_INIT;
	struct kv_dw dw;
	struct stage st = {&dw, NULL, 0};
	uint8_t *scratch = NULL;
	uint64_t max_fill = 0;
	uint8_t lenb[8];
	const char *op;
	int rc;

	if ((rc = stw_header(w, &b))) {
		kv_buf_free(&b);
		return rc;
	}
	for (size_t i = 0; i < w->n; i++)
		if (w->e[i].fill && w->e[i].nbytes > max_fill)
			max_fill = w->e[i].nbytes;
	op = "allocate buffers";
	st.buf = malloc(STW_STAGE);
	if (max_fill && !(scratch = kv_alloc(KV_MEM_OTHER, (size_t)max_fill))) {
		rc = kv_fail(KV_ERR_NOMEM, "%s: cannot allocate %llu bytes of scratch", path,
			     (unsigned long long)max_fill);
		goto fail_nodw;
	}
	if ((rc = kv_dw_begin(&dw, path)))
		goto fail_nodw;
	op = "write header";
	put_le64(lenb, b.len);
	if ((rc = stage_put(&st, lenb, 8)) || (rc = stage_put(&st, b.p, b.len)))
		goto fail;
	op = "write tensors";
	for (size_t i = 0; i < w->n; i++) {
		const struct stw_ent *e = &w->e[i];
		const void *src = e->data;
		if (!e->nbytes)
			continue;
		if (e->fill) {
			if ((rc = e->fill(e->ctx, scratch, e->nbytes))) {
				kv_fail_ctx(rc, "tensor '%s'", e->name);
				goto fail;
			}
			src = scratch;
		}
		if ((rc = stage_put(&st, src, (size_t)e->nbytes)))
			goto fail;
	}
	if ((rc = stage_flush(&st)))
		goto fail;
	free(st.buf);
	kv_free(scratch);
	kv_buf_free(&b);
	return kv_dw_commit(&dw, flags | KV_DW_PUBLIC);
fail:
	kv_dw_abort(&dw);
fail_nodw:
	free(st.buf);
	kv_free(scratch);
	kv_buf_free(&b);
	return kv_fail_ctx(rc, "safetensors writer: %s: %s", path, op);
}
