/*
 * obj.c - see obj.h for the format and the validation order.
 *
 * Reading never maps tensor data: kv_st_open parses the header (its mmap
 * only touches the header pages), then the data is read with pread
 * straight into the caller's buffers (a KV page, a snapshot buffer), in
 * file order so the CRC chains over the data section. Reads of adjacent
 * tensors landing in adjacent memory are merged into one pread.
 */
#include "store/obj.h"
#include "base/clock.h"
#include "base/corrupt.h"
#include "base/durable.h"
#include "base/err.h"
#include "base/io.h"
#include "base/mem.h"
#include "cache/names.h"
#include "model/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char *const kind_names[] = {NULL, "block", "tail", "snapshot", "entry"};
static const char *const kind_suffix[] = {NULL, "block", "tail", "snap", "entry"};

const char *ks_kind_name(int kind)
{
	return kind > 0 && kind < KS_KIND__END ? kind_names[kind] : NULL;
}

int ks_kind_from_suffix(const char *s, size_t n)
{
	for (int k = 1; k < KS_KIND__END; k++)
		if (strlen(kind_suffix[k]) == n && !memcmp(s, kind_suffix[k], n))
			return k;
	return 0;
}

const char *ks_bad_name(int bad)
{
	static const char *const names[KS_BAD__COUNT] = {"none",   "size", "header", "version", "namespace", "arith",
							 "crc",    "tokens", "shape", "position", "coverage", "io"};
	return bad >= 0 && bad < KS_BAD__COUNT ? names[bad] : "?";
}

void ks_obj_name(int kind, struct kv_h128 id, char out[64])
{
	char hex[33];
	kv_h128_hex(id, hex);
	snprintf(out, 64, "%s.%s.safetensors", hex, ks_kind_name(kind) ? kind_suffix[kind] : "x");
}

int ks_obj_parse_name(const char *name, int *kind, struct kv_h128 *id)
{
	const char *dot, *ext;
	size_t n = strlen(name);
	if (n < 34 || name[32] != '.')
		return KV_ERR_INVALID;
	dot = strchr(name + 33, '.');
	if (!dot || strcmp(dot, ".safetensors"))
		return KV_ERR_INVALID;
	ext = name + 33;
	*kind = ks_kind_from_suffix(ext, (size_t)(dot - ext));
	if (!*kind)
		return KV_ERR_INVALID;
	char hex[33];
	memcpy(hex, name, 32);
	hex[32] = 0;
	for (int i = 0; i < 32; i++)
		if (!((hex[i] >= '0' && hex[i] <= '9') || (hex[i] >= 'a' && hex[i] <= 'f')))
			return KV_ERR_INVALID;
	return kv_h128_parse(hex, id) ? KV_ERR_INVALID : KV_OK;
}

/* --- the tensor plan: names, dtypes, shapes and bytes of each kind ------- */

#define MAX_TENSORS (2 + 2 * KV_MAX_LAYERS) /* block: 1 + 2 x attention layers; snapshot: 1 + 2 x
						* (recurrent + window layers) */

struct tplan {
	char name[32];
	int dtype;
	int ndim;
	int64_t shape[4];
	uint64_t nbytes;
	size_t mem_off;   /* offset inside the destination buffer of its part */
	int part;         /* 0 tokens, 1 kv, 2 snap, 3 ckpt */
	int rec;          /* snapshot: index into layout.rec, or n_rec_layers + index into
			     layout.win, else -1 */
};

/* A recurrent array: dims when they describe the bytes, else U8 [bytes]. */
static void rec_tensor(struct tplan *t, size_t bytes, const int *dims, int nd)
{
	uint64_t prod = 4;
	int ok = nd > 0;
	for (int i = 0; i < nd; i++) {
		if (dims[i] <= 0)
			ok = 0;
		prod *= (uint64_t)(dims[i] > 0 ? dims[i] : 0);
	}
	if (ok && prod == bytes) {
		t->dtype = KV_DT_F32;
		t->ndim = nd;
		for (int i = 0; i < nd; i++)
			t->shape[i] = dims[i];
	} else {
		t->dtype = KV_DT_U8;
		t->ndim = 1;
		t->shape[0] = (int64_t)bytes;
	}
	t->nbytes = bytes;
}

/* How a KV tensor is typed in the file: the layout's dtype where
 * safetensors has it (F32, BF16, F16: [kv_heads, rows, head_dim]), else
 * U8 over each row's bytes ([kv_heads, rows, row_bytes]: Q8_0 blocks,
 * which safetensors cannot name; the "kv_dtype" metadata says what they
 * are). */
static int kv_tensor_dtype(const struct ke_layout *L, int head_dim, size_t row_bytes, int64_t *last_dim)
{
	if (kv_dtype_size(L->kv_dtype)) {
		*last_dim = head_dim;
		return L->kv_dtype;
	}
	*last_dim = (int64_t)row_bytes;
	return KV_DT_U8;
}

