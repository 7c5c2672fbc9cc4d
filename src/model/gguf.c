/*
 * gguf.c - see gguf.h for the format and the rules.
 *
 * Reader: each file is mapped read-only and walked with a bounds-checked
 * cursor; every count is checked against the bytes left before anything
 * is allocated for it (a string array claims at least 8 bytes per
 * element, a tensor info at least 24), so hostile counts cost nothing.
 * Only string arrays get an index (pointer + length per element), for
 * the tokenizer's vocabulary and merges. Tensor data is never touched at
 * open time.
 *
 * Writer: metadata and tensor infos are serialised into one buffer;
 * tensor offsets are known from the sizes; then header, padding and each
 * tensor (padded to the alignment) stream into a durable temp file.
 */
#include "model/gguf.h"
#include "model/quant.h"
#include "base/buf.h"
#include "base/corrupt.h"
#include "base/durable.h"
#include "base/err.h"
#include "base/io.h"
#include "base/map.h"
#include "base/mem.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>

#define GG_MAX_KEY 65535u
#define GG_MAX_ALIGN (1u << 20)

struct gg_file {
	char *path;
	const uint8_t *base;
	size_t size;
	int mapped;
	uint32_t version;
	uint64_t data_off;       /* start of the data section */
	struct kv_gguf_kv *kv;
	size_t n_kv;
	struct kv_tensor *t;
	size_t n_t;
};

struct kv_gguf {
	struct gg_file *f;       /* f[0] holds the metadata */
	size_t nf;
	const struct kv_tensor **all;
	size_t n;
	struct kv_map *idx;      /* tensor name -> index into all */
	struct kv_map *kidx;     /* key -> index into f[0].kv */
	uint64_t noted;          /* bytes noted under KV_MEM_WEIGHTS */
};

/* --- cursor ------------------------------------------------------------------ */

struct cur {
	const uint8_t *p;
	size_t n, o;
	const char *path;
};

static int need(struct cur *c, uint64_t k, const char *what)
{
	if (k > c->n - c->o)
		return KV_CORRUPT(c->path, c->o, "%s needs %llu bytes, %zu left in the file", what,
				  (unsigned long long)k, c->n - c->o);
	return KV_OK;
}

static uint64_t rd(struct cur *c, int bytes)
{
	uint64_t v = 0;
	for (int i = bytes - 1; i >= 0; i--)
		v = (v << 8) | c->p[c->o + (size_t)i];
	c->o += (size_t)bytes;
	return v;
}

static int rd_u32(struct cur *c, uint32_t *v, const char *what)
{
	int rc = need(c, 4, what);
	if (!rc)
		*v = (uint32_t)rd(c, 4);
	return rc;
}

static int rd_u64(struct cur *c, uint64_t *v, const char *what)
{
	int rc = need(c, 8, what);
	if (!rc)
		*v = rd(c, 8);
	return rc;
}

static int rd_str(struct cur *c, const char **s, uint64_t *len, const char *what)
{
	int rc;
	uint64_t at = c->o;
	if ((rc = rd_u64(c, len, what)))
		return rc;
	if (*len > c->n - c->o)
		return KV_CORRUPT(c->path, at, "%s: string length %llu runs past the end of the file (%zu bytes left)",
				  what, (unsigned long long)*len, c->n - c->o);
	*s = (const char *)c->p + c->o;
	c->o += (size_t)*len;
	return KV_OK;
}

static size_t vsize(int t)
{
	switch (t) {
	case KV_GGUF_U8: case KV_GGUF_I8: case KV_GGUF_BOOL: return 1;
	case KV_GGUF_U16: case KV_GGUF_I16: return 2;
	case KV_GGUF_U32: case KV_GGUF_I32: case KV_GGUF_F32: return 4;
	case KV_GGUF_U64: case KV_GGUF_I64: case KV_GGUF_F64: return 8;
	}
	return 0;
}

static void scalar(const uint8_t *p, int t, struct kv_gguf_kv *kv)
{
	uint64_t u = 0;
	size_t s = vsize(t);
	for (int i = (int)s - 1; i >= 0; i--)
		u = (u << 8) | p[i];
	switch (t) {
	case KV_GGUF_I8: kv->v.i = (int8_t)u; break;
	case KV_GGUF_I16: kv->v.i = (int16_t)u; break;
	case KV_GGUF_I32: kv->v.i = (int32_t)u; break;
	case KV_GGUF_I64: kv->v.i = (int64_t)u; break;
	case KV_GGUF_F32: { uint32_t x = (uint32_t)u; float f; memcpy(&f, &x, 4); kv->v.f = f; break; }
	case KV_GGUF_F64: { double f; memcpy(&f, &u, 8); kv->v.f = f; break; }
	default: kv->v.u = u; break;
	}
}

/* --- reader ------------------------------------------------------------------ */

static void file_free(struct gg_file *f)
{
	for (size_t i = 0; i < f->n_kv; i++) {
		free((char *)f->kv[i].key);
		free(f->kv[i].astr);
		free(f->kv[i].alen);
	}
	free(f->kv);
	for (size_t i = 0; i < f->n_t; i++)
		free((char *)f->t[i].name);
	free(f->t);
	if (f->mapped && f->base)
		munmap((void *)f->base, f->size);
	free(f->path);
	memset(f, 0, sizeof *f);
}

