/*
 * echo.c - the namespace's remembered answers (cache/echo.h) on disk, so
 * an answer a client sends back after a restart still renders as it was
 * generated (store_int.h: the writer saves them, the scan loads them).
 *
 * One file per record in the namespace's "echo/" folder, named
 * "<32 hex>.echo.safetensors" (the hash of its key and reasoning), a
 * plain safetensors file like every disk object (obj.h):
 *   __metadata__ (strings)
 *     "format"        "kvkeep-disk"
 *     "version"       "1"
 *     "kind"          "echo"
 *     "namespace"     32 hex        the namespace (never another's)
 *     "id"            32 hex        the file's name
 *     "created"       unix seconds
 *     "n_tokens"      decimal       length of "tokens"
 *     "key_len", "reasoning_len", "text_len"  decimal: how "bytes" splits
 *     "crc32c"        8 hex         CRC32C of the data section
 *     "meta_crc32c"   8 hex         CRC32C of the other pairs as
 *                                   "key=value\n", keys sorted
 *   "tokens"  I32 [n_tokens]        the exact tokens
 *   "bytes"   U8 [key + reasoning + text]
 * Validation on load, cheapest first: size, safetensors rules, format,
 * kind, version, namespace (another is left alone), metadata checksum,
 * tensor shapes against the lengths, data checksum, the id recomputed,
 * the key's magic, token ids inside the vocabulary, text valid UTF-8. A
 * file that fails goes to quarantine, never into the store.
 *
 * The folder is kept to the store's budget in bytes (records beyond what
 * RAM holds would be evicted on load anyway), oldest files out first.
 * Loading reads the files oldest first, so the newest stay in the LRU.
 */
#include "store/store_int.h"
#include "base/clock.h"
#include "base/durable.h"
#include "base/err.h"
#include "base/hash.h"
#include "base/io.h"
#include "base/log.h"
#include "base/utf8.h"
#include "cache/echo.h"
#include "model/safetensors.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>

#define ECHO_DIR "echo"
#define ECHO_SUFFIX ".echo.safetensors"
#define ECHO_KEY_MAGIC "kvkeep-echo-1|"
#define ECHO_BATCH 64

static struct kv_h128 rec_id(const struct kc_echo_rec *r)
{
	return kv_xxh3_128_cat(r->key, r->key_len, r->reasoning, r->reasoning_len);
}

static int echo_dir(const struct ks_store *s, char *out, size_t cap)
{
	return kv_path_fmt(out, cap, "%s/%s", s->dir[KS_AREA_MAIN], ECHO_DIR);
}

/* The metadata pairs in sorted key order ("key=value\n" each): the
 * checksum's input. */
static uint32_t meta_crc(const char *const *k, char (*v)[40], size_t n)
{
	uint32_t c = 0;
	for (size_t i = 0; i < n; i++) {
		c = kv_crc32c(c, k[i], strlen(k[i]));
		c = kv_crc32c(c, "=", 1);
		c = kv_crc32c(c, v[i], strlen(v[i]));
		c = kv_crc32c(c, "\n", 1);
	}
	return c;
}

/* Metadata keys, sorted (the order meta_crc walks). */
static const char *const META[] = {"created", "crc32c", "format", "id", "key_len", "kind", "n_tokens",
				   "namespace", "reasoning_len", "text_len", "version"};
#define N_META (sizeof META / sizeof *META)