/* The tensors of an object, in file order. Returns the count. */
static int plan(const struct ke_layout *L, int kind, uint32_t n_tokens, uint32_t n_ckpt, struct tplan *p)
{
	int n = 0;
	memset(p, 0, sizeof *p);
	snprintf(p[n].name, sizeof p[n].name, "tokens");
	p[n].dtype = KV_DT_I32;
	p[n].ndim = 1;
	p[n].shape[0] = n_tokens;
	p[n].nbytes = (uint64_t)n_tokens * 4;
	p[n].part = 0;
	p[n].rec = -1;
	n++;
	if (kind == KS_BLOCK || kind == KS_TAIL) {
		uint32_t rows = kind == KS_BLOCK ? (uint32_t)L->page_tokens : n_tokens;
		size_t seg_bytes = (size_t)rows * L->row_bytes, off = 0;
		for (int l = 0; l < L->n_attn_layers; l++)
			for (int kv = 0; kv < 2; kv++) {
				struct tplan *t = &p[n++];
				memset(t, 0, sizeof *t);
				snprintf(t->name, sizeof t->name, "kv.%d.%c", l, kv ? 'v' : 'k');
				t->dtype = kv_tensor_dtype(L, L->head_dim, L->row_bytes, &t->shape[2]);
				t->ndim = 3;
				t->shape[0] = L->n_kv_heads;
				t->shape[1] = rows;
				t->nbytes = (uint64_t)seg_bytes * (uint64_t)L->n_kv_heads;
				t->mem_off = off;
				t->part = 1;
				t->rec = -1;
				off += (size_t)t->nbytes;
			}
	} else if (kind == KS_SNAP) {
		for (int i = 0; i < L->n_rec_layers; i++) {
			const struct ke_rec_layer *r = &L->rec[i];
			if (r->conv_bytes) {
				struct tplan *t = &p[n++];
				memset(t, 0, sizeof *t);
				snprintf(t->name, sizeof t->name, "rec.%d.conv", r->layer);
				rec_tensor(t, r->conv_bytes, r->conv_dims, 2);
				t->mem_off = r->conv_off;
				t->part = 2;
				t->rec = i;
			}
			struct tplan *t = &p[n++];
			memset(t, 0, sizeof *t);
			snprintf(t->name, sizeof t->name, "rec.%d.state", r->layer);
			rec_tensor(t, r->state_bytes, r->state_dims, 3);
			t->mem_off = r->state_off;
			t->part = 2;
			t->rec = i;
		}
		/* sliding layers: K then V rows of the window, in the KV dtype */
		for (int i = 0; i < L->n_win_layers; i++) {
			const struct ke_win_layer *w = &L->win[i];
			for (int kv = 0; kv < 2; kv++) {
				struct tplan *t = &p[n++];
				memset(t, 0, sizeof *t);
				snprintf(t->name, sizeof t->name, "win.%d.%c", w->layer, kv ? 'v' : 'k');
				t->dtype = kv_tensor_dtype(L, w->head_dim, w->row_bytes, &t->shape[2]);
				t->ndim = 3;
				t->shape[0] = w->kv_heads;
				t->shape[1] = w->rows;
				t->nbytes = w->bytes / 2;
				t->mem_off = kv ? w->v_off : w->k_off;
				t->part = 2;
				t->rec = L->n_rec_layers + i;
			}
		}
	} else if (kind == KS_ENTRY) {
		struct tplan *t = &p[n++];
		memset(t, 0, sizeof *t);
		snprintf(t->name, sizeof t->name, "checkpoints");
		t->dtype = KV_DT_I32;
		t->ndim = 1;
		t->shape[0] = n_ckpt;
		t->nbytes = (uint64_t)n_ckpt * 4;
		t->part = 3;
		t->rec = -1;
	}
	return n;
}

uint64_t ks_obj_data_bytes(const struct ke_layout *L, int kind, uint32_t n_tokens, uint32_t n_ckpt)
{
	struct tplan p[MAX_TENSORS];
	int n = plan(L, kind, n_tokens, n_ckpt, p);
	uint64_t s = 0;
	for (int i = 0; i < n; i++)
		s += p[i].nbytes;
	return s;
}

/* --- writing ----------------------------------------------------------- */

/*
 * A placeholder fill: the header-only serialisation below asks the
 * safetensors writer for its bytes without the data, which we then write
 * straight from the caller's memory. The buffer kv_stw_to_mem hands us is
 * malloc'd and never read past the header, so its data pages are not even
 * touched.
 */
static int fill_none(void *ctx, void *dst, uint64_t nbytes)
{
	(void)ctx;
	(void)dst;
	(void)nbytes;
	return KV_OK;
}

static const void *part_ptr(const struct ks_obj_src *s, const struct tplan *t, const int32_t *ckv)
{
	switch (t->part) {
	case 0:
		return s->tokens;
	case 1:
		return (const char *)s->kv + t->mem_off;
	case 2:
		return (const char *)s->snap + t->mem_off;
	default:
		return ckv;
	}
}