static int parse_kv(struct cur *c, struct kv_gguf_kv *kv, struct kv_map *keys, size_t i)
{
	const char *k;
	uint64_t klen, at = c->o;
	uint32_t t;
	int rc;
	if ((rc = rd_str(c, &k, &klen, "metadata key")))
		return rc;
	if (klen == 0 || klen > GG_MAX_KEY)
		return KV_CORRUPT(c->path, at, "metadata key of %llu bytes (must be 1..%u)", (unsigned long long)klen,
				  GG_MAX_KEY);
	if (memchr(k, 0, (size_t)klen))
		return KV_CORRUPT(c->path, at, "metadata key holds a NUL byte");
	if (!(kv->key = strndup(k, (size_t)klen)))
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	if (kv_map_get(keys, k, (size_t)klen, NULL))
		return KV_CORRUPT(c->path, at, "duplicate metadata key '%s'", kv->key);
	if (kv_map_put(keys, k, (size_t)klen, i))
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	at = c->o;
	if ((rc = rd_u32(c, &t, "metadata value type")))
		return rc;
	if (t >= KV_GGUF__NTYPES)
		return KV_CORRUPT(c->path, at, "metadata '%s': unknown value type %u", kv->key, t);
	kv->type = (int)t;
	kv->n = 1;
	if (t == KV_GGUF_STR)
		return rd_str(c, &kv->s, &kv->slen, kv->key);
	if (t != KV_GGUF_ARR) {
		if ((rc = need(c, vsize((int)t), kv->key)))
			return rc;
		scalar(c->p + c->o, (int)t, kv);
		c->o += vsize((int)t);
		return KV_OK;
	}
	uint32_t et;
	uint64_t n;
	if ((rc = rd_u32(c, &et, "array element type")) || (rc = rd_u64(c, &n, "array length")))
		return rc;
	if (et >= KV_GGUF__NTYPES)
		return KV_CORRUPT(c->path, at, "metadata '%s': unknown array element type %u", kv->key, et);
	if (et == KV_GGUF_ARR)
		return KV_CORRUPT(c->path, at, "metadata '%s': arrays of arrays are not read", kv->key);
	kv->arr_type = (int)et;
	kv->n = n;
	if (et != KV_GGUF_STR) {
		uint64_t bytes;
		if (__builtin_mul_overflow(n, (uint64_t)vsize((int)et), &bytes) || bytes > c->n - c->o)
			return KV_CORRUPT(c->path, at, "metadata '%s': array of %llu elements runs past the end of the file",
					  kv->key, (unsigned long long)n);
		kv->arr = c->p + c->o;
		c->o += (size_t)bytes;
		return KV_OK;
	}
	/* Each string takes at least its 8-byte length: bound n first. */
	if (n > (c->n - c->o) / 8)
		return KV_CORRUPT(c->path, at, "metadata '%s': array of %llu strings cannot fit in the %zu bytes left",
				  kv->key, (unsigned long long)n, c->n - c->o);
	kv->astr = malloc((n ? n : 1) * sizeof *kv->astr);
	kv->alen = malloc((n ? n : 1) * sizeof *kv->alen);
	if (!kv->astr || !kv->alen)
		return kv_fail(KV_ERR_NOMEM, "out of memory for %llu strings of '%s'", (unsigned long long)n, kv->key);
	for (uint64_t j = 0; j < n; j++)
		if ((rc = rd_str(c, &kv->astr[j], &kv->alen[j], kv->key)))
			return rc;
	return KV_OK;
}

static int cmp_off(const void *a, const void *b, void *ctx)
{
	const struct kv_tensor *t = ctx;
	uint64_t x = t[*(const size_t *)a].offset, y = t[*(const size_t *)b].offset;
	return x < y ? -1 : x > y;
}

static int parse_tensor(struct cur *c, struct gg_file *f, struct kv_tensor *t, struct kv_map *names, size_t i,
			uint64_t *rel)
{
	const char *name;
	uint64_t nlen, at = c->o, ne[KV_GGUF_MAX_DIMS], numel = 1;
	uint32_t nd, type;
	int rc;
	if ((rc = rd_str(c, &name, &nlen, "tensor name")))
		return rc;
	if (nlen == 0 || nlen > 1024 || memchr(name, 0, (size_t)nlen))
		return KV_CORRUPT(c->path, at, "tensor name of %llu bytes (must be 1..1024, no NUL)",
				  (unsigned long long)nlen);
	if (!(t->name = strndup(name, (size_t)nlen)))
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	if (kv_map_get(names, name, (size_t)nlen, NULL))
		return KV_CORRUPT(c->path, at, "duplicate tensor name '%s'", t->name);
	if (kv_map_put(names, name, (size_t)nlen, i))
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	if ((rc = rd_u32(c, &nd, t->name)))
		return rc;
	if (nd < 1 || nd > KV_GGUF_MAX_DIMS)
		return KV_CORRUPT(c->path, at, "tensor '%s': %u dims (must be 1..%d)", t->name, nd, KV_GGUF_MAX_DIMS);
	for (uint32_t d = 0; d < nd; d++) {
		if ((rc = rd_u64(c, &ne[d], t->name)))
			return rc;
		if (ne[d] == 0 || ne[d] >= (1ull << 62) || __builtin_mul_overflow(numel, ne[d], &numel) ||
		    numel >= (1ull << 62))
			return KV_CORRUPT(c->path, at, "tensor '%s': dimension %u is %llu (or the product overflows)",
					  t->name, d, (unsigned long long)ne[d]);
	}
	if ((rc = rd_u32(c, &type, t->name)) || (rc = rd_u64(c, rel, t->name)))
		return rc;
	t->dtype = kq_dtype_from_ggml((int)type);
	if (t->dtype < 0) {
		const char *tn = kq_ggml_name((int)type);
		if (tn)
			return kv_fail(KV_ERR_UNSUPPORTED, "%s: tensor '%s' has ggml type %s (%u), which kvkeep does not read",
				       c->path, t->name, tn, type);
		return KV_CORRUPT(c->path, at, "tensor '%s' has unknown ggml type %u", t->name, type);
	}
	int qk = kv_dtype_block_elems(t->dtype);
	if (ne[0] % (uint64_t)qk)
		return KV_CORRUPT(c->path, at, "tensor '%s': %llu elements per row do not divide into %s blocks of %d",
				  t->name, (unsigned long long)ne[0], kv_dtype_name(t->dtype), qk);
	t->ndim = (int)nd;
	for (uint32_t d = 0; d < nd; d++)
		t->shape[nd - 1 - d] = (int64_t)ne[d];
	t->numel = numel;
	t->nbytes = numel / (uint64_t)qk * kv_dtype_block_bytes(t->dtype);
	t->file = f->path;
	return KV_OK;
}

