/*
 * test_store_obj.c - the disk object format (store/obj.h), namespaces and
 * folder rules (store/ns.h, store/dir.h): round trips, every validation
 * step refusing what it should, and the corruption sweep (every object
 * kind truncated at many offsets and with random bytes flipped never
 * loads as something else).
 */
#include "base/durable.h"
#include "base/err.h"
#include "base/hash.h"
#include "base/io.h"
#include "base/mem.h"
#include "cache/names.h"
#include "model/safetensors.h"
#include "store/dir.h"
#include "store/ns.h"
#include "store/obj.h"
#include "kt.h"
#include "test_store_util.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const struct kv_h128 NS = {0xabcdef, 0x123456};

/* One object of each kind with content derived from a seed. */
struct sample {
	struct ks_obj_src src;
	int32_t tok[64];
	uint8_t kv[4096];
	uint8_t snap[512];
	uint32_t ck[3];
};

static void make(const struct ke_layout *L, int kind, uint64_t seed, struct sample *m)
{
	uint32_t B = (uint32_t)L->page_tokens;
	memset(m, 0, sizeof *m);
	for (int i = 0; i < 64; i++)
		m->tok[i] = (int32_t)(kt_rand(&seed) % 1000);
	for (size_t i = 0; i < sizeof m->kv; i++)
		m->kv[i] = (uint8_t)kt_rand(&seed);
	for (size_t i = 0; i < sizeof m->snap; i++)
		m->snap[i] = (uint8_t)kt_rand(&seed);
	struct ks_obj_src *s = &m->src;
	s->kind = kind;
	s->ns = NS;
	s->tokens = m->tok;
	s->created = 1700000000;
	struct kv_h128 node = kc_chain_hash(NS, m->tok, B); /* a depth-1 node */
	switch (kind) {
	case KS_BLOCK:
		s->parent = NS;
		s->n_tokens = B;
		s->pos = B;
		s->id = kc_chain_hash(NS, m->tok, B);
		s->kv = m->kv;
		break;
	case KS_TAIL:
	case KS_SNAP:
		s->parent = node;
		s->n_tokens = 3;
		s->tokens = m->tok + B;
		s->pos = B + 3;
		s->id = kc_rp_id(node, m->tok + B, 3);
		s->kv = m->kv;
		s->snap = m->snap;
		s->anchor_flag = 1;
		break;
	case KS_ENTRY:
		s->n_tokens = 2 * B + 5;
		s->pos = s->n_tokens;
		s->parent = kc_chain_hash(node, m->tok + B, B);
		s->id = kc_rp_id(s->parent, m->tok + 2 * B, 5);
		m->ck[0] = 4;
		m->ck[1] = B;
		m->ck[2] = B + 3;
		s->ckpt = m->ck;
		s->n_ckpt = 3;
		s->anchor = B;
		break;
	}
}

static void obj_path(int kind, char *out, size_t cap)
{
	KT_OK(kv_path_fmt(out, cap, "%s/obj.%s", kt_tmpdir(), ks_kind_name(kind)));
}

KT_CASE(names)
{
	struct kv_h128 id = {0x0123456789abcdefull, 0xfedcba9876543210ull}, back;
	char name[64];
	int kind;
	ks_obj_name(KS_SNAP, id, name);
	KT_EQ_STR(name, "fedcba98765432100123456789abcdef.snap.safetensors");
	KT_OK(ks_obj_parse_name(name, &kind, &back));
	KT_EQ_INT(kind, KS_SNAP);
	KT_CHECK(kv_h128_eq(back, id));
	KT_CHECK(ks_obj_parse_name("fedcba98765432100123456789abcdef.snap.safetensors.tmp.12.3", &kind, &back));
	KT_CHECK(ks_obj_parse_name("fedcba98765432100123456789abcdeF.snap.safetensors", &kind, &back));
	KT_CHECK(ks_obj_parse_name("fedcba98765432100123456789abcdef.nope.safetensors", &kind, &back));
	KT_CHECK(ks_obj_parse_name("namespace.safetensors", &kind, &back));
	KT_CHECK(ks_obj_parse_name("", &kind, &back));
}