static int write_one(struct ks_store *s, const char *dir, const struct kc_echo_rec *r)
{
	char vals[N_META][40], idx[33], nsx[33], path[4200];
	struct kv_h128 id = rec_id(r);
	size_t nb = r->key_len + r->reasoning_len + r->text_len, nt = (size_t)r->n_tokens * sizeof(int32_t);
	kv_h128_hex(id, idx);
	kv_h128_hex(s->p.ns, nsx);
	uint32_t dc = kv_crc32c(kv_crc32c(0, r->tokens, nt), r->key, r->key_len);
	dc = kv_crc32c(kv_crc32c(dc, r->reasoning, r->reasoning_len), r->text, r->text_len);
	snprintf(vals[0], 40, "%lld", (long long)time(NULL));
	snprintf(vals[1], 40, "%08x", dc);
	snprintf(vals[2], 40, "%s", KS_MAGIC);
	snprintf(vals[3], 40, "%s", idx);
	snprintf(vals[4], 40, "%zu", r->key_len);
	snprintf(vals[5], 40, "echo");
	snprintf(vals[6], 40, "%u", r->n_tokens);
	snprintf(vals[7], 40, "%s", nsx);
	snprintf(vals[8], 40, "%zu", r->reasoning_len);
	snprintf(vals[9], 40, "%zu", r->text_len);
	snprintf(vals[10], 40, "%d", KS_VERSION);
	struct kv_buf h = KV_BUF_INIT;
	kv_buf_adds(&h, "{\"__metadata__\":{");
	for (size_t i = 0; i < N_META; i++)
		kv_buf_printf(&h, "%s\"%s\":\"%s\"", i ? "," : "", META[i], vals[i]);
	kv_buf_printf(&h, ",\"meta_crc32c\":\"%08x\"},", meta_crc(META, vals, N_META));
	kv_buf_printf(&h, "\"tokens\":{\"dtype\":\"I32\",\"shape\":[%u],\"data_offsets\":[0,%zu]},", r->n_tokens, nt);
	kv_buf_printf(&h, "\"bytes\":{\"dtype\":\"U8\",\"shape\":[%zu],\"data_offsets\":[%zu,%zu]}}", nb, nt, nt + nb);
	while (h.len % 8)
		kv_buf_addc(&h, ' ');
	uint64_t hl = h.len;
	int rc = h.oom ? kv_fail(KV_ERR_NOMEM, "out of memory") : KV_OK;
	if (!rc)
		rc = kv_path_fmt(path, sizeof path, "%s/%s%s", dir, idx, ECHO_SUFFIX);
	if (!rc) {
		struct iovec iov[6] = {{&hl, 8},
				       {h.p, h.len},
				       {(void *)r->tokens, nt},
				       {(void *)r->key, r->key_len},
				       {(void *)r->reasoning, r->reasoning_len},
				       {(void *)r->text, r->text_len}};
		rc = kv_durable_writev(path, iov, 6, KV_DW_NO_DIRSYNC);
	}
	kv_buf_free(&h);
	if (!rc) {
		pthread_mutex_lock(&s->mu);
		s->echo_bytes += 8 + hl + nt + nb;
		s->st.echo_written++;
		pthread_mutex_unlock(&s->mu);
	}
	return rc;
}

struct efile {
	char name[80];
	uint64_t size;
	int64_t mtime;
};

static int cmp_efile(const void *a, const void *b)
{
	const struct efile *x = a, *y = b;
	if (x->mtime != y->mtime)
		return x->mtime < y->mtime ? -1 : 1;
	return strcmp(x->name, y->name);
}

/* The folder's record files, oldest first (*n; malloc'd, NULL if none). */
static struct efile *list_files(const char *dir, size_t *n, uint64_t *total)
{
	DIR *d = opendir(dir);
	struct efile *v = NULL;
	size_t cap = 0;
	struct dirent *e;
	*n = 0;
	*total = 0;
	if (!d)
		return NULL;
	while ((e = readdir(d))) {
		size_t l = strlen(e->d_name), sl = strlen(ECHO_SUFFIX);
		char p[4400];
		struct stat st;
		if (l != 32 + sl || strcmp(e->d_name + 32, ECHO_SUFFIX))
			continue;
		if (kv_path_fmt(p, sizeof p, "%s/%s", dir, e->d_name) || stat(p, &st) || !S_ISREG(st.st_mode))
			continue;
		if (*n == cap) {
			size_t nc = cap ? cap * 2 : 64;
			struct efile *nv = realloc(v, nc * sizeof *nv);
			if (!nv)
				break;
			v = nv;
			cap = nc;
		}
		if (l >= sizeof v[*n].name)
			continue;
		memcpy(v[*n].name, e->d_name, l + 1);
		v[*n].size = (uint64_t)st.st_size;
		v[*n].mtime = (int64_t)st.st_mtime;
		*total += (uint64_t)st.st_size;
		(*n)++;
	}
	closedir(d);
	if (v)
		qsort(v, *n, sizeof *v, cmp_efile);
	return v;
}