static int file_parse(struct gg_file *f)
{
	struct cur c = {f->base, f->size, 0, f->path};
	struct kv_map *keys = NULL, *names = NULL;
	uint32_t magic, version;
	uint64_t nt, nkv, align = KV_GGUF_ALIGN, *rel = NULL;
	size_t *order = NULL;
	int rc;

	if (f->size < 4)
		return KV_CORRUPT(f->path, 0, "%zu bytes, too short for a GGUF header", f->size);
	if ((magic = (uint32_t)rd(&c, 4)) != KV_GGUF_MAGIC)
		return kv_fail(KV_ERR_NOT_OURS, "%s: not a GGUF file (no \"GGUF\" magic)", f->path);
	if ((rc = rd_u32(&c, &version, "version")))
		return rc;
	if (version != 2 && version != 3)
		return kv_fail(KV_ERR_VERSION, "%s: GGUF version %u (kvkeep reads 2 and 3)", f->path, version);
	f->version = version;
	if ((rc = rd_u64(&c, &nt, "tensor count")) || (rc = rd_u64(&c, &nkv, "metadata count")))
		return rc;
	/* A key-value pair takes >= 13 bytes (8 length, 1 key byte, 4 type),
	 * a tensor info >= 29: refuse counts the file cannot hold. */
	if (nkv > (f->size - c.o) / 13 || nt > (f->size - c.o) / 29)
		return KV_CORRUPT(f->path, 8, "%llu tensors and %llu metadata entries cannot fit in a %zu-byte file",
				  (unsigned long long)nt, (unsigned long long)nkv, f->size);
	f->kv = calloc(nkv ? nkv : 1, sizeof *f->kv);
	f->t = calloc(nt ? nt : 1, sizeof *f->t);
	rel = calloc(nt ? nt : 1, sizeof *rel);
	order = calloc(nt ? nt : 1, sizeof *order);
	keys = kv_map_create(nkv);
	names = kv_map_create(nt);
	if (!f->kv || !f->t || !rel || !order || !keys || !names) {
		rc = kv_fail(KV_ERR_NOMEM, "%s: out of memory", f->path);
		goto out;
	}
	for (uint64_t i = 0; i < nkv; i++) {
		f->n_kv = i + 1;
		if ((rc = parse_kv(&c, &f->kv[i], keys, i)))
			goto out;
		if (!strcmp(f->kv[i].key, "general.alignment")) {
			if (f->kv[i].type != KV_GGUF_U32 || !f->kv[i].v.u || f->kv[i].v.u > GG_MAX_ALIGN ||
			    (f->kv[i].v.u & (f->kv[i].v.u - 1))) {
				rc = KV_CORRUPT(f->path, c.o, "general.alignment must be a u32 power of two <= %u",
						GG_MAX_ALIGN);
				goto out;
			}
			align = f->kv[i].v.u;
		}
	}
	for (uint64_t i = 0; i < nt; i++) {
		f->n_t = i + 1;
		if ((rc = parse_tensor(&c, f, &f->t[i], names, i, &rel[i])))
			goto out;
	}
	f->data_off = (c.o + align - 1) / align * align;
	if (nt && f->data_off > f->size) {
		rc = KV_CORRUPT(f->path, c.o, "data section at %llu starts past the end of the %zu-byte file",
				(unsigned long long)f->data_off, f->size);
		goto out;
	}
	for (uint64_t i = 0; i < nt; i++) {
		struct kv_tensor *t = &f->t[i];
		uint64_t room = f->size > f->data_off ? f->size - f->data_off : 0;
		if (rel[i] % align) {
			rc = KV_CORRUPT(f->path, f->data_off, "tensor '%s': offset %llu is not a multiple of the alignment %llu",
					t->name, (unsigned long long)rel[i], (unsigned long long)align);
			goto out;
		}
		if (rel[i] > room || t->nbytes > room - rel[i]) {
			rc = KV_CORRUPT(f->path, f->data_off + rel[i],
					"tensor '%s': %llu bytes at data offset %llu run past the end of the file (%llu bytes of data)",
					t->name, (unsigned long long)t->nbytes, (unsigned long long)rel[i],
					(unsigned long long)room);
			goto out;
		}
		t->offset = f->data_off + rel[i];
		t->data = f->base + t->offset;
		order[i] = i;
	}
	qsort_r(order, nt, sizeof *order, cmp_off, f->t);
	for (uint64_t i = 1; i < nt; i++) {
		const struct kv_tensor *a = &f->t[order[i - 1]], *b = &f->t[order[i]];
		if (b->offset < a->offset + a->nbytes) {
			rc = KV_CORRUPT(f->path, b->offset, "tensors '%s' and '%s' overlap", a->name, b->name);
			goto out;
		}
	}
	rc = KV_OK;
out:
	kv_map_destroy(keys);
	kv_map_destroy(names);
	free(rel);
	free(order);
	return rc;
}

static int file_map(const char *path, struct gg_file *f)
{
	struct stat sb;
	void *m;
	int fd, rc;
	memset(f, 0, sizeof *f);
	if (!(f->path = strdup(path)))
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	fd = kv_io_open(path, O_RDONLY, 0);
	if (fd < 0)
		return kv_fail(errno == ENOENT ? KV_ERR_NOT_FOUND : kv_io_errno_code(errno), "%s: %s", path,
			       strerror(errno));
	if (kv_io_fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
		rc = kv_fail(KV_ERR_INVALID, "%s: not a regular file", path);
		kv_io_close(fd);
		return rc;
	}
	if (sb.st_size < 4) {
		kv_io_close(fd);
		return KV_CORRUPT(path, 0, "file is %lld bytes, too short for a GGUF header", (long long)sb.st_size);
	}
	m = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
	kv_io_close(fd);
	if (m == MAP_FAILED)
		return kv_fail(kv_io_errno_code(errno), "%s: mmap: %s", path, strerror(errno));
	kv_mem_advise_huge(m, (size_t)sb.st_size); /* base/mem.c: weights */
	f->base = m;
	f->size = (size_t)sb.st_size;
	f->mapped = 1;
	return file_parse(f);
}

static void gguf_free(struct kv_gguf *g)
{
	if (!g)
		return;
	for (size_t i = 0; i < g->nf; i++)
		file_free(&g->f[i]);
	if (g->noted)
		kv_mem_note(KV_MEM_WEIGHTS, -(int64_t)g->noted);
	free(g->f);
	free(g->all);
	kv_map_destroy(g->idx);
	kv_map_destroy(g->kidx);
	free(g);
}

void kv_gguf_close(struct kv_gguf *g)
{
	gguf_free(g);
}