KT_CASE(roundtrip_every_kind)
{
	struct ke_layout L;
	ts_layout(&L, 1);
	for (int kind = KS_BLOCK; kind <= KS_ENTRY; kind++) {
		struct sample m;
		char path[4096];
		uint64_t bytes;
		make(&L, kind, (uint64_t)kind * 77, &m);
		obj_path(kind, path, sizeof path);
		KT_OK(ks_obj_write(path, &L, &m.src, 0, 0, &bytes));
		KT_EQ_U64(bytes, ks_obj_file_size(&L, &m.src));
		struct stat sb;
		KT_REQUIRE(stat(path, &sb) == 0);
		KT_EQ_U64((uint64_t)sb.st_size, bytes);
		KT_EQ_INT(sb.st_mode & 0777, 0600);

		/* a standard safetensors reader opens it */
		struct kv_st *st;
		KT_OK(kv_st_open(path, &st));
		KT_EQ_STR(kv_st_meta(st, "format"), KS_MAGIC);
		KT_EQ_STR(kv_st_meta(st, "kind"), ks_kind_name(kind));
		KT_CHECK(kv_st_find(st, "tokens") != NULL);
		kv_st_close(st);

		struct ks_obj *o;
		int bad = -1;
		KT_OK(ks_obj_open(path, &L, kind, &NS, &o, &bad));
		KT_REQUIRE(o);
		const struct ks_obj_info *in = ks_obj_info(o);
		KT_EQ_INT(in->kind, kind);
		KT_EQ_U64(in->pos, m.src.pos);
		KT_EQ_U64(in->n_tokens, m.src.n_tokens);
		KT_CHECK(kv_h128_eq(in->id, m.src.id));
		KT_CHECK(kv_h128_eq(in->parent, m.src.parent));
		int32_t tok[64] = {0};
		uint8_t kv[4096] = {0}, snap[512] = {0};
		uint32_t ck[8] = {0};
		struct ks_obj_dst d = {.tokens = tok, .kv = kv, .snap = snap, .ckpt = ck, .expect = m.src.tokens};
		KT_OK(ks_obj_read(o, &d, &bad));
		KT_EQ_INT(bad, KS_BAD_NONE);
		KT_CHECK(!memcmp(tok, m.src.tokens, m.src.n_tokens * 4));
		if (kind == KS_BLOCK)
			KT_CHECK(!memcmp(kv, m.kv, L.page_bytes));
		if (kind == KS_TAIL)
			KT_CHECK(!memcmp(kv, m.kv, ke_layout_tail_bytes(&L, 3)));
		if (kind == KS_SNAP) {
			KT_CHECK(!memcmp(snap, m.snap, L.snapshot_bytes));
			KT_EQ_INT(in->anchor_flag, 1);
		}
		if (kind == KS_ENTRY) {
			KT_EQ_U64(in->n_ckpt, 3);
			KT_EQ_U64(in->anchor, L.page_tokens);
			KT_CHECK(!memcmp(ck, m.ck, sizeof m.ck));
		}
		ks_obj_close(o);
	}
}

KT_CASE(refusals_name_the_step)
{
	struct ke_layout L, L2;
	struct sample m;
	char path[4096];
	struct ks_obj *o = NULL;
	int bad;
	ts_layout(&L, 1);
	make(&L, KS_SNAP, 5, &m);
	obj_path(KS_SNAP, path, sizeof path);
	KT_OK(ks_obj_write(path, &L, &m.src, 0, 0, NULL));

	/* another namespace: a miss, not a corruption */
	struct kv_h128 other = {1, 2};
	KT_EQ_INT(ks_obj_open(path, &L, KS_SNAP, &other, &o, &bad), KV_ERR_NOT_OURS);
	KT_EQ_INT(bad, KS_BAD_NS);
	/* wrong kind asked */
	KT_EQ_INT(ks_obj_open(path, &L, KS_BLOCK, &NS, &o, &bad), KV_ERR_CORRUPT);
	/* the prompt's tokens differ */
	KT_OK(ks_obj_open(path, &L, KS_SNAP, &NS, &o, &bad));
	int32_t wrong[8];
	memcpy(wrong, m.src.tokens, sizeof wrong);
	wrong[2] ^= 1;
	struct ks_obj_dst d = {.expect = wrong};
	KT_EQ_INT(ks_obj_read(o, &d, &bad), KV_ERR_CORRUPT);
	KT_EQ_INT(bad, KS_BAD_TOKENS);
	ks_obj_close(o);

	/* same bytes per layer, other shape: caught by the shape check */
	L2 = L;
	for (int i = 0; i < 2; i++) {
		L2.rec[i].state_dims[0] = 4;
		L2.rec[i].state_dims[1] = 1;
	}
	KT_OK(ks_obj_open(path, &L2, KS_SNAP, &NS, &o, &bad));
	struct ks_obj_dst d2 = {0};
	KT_EQ_INT(ks_obj_read(o, &d2, &bad), KV_ERR_CORRUPT);
	KT_EQ_INT(bad, KS_BAD_SHAPE);
	ks_obj_close(o);

	/* a layout with one more recurrent layer: the file does not cover it */
	L2 = L;
	L2.rec[2] = L.rec[1];
	L2.rec[2].layer = 7;
	L2.rec[2].conv_off = L.snapshot_bytes;
	L2.rec[2].state_off = L.snapshot_bytes + L.rec[1].conv_bytes;
	L2.n_rec_layers = 3;
	L2.snapshot_bytes += L.rec[1].conv_bytes + L.rec[1].state_bytes;
	KT_EQ_INT(ks_obj_open(path, &L2, KS_SNAP, &NS, &o, &bad), KV_ERR_CORRUPT);
	KT_CHECK(bad == KS_BAD_ARITH || bad == KS_BAD_SIZE || bad == KS_BAD_COVER);

	/* another KV dtype: the size arithmetic differs */
	make(&L, KS_BLOCK, 6, &m);
	obj_path(KS_BLOCK, path, sizeof path);
	KT_OK(ks_obj_write(path, &L, &m.src, 0, 0, NULL));
	L2 = L;
	L2.kv_dtype = KV_DT_BF16;
	L2.row_bytes = 4;
	L2.page_bytes /= 2;
	L2.kv_bytes_per_token /= 2;
	KT_EQ_INT(ks_obj_open(path, &L2, KS_BLOCK, &NS, &o, &bad), KV_ERR_CORRUPT);
	KT_CHECK(bad == KS_BAD_ARITH || bad == KS_BAD_SIZE);

	/* a missing file */
	KT_EQ_INT(ks_obj_open("/nonexistent/x.block.safetensors", &L, KS_BLOCK, &NS, &o, &bad), KV_ERR_NOT_FOUND);
}