/* Keep the folder within cap bytes, oldest files out first. */
static void enforce_cap(struct ks_store *s, const char *dir, uint64_t cap)
{
	size_t n;
	uint64_t total;
	struct efile *v = list_files(dir, &n, &total);
	for (size_t i = 0; i < n && total > cap; i++) {
		char p[4400];
		if (!kv_path_fmt(p, sizeof p, "%s/%s", dir, v[i].name) && kv_io_unlink(p) == 0)
			total -= v[i].size;
	}
	pthread_mutex_lock(&s->mu);
	s->echo_bytes = total;
	pthread_mutex_unlock(&s->mu);
	free(v);
}

void ks_echo_save(struct ks_store *s)
{
	struct kc_echo *e = s->p.cache ? kc_cache_echo(s->p.cache) : NULL;
	struct kc_echo_rec r[ECHO_BATCH];
	void *blk[ECHO_BATCH];
	char dir[4200];
	pthread_mutex_lock(&s->mu);
	int can = s->writable && !s->ns_busy && !s->unclaimed && !s->p.tool;
	pthread_mutex_unlock(&s->mu);
	if (!e || !can || echo_dir(s, dir, sizeof dir))
		return;
	for (;;) {
		size_t n = kc_echo_take_dirty(e, r, blk, ECHO_BATCH), ok = 0;
		if (!n)
			break;
		if (ks_dir_ensure(dir) == KV_OK)
			for (size_t i = 0; i < n; i++) {
				if (write_one(s, dir, &r[i]) == KV_OK)
					ok++;
				else
					ks_store_write_failed(s, KV_ERR_IO, "answer record");
			}
		for (size_t i = 0; i < n; i++)
			free(blk[i]);
		if (ok)
			kv_io_fsync_dir(dir);
		if (n < ECHO_BATCH)
			break;
	}
	struct kc_echo_stats st;
	kc_echo_stats(e, &st);
	pthread_mutex_lock(&s->mu);
	int over = s->echo_bytes > st.budget;
	pthread_mutex_unlock(&s->mu);
	if (over)
		enforce_cap(s, dir, st.budget);
}

static int parse_size(const char *v, size_t *out)
{
	char *end;
	if (!v || !*v || *v == '-')
		return -1;
	errno = 0;
	unsigned long long x = strtoull(v, &end, 10);
	if (errno || *end || x > (1ull << 40))
		return -1;
	*out = (size_t)x;
	return 0;
}

/* One file into the store; KV_OK, KV_ERR_NOT_OURS (another namespace or
 * version: left alone) or KV_ERR_CORRUPT (the reason in kv_errmsg). */