static int cmp_cstr(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* CRC of "key=value\n" over sorted keys (the meta_crc32c rule). */
static uint32_t meta_crc(char **keys, char **vals, size_t n)
{
	size_t idx[32];
	char *sorted[32];
	uint32_t crc = 0;
	if (n > 32)
		n = 32;
	for (size_t i = 0; i < n; i++)
		sorted[i] = keys[i];
	qsort(sorted, n, sizeof *sorted, cmp_cstr);
	for (size_t i = 0; i < n; i++)
		for (size_t j = 0; j < n; j++)
			if (keys[j] == sorted[i])
				idx[i] = j;
	for (size_t i = 0; i < n; i++) {
		crc = kv_crc32c(crc, keys[idx[i]], strlen(keys[idx[i]]));
		crc = kv_crc32c(crc, "=", 1);
		crc = kv_crc32c(crc, vals[idx[i]], strlen(vals[idx[i]]));
		crc = kv_crc32c(crc, "\n", 1);
	}
	return crc;
}

static int check_src(const struct ke_layout *L, const struct ks_obj_src *s)
{
	uint32_t B = (uint32_t)L->page_tokens;
	if (!ks_kind_name(s->kind))
		return kv_fail(KV_ERR_INVALID, "disk object: unknown kind %d", s->kind);
	if (s->n_tokens && !s->tokens)
		return kv_fail(KV_ERR_INVALID, "disk object: no tokens");
	switch (s->kind) {
	case KS_BLOCK:
		if (s->n_tokens != B || !s->kv || !s->pos || s->pos % B)
			return kv_fail(KV_ERR_INVALID, "disk block: %u tokens at %u (B %u)", s->n_tokens, s->pos, B);
		break;
	case KS_TAIL:
		if (!s->n_tokens || s->n_tokens >= B || s->pos % B != s->n_tokens || !s->kv)
			return kv_fail(KV_ERR_INVALID, "disk tail: %u tokens at %u", s->n_tokens, s->pos);
		break;
	case KS_SNAP:
		if (!L->snapshot_bytes || !s->snap || s->pos % B != s->n_tokens || !s->pos)
			return kv_fail(KV_ERR_INVALID, "disk snapshot at %u: no snapshot or bad position", s->pos);
		break;
	case KS_ENTRY:
		if (!s->n_tokens || s->pos != s->n_tokens || s->n_tokens > KS_ENTRY_MAX_TOKENS ||
		    s->n_ckpt > KS_MAX_CKPT || (s->n_ckpt && !s->ckpt))
			return kv_fail(KV_ERR_INVALID, "disk entry: %u tokens, %u checkpoints", s->n_tokens, s->n_ckpt);
		break;
	}
	return KV_OK;
}

/*
 * The header of an object: its metadata (with both checksums, so the
 * data is read once here for the CRC) and its tensor table, serialised by
 * the safetensors writer. *hdr malloc'd (8 + header JSON bytes); *ck the
 * int32 checkpoint list the data section needs (entries), freed by the
 * caller; *total the file size.
 */
static int header(const struct ke_layout *L, const struct ks_obj_src *s, struct tplan *p, int *nt, void **hdr,
		  size_t *hdr_len, int32_t **ck, uint64_t *total)
{
	struct kv_stw *w = kv_stw_create();
	char hex[4][33], num[6][24], crcs[2][12];
	char *keys[16], *vals[16];
	size_t nm = 0;
	uint32_t crc = 0;
	uint64_t data = 0;
	int32_t *ckv = NULL;
	int rc = KV_OK;

	*hdr = NULL;
	*ck = NULL;
	if (!w)
		return kv_fail(KV_ERR_NOMEM, "disk object: out of memory");
	if (s->kind == KS_ENTRY && s->n_ckpt) {
		ckv = malloc(s->n_ckpt * sizeof *ckv);
		if (!ckv) {
			kv_stw_destroy(w);
			return kv_fail(KV_ERR_NOMEM, "disk object: out of memory");
		}
		for (uint32_t i = 0; i < s->n_ckpt; i++)
			ckv[i] = (int32_t)s->ckpt[i];
	}
	*nt = plan(L, s->kind, s->n_tokens, s->n_ckpt, p);
	for (int i = 0; i < *nt && !rc; i++) {
		if (p[i].nbytes)
			crc = kv_crc32c(crc, part_ptr(s, &p[i], ckv), (size_t)p[i].nbytes);
		data += p[i].nbytes;
		rc = kv_stw_add_fill(w, p[i].name, p[i].dtype, p[i].ndim, p[i].shape, fill_none, NULL);
	}
	if (rc)
		goto fail;

	struct kv_h128 th = kv_xxh3_128(s->tokens ? (const void *)s->tokens : "", (size_t)s->n_tokens * 4, 0);
	int64_t created = s->created ? s->created : (int64_t)time(NULL);
	kv_h128_hex(s->ns, hex[0]);
	kv_h128_hex(s->id, hex[1]);
	kv_h128_hex(s->parent, hex[2]);
	kv_h128_hex(th, hex[3]);
	snprintf(num[0], sizeof num[0], "%d", KS_VERSION);
	snprintf(num[1], sizeof num[1], "%u", s->pos);
	snprintf(num[2], sizeof num[2], "%u", s->n_tokens);
	snprintf(num[3], sizeof num[3], "%d", L->page_tokens);
	snprintf(num[4], sizeof num[4], "%" PRId64, created);
	snprintf(num[5], sizeof num[5], "%u", s->kind == KS_SNAP ? (s->anchor_flag ? 1u : 0u) : s->anchor);
	snprintf(crcs[0], sizeof crcs[0], "%08x", crc);
#define M(k, v) (keys[nm] = (char *)(k), vals[nm] = (char *)(v), nm++)
	M("format", KS_MAGIC);
	M("version", num[0]);
	M("kind", ks_kind_name(s->kind));
	M("namespace", hex[0]);
	M("id", hex[1]);
	M("parent", hex[2]);
	M("pos", num[1]);
	M("n_tokens", num[2]);
	M("tokens_xxh3", hex[3]);
	M("page_tokens", num[3]);
	if (s->kind == KS_BLOCK || s->kind == KS_TAIL || (s->kind == KS_SNAP && L->n_win_layers))
		M("kv_dtype", kv_dtype_name(L->kv_dtype)); /* (a snapshot's window rows are KV rows) */
	if (s->kind == KS_SNAP || s->kind == KS_ENTRY)
		M("anchor", num[5]);
	M("created", num[4]);
	M("crc32c", crcs[0]);
#undef M
	snprintf(crcs[1], sizeof crcs[1], "%08x", meta_crc(keys, vals, nm));
	for (size_t i = 0; i < nm && !rc; i++)
		rc = kv_stw_meta(w, keys[i], vals[i]);
	if (!rc)
		rc = kv_stw_meta(w, "meta_crc32c", crcs[1]);
	if (rc)
		goto fail;
	*total = kv_stw_size(w);
	{
		void *mem;
		size_t len;
		if ((rc = kv_stw_to_mem(w, &mem, &len)))
			goto fail;
		*hdr_len = (size_t)(*total - data);
		*hdr = realloc(mem, *hdr_len); /* keep the header, give back the rest */
		if (!*hdr)
			*hdr = mem;
	}
	kv_stw_destroy(w);
	*ck = ckv;
	return KV_OK;
fail:
	kv_stw_destroy(w);
	free(ckv);
	return rc;
}

uint64_t ks_obj_file_size(const struct ke_layout *L, const struct ks_obj_src *s)
{
	struct tplan p[MAX_TENSORS];
	int nt;
	void *hdr;
	size_t hl;
	int32_t *ck;
	uint64_t total = 0;
	if (check_src(L, s) || header(L, s, p, &nt, &hdr, &hl, &ck, &total))
		return 0;
	free(hdr);
	free(ck);
	return total;
}

#define STAGE_CHUNK (4u << 20) /* deadline checks at least this often */

int ks_obj_stage(const char *path, const struct ke_layout *L, const struct ks_obj_src *s, uint64_t deadline_ns,
		 struct ks_obj_staged *st)
{
	struct tplan p[MAX_TENSORS];
	int nt, rc;
	void *hdr = NULL;
	size_t hl = 0;
	int32_t *ck = NULL;
	const char *op = "header";

	st->bytes = 0;
	st->dw.fd = -1;
	st->dw.tmp[0] = 0;
	if ((rc = check_src(L, s)))
		return rc;
	if (deadline_ns && kv_now_ns() >= deadline_ns)
		return kv_fail(KV_ERR_TIMEOUT, "%s: shutdown budget reached", path);
	if ((rc = header(L, s, p, &nt, &hdr, &hl, &ck, &st->bytes)))
		return rc;
	op = "create";
	if ((rc = kv_dw_begin(&st->dw, path)))
		goto fail_nodw;
	op = "write";
	if ((rc = kv_dw_write(&st->dw, hdr, hl)))
		goto fail;
	for (int i = 0; i < nt; i++) {
		const char *src = part_ptr(s, &p[i], ck);
		for (uint64_t off = 0; off < p[i].nbytes;) {
			size_t n = p[i].nbytes - off < STAGE_CHUNK ? (size_t)(p[i].nbytes - off) : STAGE_CHUNK;
			if (deadline_ns && kv_now_ns() >= deadline_ns) {
				rc = kv_fail(KV_ERR_TIMEOUT, "%s: shutdown budget reached", path);
				goto fail;
			}
			if ((rc = kv_dw_write(&st->dw, src + off, n)))
				goto fail;
			off += n;
		}
	}
	free(hdr);
	free(ck);
	/* Start the device on it now, so the batched data sync that follows
	 * mostly waits for writes already under way while the next objects
	 * are staged. A hint, not a step: it changes nothing a crash could
	 * observe (the temp name is not visible as an object until renamed),
	 * so it is not in the I/O table. */
	(void)sync_file_range(st->dw.fd, 0, 0, SYNC_FILE_RANGE_WRITE);
	return KV_OK;
fail:
	kv_dw_abort(&st->dw);
fail_nodw:
	free(hdr);
	free(ck);
	if (rc == KV_ERR_TIMEOUT)
		return rc;
	return kv_fail_ctx(rc, "disk object %s: %s", path, op);
}

int ks_obj_stage_commit(struct ks_obj_staged *st, unsigned dw_flags)
{
	return kv_dw_commit(&st->dw, dw_flags);
}

void ks_obj_stage_abort(struct ks_obj_staged *st)
{
	kv_dw_abort(&st->dw);
}

int ks_obj_write(const char *path, const struct ke_layout *L, const struct ks_obj_src *s, unsigned dw_flags,
		 uint64_t deadline_ns, uint64_t *bytes)
{
	struct ks_obj_staged st;
	int rc;
	if (bytes)
		*bytes = 0;
	if ((rc = ks_obj_stage(path, L, s, deadline_ns, &st)))
		return rc;
	if ((rc = ks_obj_stage_commit(&st, dw_flags)))
		return rc;
	if (bytes)
		*bytes = st.bytes;
	return KV_OK;
}

int ks_obj_iov(const struct ke_layout *L, const struct ks_obj_src *s, struct iovec *iov, void **owned, uint64_t *total)
{
	struct tplan p[MAX_TENSORS];
	int nt, rc, n = 0;
	void *hdr = NULL;
	size_t hl = 0;
	int32_t *ck = NULL;
	*owned = NULL;
	*total = 0;
	if ((rc = check_src(L, s)) || (rc = header(L, s, p, &nt, &hdr, &hl, &ck, total)))
		return rc;
	/* one owned block: the header, then the entry's int32 checkpoints */
	size_t ckb = s->kind == KS_ENTRY ? (size_t)s->n_ckpt * 4 : 0;
	char *own = realloc(hdr, hl + ckb + 1);
	if (!own) {
		free(hdr);
		free(ck);
		return kv_fail(KV_ERR_NOMEM, "remote object: out of memory");
	}
	if (ckb)
		memcpy(own + hl, ck, ckb);
	free(ck);
	iov[n++] = (struct iovec){own, hl};
	for (int i = 0; i < nt; i++) {
		if (!p[i].nbytes)
			continue;
		const void *src = p[i].part == 3 ? (const void *)(own + hl) : part_ptr(s, &p[i], NULL);
		iov[n++] = (struct iovec){(void *)src, (size_t)p[i].nbytes};
	}
	*owned = own;
	return n;
}

/* --- reading ----------------------------------------------------------- */

struct ks_obj {
	char *path;
	struct kv_st *st;
	int fd;                   /* -1 for an object in memory */
	const uint8_t *mem;       /* ks_obj_open_mem: the bytes (borrowed) */
	uint64_t mem_len;
	const struct ke_layout *L;
	struct ks_obj_info info;
	struct tplan p[MAX_TENSORS];
	const struct kv_tensor *t[MAX_TENSORS];
	int nt;
};

const struct ks_obj_info *ks_obj_info(const struct ks_obj *o)
{
	return &o->info;
}

void ks_obj_close(struct ks_obj *o)
{
	if (!o)
		return;
	if (o->fd >= 0)
		kv_io_close(o->fd);
	kv_st_close(o->st);
	free(o->path);
	free(o);
}

static int parse_u32(const char *s, uint32_t *out)
{
	char *end;
	unsigned long long v;
	if (!s || !*s || *s == '-' || *s == '+' || *s == ' ')
		return -1;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || *end || v > UINT32_MAX)
		return -1;
	*out = (uint32_t)v;
	return 0;
}