/* A file with valid safetensors structure whose metadata we rewrite. */
static void write_with_meta(const char *path, const struct ke_layout *L, const struct sample *m, const char *key,
			    const char *val)
{
	/* serialise, then re-emit with one metadata value replaced */
	void *buf;
	size_t len;
	struct kv_st *st;
	KT_OK(ks_obj_write(path, L, &m->src, KV_DW_NO_SYNC, 0, NULL));
	KT_OK(kv_io_read_file(path, 64u << 20, (char **)&buf, &len));
	KT_OK(kv_st_open_mem(buf, len, "x", &st));
	struct kv_stw *w = kv_stw_create();
	for (size_t i = 0; i < kv_st_meta_count(st); i++) {
		const char *k, *v;
		kv_st_meta_at(st, i, &k, &v);
		KT_OK(kv_stw_meta(w, k, strcmp(k, key) ? v : val));
	}
	for (size_t i = 0; i < kv_st_count(st); i++) {
		const struct kv_tensor *t = kv_st_tensor(st, i);
		KT_OK(kv_stw_add(w, t->name, t->dtype, t->ndim, t->shape, t->data, t->nbytes));
	}
	KT_OK(kv_stw_write(w, path, KV_DW_NO_SYNC));
	kv_stw_destroy(w);
	kv_st_close(st);
	free(buf);
}

KT_CASE(version_and_metadata_checks)
{
	struct ke_layout L;
	struct sample m;
	char path[4096];
	struct ks_obj *o = NULL;
	int bad;
	ts_layout(&L, 0);
	make(&L, KS_BLOCK, 9, &m);
	obj_path(KS_BLOCK, path, sizeof path);

	/* a future version is not ours to read (and not corrupt) */
	write_with_meta(path, &L, &m, "version", "2");
	KT_EQ_INT(ks_obj_open(path, &L, KS_BLOCK, &NS, &o, &bad), KV_ERR_VERSION);
	KT_EQ_INT(bad, KS_BAD_VERSION);
	/* a changed position without a matching metadata checksum */
	write_with_meta(path, &L, &m, "pos", "16");
	KT_EQ_INT(ks_obj_open(path, &L, KS_BLOCK, &NS, &o, &bad), KV_ERR_CORRUPT);
	KT_EQ_INT(bad, KS_BAD_CRC);
	/* not ours at all */
	write_with_meta(path, &L, &m, "format", "something-else");
	KT_EQ_INT(ks_obj_open(path, &L, KS_BLOCK, &NS, &o, &bad), KV_ERR_CORRUPT);
	KT_EQ_INT(bad, KS_BAD_HEADER);
	/* bad source objects are refused before writing */
	struct sample m2 = m;
	m2.src.pos = 5;
	KT_EQ_INT(ks_obj_write(path, &L, &m2.src, 0, 0, NULL), KV_ERR_INVALID);
}

/* A KV layout of one attention layer, one KV head and B = 8 with rows of
 * hd elements of dt (Q8_0: hd / 32 blocks of 34 bytes). */
static void kv_layout(struct ke_layout *L, int dt, int hd)
{
	memset(L, 0, sizeof *L);
	L->page_tokens = TS_B;
	L->kv_dtype = dt;
	L->n_attn_layers = 1;
	L->n_kv_heads = 1;
	L->head_dim = hd;
	L->n_segments = 2;
	L->row_bytes = ke_layout_row_bytes(dt, hd);
	L->page_bytes = (size_t)L->n_segments * TS_B * L->row_bytes;
	L->kv_bytes_per_token = (size_t)L->n_segments * L->row_bytes;
}