static int build_index(struct kv_gguf *g)
{
	size_t total = 0;
	for (size_t i = 0; i < g->nf; i++)
		total += g->f[i].n_t;
	g->all = calloc(total ? total : 1, sizeof *g->all);
	g->idx = kv_map_create(total);
	g->kidx = kv_map_create(g->f[0].n_kv);
	if (!g->all || !g->idx || !g->kidx)
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	for (size_t i = 0; i < g->f[0].n_kv; i++)
		if (kv_map_put(g->kidx, g->f[0].kv[i].key, strlen(g->f[0].kv[i].key), i))
			return kv_fail(KV_ERR_NOMEM, "out of memory");
	for (size_t i = 0; i < g->nf; i++)
		for (size_t j = 0; j < g->f[i].n_t; j++) {
			const struct kv_tensor *t = &g->f[i].t[j];
			if (kv_map_get(g->idx, t->name, strlen(t->name), NULL))
				return KV_CORRUPT(t->file, t->offset, "tensor '%s' is in two files of the split set", t->name);
			if (kv_map_put(g->idx, t->name, strlen(t->name), g->n))
				return kv_fail(KV_ERR_NOMEM, "out of memory");
			g->all[g->n++] = t;
		}
	return KV_OK;
}

int kv_gguf_open_mem(const void *p, size_t n, const char *what, struct kv_gguf **out)
{
	struct kv_gguf *g = calloc(1, sizeof *g);
	int rc;
	*out = NULL;
	if (!g || !(g->f = calloc(1, sizeof *g->f))) {
		free(g);
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	}
	g->nf = 1;
	if (!(g->f[0].path = strdup(what ? what : "(memory)"))) {
		gguf_free(g);
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	}
	g->f[0].base = p;
	g->f[0].size = n;
	if ((rc = file_parse(&g->f[0])) || (rc = build_index(g))) {
		gguf_free(g);
		return rc;
	}
	*out = g;
	return KV_OK;
}

/* "<stem>-00001-of-00003.gguf": *k = 1, *n = 3, stem length in *stem. */
static int split_name(const char *path, int *k, int *n, size_t *stem)
{
	size_t len = strlen(path);
	const char *s;
	if (len < 20 || strcmp(path + len - 5, ".gguf"))
		return 0;
	s = path + len - 5 - 15; /* "-00001-of-00003" */
	if (s[0] != '-' || strncmp(s + 6, "-of-", 4))
		return 0;
	for (int i = 1; i < 6; i++)
		if (s[i] < '0' || s[i] > '9' || s[i + 9] < '0' || s[i + 9] > '9')
			return 0;
	*k = atoi(s + 1);
	*n = atoi(s + 10);
	*stem = (size_t)(s - path);
	return *k >= 1 && *n >= 1 && *k <= *n;
}

static int has_suffix(const char *s, const char *suf)
{
	size_t a = strlen(s), b = strlen(suf);
	return a >= b && !strcmp(s + a - b, suf);
}

/* The .gguf file of a folder: exactly one, or the first of one split set. */
static int folder_gguf(const char *dir, char *out, size_t cap)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	char first[1024] = "";
	int count = 0, split_firsts = 0, splits = 0, k, n;
	size_t stem;
	if (!d)
		return kv_fail(kv_io_errno_code(errno), "%s: %s", dir, strerror(errno));
	while ((e = readdir(d))) {
		if (!has_suffix(e->d_name, ".gguf") || e->d_name[0] == '.')
			continue;
		count++;
		if (split_name(e->d_name, &k, &n, &stem)) {
			splits++;
			if (k == 1) {
				split_firsts++;
				snprintf(first, sizeof first, "%s", e->d_name);
			}
		} else {
			snprintf(first, sizeof first, "%s", e->d_name);
		}
	}
	closedir(d);
	if (count == 0)
		return kv_fail(KV_ERR_NOT_FOUND, "%s: no .gguf file in the folder", dir);
	if (!(count == 1 || (splits == count && split_firsts == 1)))
		return kv_fail(KV_ERR_INVALID, "%s: %d .gguf files; give the path of the one to load", dir, count);
	if ((size_t)snprintf(out, cap, "%s/%s", dir, first) >= cap)
		return kv_fail(KV_ERR_INVALID, "%s: path too long", dir);
	return KV_OK;
}

/* 1 if the file starts with the GGUF magic: a file without the suffix,
 * such as a blob of Ollama's store (model/locate.h), is one too. */
static int has_gguf_magic(const char *path)
{
	char m[4];
	int fd = kv_io_open(path, O_RDONLY | O_CLOEXEC, 0);
	if (fd < 0)
		return 0;
	int ok = kv_io_pread_full(fd, m, 4, 0, path) == KV_OK && !memcmp(m, "GGUF", 4);
	kv_io_close(fd);
	kv_errclear();
	return ok;
}

int kv_gguf_is_model_path(const char *path)
{
	struct stat sb;
	char buf[4096];
	if (!path || stat(path, &sb) != 0)
		return 0;
	if (S_ISREG(sb.st_mode))
		return has_suffix(path, ".gguf") || has_gguf_magic(path);
	if (!S_ISDIR(sb.st_mode))
		return 0;
	snprintf(buf, sizeof buf, "%s/config.json", path);
	if (stat(buf, &sb) == 0)
		return 0;
	DIR *d = opendir(path);
	struct dirent *e;
	int found = 0;
	if (!d)
		return 0;
	while (!found && (e = readdir(d)))
		found = has_suffix(e->d_name, ".gguf") && e->d_name[0] != '.';
	closedir(d);
	return found;
}

