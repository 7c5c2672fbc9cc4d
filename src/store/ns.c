/*
 * ns.c - see ns.h.
 */
#include "store/ns.h"
#include "base/corrupt.h"
#include "base/durable.h"
#include "base/err.h"
#include "base/io.h"
#include "model/safetensors.h"
#include "store/dir.h"
#include "store/obj.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <time.h>

struct kv_h128 ks_ns_derive(struct kv_h128 fp, const char *salt)
{
	uint8_t b[10 + 16 + 1];
	memcpy(b, "kvkeep-ns|", 10);
	for (int i = 0; i < 8; i++) {
		b[10 + i] = (uint8_t)(fp.lo >> (8 * i));
		b[18 + i] = (uint8_t)(fp.hi >> (8 * i));
	}
	b[26] = '|';
	return kv_xxh3_128_cat(b, sizeof b, salt ? salt : "", salt ? strlen(salt) : 0);
}

int ks_ns_layout_str(const struct ke_layout *L, char *out, size_t cap)
{
	size_t n;
	int k = snprintf(out, cap, "v1 B=%d dt=%s attn=%d kvh=%d hd=%d", L->page_tokens,
			 kv_dtype_name(L->kv_dtype) ? kv_dtype_name(L->kv_dtype) : "?", L->n_attn_layers, L->n_kv_heads,
			 L->head_dim);
	if (k < 0 || (size_t)k >= cap)
		return kv_fail(KV_ERR_INVALID, "layout text does not fit");
	n = (size_t)k;
	for (int i = 0; i < L->n_rec_layers; i++) {
		const struct ke_rec_layer *r = &L->rec[i];
		k = snprintf(out + n, cap - n, " rec=%d:%zu:%d:%d:%zu:%d:%d:%d", r->layer, r->conv_off, r->conv_dims[0],
			     r->conv_dims[1], r->state_off, r->state_dims[0], r->state_dims[1], r->state_dims[2]);
		if (k < 0 || (size_t)k >= cap - n)
			return kv_fail(KV_ERR_INVALID, "layout text does not fit");
		n += (size_t)k;
	}
	/* sliding layers: layer:rows:k_off:v_off (after every rec=) */
	for (int i = 0; i < L->n_win_layers; i++) {
		const struct ke_win_layer *w = &L->win[i];
		if (w->kv_heads == L->n_kv_heads && w->head_dim == L->head_dim)
			k = snprintf(out + n, cap - n, " win=%d:%d:%zu:%zu", w->layer, w->rows, w->k_off, w->v_off);
		else /* a geometry of its own (gemma4): :kv_heads:head_dim */
			k = snprintf(out + n, cap - n, " win=%d:%d:%zu:%zu:%d:%d", w->layer, w->rows, w->k_off,
				     w->v_off, w->kv_heads, w->head_dim);
		if (k < 0 || (size_t)k >= cap - n)
			return kv_fail(KV_ERR_INVALID, "layout text does not fit");
		n += (size_t)k;
	}
	return KV_OK;
}

/* A decimal in [lo, hi] followed by one of `ends` (or NUL). */
static int num(const char **p, long long lo, long long hi, const char *ends, long long *v)
{
	char *e;
	if (**p < '0' || **p > '9')
		return -1;
	errno = 0;
	*v = strtoll(*p, &e, 10);
	if (errno || *v < lo || *v > hi || (*e && !strchr(ends, *e)))
		return -1;
	*p = e;
	return 0;
}

static int lit(const char **p, const char *s)
{
	size_t n = strlen(s);
	if (strncmp(*p, s, n))
		return -1;
	*p += n;
	return 0;
}