static int parse_i64(const char *s, int64_t *out)
{
	char *end;
	long long v;
	if (!s || !*s || *s == ' ')
		return -1;
	errno = 0;
	v = strtoll(s, &end, 10);
	if (errno || *end)
		return -1;
	*out = v;
	return 0;
}

static int parse_h(const char *s, struct kv_h128 *out)
{
	if (!s || strlen(s) != 32)
		return -1;
	for (int i = 0; i < 32; i++)
		if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
			return -1;
	return kv_h128_parse(s, out);
}

static int parse_crc(const char *s, uint32_t *out)
{
	uint32_t v = 0;
	if (!s || strlen(s) != 8)
		return -1;
	for (int i = 0; i < 8; i++) {
		int c = s[i], d;
		if (c >= '0' && c <= '9')
			d = c - '0';
		else if (c >= 'a' && c <= 'f')
			d = c - 'a' + 10;
		else
			return -1;
		v = v << 4 | (uint32_t)d;
	}
	*out = v;
	return 0;
}

/* Upper bound of a file of this kind (step 1: fstat only). */
static uint64_t max_size(const struct ke_layout *L, int kind)
{
	uint64_t B = (uint64_t)L->page_tokens, h = 8 + KS_HEADER_MAX;
	switch (kind) {
	case KS_BLOCK:
	case KS_TAIL:
		return h + B * 4 + L->page_bytes;
	case KS_SNAP:
		return h + B * 4 + L->snapshot_bytes;
	case KS_ENTRY:
		return h + (uint64_t)KS_ENTRY_MAX_TOKENS * 4 + KS_MAX_CKPT * 4;
	default: /* any kind: the largest */
		return h + (uint64_t)KS_ENTRY_MAX_TOKENS * 4 + L->page_bytes + L->snapshot_bytes;
	}
}