int kv_gguf_open(const char *path, struct kv_gguf **out)
{
	struct kv_gguf *g;
	struct stat sb;
	char file[4096];
	int rc, k, n;
	size_t stem;

	*out = NULL;
	if (stat(path, &sb) != 0)
		return kv_fail(KV_ERR_NOT_FOUND, "%s: %s", path, strerror(errno));
	if (S_ISDIR(sb.st_mode)) {
		if ((rc = folder_gguf(path, file, sizeof file)))
			return rc;
	} else {
		snprintf(file, sizeof file, "%s", path);
	}
	if (!(g = calloc(1, sizeof *g)))
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	if (!split_name(file, &k, &n, &stem))
		n = 1;
	if (n > KV_GGUF_MAX_SPLITS) {
		free(g);
		return kv_fail(KV_ERR_UNSUPPORTED, "%s: split sets of more than %d files are not read", file,
			       KV_GGUF_MAX_SPLITS);
	}
	if (!(g->f = calloc((size_t)n, sizeof *g->f))) {
		free(g);
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	}
	for (int i = 0; i < n; i++) {
		char p[4200];
		if (n == 1)
			snprintf(p, sizeof p, "%s", file);
		else
			snprintf(p, sizeof p, "%.*s-%05d-of-%05d.gguf", (int)stem, file, i + 1, n);
		g->nf = (size_t)i + 1;
		if ((rc = file_map(p, &g->f[i])))
			goto fail;
		kv_mem_note(KV_MEM_WEIGHTS, (int64_t)g->f[i].size);
		g->noted += g->f[i].size;
		if (n > 1) {
			const struct kv_gguf_kv *no = NULL, *cnt = NULL;
			for (size_t j = 0; j < g->f[i].n_kv; j++) {
				if (!strcmp(g->f[i].kv[j].key, "split.no"))
					no = &g->f[i].kv[j];
				if (!strcmp(g->f[i].kv[j].key, "split.count"))
					cnt = &g->f[i].kv[j];
			}
			if (!no || !cnt || no->type == KV_GGUF_ARR || cnt->type == KV_GGUF_ARR ||
			    no->v.u != (uint64_t)i || cnt->v.u != (uint64_t)n) {
				rc = KV_CORRUPT(p, 0, "split.no / split.count do not say file %d of %d", i + 1, n);
				goto fail;
			}
		}
	}
	if ((rc = build_index(g)))
		goto fail;
	*out = g;
	return KV_OK;
fail:
	gguf_free(g);
	return rc;
}

const char *kv_gguf_path(const struct kv_gguf *g) { return g->f[0].path; }
uint32_t kv_gguf_version(const struct kv_gguf *g) { return g->f[0].version; }
size_t kv_gguf_nfiles(const struct kv_gguf *g) { return g->nf; }

uint64_t kv_gguf_file_bytes(const struct kv_gguf *g)
{
	uint64_t n = 0;
	for (size_t i = 0; i < g->nf; i++)
		n += g->f[i].size;
	return n;
}

int kv_gguf_header(const struct kv_gguf *g, size_t i, const void **p, size_t *n)
{
	if (i >= g->nf)
		return kv_fail(KV_ERR_INVALID, "no file %zu in the set", i);
	*p = g->f[i].base;
	*n = (size_t)(g->f[i].data_off < g->f[i].size ? g->f[i].data_off : g->f[i].size);
	return KV_OK;
}

size_t kv_gguf_kv_count(const struct kv_gguf *g) { return g->f[0].n_kv; }

const struct kv_gguf_kv *kv_gguf_kv_at(const struct kv_gguf *g, size_t i)
{
	return i < g->f[0].n_kv ? &g->f[0].kv[i] : NULL;
}

const struct kv_gguf_kv *kv_gguf_kv_find(const struct kv_gguf *g, const char *key)
{
	uint64_t i;
	if (!kv_map_get(g->kidx, key, strlen(key), &i))
		return NULL;
	return &g->f[0].kv[i];
}

static int is_int_type(int t)
{
	return t == KV_GGUF_U8 || t == KV_GGUF_I8 || t == KV_GGUF_U16 || t == KV_GGUF_I16 || t == KV_GGUF_U32 ||
	       t == KV_GGUF_I32 || t == KV_GGUF_U64 || t == KV_GGUF_I64;
}

static int is_signed(int t)
{
	return t == KV_GGUF_I8 || t == KV_GGUF_I16 || t == KV_GGUF_I32 || t == KV_GGUF_I64;
}

int kv_gguf_get_int(const struct kv_gguf *g, const char *key, int64_t *out)
{
	const struct kv_gguf_kv *kv = kv_gguf_kv_find(g, key);
	if (!kv)
		return kv_fail(KV_ERR_NOT_FOUND, "%s: no metadata '%s'", g->f[0].path, key);
	if (!is_int_type(kv->type) || (!is_signed(kv->type) && kv->v.u > (uint64_t)INT64_MAX))
		return kv_fail(KV_ERR_INCOMPATIBLE, "%s: metadata '%s' is not an integer", g->f[0].path, key);
	*out = kv->v.i;
	return KV_OK;
}

int kv_gguf_get_float(const struct kv_gguf *g, const char *key, double *out)
{
	const struct kv_gguf_kv *kv = kv_gguf_kv_find(g, key);
	if (!kv)
		return kv_fail(KV_ERR_NOT_FOUND, "%s: no metadata '%s'", g->f[0].path, key);
	if (kv->type == KV_GGUF_F32 || kv->type == KV_GGUF_F64)
		*out = kv->v.f;
	else if (is_int_type(kv->type))
		*out = is_signed(kv->type) ? (double)kv->v.i : (double)kv->v.u;
	else
		return kv_fail(KV_ERR_INCOMPATIBLE, "%s: metadata '%s' is not a number", g->f[0].path, key);
	return KV_OK;
}

int kv_gguf_get_bool(const struct kv_gguf *g, const char *key, int *out)
{
	const struct kv_gguf_kv *kv = kv_gguf_kv_find(g, key);
	if (!kv)
		return kv_fail(KV_ERR_NOT_FOUND, "%s: no metadata '%s'", g->f[0].path, key);
	if (kv->type != KV_GGUF_BOOL)
		return kv_fail(KV_ERR_INCOMPATIBLE, "%s: metadata '%s' is not a bool", g->f[0].path, key);
	*out = kv->v.u != 0;
	return KV_OK;
}

int kv_gguf_get_str(const struct kv_gguf *g, const char *key, char **out)
{
	const struct kv_gguf_kv *kv = kv_gguf_kv_find(g, key);
	*out = NULL;
	if (!kv)
		return kv_fail(KV_ERR_NOT_FOUND, "%s: no metadata '%s'", g->f[0].path, key);
	if (kv->type != KV_GGUF_STR)
		return kv_fail(KV_ERR_INCOMPATIBLE, "%s: metadata '%s' is not a string", g->f[0].path, key);
	if (!(*out = strndup(kv->s, (size_t)kv->slen)))
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	return KV_OK;
}

int kv_gguf_arr_int(const struct kv_gguf_kv *kv, uint64_t i, int64_t *out)
{
	struct kv_gguf_kv tmp;
	if (kv->type != KV_GGUF_ARR || !is_int_type(kv->arr_type) || i >= kv->n)
		return kv_fail(KV_ERR_INVALID, "metadata '%s': no integer element %llu", kv->key, (unsigned long long)i);
	scalar(kv->arr + i * vsize(kv->arr_type), kv->arr_type, &tmp);
	*out = tmp.v.i;
	return KV_OK;
}