int ks_ns_layout_parse(const char *s, struct ke_layout *L)
{
	const char *p = s;
	long long B, attn, kvh, hd, v[8];
	char dt[8];
	size_t i = 0;
	memset(L, 0, sizeof *L);
	if (lit(&p, "v1 B=") || num(&p, 1, 1 << 20, " ", &B) || lit(&p, " dt="))
		goto bad;
	while (*p && *p != ' ' && i < sizeof dt - 1)
		dt[i++] = *p++;
	dt[i] = 0;
	/* Q8_0 is not a safetensors dtype: kv_dtype_parse does not take it */
	L->kv_dtype = !strcmp(dt, "Q8_0") ? KV_DT_Q8_0 : kv_dtype_parse(dt);
	if ((L->kv_dtype != KV_DT_BF16 && L->kv_dtype != KV_DT_F32 && L->kv_dtype != KV_DT_F16 &&
	     L->kv_dtype != KV_DT_Q8_0) ||
	    lit(&p, " attn=") ||
	    num(&p, 0, KV_MAX_LAYERS, " ", &attn) || lit(&p, " kvh=") || num(&p, 1, 4096, " ", &kvh) ||
	    lit(&p, " hd=") || num(&p, 1, 65536, " ", &hd))
		goto bad;
	L->page_tokens = (int)B;
	L->n_attn_layers = (int)attn;
	L->n_kv_heads = (int)kvh;
	L->head_dim = (int)hd;
	L->n_segments = L->n_attn_layers * 2 * L->n_kv_heads;
	L->row_bytes = ke_layout_row_bytes(L->kv_dtype, (int)hd);
	if (!L->row_bytes)
		goto bad; /* Q8_0 with head_dim not a multiple of 32 */
	L->page_bytes = (size_t)L->n_segments * (size_t)B * L->row_bytes;
	L->kv_bytes_per_token = (size_t)L->n_segments * L->row_bytes;
	if (L->page_bytes > (1ull << 32))
		goto bad;
	size_t off = 0;
	while (*p && strncmp(p, " win=", 5)) {
		if (L->n_rec_layers >= KV_MAX_LAYERS || lit(&p, " rec="))
			goto bad;
		for (int k = 0; k < 8; k++)
			if (num(&p, 0, k == 1 || k == 4 ? (1ll << 40) : (1ll << 20), k < 7 ? ":" : " ", &v[k]) ||
			    (k < 7 && lit(&p, ":")))
				goto bad;
		struct ke_rec_layer *r = &L->rec[L->n_rec_layers++];
		r->layer = (int)v[0];
		r->conv_off = (size_t)v[1];
		r->conv_dims[0] = (int)v[2];
		r->conv_dims[1] = (int)v[3];
		r->conv_bytes = (size_t)v[2] * (size_t)v[3] * 4;
		r->state_off = (size_t)v[4];
		r->state_dims[0] = (int)v[5];
		r->state_dims[1] = (int)v[6];
		r->state_dims[2] = (int)v[7];
		r->state_bytes = (size_t)v[5] * (size_t)v[6] * (size_t)v[7] * 4;
		/* arrays must sit one after another, as layout.h says */
		if (r->conv_off != off || r->state_off != off + r->conv_bytes || r->state_bytes > (1ull << 34))
			goto bad;
		off = r->state_off + r->state_bytes;
	}
	L->rec_bytes = off;
	while (*p) {
		if (L->n_win_layers >= KV_MAX_LAYERS || lit(&p, " win="))
			goto bad;
		for (int k = 0; k < 4; k++)
			if (num(&p, 0, k < 2 ? (1ll << 20) : (1ll << 40), k < 3 ? ":" : ": ", &v[k]) || (k < 3 && lit(&p, ":")))
				goto bad;
		v[4] = L->n_kv_heads;
		v[5] = L->head_dim;
		if (*p == ':' && (lit(&p, ":") || num(&p, 1, 4096, ":", &v[4]) || lit(&p, ":") ||
				  num(&p, 1, 65536, " ", &v[5])))
			goto bad;
		struct ke_win_layer *w = &L->win[L->n_win_layers];
		w->layer = (int)v[0];
		w->idx = L->n_win_layers++;
		w->rows = (int)v[1];
		w->kv_heads = (int)v[4];
		w->head_dim = (int)v[5];
		w->row_bytes = ke_layout_row_bytes(L->kv_dtype, w->head_dim);
		if (!w->row_bytes)
			goto bad;
		size_t half = (size_t)w->kv_heads * (size_t)w->rows * w->row_bytes;
		w->k_off = (size_t)v[2];
		w->v_off = (size_t)v[3];
		w->bytes = 2 * half;
		/* K then V, one layer after another, as layout.h says */
		if (w->rows < 1 || w->k_off != off || w->v_off != off + half || half > (1ull << 34))
			goto bad;
		off += w->bytes;
		L->window = w->rows + 1;
	}
	L->snapshot_bytes = off;
	return KV_OK;
bad:
	return kv_fail(KV_ERR_CORRUPT, "malformed layout text near '%.24s'", p);
}

int ks_ns_mark(const char *ns_dir, struct kv_h128 ns, const char *label, int salted, const struct ke_layout *L)
{
	char path[4096], hex[33], lay[8192], created[24];
	struct kv_stw *w;
	int rc;
	if ((rc = ks_dir_ensure(ns_dir)))
		return rc;
	if ((rc = ks_ns_layout_str(L, lay, sizeof lay)))
		return rc;
	w = kv_stw_create();
	if (!w)
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	kv_h128_hex(ns, hex);
	snprintf(created, sizeof created, "%" PRId64, (int64_t)time(NULL));
	snprintf(path, sizeof path, "%s/%s", ns_dir, KS_NS_FILE);
	if (!(rc = kv_stw_meta(w, "format", KS_MAGIC)) && !(rc = kv_stw_meta(w, "version", "1")) &&
	    !(rc = kv_stw_meta(w, "kind", "namespace")) && !(rc = kv_stw_meta(w, "namespace", hex)) &&
	    !(rc = kv_stw_meta(w, "label", label ? label : "")) && !(rc = kv_stw_meta(w, "salted", salted ? "1" : "0")) &&
	    !(rc = kv_stw_meta(w, "layout", lay)) && !(rc = kv_stw_meta(w, "created", created)))
		rc = kv_stw_write(w, path, 0);
	kv_stw_destroy(w);
	return rc;
}