#define BAD(code, errv, ...) (*bad = (code), KV_CORRUPT(path, 0, __VA_ARGS__), (errv))

/* ks_obj_open and ks_obj_open_mem: a file at path, or mem_len bytes at
 * mem (path then only names them in messages). */
static int obj_open(const char *path, const void *mem, size_t mem_len, const struct ke_layout *L, int want_kind,
		    const struct kv_h128 *ns, struct ks_obj **out, int *bad)
{
	struct ks_obj *o;
	struct stat sb;
	int rc, fd = -1;
	int dummy;
	if (!bad)
		bad = &dummy;
	*bad = KS_BAD_NONE;
	*out = NULL;

	/* 1 size */
	if (mem) {
		memset(&sb, 0, sizeof sb);
		sb.st_mode = S_IFREG;
		sb.st_size = (off_t)mem_len;
		goto sized;
	}
	fd = kv_io_open(path, O_RDONLY | O_CLOEXEC, 0);
	if (fd < 0) {
		int e = errno;
		*bad = KS_BAD_IO;
		return kv_fail(kv_io_errno_code(e), "%s: %s", path, strerror(e));
	}
	if (kv_io_fstat(fd, &sb) != 0) {
		int e = errno;
		kv_io_close(fd);
		*bad = KS_BAD_IO;
		return kv_fail(kv_io_errno_code(e), "%s: stat: %s", path, strerror(e));
	}
sized:
	if (!S_ISREG(sb.st_mode) || (uint64_t)sb.st_size < 10 || (uint64_t)sb.st_size > max_size(L, want_kind)) {
		if (fd >= 0)
			kv_io_close(fd);
		*bad = KS_BAD_SIZE;
		return KV_CORRUPT(path, 0, "file of %lld bytes cannot be a %s object", (long long)sb.st_size,
				  want_kind ? ks_kind_name(want_kind) : "disk");
	}
	o = calloc(1, sizeof *o);
	if (!o || !(o->path = strdup(path))) {
		free(o);
		if (fd >= 0)
			kv_io_close(fd);
		return kv_fail(KV_ERR_NOMEM, "%s: out of memory", path);
	}
	o->fd = fd;
	o->mem = mem;
	o->mem_len = mem_len;
	o->L = L;
	o->info.file_size = (uint64_t)sb.st_size;

	/* 2 header: the safetensors rules, then ours */
	rc = mem ? kv_st_open_mem(mem, mem_len, path, &o->st) : kv_st_open(path, &o->st);
	if (rc) {
		*bad = rc == KV_ERR_CORRUPT ? KS_BAD_HEADER : KS_BAD_IO;
		goto fail;
	}
	struct kv_st *st = o->st;
	struct ks_obj_info *in = &o->info;
	const char *fmt = kv_st_meta(st, "format"), *kind = kv_st_meta(st, "kind");
	if (!fmt || strcmp(fmt, KS_MAGIC)) {
		rc = BAD(KS_BAD_HEADER, KV_ERR_CORRUPT, "not a kvkeep disk object (format '%.40s')", fmt ? fmt : "");
		goto fail;
	}
	if (kv_st_header_len(st) > KS_HEADER_MAX) {
		rc = BAD(KS_BAD_HEADER, KV_ERR_CORRUPT, "header of %llu bytes is over %u",
			 (unsigned long long)kv_st_header_len(st), KS_HEADER_MAX);
		goto fail;
	}
	in->kind = 0;
	for (int k = 1; k < KS_KIND__END && kind; k++)
		if (!strcmp(kind, kind_names[k]))
			in->kind = k;
	if (!in->kind || (want_kind && in->kind != want_kind)) {
		rc = BAD(KS_BAD_HEADER, KV_ERR_CORRUPT, "kind '%.20s' where a %s was expected", kind ? kind : "",
			 want_kind ? ks_kind_name(want_kind) : "known kind");
		goto fail;
	}

	/* 3 version: another version is not ours to read (not corrupt) */
	uint32_t ver;
	if (parse_u32(kv_st_meta(st, "version"), &ver)) {
		rc = BAD(KS_BAD_HEADER, KV_ERR_CORRUPT, "version is not a number");
		goto fail;
	}
	if (ver != KS_VERSION) {
		*bad = KS_BAD_VERSION;
		rc = kv_fail(KV_ERR_VERSION, "%s: format version %u, this build reads %d", path, ver, KS_VERSION);
		goto fail;
	}

	/* 4 namespace: another namespace is a miss, never a corruption */
	if (parse_h(kv_st_meta(st, "namespace"), &in->ns)) {
		rc = BAD(KS_BAD_HEADER, KV_ERR_CORRUPT, "namespace is not 32 hex digits");
		goto fail;
	}
	if (ns && !kv_h128_eq(*ns, in->ns)) {
		*bad = KS_BAD_NS;
		rc = kv_fail(KV_ERR_NOT_OURS, "%s: another namespace", path);
		goto fail;
	}

	/* 5 metadata checksum */
	{
		size_t nm = kv_st_meta_count(st), k = 0;
		char *keys[32], *vals[32];
		uint32_t want;
		const char *mc = NULL;
		if (nm > 32) {
			rc = BAD(KS_BAD_HEADER, KV_ERR_CORRUPT, "%zu metadata keys", nm);
			goto fail;
		}
		for (size_t i = 0; i < nm; i++) {
			const char *kk, *vv;
			kv_st_meta_at(st, i, &kk, &vv);
			if (!strcmp(kk, "meta_crc32c")) {
				mc = vv;
				continue;
			}
			keys[k] = (char *)kk;
			vals[k] = (char *)vv;
			k++;
		}
		if (parse_crc(mc, &want) || meta_crc(keys, vals, k) != want) {
			rc = BAD(KS_BAD_CRC, KV_ERR_CORRUPT, "metadata checksum mismatch");
			goto fail;
		}
	}
	uint32_t B;
	if (parse_h(kv_st_meta(st, "id"), &in->id) || parse_h(kv_st_meta(st, "parent"), &in->parent) ||
	    parse_h(kv_st_meta(st, "tokens_xxh3"), &in->tokens_hash) || parse_u32(kv_st_meta(st, "pos"), &in->pos) ||
	    parse_u32(kv_st_meta(st, "n_tokens"), &in->n_tokens) || parse_u32(kv_st_meta(st, "page_tokens"), &B) ||
	    parse_i64(kv_st_meta(st, "created"), &in->created) || parse_crc(kv_st_meta(st, "crc32c"), &in->crc)) {
		rc = BAD(KS_BAD_HEADER, KV_ERR_CORRUPT, "a metadata field is missing or malformed");
		goto fail;
	}
	if (in->kind == KS_SNAP || in->kind == KS_ENTRY) {
		uint32_t a;
		if (parse_u32(kv_st_meta(st, "anchor"), &a)) {
			rc = BAD(KS_BAD_HEADER, KV_ERR_CORRUPT, "anchor is missing or malformed");
			goto fail;
		}
		if (in->kind == KS_SNAP)
			in->anchor_flag = a != 0;
		else
			in->anchor = a;
	}
	if (B != (uint32_t)L->page_tokens) {
		rc = BAD(KS_BAD_ARITH, KV_ERR_CORRUPT, "written with %u tokens per block, layout has %d", B,
			 L->page_tokens);
		goto fail;
	}

	/* 6 size arithmetic: every tensor's bytes from the layout, tiling the
	 * data section in order */
	{
		uint32_t n_ck = 0;
		if (in->kind == KS_ENTRY) {
			const struct kv_tensor *ct = kv_st_find(st, "checkpoints");
			if (!ct || ct->numel > KS_MAX_CKPT) {
				rc = BAD(KS_BAD_ARITH, KV_ERR_CORRUPT, "checkpoints tensor missing or too long");
				goto fail;
			}
			n_ck = (uint32_t)ct->numel;
		}
		uint64_t lim = in->kind == KS_ENTRY ? KS_ENTRY_MAX_TOKENS : (uint64_t)L->page_tokens;
		if (in->n_tokens > lim) {
			rc = BAD(KS_BAD_ARITH, KV_ERR_CORRUPT, "%u tokens, at most %llu for a %s", in->n_tokens,
				 (unsigned long long)lim, ks_kind_name(in->kind));
			goto fail;
		}
		in->n_ckpt = n_ck;
		o->nt = plan(L, in->kind, in->n_tokens, n_ck, o->p);
		in->data_off = 8 + kv_st_header_len(st);
		in->data_bytes = in->file_size - in->data_off;
		uint64_t off = in->data_off;
		if (kv_st_count(st) != (size_t)o->nt) {
			rc = BAD(KS_BAD_ARITH, KV_ERR_CORRUPT, "%zu tensors, a %s of this layout has %d", kv_st_count(st),
				 ks_kind_name(in->kind), o->nt);
			goto fail;
		}
		for (int i = 0; i < o->nt; i++) {
			const struct kv_tensor *t = kv_st_find(st, o->p[i].name);
			if (!t || t->nbytes != o->p[i].nbytes || (t->nbytes && t->offset != off)) {
				rc = BAD(KS_BAD_ARITH, KV_ERR_CORRUPT,
					 "tensor '%s' missing, of the wrong size or out of place (want %llu bytes at %llu)",
					 o->p[i].name, (unsigned long long)o->p[i].nbytes, (unsigned long long)off);
				goto fail;
			}
			o->t[i] = t;
			off += t->nbytes;
		}
		if (off != in->file_size) {
			rc = BAD(KS_BAD_ARITH, KV_ERR_CORRUPT, "data section is %llu bytes, tensors need %llu",
				 (unsigned long long)in->data_bytes, (unsigned long long)(off - in->data_off));
			goto fail;
		}
	}
	*out = o;
	return KV_OK;
fail:
	ks_obj_close(o);
	return rc;
}