size_t kv_gguf_tensor_count(const struct kv_gguf *g) { return g->n; }

const struct kv_tensor *kv_gguf_tensor_at(const struct kv_gguf *g, size_t i)
{
	return i < g->n ? g->all[i] : NULL;
}

const struct kv_tensor *kv_gguf_tensor_find(const struct kv_gguf *g, const char *name)
{
	uint64_t i;
	if (!kv_map_get(g->idx, name, strlen(name), &i))
		return NULL;
	return g->all[i];
}

/* --- writer ------------------------------------------------------------------ */

struct gw_kv {
	char *key;
	struct kv_buf val;       /* type + value bytes as written */
};

struct gw_t {
	char *name;
	int dt, ndim;
	int64_t shape[KV_GGUF_MAX_DIMS];
	uint64_t nbytes, off;
	const void *data;
	kv_ggufw_fill_fn fill;
	void *ctx;
};

struct kv_ggufw {
	struct gw_kv *kv;
	size_t n_kv;
	struct gw_t *t;
	size_t n_t;
	int oom;
};

struct kv_ggufw *kv_ggufw_create(void)
{
	return calloc(1, sizeof(struct kv_ggufw));
}

void kv_ggufw_destroy(struct kv_ggufw *w)
{
	if (!w)
		return;
	for (size_t i = 0; i < w->n_kv; i++) {
		free(w->kv[i].key);
		kv_buf_free(&w->kv[i].val);
	}
	for (size_t i = 0; i < w->n_t; i++)
		free(w->t[i].name);
	free(w->kv);
	free(w->t);
	free(w);
}

static void put_le(struct kv_buf *b, uint64_t v, int bytes)
{
	uint8_t x[8];
	for (int i = 0; i < bytes; i++)
		x[i] = (uint8_t)(v >> (8 * i));
	kv_buf_add(b, x, (size_t)bytes);
}

static void put_str(struct kv_buf *b, const char *s)
{
	put_le(b, strlen(s), 8);
	kv_buf_add(b, s, strlen(s));
}

/* The value buffer of key (created empty, or reset when set again). */
static struct kv_buf *gw_slot(struct kv_ggufw *w, const char *key)
{
	for (size_t i = 0; i < w->n_kv; i++)
		if (!strcmp(w->kv[i].key, key)) {
			kv_buf_reset(&w->kv[i].val);
			return &w->kv[i].val;
		}
	struct gw_kv *nk = realloc(w->kv, (w->n_kv + 1) * sizeof *nk);
	if (!nk)
		return NULL;
	w->kv = nk;
	memset(&nk[w->n_kv], 0, sizeof *nk);
	if (!(nk[w->n_kv].key = strdup(key)))
		return NULL;
	return &w->kv[w->n_kv++].val;
}

#define GW_SET(fn, ctype, tcode, bytes, conv) \
	int fn(struct kv_ggufw *w, const char *key, ctype v) \
	{ \
		struct kv_buf *b = gw_slot(w, key); \
		if (!b) \
			return kv_fail(KV_ERR_NOMEM, "out of memory"); \
		put_le(b, tcode, 4); \
		put_le(b, conv, bytes); \
		return b->oom ? kv_fail(KV_ERR_NOMEM, "out of memory") : KV_OK; \
	}

static uint32_t f32_bits(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	return u;
}

GW_SET(kv_ggufw_set_u16, uint16_t, KV_GGUF_U16, 2, v)
GW_SET(kv_ggufw_set_u32, uint32_t, KV_GGUF_U32, 4, v)
GW_SET(kv_ggufw_set_i32, int32_t, KV_GGUF_I32, 4, (uint32_t)v)
GW_SET(kv_ggufw_set_u64, uint64_t, KV_GGUF_U64, 8, v)
GW_SET(kv_ggufw_set_f32, float, KV_GGUF_F32, 4, f32_bits(v))
GW_SET(kv_ggufw_set_bool, int, KV_GGUF_BOOL, 1, (uint64_t)(v != 0))

int kv_ggufw_set_str(struct kv_ggufw *w, const char *key, const char *v)
{
	struct kv_buf *b = gw_slot(w, key);
	if (!b)
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	put_le(b, KV_GGUF_STR, 4);
	put_str(b, v);
	return b->oom ? kv_fail(KV_ERR_NOMEM, "out of memory") : KV_OK;
}

int kv_ggufw_set_arr_str(struct kv_ggufw *w, const char *key, size_t n, const char *const *v)
{
	struct kv_buf *b = gw_slot(w, key);
	if (!b)
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	put_le(b, KV_GGUF_ARR, 4);
	put_le(b, KV_GGUF_STR, 4);
	put_le(b, n, 8);
	for (size_t i = 0; i < n; i++)
		put_str(b, v[i]);
	return b->oom ? kv_fail(KV_ERR_NOMEM, "out of memory") : KV_OK;
}

int kv_ggufw_set_arr_i32(struct kv_ggufw *w, const char *key, size_t n, const int32_t *v)
{
	struct kv_buf *b = gw_slot(w, key);
	if (!b)
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	put_le(b, KV_GGUF_ARR, 4);
	put_le(b, KV_GGUF_I32, 4);
	put_le(b, n, 8);
	for (size_t i = 0; i < n; i++)
		put_le(b, (uint32_t)v[i], 4);
	return b->oom ? kv_fail(KV_ERR_NOMEM, "out of memory") : KV_OK;
}