static int cmp_cstr(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Rewrite an object without its "kv_dtype" metadata and with a correct
 * meta_crc32c over what is left: the file a build from before the key
 * existed would have written. */
static void drop_kv_dtype(const char *path)
{
	void *buf;
	size_t len;
	struct kv_st *st;
	char *keys[32], *vals[32], *sorted[32], crc[16];
	size_t n = 0;
	KT_OK(kv_io_read_file(path, 64u << 20, (char **)&buf, &len));
	KT_OK(kv_st_open_mem(buf, len, "x", &st));
	KT_REQUIRE(kv_st_meta(st, "kv_dtype") != NULL);
	for (size_t i = 0; i < kv_st_meta_count(st) && n < 32; i++) {
		const char *k, *v;
		kv_st_meta_at(st, i, &k, &v);
		if (strcmp(k, "kv_dtype") && strcmp(k, "meta_crc32c")) {
			keys[n] = (char *)k;
			vals[n] = (char *)v;
			sorted[n++] = (char *)k;
		}
	}
	qsort(sorted, n, sizeof *sorted, cmp_cstr);
	uint32_t c = 0;
	for (size_t i = 0; i < n; i++)
		for (size_t j = 0; j < n; j++)
			if (keys[j] == sorted[i]) {
				c = kv_crc32c(c, keys[j], strlen(keys[j]));
				c = kv_crc32c(c, "=", 1);
				c = kv_crc32c(c, vals[j], strlen(vals[j]));
				c = kv_crc32c(c, "\n", 1);
			}
	snprintf(crc, sizeof crc, "%08x", c);
	struct kv_stw *w = kv_stw_create();
	for (size_t i = 0; i < n; i++)
		KT_OK(kv_stw_meta(w, keys[i], vals[i]));
	KT_OK(kv_stw_meta(w, "meta_crc32c", crc));
	for (size_t i = 0; i < kv_st_count(st); i++) {
		const struct kv_tensor *t = kv_st_tensor(st, i);
		KT_OK(kv_stw_add(w, t->name, t->dtype, t->ndim, t->shape, t->data, t->nbytes));
	}
	KT_OK(kv_stw_write(w, path, KV_DW_NO_SYNC));
	kv_stw_destroy(w);
	kv_st_close(st);
	free(buf);
}

/* Read a block or tail object of layout L; KV_OK or the error, *bad the
 * reason. */
static int read_kv_obj(const char *path, const struct ke_layout *L, int kind, uint8_t *kv, int *bad)
{
	struct ks_obj *o = NULL;
	int rc = ks_obj_open(path, L, kind, &NS, &o, bad);
	if (rc)
		return rc;
	struct ks_obj_dst d = {.kv = kv};
	rc = ks_obj_read(o, &d, bad);
	ks_obj_close(o);
	return rc;
}

/*
 * KV objects say their dtype: "kv_dtype" metadata on every block and
 * tail; Q8_0 rows, which safetensors has no dtype for, as U8 [kv_heads,
 * rows, row_bytes]. A file of another KV dtype is refused even where its
 * bytes would fit (a Q8_0 row of 32 elements and a BF16 row of 17 are
 * both 34 bytes), whichever way round: the validation's shape step, a
 * miss and a quarantine, never KV read as another type. A file without
 * the key (written before it existed) still loads when its tensors name
 * the type (BF16, F32), and never as Q8_0.
 */
KT_CASE(kv_objects_say_their_dtype)
{
	struct ke_layout Lq, Lb, Lf;
	struct sample m;
	char path[4096];
	uint8_t kv[4096];
	int bad;
	kv_layout(&Lq, KV_DT_Q8_0, 32);
	kv_layout(&Lb, KV_DT_BF16, 17);
	kv_layout(&Lf, KV_DT_F32, 8);
	KT_EQ_U64(Lq.row_bytes, 34);
	KT_EQ_U64(Lb.row_bytes, 34);
	for (int kind = KS_BLOCK; kind <= KS_TAIL; kind++) {
		int rows = kind == KS_BLOCK ? TS_B : 3;
		size_t kvb = kind == KS_BLOCK ? Lq.page_bytes : ke_layout_tail_bytes(&Lq, 3);
		make(&Lq, kind, 40 + (uint64_t)kind, &m);
		obj_path(kind, path, sizeof path);
		KT_OK(ks_obj_write(path, &Lq, &m.src, KV_DW_NO_SYNC, 0, NULL));
		struct kv_st *st;
		KT_OK(kv_st_open(path, &st));
		KT_EQ_STR(kv_st_meta(st, "kv_dtype"), "Q8_0");
		const struct kv_tensor *t = kv_st_find(st, "kv.0.v");
		KT_REQUIRE(t);
		KT_EQ_INT(t->dtype, KV_DT_U8);
		KT_EQ_INT(t->ndim, 3);
		KT_CHECK(t->shape[0] == 1 && t->shape[1] == rows && t->shape[2] == 34);
		kv_st_close(st);
		memset(kv, 0, sizeof kv);
		KT_OK(read_kv_obj(path, &Lq, kind, kv, &bad));
		KT_CHECK(!memcmp(kv, m.kv, kvb));
		/* read by a BF16 layout with the same row bytes */
		KT_EQ_INT(read_kv_obj(path, &Lb, kind, kv, &bad), KV_ERR_CORRUPT);
		KT_EQ_INT(bad, KS_BAD_SHAPE);
		/* and the other way round */
		KT_OK(ks_obj_write(path, &Lb, &m.src, KV_DW_NO_SYNC, 0, NULL));
		KT_OK(kv_st_open(path, &st));
		KT_EQ_STR(kv_st_meta(st, "kv_dtype"), "BF16");
		kv_st_close(st);
		KT_OK(read_kv_obj(path, &Lb, kind, kv, &bad));
		KT_EQ_INT(read_kv_obj(path, &Lq, kind, kv, &bad), KV_ERR_CORRUPT);
		KT_EQ_INT(bad, KS_BAD_SHAPE);
		/* a BF16 file from before the key: still read by BF16, not by Q8_0 */
		drop_kv_dtype(path);
		KT_OK(read_kv_obj(path, &Lb, kind, kv, &bad));
		KT_EQ_INT(read_kv_obj(path, &Lq, kind, kv, &bad), KV_ERR_CORRUPT);
		KT_EQ_INT(bad, KS_BAD_SHAPE);
		/* a Q8_0 file that does not say so is not read as Q8_0 */
		KT_OK(ks_obj_write(path, &Lq, &m.src, KV_DW_NO_SYNC, 0, NULL));
		drop_kv_dtype(path);
		KT_EQ_INT(read_kv_obj(path, &Lq, kind, kv, &bad), KV_ERR_CORRUPT);
		KT_EQ_INT(bad, KS_BAD_SHAPE);
		/* F32 says so too */
		KT_OK(ks_obj_write(path, &Lf, &m.src, KV_DW_NO_SYNC, 0, NULL));
		KT_OK(kv_st_open(path, &st));
		KT_EQ_STR(kv_st_meta(st, "kv_dtype"), "F32");
		KT_EQ_INT(kv_st_find(st, "kv.0.k")->dtype, KV_DT_F32);
		kv_st_close(st);
		KT_OK(read_kv_obj(path, &Lf, kind, kv, &bad));
	}
	/* snapshots and entries carry no KV and no key */
	struct ke_layout Lh;
	ts_layout(&Lh, 1);
	make(&Lh, KS_SNAP, 3, &m);
	obj_path(KS_SNAP, path, sizeof path);
	KT_OK(ks_obj_write(path, &Lh, &m.src, KV_DW_NO_SYNC, 0, NULL));
	struct kv_st *st;
	KT_OK(kv_st_open(path, &st));
	KT_CHECK(kv_st_meta(st, "kv_dtype") == NULL);
	kv_st_close(st);
}

/*
 * The sweep: for each kind, truncations at every offset of the header and
 * a spread through the data, and many random flips of 1-3 bytes. Each
 * attempt must fail cleanly, or (a flip in JSON whitespace or in a
 * padding space) succeed with exactly the original content. Never a
 * different content, never a crash.
 */
/* A file at path, or (mem != NULL) len bytes in memory: the remote tier's values. */
static int check_bytes(const char *path, const void *mem, size_t len, const struct ke_layout *L, int kind,
		       const struct sample *m, int *n_ok)
{
	struct ks_obj *o;
	int bad;
	int32_t tok[64];
	uint8_t kv[4096], snap[512];
	uint32_t ck[64];
	int rc = mem ? ks_obj_open_mem(mem, len, "value", L, kind, &NS, &o, &bad) : ks_obj_open(path, L, kind, &NS, &o, &bad);
	if (rc == KV_OK) {
		const struct ks_obj_info *in = ks_obj_info(o);
		struct ks_obj_dst d = {.tokens = tok, .kv = kv, .snap = snap, .ckpt = ck};
		rc = ks_obj_read(o, &d, &bad);
		if (rc == KV_OK) {
			(*n_ok)++;
			/* accepted: it must be the very same object */
			if (in->n_tokens != m->src.n_tokens || memcmp(tok, m->src.tokens, in->n_tokens * 4) ||
			    !kv_h128_eq(in->id, m->src.id) || in->pos != m->src.pos ||
			    (kind == KS_BLOCK && memcmp(kv, m->kv, L->page_bytes)) ||
			    (kind == KS_TAIL && memcmp(kv, m->kv, ke_layout_tail_bytes(L, 3))) ||
			    (kind == KS_SNAP && memcmp(snap, m->snap, L->snapshot_bytes)) ||
			    (kind == KS_ENTRY && (in->n_ckpt != 3 || memcmp(ck, m->ck, sizeof m->ck))))
				rc = -100;
		}
		ks_obj_close(o);
	} else if (rc != KV_ERR_CORRUPT && rc != KV_ERR_NOT_OURS && rc != KV_ERR_VERSION) {
		rc = -101; /* anything else (IO, NOMEM) is not what a bad file should give */
	}
	return rc;
}

static int check_variant(const char *path, const struct ke_layout *L, int kind, const struct sample *m, int *n_ok)
{
	return check_bytes(path, NULL, 0, L, kind, m, n_ok);
}

KT_CASE(corruption_sweep)
{
	uint64_t seed = 42;
	for (int hybrid = 0; hybrid <= 1; hybrid++) {
		struct ke_layout L;
		ts_layout(&L, hybrid);
		for (int kind = KS_BLOCK; kind <= KS_ENTRY; kind++) {
			if (kind == KS_SNAP && !hybrid)
				continue;
			struct sample m;
			char path[4096], orig[4096];
			void *good;
			size_t len;
			int n_ok = 0, tried = 0;
			make(&L, kind, (uint64_t)kind * 13 + (uint64_t)hybrid, &m);
			obj_path(kind, orig, sizeof orig);
			KT_OK(kv_path_fmt(path, sizeof path, "%s.mut", orig));
			KT_OK(ks_obj_write(orig, &L, &m.src, KV_DW_NO_SYNC, 0, NULL));
			KT_OK(kv_io_read_file(orig, 1u << 20, (char **)&good, &len));
			/* truncation: every offset up to 600, then every 7th */
			for (size_t cut = 0; cut < len; cut += cut < 600 ? 1 : 7) {
				KT_OK(kv_durable_write(path, good, cut, KV_DW_NO_SYNC));
				int rc = check_variant(path, &L, kind, &m, &n_ok);
				KT_CHECKF(rc == KV_ERR_CORRUPT, "%s truncated at %zu of %zu: rc %d", ks_kind_name(kind), cut,
					  len, rc);
				tried++;
			}
			/* flips */
			uint8_t *mut = malloc(len);
			KT_REQUIRE(mut);
			for (int it = 0; it < 400; it++) {
				memcpy(mut, good, len);
				int nf = 1 + (int)(kt_rand(&seed) % 3);
				for (int f = 0; f < nf; f++) {
					size_t at = (size_t)(kt_rand(&seed) % len);
					mut[at] ^= (uint8_t)(1 + kt_rand(&seed) % 255);
				}
				KT_OK(kv_durable_write(path, mut, len, KV_DW_NO_SYNC));
				int rc = check_variant(path, &L, kind, &m, &n_ok);
				KT_CHECKF(rc == KV_OK || rc == KV_ERR_CORRUPT || rc == KV_ERR_NOT_OURS || rc == KV_ERR_VERSION,
					  "%s flip %d: rc %d (a different object was accepted or an odd error)",
					  ks_kind_name(kind), it, rc);
				tried++;
			}
			/* appended garbage */
			memcpy(mut, good, len);
			KT_OK(kv_durable_write(path, good, len, KV_DW_NO_SYNC));
			{
				int fd = open(path, O_WRONLY | O_APPEND);
				KT_REQUIRE(fd >= 0);
				KT_CHECK(write(fd, "junk", 4) == 4);
				close(fd);
				KT_EQ_INT(check_variant(path, &L, kind, &m, &n_ok), KV_ERR_CORRUPT);
			}
			free(mut);
			free(good);
			/* most flips must be caught: a checker accepting everything
			 * would pass the content test only by luck */
			KT_CHECKF(n_ok < tried / 4, "%s: %d of %d mutants accepted", ks_kind_name(kind), n_ok, tried);
		}
	}
}

/*
 * The remote tier's side (store/remote.c): ks_obj_iov gives exactly the
 * file's bytes, and ks_obj_open_mem validates a value in memory with the
 * same steps, refusing truncations and flips as a file's would be.
 */
KT_CASE(memory_objects_are_the_file_bytes)
{
	uint64_t seed = 99;
	for (int hybrid = 0; hybrid <= 1; hybrid++) {
		struct ke_layout L;
		ts_layout(&L, hybrid);
		for (int kind = KS_BLOCK; kind <= KS_ENTRY; kind++) {
			if (kind == KS_SNAP && !hybrid)
				continue;
			struct sample m;
			char path[4096];
			char *file;
			size_t flen;
			make(&L, kind, (uint64_t)kind * 5 + (uint64_t)hybrid, &m);
			obj_path(kind, path, sizeof path);
			KT_OK(ks_obj_write(path, &L, &m.src, KV_DW_NO_SYNC, 0, NULL));
			KT_OK(kv_io_read_file(path, 1u << 20, &file, &flen));
			struct iovec iov[KS_OBJ_MAX_IOV];
			void *owned;
			uint64_t total;
			int n = ks_obj_iov(&L, &m.src, iov, &owned, &total);
			KT_REQUIRE(n > 0 && n <= KS_OBJ_MAX_IOV);
			KT_EQ_U64(total, flen);
			uint8_t *val = malloc(total);
			KT_REQUIRE(val);
			size_t o = 0;
			for (int i = 0; i < n; i++) {
				memcpy(val + o, iov[i].iov_base, iov[i].iov_len);
				o += iov[i].iov_len;
			}
			free(owned);
			KT_EQ_U64(o, total);
			KT_CHECKF(!memcmp(val, file, flen), "%s: the pieces are not the file's bytes", ks_kind_name(kind));
			int n_ok = 0, tried = 0;
			KT_EQ_INT(check_bytes(NULL, val, total, &L, kind, &m, &n_ok), KV_OK);
			KT_EQ_INT(n_ok, 1);
			n_ok = 0;
			for (size_t cut = 0; cut < total; cut += cut < 600 ? 1 : 7, tried++) {
				int rc = check_bytes(NULL, val, cut, &L, kind, &m, &n_ok);
				KT_CHECKF(rc == KV_ERR_CORRUPT, "%s value truncated at %zu: rc %d", ks_kind_name(kind), cut, rc);
			}
			uint8_t *mut = malloc(total + 4);
			KT_REQUIRE(mut);
			for (int it = 0; it < 300; it++, tried++) {
				memcpy(mut, val, total);
				mut[kt_rand(&seed) % total] ^= (uint8_t)(1 + kt_rand(&seed) % 255);
				int rc = check_bytes(NULL, mut, total, &L, kind, &m, &n_ok);
				KT_CHECKF(rc == KV_OK || rc == KV_ERR_CORRUPT || rc == KV_ERR_NOT_OURS || rc == KV_ERR_VERSION,
					  "%s value flip %d: rc %d", ks_kind_name(kind), it, rc);
			}
			memcpy(mut, val, total);
			memcpy(mut + total, "junk", 4);
			KT_EQ_INT(check_bytes(NULL, mut, total + 4, &L, kind, &m, &n_ok), KV_ERR_CORRUPT);
			KT_CHECKF(n_ok < tried / 4, "%s: %d of %d mutated values accepted", ks_kind_name(kind), n_ok, tried);
			free(mut);
			free(val);
			free(file);
		}
	}
}

KT_CASE(deadline_stops_a_write)
{
	struct ke_layout L;
	struct sample m;
	char path[4096];
	ts_layout(&L, 0);
	make(&L, KS_BLOCK, 3, &m);
	obj_path(KS_BLOCK, path, sizeof path);
	/* a deadline already past: nothing written, nothing left */
	KT_EQ_INT(ks_obj_write(path, &L, &m.src, 0, 1, NULL), KV_ERR_TIMEOUT);
	KT_EQ_INT(access(path, F_OK), -1);
	KT_EQ_INT(ts_count_files(kt_tmpdir(), ".tmp."), 0);
	/* a deadline far away: written, through the copying path */
	KT_OK(ks_obj_write(path, &L, &m.src, 0, UINT64_MAX / 2, NULL));
	int bad;
	KT_OK(ks_obj_verify(path, &L, KS_BLOCK, &NS, NULL, &bad));
}

KT_CASE(layout_text)
{
	struct ke_layout L, back;
	char txt[8192];
	ts_layout(&L, 1);
	KT_OK(ks_ns_layout_str(&L, txt, sizeof txt));
	KT_OK(ks_ns_layout_parse(txt, &back));
	KT_EQ_INT(back.page_tokens, L.page_tokens);
	KT_EQ_INT(back.kv_dtype, L.kv_dtype);
	KT_EQ_U64(back.page_bytes, L.page_bytes);
	KT_EQ_U64(back.kv_bytes_per_token, L.kv_bytes_per_token);
	KT_EQ_U64(back.snapshot_bytes, L.snapshot_bytes);
	KT_EQ_INT(back.n_rec_layers, 2);
	KT_EQ_U64(back.rec[1].state_off, L.rec[1].state_off);
	KT_EQ_INT(back.rec[1].layer, 2);
	/* bad texts are refused */
	const char *bads[] = {"", "v2 B=8", "v1 B=0 dt=F32 attn=1 kvh=1 hd=1", "v1 B=8 dt=I8 attn=1 kvh=1 hd=1",
			      "v1 B=8 dt=F32 attn=1 kvh=1 hd=1 rec=0:5:1:1:9:1:1:1",
			      "v1 B=8 dt=F32 attn=1 kvh=1 hd=1 rec=0:0:1:1", "v1 B=8 dt=F32 attn=1 kvh=1 hd=-1",
			      "v1 B=8 dt=F32 attn=99999 kvh=1 hd=1"};
	for (size_t i = 0; i < sizeof bads / sizeof *bads; i++)
		KT_CHECKF(ks_ns_layout_parse(bads[i], &back) == KV_ERR_CORRUPT, "accepted '%s'", bads[i]);
	/* Q8_0 KV: 34 bytes per 32 elements, head_dim a multiple of 32 */
	kv_layout(&L, KV_DT_Q8_0, 256);
	KT_OK(ks_ns_layout_str(&L, txt, sizeof txt));
	KT_EQ_STR(txt, "v1 B=8 dt=Q8_0 attn=1 kvh=1 hd=256");
	KT_OK(ks_ns_layout_parse(txt, &back));
	KT_EQ_INT(back.kv_dtype, KV_DT_Q8_0);
	KT_EQ_U64(back.row_bytes, 8 * 34);
	KT_EQ_U64(back.page_bytes, L.page_bytes);
	KT_EQ_U64(back.kv_bytes_per_token, 2 * 8 * 34);
	KT_EQ_INT(ks_ns_layout_parse("v1 B=8 dt=Q8_0 attn=1 kvh=1 hd=48", &back), KV_ERR_CORRUPT);
	KT_EQ_INT(ks_ns_layout_parse("v1 B=8 dt=Q4_0 attn=1 kvh=1 hd=32", &back), KV_ERR_CORRUPT);
	/* window layers: the pages' geometry unless the text gives its own
	 * (gemma4: 2 heads of 32 in the windows, 1 head of 64 in the pages) */
	const char *w1 = "v1 B=16 dt=F32 attn=1 kvh=2 hd=32 win=0:15:0:3840";
	KT_OK(ks_ns_layout_parse(w1, &back));
	KT_EQ_INT(back.n_win_layers, 1);
	KT_EQ_INT(back.win[0].kv_heads, 2);
	KT_EQ_INT(back.win[0].head_dim, 32);
	KT_EQ_U64(back.snapshot_bytes, 7680);
	KT_OK(ks_ns_layout_str(&back, txt, sizeof txt));
	KT_EQ_STR(txt, w1);
	const char *w2 = "v1 B=16 dt=F32 attn=1 kvh=1 hd=64 win=0:15:0:3840:2:32 win=1:15:7680:11520:2:32";
	KT_OK(ks_ns_layout_parse(w2, &back));
	KT_EQ_INT(back.n_win_layers, 2);
	KT_EQ_INT(back.win[1].kv_heads, 2);
	KT_EQ_INT(back.win[1].head_dim, 32);
	KT_EQ_U64(back.win[1].row_bytes, 128);
	KT_EQ_U64(back.snapshot_bytes, 15360);
	KT_EQ_U64(back.kv_bytes_per_token, 2 * 64 * 4);
	KT_OK(ks_ns_layout_str(&back, txt, sizeof txt));
	KT_EQ_STR(txt, w2);
	const char *wbad[] = {"v1 B=16 dt=F32 attn=1 kvh=1 hd=64 win=0:15:0:3840:0:32",
			      "v1 B=16 dt=F32 attn=1 kvh=1 hd=64 win=0:15:0:3840:2",
			      "v1 B=16 dt=F32 attn=1 kvh=1 hd=64 win=0:15:0:1920:2:32",
			      "v1 B=16 dt=Q8_0 attn=1 kvh=1 hd=64 win=0:15:0:3840:2:48"};
	for (size_t i = 0; i < sizeof wbad / sizeof *wbad; i++)
		KT_CHECKF(ks_ns_layout_parse(wbad[i], &back) == KV_ERR_CORRUPT, "accepted '%s'", wbad[i]);
}

KT_CASE(namespace_rules)
{
	struct kv_h128 fp = {5, 6};
	struct kv_h128 a = ks_ns_derive(fp, NULL), b = ks_ns_derive(fp, ""), c = ks_ns_derive(fp, "tenant-a"),
		       d = ks_ns_derive(fp, "tenant-b"), e = ks_ns_derive((struct kv_h128){5, 7}, NULL);
	KT_CHECK(kv_h128_eq(a, b)); /* empty salt = no salt */
	KT_CHECK(!kv_h128_eq(a, c));
	KT_CHECK(!kv_h128_eq(c, d));
	KT_CHECK(!kv_h128_eq(a, e));
	/* the marker round trip */
	struct ke_layout L;
	struct ks_ns_info ni;
	char dir[4096];
	ts_layout(&L, 1);
	snprintf(dir, sizeof dir, "%s/nsdir", kt_tmpdir());
	KT_OK(ks_ns_mark(dir, c, "my-model", 1, &L));
	KT_OK(ks_ns_read(dir, &ni));
	KT_CHECK(kv_h128_eq(ni.ns, c));
	KT_EQ_STR(ni.label, "my-model");
	KT_EQ_INT(ni.salted, 1);
	KT_EQ_INT(ni.has_layout, 1);
	KT_EQ_U64(ni.layout.snapshot_bytes, L.snapshot_bytes);
	struct stat sb;
	KT_REQUIRE(stat(dir, &sb) == 0);
	KT_EQ_INT(sb.st_mode & 0777, 0700);
}

KT_CASE(root_resolution)
{
	char out[256];
	KT_OK(ks_dir_root_from("/flag", "/env", "/xdg", "/home", out, sizeof out));
	KT_EQ_STR(out, "/flag");
	KT_OK(ks_dir_root_from(NULL, "/env/", "/xdg", "/home", out, sizeof out));
	KT_EQ_STR(out, "/env");
	KT_OK(ks_dir_root_from("", "", "/xdg", "/home", out, sizeof out));
	KT_EQ_STR(out, "/xdg/kvkeep");
	KT_OK(ks_dir_root_from(NULL, NULL, NULL, "/home/u", out, sizeof out));
	KT_EQ_STR(out, "/home/u/.cache/kvkeep");
	KT_EQ_INT(ks_dir_root_from(NULL, NULL, NULL, NULL, out, sizeof out), KV_ERR_INVALID);
	KT_EQ_INT(ks_dir_root_from("/a/very/long/path/that/does/not/fit", NULL, NULL, NULL, out, 8), KV_ERR_INVALID);
}

/* A path that does not fit its buffer is an error and an empty string,
 * never a shorter path naming another file. */
KT_CASE(path_builders_refuse_truncation)
{
	struct kv_h128 id = {0x0123456789abcdefull, 0xfedcba9876543210ull};
	char out[4096], small[40];
	KT_OK(ks_dir_ns_path("/r", id, KS_AREA_CKPT, out, sizeof out));
	KT_EQ_STR(out, "/r/kv_checkpoints/fedcba98765432100123456789abcdef");
	KT_EQ_INT(ks_dir_ns_path("/r", id, KS_AREA_CKPT, small, sizeof small), KV_ERR_INVALID);
	KT_EQ_STR(small, "");
	KT_OK(ks_dir_shard_path("/r", id, small, sizeof small));
	KT_EQ_STR(small, "/r/fe");
	KT_EQ_INT(ks_dir_shard_path("/r/0123456789/0123456789/0123456789/x", id, small, sizeof small), KV_ERR_INVALID);
	KT_EQ_STR(small, "");
	KT_OK(ks_dir_obj_path("/r", KS_BLOCK, id, out, sizeof out));
	KT_CHECK(strncmp(out, "/r/fe/", 6) == 0);
	KT_EQ_INT(ks_dir_obj_path("/r", KS_BLOCK, id, out, strlen(out)), KV_ERR_INVALID);
	KT_EQ_STR(out, "");
	KT_OK(kv_path_fmt(small, 5, "%s", "abcd"));
	KT_EQ_INT(kv_path_fmt(small, 5, "%s", "abcde"), KV_ERR_INVALID);
	KT_CHECK(strstr(kv_errmsg(), "too long") != NULL);
}

KT_CASE(quarantine_is_capped)
{
	char root[4096], f[4096];
	snprintf(root, sizeof root, "%s/root", kt_tmpdir());
	KT_OK(ks_dir_ensure(root));
	char big[1000];
	memset(big, 'x', sizeof big);
	for (int i = 0; i < 10; i++) {
		KT_OK(kv_path_fmt(f, sizeof f, "%s/bad%d", root, i));
		KT_OK(kv_durable_write(f, big, sizeof big, KV_DW_NO_SYNC));
		KT_OK(ks_dir_quarantine(root, f, "t", 3500));
		KT_EQ_INT(access(f, F_OK), -1);
	}
	char q[4200];
	snprintf(q, sizeof q, "%s/quarantine", root);
	int n = ts_count_files(q, "bad");
	KT_CHECKF(n >= 1 && n <= 3, "%d files kept under a 3500-byte cap", n);
}

KT_CASE(temp_debris_cleaned)
{
	char d[4096], f[4200];
	snprintf(d, sizeof d, "%s/ns/ab", kt_tmpdir());
	KT_OK(ks_dir_ensure(d));
	snprintf(f, sizeof f, "%s/x.block.safetensors.tmp.1.2", d);
	KT_OK(kv_durable_write(f, "a", 1, KV_DW_NO_SYNC));
	snprintf(f, sizeof f, "%s/keep.block.safetensors", d);
	KT_OK(kv_durable_write(f, "a", 1, KV_DW_NO_SYNC));
	snprintf(d, sizeof d, "%s/ns", kt_tmpdir());
	KT_EQ_U64(ks_dir_clean_temp(d), 1);
	KT_EQ_INT(ts_count_files(d, ".tmp."), 0);
	KT_EQ_INT(ts_count_files(d, "keep"), 1);
}

KT_MAIN(names, roundtrip_every_kind, refusals_name_the_step, version_and_metadata_checks, kv_objects_say_their_dtype,
	corruption_sweep, memory_objects_are_the_file_bytes,
	deadline_stops_a_write, layout_text, namespace_rules, root_resolution, path_builders_refuse_truncation,
	quarantine_is_capped,
	temp_debris_cleaned)