int ks_obj_open(const char *path, const struct ke_layout *L, int want_kind, const struct kv_h128 *ns,
		struct ks_obj **out, int *bad)
{
	return obj_open(path, NULL, 0, L, want_kind, ns, out, bad);
}

int ks_obj_open_mem(const void *buf, size_t len, const char *what, const struct ke_layout *L, int want_kind,
		    const struct kv_h128 *ns, struct ks_obj **out, int *bad)
{
	int dummy;
	if (!buf) {
		*out = NULL;
		*(bad ? bad : &dummy) = KS_BAD_SIZE;
		return KV_CORRUPT(what, 0, "no bytes");
	}
	return obj_open(what, buf, len, L, want_kind, ns, out, bad);
}

/* Bytes [off, off + len) of the object into dst. */
static int obj_pread(const struct ks_obj *o, void *dst, size_t len, uint64_t off)
{
	if (!o->mem)
		return kv_io_pread_full(o->fd, dst, len, off, o->path);
	if (off > o->mem_len || len > o->mem_len - off)
		return KV_CORRUPT(o->path, off, "%zu bytes past the end of a %llu-byte object", len,
				  (unsigned long long)o->mem_len);
	memcpy(dst, o->mem + off, len);
	return KV_OK;
}

static void *part_dst(const struct ks_obj_dst *d, const struct tplan *t)
{
	switch (t->part) {
	case 0:
		return d->tokens;
	case 1:
		return d->kv ? (char *)d->kv + t->mem_off : NULL;
	case 2:
		return d->snap ? (char *)d->snap + t->mem_off : NULL;
	default:
		return d->ckpt; /* int32 on disk, uint32 in memory: same bytes, checked below */
	}
}