static int gw_add(struct kv_ggufw *w, const char *name, int dt, int ndim, const int64_t *shape, const void *data,
		  uint64_t nbytes, kv_ggufw_fill_fn fill, void *ctx, int check)
{
	uint64_t numel = 1, need_b;
	if (!name || !name[0] || ndim < 1 || ndim > KV_GGUF_MAX_DIMS || kq_ggml_from_dtype(dt) < 0)
		return kv_fail(KV_ERR_INVALID, "gguf writer: tensor '%s': bad name, dims or dtype", name ? name : "");
	for (int i = 0; i < ndim; i++)
		if (shape[i] <= 0 || __builtin_mul_overflow(numel, (uint64_t)shape[i], &numel))
			return kv_fail(KV_ERR_INVALID, "gguf writer: tensor '%s': bad dim %d", name, i);
	need_b = kv_dtype_row_bytes(dt, (uint64_t)shape[ndim - 1]);
	if (!need_b)
		return kv_fail(KV_ERR_INVALID, "gguf writer: tensor '%s': rows of %lld do not divide into %s blocks", name,
			       (long long)shape[ndim - 1], kv_dtype_name(dt));
	need_b *= numel / (uint64_t)shape[ndim - 1];
	if (check && need_b != nbytes)
		return kv_fail(KV_ERR_INVALID, "gguf writer: tensor '%s': %llu bytes given, needs %llu", name,
			       (unsigned long long)nbytes, (unsigned long long)need_b);
	for (size_t i = 0; i < w->n_t; i++)
		if (!strcmp(w->t[i].name, name))
			return kv_fail(KV_ERR_INVALID, "gguf writer: duplicate tensor '%s'", name);
	struct gw_t *nt = realloc(w->t, (w->n_t + 1) * sizeof *nt);
	if (!nt)
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	w->t = nt;
	struct gw_t *t = &w->t[w->n_t];
	memset(t, 0, sizeof *t);
	if (!(t->name = strdup(name)))
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	t->dt = dt;
	t->ndim = ndim;
	for (int i = 0; i < ndim; i++)
		t->shape[i] = shape[i];
	t->nbytes = need_b;
	t->data = data;
	t->fill = fill;
	t->ctx = ctx;
	w->n_t++;
	return KV_OK;
}

int kv_ggufw_add(struct kv_ggufw *w, const char *name, int dt, int ndim, const int64_t *shape, const void *data,
		 uint64_t nbytes)
{
	if (!data)
		return kv_fail(KV_ERR_INVALID, "gguf writer: tensor '%s': no data", name ? name : "");
	return gw_add(w, name, dt, ndim, shape, data, nbytes, NULL, NULL, 1);
}

int kv_ggufw_add_fill(struct kv_ggufw *w, const char *name, int dt, int ndim, const int64_t *shape,
		      kv_ggufw_fill_fn fill, void *ctx)
{
	if (!fill)
		return kv_fail(KV_ERR_INVALID, "gguf writer: tensor '%s': no fill function", name ? name : "");
	return gw_add(w, name, dt, ndim, shape, NULL, 0, fill, ctx, 0);
}

static uint64_t pad_to(uint64_t x)
{
	return (x + KV_GGUF_ALIGN - 1) / KV_GGUF_ALIGN * KV_GGUF_ALIGN;
}

/* Header (magic .. tensor infos) padded to the alignment; offsets set. */
static int gw_header(struct kv_ggufw *w, struct kv_buf *b, uint64_t *data_bytes)
{
	uint64_t off = 0;
	put_le(b, KV_GGUF_MAGIC, 4);
	put_le(b, KV_GGUF_VERSION, 4);
	put_le(b, w->n_t, 8);
	put_le(b, w->n_kv, 8);
	for (size_t i = 0; i < w->n_kv; i++) {
		put_str(b, w->kv[i].key);
		kv_buf_add(b, w->kv[i].val.p, w->kv[i].val.len);
	}
	for (size_t i = 0; i < w->n_t; i++) {
		struct gw_t *t = &w->t[i];
		put_str(b, t->name);
		put_le(b, (uint64_t)t->ndim, 4);
		for (int d = t->ndim - 1; d >= 0; d--)
			put_le(b, (uint64_t)t->shape[d], 8);
		put_le(b, (uint64_t)kq_ggml_from_dtype(t->dt), 4);
		put_le(b, off, 8);
		t->off = off;
		off = pad_to(off + t->nbytes);
	}
	while (b->len % KV_GGUF_ALIGN)
		kv_buf_addc(b, 0);
	*data_bytes = off;
	return b->oom ? kv_fail(KV_ERR_NOMEM, "gguf writer: out of memory for the header") : KV_OK;
}

int kv_ggufw_to_mem(struct kv_ggufw *w, void **out, size_t *len)
{
	struct kv_buf b = KV_BUF_INIT;
	uint64_t data;
	int rc;
	*out = NULL;
	*len = 0;
	if ((rc = gw_header(w, &b, &data))) {
		kv_buf_free(&b);
		return rc;
	}
	size_t total = b.len + (size_t)data;
	uint8_t *p = calloc(1, total ? total : 1);
	if (!p) {
		kv_buf_free(&b);
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	}
	memcpy(p, b.p, b.len);
	for (size_t i = 0; i < w->n_t; i++) {
		struct gw_t *t = &w->t[i];
		uint8_t *dst = p + b.len + t->off;
		if (t->fill) {
			if ((rc = t->fill(t->ctx, dst, t->nbytes))) {
				free(p);
				kv_buf_free(&b);
				return kv_fail_ctx(rc, "gguf writer: tensor '%s'", t->name);
			}
		} else {
			memcpy(dst, t->data, (size_t)t->nbytes);
		}
	}
	*out = p;
	*len = total;
	kv_buf_free(&b);
	return KV_OK;
}

/* Header and tensor data of w into dw (begun; neither committed nor
 * aborted here). `op` says the failing step. */
static int gw_emit(struct kv_ggufw *w, struct kv_dw *dw, const char **op)
{
	struct kv_buf b = KV_BUF_INIT;
	uint8_t *scratch = NULL, zero[KV_GGUF_ALIGN] = {0};
	uint64_t data, max_fill = 0, pos = 0;
	int rc;

	*op = "header";
	if ((rc = gw_header(w, &b, &data)))
		goto out;
	for (size_t i = 0; i < w->n_t; i++)
		if (w->t[i].fill && w->t[i].nbytes > max_fill)
			max_fill = w->t[i].nbytes;
	*op = "allocate scratch";
	if (max_fill && !(scratch = kv_alloc(KV_MEM_OTHER, (size_t)max_fill))) {
		rc = kv_fail(KV_ERR_NOMEM, "cannot allocate %llu bytes", (unsigned long long)max_fill);
		goto out;
	}
	*op = "write header";
	if ((rc = kv_dw_write(dw, b.p, b.len)))
		goto out;
	*op = "write tensors";
	for (size_t i = 0; i < w->n_t; i++) {
		struct gw_t *t = &w->t[i];
		const void *src = t->data;
		if (pos < t->off && (rc = kv_dw_write(dw, zero, (size_t)(t->off - pos))))
			goto out;
		pos = t->off;
		if (t->fill) {
			if ((rc = t->fill(t->ctx, scratch, t->nbytes))) {
				kv_fail_ctx(rc, "tensor '%s'", t->name);
				goto out;
			}
			src = scratch;
		}
		if ((rc = kv_dw_write(dw, src, (size_t)t->nbytes)))
			goto out;
		pos += t->nbytes;
	}
	if (pos < data && (rc = kv_dw_write(dw, zero, (size_t)(data - pos))))
		goto out;
out:
	kv_free(scratch);
	kv_buf_free(&b);
	return rc;
}