static int load_one(struct ks_store *s, struct kc_echo *e, const char *path, const char *name)
{
	struct kv_st *st = NULL;
	int rc = kv_st_open(path, &st);
	if (rc)
		return rc == KV_ERR_NOMEM ? rc : KV_ERR_CORRUPT;
	char vals[N_META][40], nsx[33];
	const char *fmt = kv_st_meta(st, "format"), *kind = kv_st_meta(st, "kind"), *ver = kv_st_meta(st, "version");
	const char *nsv = kv_st_meta(st, "namespace"), *mc = kv_st_meta(st, "meta_crc32c");
	size_t kl, rl, tl, nt;
	kv_h128_hex(s->p.ns, nsx);
	rc = KV_ERR_CORRUPT;
	if (!fmt || strcmp(fmt, KS_MAGIC) || !kind || strcmp(kind, "echo")) {
		kv_fail(rc, "%s: not an answer record", path);
		goto out;
	}
	if (!ver || atoi(ver) != KS_VERSION || !nsv || strcmp(nsv, nsx)) {
		rc = kv_fail(KV_ERR_NOT_OURS, "%s: another namespace or version", path);
		goto out;
	}
	for (size_t i = 0; i < N_META; i++) {
		const char *v = kv_st_meta(st, META[i]);
		if (!v || strlen(v) >= sizeof vals[i]) {
			kv_fail(rc, "%s: metadata '%s' missing", path, META[i]);
			goto out;
		}
		snprintf(vals[i], sizeof vals[i], "%s", v);
	}
	char want[9];
	snprintf(want, sizeof want, "%08x", meta_crc(META, vals, N_META));
	if (!mc || strcmp(mc, want) || parse_size(vals[4], &kl) || parse_size(vals[8], &rl) || parse_size(vals[9], &tl) ||
	    parse_size(vals[6], &nt)) {
		kv_fail(rc, "%s: metadata checksum or lengths", path);
		goto out;
	}
	const struct kv_tensor *tt = kv_st_find(st, "tokens"), *bt = kv_st_find(st, "bytes");
	if (kv_st_count(st) != 2 || !tt || !bt || tt->dtype != KV_DT_I32 || bt->dtype != KV_DT_U8 || tt->numel != nt ||
	    bt->numel != kl + rl + tl || !nt || !kl) {
		kv_fail(rc, "%s: tensors do not match their lengths", path);
		goto out;
	}
	int32_t *tok = malloc(nt * sizeof *tok);
	if (!tok) {
		rc = kv_fail(KV_ERR_NOMEM, "out of memory");
		goto out;
	}
	memcpy(tok, tt->data, nt * sizeof *tok); /* the mapping may be unaligned */
	const char *b = bt->data;
	char crc[9];
	snprintf(crc, sizeof crc, "%08x", kv_crc32c(kv_crc32c(0, tt->data, tt->nbytes), b, bt->nbytes));
	struct kc_echo_rec r = {.key = b, .key_len = kl, .reasoning = b + kl, .reasoning_len = rl, .text = b + kl + rl,
				.text_len = tl, .tokens = tok, .n_tokens = (uint32_t)nt};
	char idx[33];
	kv_h128_hex(rec_id(&r), idx);
	int bad_tok = 0;
	for (size_t i = 0; i < nt; i++)
		bad_tok |= tok[i] < 0 || (s->p.vocab > 0 && tok[i] >= s->p.vocab);
	if (strcmp(crc, vals[1]))
		kv_fail(rc, "%s: data checksum mismatch", path);
	else if (strcmp(idx, vals[3]) || strncmp(name, idx, 32))
		kv_fail(rc, "%s: the id is not its content's", path);
	else if (kl < sizeof ECHO_KEY_MAGIC - 1 || memcmp(b, ECHO_KEY_MAGIC, sizeof ECHO_KEY_MAGIC - 1))
		kv_fail(rc, "%s: not an answer key", path);
	else if (bad_tok)
		kv_fail(rc, "%s: a token id outside the vocabulary", path);
	else if (!kv_utf8_valid(r.text, tl) || !kv_utf8_valid(r.reasoning, rl))
		kv_fail(rc, "%s: text is not UTF-8", path);
	else
		rc = kc_echo_put(e, &r, 0);
	free(tok);
out:
	kv_st_close(st);
	return rc;
}

void ks_echo_load(struct ks_store *s)
{
	struct kc_echo *e = s->p.cache ? kc_cache_echo(s->p.cache) : NULL;
	char dir[4200];
	size_t n, loaded = 0, bad = 0;
	uint64_t total;
	if (!e || echo_dir(s, dir, sizeof dir))
		return;
	uint64_t t0 = kv_now_ns();
	struct efile *v = list_files(dir, &n, &total);
	for (size_t i = 0; i < n; i++) {
		char p[4400];
		if (kv_path_fmt(p, sizeof p, "%s/%s", dir, v[i].name))
			continue;
		int rc = load_one(s, e, p, v[i].name);
		if (rc == KV_OK) {
			loaded++;
		} else if (rc == KV_ERR_CORRUPT) {
			bad++;
			KV_WARN("store.echo_rejected", "path=%s err=\"%s\"", p, kv_errmsg());
			if (!s->p.tool && !s->ns_busy)
				ks_dir_quarantine(s->root, p, "echo",
						  s->p.quarantine_bytes ? s->p.quarantine_bytes : KS_QUARANTINE_MAX_DEFAULT);
		}
	}
	free(v);
	pthread_mutex_lock(&s->mu);
	s->echo_bytes = total;
	s->st.echo_loaded += loaded;
	s->st.echo_rejected += bad;
	pthread_mutex_unlock(&s->mu);
	if (n)
		KV_INFO("store.echo_load", "files=%zu loaded=%zu rejected=%zu ms=%.1f", n, loaded, bad,
			(double)(kv_now_ns() - t0) / 1e6);
}