int ks_obj_read(struct ks_obj *o, const struct ks_obj_dst *d, int *bad)
{
	const struct ke_layout *L = o->L;
	const struct ks_obj_info *in = &o->info;
	const char *path = o->path;
	uint32_t crc = 0, B = (uint32_t)L->page_tokens;
	int32_t *tok = d->tokens;
	uint32_t *ck = d->ckpt;
	uint8_t *scratch = NULL;
	size_t scratch_cap = 0;
	int rc = KV_OK, dummy;
	if (!bad)
		bad = &dummy;
	*bad = KS_BAD_NONE;

	/* tokens and checkpoints are needed for the checks: read them into
	 * our own buffers when the caller does not want them */
	if (!tok && in->n_tokens && !(tok = malloc((size_t)in->n_tokens * 4)))
		return kv_fail(KV_ERR_NOMEM, "%s: out of memory", path);
	if (!ck && in->n_ckpt && !(ck = malloc((size_t)in->n_ckpt * 4))) {
		if (tok != d->tokens)
			free(tok);
		return kv_fail(KV_ERR_NOMEM, "%s: out of memory", path);
	}
	struct ks_obj_dst dd = *d;
	dd.tokens = tok;
	dd.ckpt = ck;

	/* 7 crc: read in file order, merging tensors that are adjacent both
	 * on disk and in memory into one pread */
	for (int i = 0; i < o->nt && !rc;) {
		uint64_t off = o->t[i]->offset, len = o->p[i].nbytes;
		uint8_t *dst = part_dst(&dd, &o->p[i]);
		int j = i + 1;
		while (j < o->nt && dst && o->p[j].part == o->p[i].part && part_dst(&dd, &o->p[j]) == (void *)(dst + len)) {
			len += o->p[j].nbytes;
			j++;
		}
		if (!len) {
			i = j;
			continue;
		}
		if (dst) {
			rc = obj_pread(o, dst, (size_t)len, off);
			if (!rc)
				crc = kv_crc32c(crc, dst, (size_t)len);
		} else {
			/* checked only: stream through a scratch buffer */
			if (!scratch) {
				scratch_cap = 1u << 20;
				scratch = malloc(scratch_cap);
				if (!scratch) {
					rc = kv_fail(KV_ERR_NOMEM, "%s: out of memory", path);
					break;
				}
			}
			for (uint64_t k = 0; k < len && !rc; k += scratch_cap) {
				size_t n = (size_t)(len - k < scratch_cap ? len - k : scratch_cap);
				rc = obj_pread(o, scratch, n, off + k);
				if (!rc)
					crc = kv_crc32c(crc, scratch, n);
			}
		}
		if (rc)
			*bad = rc == KV_ERR_CORRUPT ? KS_BAD_SIZE : KS_BAD_IO; /* shrank under us */
		i = j;
	}
	free(scratch);
	if (rc)
		goto out;
	if (crc != in->crc) {
		rc = BAD(KS_BAD_CRC, KV_ERR_CORRUPT, "data checksum %08x, header says %08x", crc, in->crc);
		goto out;
	}

	/* 8 tokens: their hash, the object's name recomputed, the caller's */
	struct kv_h128 th = kv_xxh3_128(tok ? (const void *)tok : "", (size_t)in->n_tokens * 4, 0);
	if (!kv_h128_eq(th, in->tokens_hash)) {
		rc = BAD(KS_BAD_TOKENS, KV_ERR_CORRUPT, "tokens do not match tokens_xxh3");
		goto out;
	}
	{
		struct kv_h128 id;
		if (in->kind == KS_BLOCK) {
			id = kc_chain_hash(in->parent, tok, in->n_tokens);
		} else if (in->kind == KS_ENTRY) {
			/* the chain from the namespace through every full block must
			 * end at "parent", and the end's name is the id */
			struct kv_h128 h = in->ns;
			uint32_t nb = in->n_tokens / B;
			for (uint32_t b = 0; b < nb; b++)
				h = kc_chain_hash(h, tok + (size_t)b * B, B);
			if (!kv_h128_eq(h, in->parent)) {
				rc = BAD(KS_BAD_TOKENS, KV_ERR_CORRUPT, "entry tokens do not chain to its parent");
				goto out;
			}
			id = kc_rp_id(h, tok + (size_t)nb * B, in->n_tokens % B);
		} else {
			id = kc_rp_id(in->parent, tok, in->n_tokens);
		}
		if (!kv_h128_eq(id, in->id)) {
			rc = BAD(KS_BAD_TOKENS, KV_ERR_CORRUPT, "tokens and parent do not hash to the object's id");
			goto out;
		}
	}
	if (d->expect && in->n_tokens && memcmp(d->expect, tok, (size_t)in->n_tokens * 4)) {
		rc = BAD(KS_BAD_TOKENS, KV_ERR_CORRUPT, "tokens differ from the prompt's");
		goto out;
	}

	/* 9 shapes and dtypes against the layout; KV objects name their KV
	 * dtype (files written before the key existed carry F32 or BF16 in
	 * the tensors themselves, checked below; a U8-coded dtype such as
	 * Q8_0 must be named) */
	if (in->kind == KS_BLOCK || in->kind == KS_TAIL || (in->kind == KS_SNAP && L->n_win_layers)) {
		const char *kd = kv_st_meta(o->st, "kv_dtype"), *want = kv_dtype_name(L->kv_dtype);
		if (kd ? !want || strcmp(kd, want) : !kv_dtype_size(L->kv_dtype)) {
			rc = BAD(KS_BAD_SHAPE, KV_ERR_CORRUPT, "KV dtype '%.16s', the layout's is %s", kd ? kd : "(none)",
				 want ? want : "?");
			goto out;
		}
	}
	for (int i = 0; i < o->nt; i++) {
		const struct kv_tensor *t = o->t[i];
		const struct tplan *p = &o->p[i];
		int ok = t->dtype == p->dtype && t->ndim == p->ndim;
		for (int k = 0; ok && k < p->ndim; k++)
			ok = t->shape[k] == p->shape[k];
		if (!ok) {
			char a[64], b[64];
			rc = BAD(KS_BAD_SHAPE, KV_ERR_CORRUPT, "tensor '%s' is %s %s, the layout wants %s %s", p->name,
				 kv_dtype_name(t->dtype), kv_shape_str(t->ndim, t->shape, a, sizeof a),
				 kv_dtype_name(p->dtype), kv_shape_str(p->ndim, p->shape, b, sizeof b));
			goto out;
		}
	}

	/* 10 positions */
	switch (in->kind) {
	case KS_BLOCK:
		if (!in->pos || in->pos % B || in->n_tokens != B)
			rc = BAD(KS_BAD_POS, KV_ERR_CORRUPT, "block ends at %u, not a positive multiple of %u", in->pos, B);
		break;
	case KS_TAIL:
	case KS_SNAP:
		if (!in->pos || in->pos % B != in->n_tokens || (in->kind == KS_TAIL && !in->n_tokens))
			rc = BAD(KS_BAD_POS, KV_ERR_CORRUPT, "%s at %u with %u tail tokens", ks_kind_name(in->kind),
				 in->pos, in->n_tokens);
		break;
	case KS_ENTRY: {
		int anchor_ok = in->anchor == 0 || in->anchor == in->n_tokens;
		if (in->pos != in->n_tokens || !in->n_tokens) {
			rc = BAD(KS_BAD_POS, KV_ERR_CORRUPT, "entry length %u with %u tokens", in->pos, in->n_tokens);
			break;
		}
		for (uint32_t i = 0; i < in->n_ckpt; i++) {
			if ((int32_t)ck[i] <= 0 || ck[i] >= in->n_tokens || (i && ck[i] <= ck[i - 1])) {
				rc = BAD(KS_BAD_POS, KV_ERR_CORRUPT, "checkpoint %u at %d is not ascending inside (0, %u)", i,
					 (int32_t)ck[i], in->n_tokens);
				break;
			}
			if (ck[i] == in->anchor)
				anchor_ok = 1;
		}
		if (!rc && !anchor_ok)
			rc = BAD(KS_BAD_POS, KV_ERR_CORRUPT, "anchor %u is neither the end nor a checkpoint", in->anchor);
		break;
	}
	}
	if (rc)
		goto out;

	/* 11 every recurrent layer covered */
	if (in->kind == KS_SNAP) {
		for (int r = 0; r < L->n_rec_layers && !rc; r++) {
			int have = 0;
			for (int i = 0; i < o->nt; i++)
				if (o->p[i].rec == r && kv_st_find(o->st, o->p[i].name))
					have++;
			if (have != (L->rec[r].conv_bytes ? 2 : 1))
				rc = BAD(KS_BAD_COVER, KV_ERR_CORRUPT, "recurrent layer %d is not covered", L->rec[r].layer);
		}
		for (int w = 0; w < L->n_win_layers && !rc; w++) {
			int have = 0;
			for (int i = 0; i < o->nt; i++)
				if (o->p[i].rec == L->n_rec_layers + w && kv_st_find(o->st, o->p[i].name))
					have++;
			if (have != 2)
				rc = BAD(KS_BAD_COVER, KV_ERR_CORRUPT, "sliding-window layer %d is not covered", L->win[w].layer);
		}
	}
out:
	if (tok != d->tokens)
		free(tok);
	if (ck != d->ckpt)
		free(ck);
	return rc;
}

int ks_obj_verify(const char *path, const struct ke_layout *L, int want_kind, const struct kv_h128 *ns,
		  struct ks_obj_info *info, int *bad)
{
	struct ks_obj *o;
	int rc = ks_obj_open(path, L, want_kind, ns, &o, bad);
	if (rc)
		return rc;
	if (info)
		*info = o->info;
	struct ks_obj_dst d = {0};
	rc = ks_obj_read(o, &d, bad);
	ks_obj_close(o);
	return rc;
}

void ks_obj_drop_cache(const char *path)
{
	int fd = kv_io_open(path, O_RDONLY | O_CLOEXEC, 0);
	if (fd < 0)
		return;
	(void)posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
	kv_io_close(fd);
}