int kv_ggufw_write(struct kv_ggufw *w, const char *path, unsigned flags)
{
	struct kv_dw dw;
	const char *op = "create";
	int rc;
	if ((rc = kv_dw_begin(&dw, path)))
		return kv_fail_ctx(rc, "gguf writer: %s: %s", path, op);
	if ((rc = gw_emit(w, &dw, &op))) {
		kv_dw_abort(&dw);
		return kv_fail_ctx(rc, "gguf writer: %s: %s", path, op);
	}
	if ((rc = kv_dw_commit(&dw, flags | KV_DW_PUBLIC)))
		return kv_fail_ctx(rc, "gguf writer: %s: commit", path);
	return KV_OK;
}

/*
 * Split sets, the way llama.cpp's gguf-split cuts them: tensors in order,
 * a new file when the next tensor's padded size would take the current
 * file's tensor bytes past max_bytes, or every max_tensors tensors; a
 * tensor bigger than max_bytes gets a file of its own (gguf-split refuses
 * one only when it is the very first). File 1 has all the metadata, every
 * file split.no (u16, 0-based), split.count (u16), split.tensors.count
 * (i32). Every part is written to its temp file first; only when all are
 * complete are they renamed into place, and a failure removes the parts
 * already renamed, so no partial set is left behind.
 */
int kv_ggufw_write_split(struct kv_ggufw *w, const char *prefix, uint64_t max_bytes, uint32_t max_tensors,
			 unsigned flags, int *n_files)
{
	size_t *start = NULL, np = 0;
	struct kv_dw *dw = NULL;
	struct kv_ggufw part, *sk = NULL;
	struct gw_kv *kvs = NULL;
	char path[4200];
	const char *op = "plan";
	size_t begun = 0, committed = 0;
	int rc = KV_OK;

	if (n_files)
		*n_files = 0;
	if (!max_bytes && !max_tensors)
		return kv_fail(KV_ERR_INVALID, "gguf writer: a split needs a size or a tensor count");
	if (!(start = calloc(w->n_t + 1, sizeof *start)) || !(kvs = calloc(w->n_kv + 3, sizeof *kvs)))
		goto oom;
	uint64_t cur = 0;
	for (size_t i = 0; i < w->n_t; i++) {
		uint64_t nb = pad_to(w->t[i].nbytes);
		int cut = i > 0 && ((max_bytes && cur + nb > max_bytes) || (max_tensors && i % max_tensors == 0));
		if (i == 0 || cut) {
			start[np++] = i;
			cur = 0;
		}
		cur += nb;
	}
	if (!np)
		start[np++] = 0; /* no tensors: one file of metadata */
	start[np] = w->n_t;
	if (np > KV_GGUF_MAX_SPLITS) {
		rc = kv_fail(KV_ERR_INVALID,
			     "gguf writer: the split would make %zu files (at most %d: kvkeep reads no more); raise the size or "
			     "tensor limit",
			     np, KV_GGUF_MAX_SPLITS);
		goto out;
	}
	if (!(dw = calloc(np, sizeof *dw)))
		goto oom;
	for (size_t k = 0; k < np; k++) {
		if ((size_t)snprintf(path, sizeof path, "%s-%05zu-of-%05zu.gguf", prefix, k + 1, np) >= sizeof path) {
			rc = kv_fail(KV_ERR_INVALID, "gguf writer: output name too long");
			goto out;
		}
		kv_ggufw_destroy(sk);
		if (!(sk = kv_ggufw_create()) || kv_ggufw_set_u16(sk, "split.no", (uint16_t)k) ||
		    kv_ggufw_set_u16(sk, "split.count", (uint16_t)np) ||
		    kv_ggufw_set_i32(sk, "split.tensors.count", (int32_t)w->n_t))
			goto oom;
		/* a shallow view: w's keys (file 1 only) + the split keys, and
		 * the part's tensors (gw_header sets their offsets per file) */
		size_t nk = 0;
		for (size_t j = 0; k == 0 && j < w->n_kv; j++)
			if (strncmp(w->kv[j].key, "split.", 6))
				kvs[nk++] = w->kv[j];
		for (size_t j = 0; j < sk->n_kv; j++)
			kvs[nk++] = sk->kv[j];
		memset(&part, 0, sizeof part);
		part.kv = kvs;
		part.n_kv = nk;
		part.t = w->t + start[k];
		part.n_t = start[k + 1] - start[k];
		op = "create";
		if ((rc = kv_dw_begin(&dw[k], path)))
			goto fail;
		begun = k + 1;
		if ((rc = gw_emit(&part, &dw[k], &op)))
			goto fail;
	}
	op = "commit";
	for (size_t k = 0; k < np; k++) {
		snprintf(path, sizeof path, "%s", dw[k].final);
		if ((rc = kv_dw_commit(&dw[k], flags | KV_DW_NO_DIRSYNC | KV_DW_PUBLIC)))
			goto fail;
		committed = k + 1;
	}
	if (!(flags & KV_DW_NO_SYNC)) {
		char dir[4200];
		snprintf(dir, sizeof dir, "%s", prefix);
		char *sl = strrchr(dir, '/');
		if (sl)
			*(sl == dir ? sl + 1 : sl) = 0;
		else
			snprintf(dir, sizeof dir, ".");
		op = "sync the folder";
		if ((rc = kv_io_fsync_dir(dir)))
			goto fail;
	}
	if (n_files)
		*n_files = (int)np;
	goto out;
oom:
	rc = kv_fail(KV_ERR_NOMEM, "out of memory");
	goto out;
fail:
	kv_fail_ctx(rc, "gguf writer: %s: %s", path, op);
	for (size_t k = 0; k < committed; k++)
		kv_io_unlink(dw[k].final);
	for (size_t k = committed; k < begun; k++)
		kv_dw_abort(&dw[k]);
out:
	if (sk) {
		kv_ggufw_destroy(sk);
	}
	free(kvs);
	free(dw);
	free(start);
	return rc;
}