int ks_ns_read(const char *ns_dir, struct ks_ns_info *out)
{
	char path[4096];
	struct kv_st *st;
	struct stat sb;
	int rc;
	memset(out, 0, sizeof *out);
	snprintf(path, sizeof path, "%s/%s", ns_dir, KS_NS_FILE);
	if (stat(path, &sb) != 0)
		return kv_fail(kv_io_errno_code(errno), "%s: %s", path, strerror(errno));
	out->mtime = (int64_t)sb.st_mtime;
	if (sb.st_size > (off_t)(KS_HEADER_MAX + 8))
		return KV_CORRUPT(path, 0, "namespace marker of %lld bytes", (long long)sb.st_size);
	if ((rc = kv_st_open(path, &st)))
		return rc;
	const char *f = kv_st_meta(st, "format"), *k = kv_st_meta(st, "kind"), *n = kv_st_meta(st, "namespace");
	const char *l = kv_st_meta(st, "label"), *s = kv_st_meta(st, "salted"), *lay = kv_st_meta(st, "layout");
	const char *c = kv_st_meta(st, "created");
	if (!f || strcmp(f, KS_MAGIC) || !k || strcmp(k, "namespace") || !n || strlen(n) != 32 ||
	    kv_h128_parse(n, &out->ns)) {
		kv_st_close(st);
		return KV_CORRUPT(path, 0, "not a namespace marker");
	}
	snprintf(out->label, sizeof out->label, "%s", l ? l : "");
	out->salted = s && !strcmp(s, "1");
	out->created = c ? strtoll(c, NULL, 10) : 0;
	rc = KV_OK;
	if (lay) {
		if (ks_ns_layout_parse(lay, &out->layout) == KV_OK)
			out->has_layout = 1;
		else
			rc = KV_CORRUPT(path, 0, "namespace marker: %s", kv_errmsg());
	}
	kv_st_close(st);
	return rc;
}

/* flock(2) is not a disk step (nothing on disk changes), so it is called
 * directly rather than through the io table. */
int ks_ns_lock(const char *ns_dir, double wait_s, int *fd, long *holder_pid)
{
	char path[4096];
	int waited_ms = 0;
	*fd = -1;
	*holder_pid = 0;
	snprintf(path, sizeof path, "%s/%s", ns_dir, KS_NS_LOCK_FILE);
	for (;;) {
		int f = kv_io_open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
		if (f < 0)
			return kv_fail(kv_io_errno_code(errno), "%s: %s", path, strerror(errno));
		if (flock(f, LOCK_EX | LOCK_NB) == 0) {
			/* an age-out may have unlinked the file while we waited */
			struct stat a, b;
			if (kv_io_fstat(f, &a) == 0 && stat(path, &b) == 0 && a.st_ino == b.st_ino && a.st_dev == b.st_dev) {
				char pid[32];
				int n = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
				/* the pid is for messages only: a full disk may refuse it */
				if (kv_io_ftruncate(f, 0) == 0)
					(void)kv_io_pwrite(f, pid, (size_t)n, 0);
				*fd = f;
				return KV_OK;
			}
			kv_io_close(f);
			int rc = ks_dir_ensure(ns_dir);
			if (rc)
				return rc;
			continue;
		}
		int e = errno;
		if (e != EWOULDBLOCK) {
			kv_io_close(f);
			return kv_fail(KV_ERR_IO, "%s: flock: %s", path, strerror(e));
		}
		if (waited_ms >= wait_s * 1000) {
			char buf[32] = {0};
			if (kv_io_pread(f, buf, sizeof buf - 1, 0) > 0)
				*holder_pid = strtol(buf, NULL, 10);
			kv_io_close(f);
			return kv_fail(KV_ERR_NOT_OURS, "the namespace folder %s is in use by another kvkeep server (pid %ld)",
				       ns_dir, *holder_pid);
		}
		kv_io_close(f);
		usleep(20 * 1000);
		waited_ms += 20;
	}
}

int ks_ns_lock_for_removal(const char *ns_dir, int *fd)
{
	char path[4096];
	*fd = -1;
	snprintf(path, sizeof path, "%s/%s", ns_dir, KS_NS_LOCK_FILE);
	int f = kv_io_open(path, O_RDONLY | O_CLOEXEC, 0);
	if (f < 0)
		return 0; /* no lock file: a server of an older version, or none */
	if (flock(f, LOCK_EX | LOCK_NB) != 0) {
		kv_io_close(f);
		return 1;
	}
	*fd = f;
	return 0;
}
