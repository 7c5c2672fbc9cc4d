/*
 * test_safetensors.c - the safetensors reader, writer and sharded weights.
 *
 * Every validation rule of safetensors.h has a case that breaks exactly
 * that rule and checks the error code, that the message names the file,
 * and that it names the rule. Round trips go writer -> reader in memory
 * and on disk, plus files written by hand with unaligned data (what other
 * writers produce).
 */
#include "kt.h"
#include "model/safetensors.h"
#include "model/weights.h"
#include "base/corrupt.h"
#include "base/durable.h"
#include "base/err.h"
#include "base/io.h"
#include "base/mem.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* A file image: u64 LE len(header), header, data. malloc'd. */
static uint8_t *image(const char *header, const void *data, size_t dlen, size_t *len)
{
	size_t h = strlen(header);
	uint8_t *p = malloc(8 + h + dlen + 1);
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)((uint64_t)h >> (8 * i));
	memcpy(p + 8, header, h);
	if (dlen)
		memcpy(p + 8 + h, data, dlen);
	*len = 8 + h + dlen;
	return p;
}

/* Open an image in memory; expect `want` with `rule` in the message. */
static int expect_err(const char *header, size_t dlen, int want, const char *rule)
{
	uint8_t zeros[256] = {0};
	size_t len;
	uint8_t *p = image(header, zeros, dlen, &len);
	struct kv_st *st = NULL;
	int rc = kv_st_open_mem(p, len, "case.safetensors", &st);
	int ok = rc == want && st == NULL && strstr(kv_errmsg(), "case.safetensors") && strstr(kv_errmsg(), rule);
	if (!ok)
		fprintf(stderr, "  header %s: rc %d (want %d), message \"%s\" (want \"%s\")\n", header, rc, want,
			kv_errmsg(), rule);
	kv_st_close(st);
	free(p);
	return ok;
}

KT_CASE(dtype_table)
{
	const char *names[] = {"F32", "F16", "BF16", "F64", "I8", "U8", "I16", "U16", "I32", "U32", "I64", "U64",
			       "BOOL", "F8_E4M3", "F8_E5M2"};
	size_t sizes[] = {4, 2, 2, 8, 1, 1, 2, 2, 4, 4, 8, 8, 1, 1, 1};
	for (int i = 0; i < (int)(sizeof names / sizeof names[0]); i++) {
		int dt = kv_dtype_parse(names[i]);
		KT_CHECK(dt >= 0);
		KT_EQ_STR(kv_dtype_name(dt), names[i]);
		KT_EQ_INT(kv_dtype_size(dt), sizes[i]);
	}
	KT_EQ_INT(kv_dtype_parse("F7"), -1);
	KT_EQ_INT(kv_dtype_parse("f32"), -1);
	KT_EQ_INT(kv_dtype_parse(""), -1);
	/* ggml block types have names but are not safetensors dtypes */
	KT_EQ_STR(kv_dtype_name(KV_DT_Q4_K), "Q4_K");
	KT_EQ_INT(kv_dtype_parse("Q4_K"), -1);
	KT_EQ_INT(kv_dtype_size(KV_DT_Q4_K), 0);
	KT_EQ_U64(kv_dtype_row_bytes(KV_DT_Q4_K, 512), 288);
	KT_EQ_U64(kv_dtype_row_bytes(KV_DT_Q4_K, 100), 0);
	KT_EQ_U64(kv_dtype_row_bytes(KV_DT_BF16, 3), 6);
	KT_CHECK(kv_dtype_name(KV_DT__COUNT) == NULL);
	KT_EQ_INT(kv_dtype_size(-1), 0);
}

static uint32_t fbits(float f)
{
	uint32_t x;
	memcpy(&x, &f, 4);
	return x;
}

KT_CASE(half_conversions)
{
	/* bf16: round to nearest even on the dropped 16 bits. */
	KT_EQ_INT(kv_f32_to_bf16(1.0f), 0x3f80);
	KT_EQ_INT(kv_f32_to_bf16(-2.0f), 0xc000);
	float tie_even, tie_odd, above;
	uint32_t x = 0x3f808000u; /* exactly half way, lower half even */
	memcpy(&tie_even, &x, 4);
	x = 0x3f818000u; /* half way, lower half odd -> rounds up */
	memcpy(&tie_odd, &x, 4);
	x = 0x3f808001u;
	memcpy(&above, &x, 4);
	KT_EQ_INT(kv_f32_to_bf16(tie_even), 0x3f80);
	KT_EQ_INT(kv_f32_to_bf16(tie_odd), 0x3f82);
	KT_EQ_INT(kv_f32_to_bf16(above), 0x3f81);
	KT_EQ_INT(kv_f32_to_bf16(INFINITY), 0x7f80);
	KT_CHECK(isnan(kv_bf16_to_f32(kv_f32_to_bf16(NAN))));
	KT_CHECK(isnan(kv_bf16_to_f32(kv_f32_to_bf16(-NAN))));
	/* Every non-NaN bf16 survives bf16 -> f32 -> bf16. */
	int bad = 0;
	for (uint32_t h = 0; h < 65536; h++) {
		float f = kv_bf16_to_f32((uint16_t)h);
		if (isnan(f))
			continue;
		if (kv_f32_to_bf16(f) != h || fbits(f) != h << 16)
			bad++;
	}
	KT_EQ_INT(bad, 0);

	/* f16: known values, subnormals, overflow, ties. */
	KT_EQ_INT(kv_f32_to_f16(1.0f), 0x3c00);
	KT_EQ_INT(kv_f32_to_f16(-2.5f), 0xc100);
	KT_EQ_INT(kv_f32_to_f16(65504.0f), 0x7bff);
	KT_EQ_INT(kv_f32_to_f16(65519.0f), 0x7bff);
	KT_EQ_INT(kv_f32_to_f16(65520.0f), 0x7c00); /* rounds to inf */
	KT_EQ_INT(kv_f32_to_f16(0x1p-24f), 0x0001);
	KT_EQ_INT(kv_f32_to_f16(0x1p-25f), 0x0000);	  /* tie -> even (0) */
	KT_EQ_INT(kv_f32_to_f16(0x1.8p-25f), 0x0001);	  /* above the tie */
	KT_EQ_INT(kv_f32_to_f16(0x1.8p-24f), 0x0002);	  /* 1.5 ulp: tie -> even 2 */
	KT_EQ_INT(kv_f32_to_f16(0x1p-14f), 0x0400);	  /* smallest normal */
	KT_EQ_INT(kv_f32_to_f16(-0.0f), 0x8000);
	KT_EQ_INT(kv_f32_to_f16(1.0f + 0x1p-11f), 0x3c00); /* tie -> even */
	KT_EQ_INT(kv_f32_to_f16(1.0f + 0x1.8p-11f), 0x3c01);
	KT_CHECK(isnan(kv_f16_to_f32(kv_f32_to_f16(NAN))));
	KT_CHECK(kv_f16_to_f32(0x7c00) == INFINITY);
	KT_CHECK(kv_f16_to_f32(0x0001) == 0x1p-24f);
	bad = 0;
	for (uint32_t h = 0; h < 65536; h++) {
		float f = kv_f16_to_f32((uint16_t)h);
		if (isnan(f))
			continue;
		if (kv_f32_to_f16(f) != h)
			bad++;
	}
	KT_EQ_INT(bad, 0);
	/* f16 conversion agrees with the compiler's _Float16 where we have it. */
#if defined(__FLT16_MAX__) && !defined(__clang__)
	uint64_t s = 1;
	bad = 0;
	for (int i = 0; i < 200000; i++) {
		uint32_t r = (uint32_t)kt_rand(&s);
		float f;
		memcpy(&f, &r, 4);
		if (isnan(f))
			continue;
		_Float16 g = (_Float16)f;
		uint16_t gb;
		memcpy(&gb, &g, 2);
		if (kv_f32_to_f16(f) != gb)
			bad++;
	}
	KT_EQ_INT(bad, 0);
#endif
}

/* Tensors of every kind used by the round trips. */
struct rt {
	float f32[6];
	uint16_t bf16[5];
	uint16_t f16[3];
	int32_t i32[4];
	int64_t i64[2];
	uint8_t u8[7];
	uint8_t b[3];
	double f64[2];
	float scalar;
};

static void rt_fill(struct rt *r)
{
	for (int i = 0; i < 6; i++)
		r->f32[i] = (float)i * 1.5f - 2.0f;
	for (int i = 0; i < 5; i++)
		r->bf16[i] = kv_f32_to_bf16((float)i / 4.0f - 0.5f);
	for (int i = 0; i < 3; i++)
		r->f16[i] = kv_f32_to_f16((float)i * 0.125f + 3.0f);
	for (int i = 0; i < 4; i++)
		r->i32[i] = -7 * i + 3;
	r->i64[0] = -5;
	r->i64[1] = 1ll << 40;
	for (int i = 0; i < 7; i++)
		r->u8[i] = (uint8_t)(200 + i);
	r->b[0] = 1, r->b[1] = 0, r->b[2] = 1;
	r->f64[0] = 0.25, r->f64[1] = -1e3;
	r->scalar = 42.0f;
}

static struct kv_stw *rt_writer(const struct rt *r)
{
	struct kv_stw *w = kv_stw_create();
	int64_t s23[] = {2, 3}, s5[] = {5}, s3[] = {3}, s22[] = {2, 2}, s2[] = {2}, s7[] = {1, 7}, s0[] = {4, 0};
	if (!w)
		return NULL;
	if (kv_stw_add(w, "a.f32", KV_DT_F32, 2, s23, r->f32, sizeof r->f32) ||
	    kv_stw_add(w, "b.bf16", KV_DT_BF16, 1, s5, r->bf16, sizeof r->bf16) ||
	    kv_stw_add(w, "c.f16", KV_DT_F16, 1, s3, r->f16, sizeof r->f16) ||
	    kv_stw_add(w, "d.i32", KV_DT_I32, 2, s22, r->i32, sizeof r->i32) ||
	    kv_stw_add(w, "e.i64", KV_DT_I64, 1, s2, r->i64, sizeof r->i64) ||
	    kv_stw_add(w, "f.u8", KV_DT_U8, 2, s7, r->u8, sizeof r->u8) ||
	    kv_stw_add(w, "g.bool", KV_DT_BOOL, 1, s3, r->b, sizeof r->b) ||
	    kv_stw_add(w, "h.f64", KV_DT_F64, 1, s2, r->f64, sizeof r->f64) ||
	    kv_stw_add(w, "i.scalar", KV_DT_F32, 0, NULL, &r->scalar, 4) ||
	    kv_stw_add(w, "j.empty", KV_DT_F32, 2, s0, NULL, 0) || kv_stw_add(w, "k.\"quoted\"\\name\n", KV_DT_U8, 1,
									   (int64_t[]){1}, r->u8, 1) ||
	    kv_stw_meta(w, "format", "pt") || kv_stw_meta(w, "note", "h\u00e9llo \"q\"\n") ||
	    kv_stw_meta(w, "format", "pt2")) {
		kv_stw_destroy(w);
		return NULL;
	}
	return w;
}

static void rt_check(const struct kv_st *st, const struct rt *r)
{
	const struct kv_tensor *t;
	float buf[8];
	KT_EQ_INT(kv_st_count(st), 11);
	KT_EQ_INT(kv_st_meta_count(st), 2);
	KT_EQ_STR(kv_st_meta(st, "format"), "pt2");
	KT_EQ_STR(kv_st_meta(st, "note"), "h\u00e9llo \"q\"\n");
	KT_CHECK(kv_st_meta(st, "absent") == NULL);
	const char *k, *v;
	KT_OK(kv_st_meta_at(st, 0, &k, &v));
	KT_EQ_STR(k, "format");
	KT_CHECK(kv_st_meta_at(st, 2, &k, &v) != KV_OK);
	/* Our writer: header a multiple of 8, data section 64-byte aligned. */
	KT_EQ_INT(kv_st_header_len(st) % 8, 0);
	KT_EQ_INT((8 + kv_st_header_len(st)) % 64, 0);

	KT_REQUIRE((t = kv_st_find(st, "a.f32")) != NULL);
	KT_EQ_INT(t->dtype, KV_DT_F32);
	KT_EQ_INT(t->ndim, 2);
	KT_EQ_INT(t->shape[0], 2);
	KT_EQ_INT(t->shape[1], 3);
	KT_EQ_INT(t->numel, 6);
	KT_EQ_INT(t->nbytes, 24);
	KT_CHECK(!memcmp(t->data, r->f32, 24));
	KT_CHECK(kv_tensor_f32(t) != NULL);
	KT_CHECK(kv_tensor_bf16(t) == NULL); /* wrong dtype */
	KT_CHECK(strstr(kv_errmsg(), "a.f32") != NULL);
	KT_CHECK(kv_tensor_getf(t, 5) == r->f32[5]);
	KT_CHECK(kv_tensor_getf(t, 6) == 0.0f); /* out of range */
	int64_t want[] = {2, 3}, wrong[] = {3, 2};
	KT_OK(kv_tensor_expect(t, KV_DT_F32, 2, want));
	KT_EQ_INT(kv_tensor_expect(t, KV_DT_F32, 2, wrong), KV_ERR_INCOMPATIBLE);
	KT_CHECK(strstr(kv_errmsg(), "[2, 3]") && strstr(kv_errmsg(), "[3, 2]"));
	KT_EQ_INT(kv_tensor_expect(t, KV_DT_BF16, 2, want), KV_ERR_INCOMPATIBLE);

	KT_REQUIRE((t = kv_st_find(st, "b.bf16")) != NULL);
	KT_CHECK(kv_tensor_bf16(t) != NULL);
	KT_OK(kv_tensor_to_f32(t, buf, 0, 5));
	for (int i = 0; i < 5; i++)
		KT_CHECK(buf[i] == (float)i / 4.0f - 0.5f);
	KT_EQ_INT(kv_tensor_to_f32(t, buf, 3, 3), KV_ERR_INVALID); /* past numel */

	KT_REQUIRE((t = kv_st_find(st, "c.f16")) != NULL);
	KT_CHECK(kv_tensor_f16(t) != NULL);
	KT_OK(kv_tensor_to_f32(t, buf, 1, 2));
	KT_CHECK(buf[0] == 3.125f && buf[1] == 3.25f);

	KT_REQUIRE((t = kv_st_find(st, "d.i32")) != NULL);
	KT_CHECK(kv_tensor_i32(t) != NULL && kv_tensor_i32(t)[3] == r->i32[3]);
	KT_CHECK(kv_tensor_getf(t, 2) == -11.0f);
	KT_EQ_INT(kv_tensor_to_f32(t, buf, 0, 1), KV_ERR_INVALID); /* not a float type */
	KT_REQUIRE((t = kv_st_find(st, "e.i64")) != NULL);
	KT_CHECK(kv_tensor_i64(t) != NULL && kv_tensor_i64(t)[1] == (1ll << 40));
	KT_REQUIRE((t = kv_st_find(st, "f.u8")) != NULL);
	KT_CHECK(kv_tensor_u8(t) != NULL && kv_tensor_u8(t)[6] == 206);
	KT_REQUIRE((t = kv_st_find(st, "g.bool")) != NULL);
	KT_CHECK(kv_tensor_getf(t, 0) == 1.0f && kv_tensor_getf(t, 1) == 0.0f);
	KT_REQUIRE((t = kv_st_find(st, "h.f64")) != NULL);
	KT_CHECK(kv_tensor_getf(t, 1) == -1000.0f);
	KT_REQUIRE((t = kv_st_find(st, "i.scalar")) != NULL);
	KT_EQ_INT(t->ndim, 0);
	KT_EQ_INT(t->numel, 1);
	KT_CHECK(kv_tensor_getf(t, 0) == 42.0f);
	KT_REQUIRE((t = kv_st_find(st, "j.empty")) != NULL);
	KT_EQ_INT(t->numel, 0);
	KT_EQ_INT(t->nbytes, 0);
	KT_REQUIRE((t = kv_st_find(st, "k.\"quoted\"\\name\n")) != NULL);
	KT_EQ_INT(t->nbytes, 1);
	KT_CHECK(kv_st_find(st, "nope") == NULL);
	/* Order of the file is the order of adding. */
	KT_EQ_STR(kv_st_tensor(st, 0)->name, "a.f32");
	KT_EQ_STR(kv_st_tensor(st, 10)->name, "k.\"quoted\"\\name\n");
	KT_CHECK(kv_st_tensor(st, 11) == NULL);
	/* Contiguous, no gaps: what the official library demands. */
	uint64_t end = 8 + kv_st_header_len(st);
	for (size_t i = 0; i < kv_st_count(st); i++) {
		t = kv_st_tensor(st, i);
		KT_EQ_U64(t->offset, end);
		end += t->nbytes;
	}
	KT_EQ_U64(end, kv_st_file_size(st));
}

KT_CASE(roundtrip_memory)
{
	struct rt r;
	struct kv_stw *w;
	struct kv_st *st;
	void *p;
	size_t len;
	rt_fill(&r);
	KT_REQUIRE((w = rt_writer(&r)) != NULL);
	KT_OK(kv_stw_to_mem(w, &p, &len));
	KT_EQ_U64(kv_stw_size(w), len);
	kv_stw_destroy(w);
	KT_OK(kv_st_open_mem(p, len, "mem", &st));
	if (st) {
		rt_check(st, &r);
		kv_st_close(st);
	}
	free(p);
}

static int count_files(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	int n = 0;
	if (!d)
		return -1;
	while ((e = readdir(d)))
		if (e->d_name[0] != '.')
			n++;
	closedir(d);
	return n;
}

struct big_fill {
	uint64_t calls;
};

static int fill_ramp(void *ctx, void *dst, uint64_t nbytes)
{
	struct big_fill *f = ctx;
	float *v = dst;
	f->calls++;
	for (uint64_t i = 0; i < nbytes / 4; i++)
		v[i] = (float)i;
	return KV_OK;
}

KT_CASE(roundtrip_file)
{
	struct rt r;
	struct kv_stw *w;
	struct kv_st *st;
	char path[600];
	const struct kv_tensor *t;
	struct big_fill bf = {0};
	/* A large tensor goes out directly, small ones through the stage. */
	size_t nbig = 300000;
	float *big = malloc(nbig * sizeof *big);
	KT_REQUIRE(big != NULL);
	for (size_t i = 0; i < nbig; i++)
		big[i] = (float)i * 0.5f;
	rt_fill(&r);
	KT_REQUIRE((w = rt_writer(&r)) != NULL);
	KT_OK(kv_stw_add(w, "l.big", KV_DT_F32, 1, (int64_t[]){(int64_t)nbig}, big, nbig * 4));
	KT_OK(kv_stw_add_fill(w, "m.fill", KV_DT_F32, 2, (int64_t[]){100, 1000}, fill_ramp, &bf));
	snprintf(path, sizeof path, "%s/x.safetensors", kt_tmpdir());
	KT_OK(kv_stw_write(w, path, 0));
	uint64_t want_size = kv_stw_size(w);
	kv_stw_destroy(w);
	KT_EQ_INT(bf.calls, 1);
	KT_EQ_INT(count_files(kt_tmpdir()), 1); /* no temp file left */
	struct stat sb;
	KT_CHECK(stat(path, &sb) == 0 && (uint64_t)sb.st_size == want_size);
	KT_OK(kv_st_open(path, &st));
	if (st) {
		KT_EQ_INT(kv_st_count(st), 13);
		KT_REQUIRE((t = kv_st_find(st, "l.big")) != NULL);
		KT_CHECK(!memcmp(t->data, big, nbig * 4));
		KT_REQUIRE((t = kv_st_find(st, "m.fill")) != NULL);
		KT_CHECK(kv_tensor_getf(t, 99999) == 99999.0f);
		/* The first tensor starts the 64-byte aligned data section. */
		KT_CHECK(((uintptr_t)kv_st_tensor(st, 0)->data % 64) == 0);
		KT_EQ_STR(t->file, path);
		kv_st_close(st);
	}
	free(big);
}

/* A file with an unpadded header (other writers): N = 37 puts the data at
 * offset 45, so f32 and bf16 views are misaligned. */
KT_CASE(unaligned_by_hand)
{
	float f[3] = {1.25f, -3.5f, 1e-3f};
	uint16_t h[2] = {kv_f32_to_bf16(0.5f), kv_f32_to_bf16(-8.0f)};
	uint8_t data[20];
	const char *hdr = "{\"f\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,12]},"
			  "\"h\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[13,17]}}";
	size_t len;
	uint8_t *img;
	struct kv_st *st;
	const struct kv_tensor *t;
	float out[3];
	char path[600];

	memcpy(data, f, 12);
	data[12] = 0xee; /* a gap byte: allowed, nothing claims it */
	memcpy(data + 13, h, 4);
	/* Header length 135: data starts at 143, odd. */
	img = image(hdr, data, 17, &len);
	KT_REQUIRE(img != NULL);
	KT_EQ_INT((8 + strlen(hdr)) % 2, 1);
	/* At an even address the data lands on an odd one. */
	uint8_t *mis = malloc(len + 2);
	memcpy(mis + 2, img, len);
	KT_OK(kv_st_open_mem(mis + 2, len, "hand.safetensors", &st));
	if (st) {
		KT_REQUIRE((t = kv_st_find(st, "f")) != NULL);
		KT_CHECK(!kv_tensor_is_aligned(t));
		KT_CHECK(kv_tensor_f32(t) == NULL);
		KT_CHECK(strstr(kv_errmsg(), "aligned") != NULL);
		KT_CHECK(kv_tensor_getf(t, 0) == 1.25f && kv_tensor_getf(t, 2) == 1e-3f);
		KT_OK(kv_tensor_to_f32(t, out, 0, 3));
		KT_CHECK(out[1] == -3.5f);
		float *dup = kv_tensor_dup(t, KV_MEM_OTHER);
		KT_CHECK(dup && ((uintptr_t)dup % 64) == 0 && dup[2] == 1e-3f);
		kv_free(dup);
		KT_REQUIRE((t = kv_st_find(st, "h")) != NULL);
		KT_CHECK(kv_tensor_getf(t, 1) == -8.0f);
		KT_OK(kv_tensor_to_f32(t, out, 0, 2));
		KT_CHECK(out[0] == 0.5f);
		kv_st_close(st);
	}
	/* Same bytes from a file (the mapping is page aligned, data is not). */
	snprintf(path, sizeof path, "%s/hand.safetensors", kt_tmpdir());
	KT_OK(kv_durable_write(path, img, len, KV_DW_NO_SYNC));
	KT_OK(kv_st_open(path, &st));
	if (st) {
		KT_REQUIRE((t = kv_st_find(st, "f")) != NULL);
		KT_CHECK(!kv_tensor_is_aligned(t));
		KT_CHECK(kv_tensor_getf(t, 1) == -3.5f);
		kv_st_close(st);
	}
	free(mis);
	free(img);
}

KT_CASE(writer_rejects)
{
	struct kv_stw *w = kv_stw_create();
	float x[4] = {0};
	int64_t s4[] = {4}, neg[] = {-1}, s9[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
	KT_REQUIRE(w != NULL);
	KT_OK(kv_stw_add(w, "x", KV_DT_F32, 1, s4, x, 16));
	KT_EQ_INT(kv_stw_add(w, "x", KV_DT_F32, 1, s4, x, 16), KV_ERR_INVALID);
	KT_CHECK(strstr(kv_errmsg(), "duplicate") != NULL);
	KT_EQ_INT(kv_stw_add(w, "y", KV_DT_F32, 1, s4, x, 12), KV_ERR_INVALID);
	KT_CHECK(strstr(kv_errmsg(), "12 bytes") != NULL);
	KT_EQ_INT(kv_stw_add(w, "y", 99, 1, s4, x, 16), KV_ERR_INVALID);
	KT_EQ_INT(kv_stw_add(w, "y", KV_DT_F32, 1, neg, x, 16), KV_ERR_INVALID);
	KT_EQ_INT(kv_stw_add(w, "y", KV_DT_F32, 9, s9, x, 4), KV_ERR_INVALID);
	KT_EQ_INT(kv_stw_add(w, "__metadata__", KV_DT_F32, 1, s4, x, 16), KV_ERR_INVALID);
	KT_EQ_INT(kv_stw_add(w, "", KV_DT_F32, 1, s4, x, 16), KV_ERR_INVALID);
	KT_EQ_INT(kv_stw_add(w, "bad\xff", KV_DT_F32, 1, s4, x, 16), KV_ERR_INVALID);
	KT_EQ_INT(kv_stw_add(w, "y", KV_DT_F32, 1, s4, NULL, 16), KV_ERR_INVALID);
	KT_EQ_INT(kv_stw_add_fill(w, "y", KV_DT_F32, 1, s4, NULL, NULL), KV_ERR_INVALID);
	KT_EQ_INT(kv_stw_meta(w, "k", "\xc0\x80"), KV_ERR_INVALID); /* overlong NUL */
	KT_EQ_INT(kv_stw_meta(w, "k", "\xed\xa0\x80"), KV_ERR_INVALID); /* surrogate */
	kv_stw_destroy(w);
}

static int fill_fails(void *ctx, void *dst, uint64_t nbytes)
{
	(void)ctx;
	(void)dst;
	(void)nbytes;
	return kv_fail(KV_ERR_IO, "generator broke");
}

KT_CASE(writer_failures_leave_nothing)
{
	struct kv_stw *w = kv_stw_create();
	char path[600];
	float big[70000] = {0};
	KT_REQUIRE(w != NULL);
	snprintf(path, sizeof path, "%s/f.safetensors", kt_tmpdir());
	KT_OK(kv_stw_add(w, "a", KV_DT_F32, 1, (int64_t[]){70000}, big, sizeof big));
	KT_OK(kv_stw_add_fill(w, "b", KV_DT_F32, 1, (int64_t[]){4}, fill_fails, NULL));
	KT_EQ_INT(kv_stw_write(w, path, KV_DW_NO_SYNC), KV_ERR_IO);
	KT_CHECK(strstr(kv_errmsg(), "generator broke") != NULL);
	KT_EQ_INT(count_files(kt_tmpdir()), 0);
	kv_stw_destroy(w);

	/* ENOSPC on the second write: KV_ERR_FULL, no file, no temp file. */
	w = kv_stw_create();
	KT_OK(kv_stw_add(w, "a", KV_DT_F32, 1, (int64_t[]){70000}, big, sizeof big));
	struct kv_io_fault f = {.ops = KV_IO_BIT(KV_IO_PWRITE), .err = ENOSPC, .after = 1, .count = 0};
	kv_io_fault_set(&f);
	int rc = kv_stw_write(w, path, 0);
	kv_io_fault_set(NULL);
	KT_EQ_INT(rc, KV_ERR_FULL);
	KT_EQ_INT(count_files(kt_tmpdir()), 0);
	/* A failed fdatasync: the object does not exist. */
	struct kv_io_fault g = {.ops = KV_IO_BIT(KV_IO_FDATASYNC), .err = EIO};
	kv_io_fault_set(&g);
	rc = kv_stw_write(w, path, 0);
	kv_io_fault_set(NULL);
	KT_EQ_INT(rc, KV_ERR_IO);
	KT_EQ_INT(count_files(kt_tmpdir()), 0);
	/* And the reader's length word read goes through the I/O table. */
	KT_OK(kv_stw_write(w, path, KV_DW_NO_SYNC));
	struct kv_io_fault h = {.ops = KV_IO_BIT(KV_IO_PREAD), .err = EIO};
	struct kv_st *st = NULL;
	kv_io_fault_set(&h);
	rc = kv_st_open(path, &st);
	kv_io_fault_set(NULL);
	KT_EQ_INT(rc, KV_ERR_IO);
	KT_CHECK(st == NULL);
	kv_stw_destroy(w);
}

KT_CASE(validation_errors)
{
	uint64_t corrupt0 = kv_corrupt_count();
	const int C = KV_ERR_CORRUPT;
	/* Each header breaks one rule. */
	KT_CHECK(expect_err("[]", 0, C, "not a JSON object"));
	KT_CHECK(expect_err("\"x\"", 0, C, "not a JSON object"));
	KT_CHECK(expect_err("  5", 0, C, "not a JSON object"));
	KT_CHECK(expect_err("{\"a\":", 0, C, "not valid JSON"));
	KT_CHECK(expect_err("{} x", 0, C, "not valid JSON"));
	KT_CHECK(expect_err("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
			    "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
			    8, C, "duplicate"));
	KT_CHECK(expect_err("{\"a\":{\"dtype\":\"F7\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, C,
			    "unknown dtype 'F7'"));
	KT_CHECK(expect_err("{\"a\":{\"dtype\":3,\"shape\":[1],\"data_offsets\":[0,4]}}", 4, C, "dtype"));
	KT_CHECK(expect_err("{\"a\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, C, "dtype missing"));
	KT_CHECK(expect_err("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", 8, C,
			    "shape x F32 needs 2 elements"));
	KT_CHECK(expect_err("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8, C,
			    "8 bytes in data_offsets"));
	KT_CHECK(expect_err("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 6, C,
			    "past the data section of 6 bytes"));
	KT_CHECK(expect_err("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,4]}}", 8, C,
			    "end before begin"));
	KT_CHECK(expect_err("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
			    "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
			    8, C, "overlap"));
	KT_CHECK(expect_err("{\"b\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[5,8]},"
			    "\"a\":{\"dtype\":\"U8\",\"shape\":[6],\"data_offsets\":[0,6]}}",
			    8, C, "overlap"));
	KT_CHECK(expect_err("{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4, C, "shape[0]"));
	KT_CHECK(expect_err("{\"a\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}", 4, C, "shape[0]"));
	KT_CHECK(expect_err("{\"a\":{\"dtype\":\"F32\",\"shape\":\"1\",\"data_offsets\":[0,4]}}", 4, C, "shape"));
	KT_CHECK(expect_err("{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4, C,
			    "9 dims"));
	KT_CHECK(expect_err("{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,4]}}", 4,
			    C, "overflows"));
	KT_CHECK(expect_err("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 4, C, "data_offsets"));
	KT_CHECK(expect_err("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,-4]}}", 4, C,
			    "data_offsets"));
	KT_CHECK(expect_err("{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, C, "data_offsets"));
	KT_CHECK(expect_err("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,99999999999999999999]}}", 4,
			    C, "not valid JSON"));
	KT_CHECK(expect_err("{\"a\":[1,2]}", 0, C, "entry is not an object"));
	KT_CHECK(expect_err("{\"__metadata__\":[1]}", 0, C, "__metadata__ is not an object"));
	KT_CHECK(expect_err("{\"__metadata__\":{\"k\":1}}", 0, C, "__metadata__ value of 'k'"));
	KT_CHECK(expect_err("{\"__metadata__\":{\"k\":{\"x\":\"y\"}}}", 0, C, "__metadata__ value"));
	KT_CHECK(expect_err("{\"a\\u0000b\":{}}", 0, C, "not valid JSON"));
	KT_CHECK(expect_err("{\"a\":[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]}", 0, C, "nested"));
	KT_CHECK(expect_err("{\"\xff\":1}", 0, C, "not valid JSON"));

	/* Length word cases, built by hand. */
	struct kv_st *st = NULL;
	uint8_t b[64] = {0};
	KT_EQ_INT(kv_st_open_mem(b, 0, "case.safetensors", &st), C);
	KT_CHECK(strstr(kv_errmsg(), "too short") && strstr(kv_errmsg(), "case.safetensors"));
	KT_EQ_INT(kv_st_open_mem(b, 7, "case.safetensors", &st), C);
	KT_CHECK(strstr(kv_errmsg(), "too short"));
	b[0] = 1; /* N = 1: tiny */
	KT_EQ_INT(kv_st_open_mem(b, 16, "case.safetensors", &st), C);
	KT_CHECK(strstr(kv_errmsg(), "too small"));
	b[0] = 0; /* N = 0 */
	KT_EQ_INT(kv_st_open_mem(b, 16, "case.safetensors", &st), C);
	KT_CHECK(strstr(kv_errmsg(), "too small"));
	for (int i = 0; i < 8; i++)
		b[i] = 0xff; /* huge */
	KT_EQ_INT(kv_st_open_mem(b, 64, "case.safetensors", &st), C);
	KT_CHECK(strstr(kv_errmsg(), "exceeds the limit"));
	memset(b, 0, 8);
	b[0] = 0x01, b[3] = 0x06; /* 100 MiB + 1 */
	uint64_t n = ((uint64_t)KV_ST_MAX_HEADER) + 1;
	for (int i = 0; i < 8; i++)
		b[i] = (uint8_t)(n >> (8 * i));
	KT_EQ_INT(kv_st_open_mem(b, 64, "case.safetensors", &st), C);
	KT_CHECK(strstr(kv_errmsg(), "exceeds the limit"));
	memset(b, 0, 8);
	b[0] = 60; /* header runs past the end: truncated file */
	KT_EQ_INT(kv_st_open_mem(b, 64, "case.safetensors", &st), C);
	KT_CHECK(strstr(kv_errmsg(), "past the end"));
	KT_CHECK(st == NULL);

	/* A valid file cut short anywhere is refused. */
	{
		struct rt r;
		struct kv_stw *w;
		void *p;
		size_t len;
		int bad = 0;
		rt_fill(&r);
		KT_REQUIRE((w = rt_writer(&r)) != NULL);
		KT_OK(kv_stw_to_mem(w, &p, &len));
		kv_stw_destroy(w);
		for (size_t cut = 0; cut < len; cut++) {
			if (kv_st_open_mem(p, cut, "cut", &st) != C || st)
				bad++;
			kv_st_close(st);
			st = NULL;
		}
		KT_EQ_INT(bad, 0);
		free(p);
	}
	/* Every report was counted for /metrics. */
	KT_CHECK(kv_corrupt_count() > corrupt0 + 40);
}

KT_CASE(open_errors)
{
	struct kv_st *st = NULL;
	char path[600];
	KT_EQ_INT(kv_st_open("/nonexistent/x.safetensors", &st), KV_ERR_NOT_FOUND);
	KT_CHECK(strstr(kv_errmsg(), "/nonexistent/x.safetensors") != NULL);
	KT_EQ_INT(kv_st_open(kt_tmpdir(), &st), KV_ERR_INVALID);
	snprintf(path, sizeof path, "%s/empty.safetensors", kt_tmpdir());
	KT_OK(kv_durable_write(path, "", 0, KV_DW_NO_SYNC));
	KT_EQ_INT(kv_st_open(path, &st), KV_ERR_CORRUPT);
	KT_CHECK(strstr(kv_errmsg(), "empty.safetensors") && strstr(kv_errmsg(), "too short"));
	KT_CHECK(st == NULL);
}

/* Write one shard holding the given tensor names (F32 [2] each). */
static int write_shard(const char *dir, const char *file, const char **names, int n, float base)
{
	struct kv_stw *w = kv_stw_create();
	static float vals[16][2];
	char path[700];
	int rc = KV_OK;
	for (int i = 0; i < n && !rc; i++) {
		vals[i][0] = base + (float)i;
		vals[i][1] = -base - (float)i;
		rc = kv_stw_add(w, names[i], KV_DT_F32, 1, (int64_t[]){2}, vals[i], 8);
	}
	snprintf(path, sizeof path, "%s/%s", dir, file);
	if (!rc)
		rc = kv_stw_write(w, path, KV_DW_NO_SYNC);
	kv_stw_destroy(w);
	return rc;
}

static int write_text(const char *dir, const char *file, const char *text)
{
	char path[700];
	snprintf(path, sizeof path, "%s/%s", dir, file);
	return kv_durable_write(path, text, strlen(text), KV_DW_NO_SYNC);
}

KT_CASE(sharded_index)
{
	const char *d = kt_tmpdir();
	const char *s1[] = {"model.embed_tokens.weight", "model.layers.0.mlp.up_proj.weight"};
	const char *s2[] = {"model.norm.weight", "lm_head.weight", "extra.not.in.index"};
	struct kv_weights *w = NULL;
	const struct kv_tensor *t;
	uint64_t mem0 = kv_mem_used(KV_MEM_WEIGHTS);

	KT_EQ_INT(kv_weights_open(d, &w), KV_ERR_NOT_FOUND);
	KT_CHECK(strstr(kv_errmsg(), "model.safetensors") != NULL);
	KT_OK(write_shard(d, "model-00001-of-00002.safetensors", s1, 2, 1.0f));
	KT_OK(write_shard(d, "model-00002-of-00002.safetensors", s2, 3, 10.0f));
	KT_OK(write_text(d, "model.safetensors.index.json",
			 "{\"metadata\": {\"total_size\": 40}, \"weight_map\": {"
			 "\"lm_head.weight\": \"model-00002-of-00002.safetensors\","
			 "\"model.embed_tokens.weight\": \"model-00001-of-00002.safetensors\","
			 "\"model.layers.0.mlp.up_proj.weight\": \"model-00001-of-00002.safetensors\","
			 "\"model.norm.weight\": \"model-00002-of-00002.safetensors\"}}"));
	KT_OK(kv_weights_open(d, &w));
	KT_REQUIRE(w != NULL);
	KT_EQ_INT(kv_weights_nfiles(w), 2);
	KT_EQ_INT(kv_weights_count(w), 5);
	KT_EQ_U64(kv_weights_bytes(w), 40);
	KT_CHECK(kv_mem_used(KV_MEM_WEIGHTS) > mem0);
	KT_REQUIRE((t = kv_weights_find(w, "model.norm.weight")) != NULL);
	KT_CHECK(kv_tensor_getf(t, 1) == -10.0f);
	KT_CHECK(strstr(t->file, "model-00002-of-00002.safetensors") != NULL);
	KT_REQUIRE((t = kv_weights_find(w, "model.layers.0.mlp.up_proj.weight")) != NULL);
	KT_CHECK(kv_tensor_getf(t, 0) == 2.0f);
	KT_CHECK(kv_weights_find(w, "nope") == NULL);
	KT_CHECK(kv_weights_at(w, 0) != NULL && kv_weights_at(w, 5) == NULL);
	kv_weights_close(w);
	KT_EQ_U64(kv_mem_used(KV_MEM_WEIGHTS), mem0);

	/* The index names a tensor its shard lacks. */
	KT_OK(write_text(d, "model.safetensors.index.json",
			 "{\"weight_map\": {\"model.norm.weight\": \"model-00001-of-00002.safetensors\"}}"));
	KT_EQ_INT(kv_weights_open(d, &w), KV_ERR_CORRUPT);
	KT_CHECK(strstr(kv_errmsg(), "model.safetensors.index.json") && strstr(kv_errmsg(), "model.norm.weight"));
	/* A shard that is missing. */
	KT_OK(write_text(d, "model.safetensors.index.json",
			 "{\"weight_map\": {\"a\": \"model-00009-of-00009.safetensors\"}}"));
	KT_EQ_INT(kv_weights_open(d, &w), KV_ERR_NOT_FOUND);
	KT_CHECK(strstr(kv_errmsg(), "model-00009-of-00009.safetensors") != NULL);
	/* A path outside the folder. */
	KT_OK(write_text(d, "model.safetensors.index.json", "{\"weight_map\": {\"a\": \"../evil.safetensors\"}}"));
	KT_EQ_INT(kv_weights_open(d, &w), KV_ERR_CORRUPT);
	KT_CHECK(strstr(kv_errmsg(), "plain file name") != NULL);
	/* Not JSON, no weight_map, empty weight_map, a non-string value. */
	KT_OK(write_text(d, "model.safetensors.index.json", "{\"weight_map\": "));
	KT_EQ_INT(kv_weights_open(d, &w), KV_ERR_CORRUPT);
	KT_OK(write_text(d, "model.safetensors.index.json", "{\"metadata\": {}}"));
	KT_EQ_INT(kv_weights_open(d, &w), KV_ERR_CORRUPT);
	KT_CHECK(strstr(kv_errmsg(), "weight_map") != NULL);
	KT_OK(write_text(d, "model.safetensors.index.json", "{\"weight_map\": {}}"));
	KT_EQ_INT(kv_weights_open(d, &w), KV_ERR_CORRUPT);
	KT_OK(write_text(d, "model.safetensors.index.json", "{\"weight_map\": {\"a\": 3}}"));
	KT_EQ_INT(kv_weights_open(d, &w), KV_ERR_CORRUPT);
	/* The same tensor in two shards. */
	const char *dup[] = {"model.norm.weight"};
	KT_OK(write_shard(d, "model-00003.safetensors", dup, 1, 5.0f));
	KT_OK(write_text(d, "model.safetensors.index.json",
			 "{\"weight_map\": {\"model.norm.weight\": \"model-00002-of-00002.safetensors\","
			 "\"x\": \"model-00003.safetensors\"}}"));
	KT_EQ_INT(kv_weights_open(d, &w), KV_ERR_CORRUPT);
	KT_CHECK(strstr(kv_errmsg(), "also in") != NULL);
	/* A corrupt shard is reported with its own name. */
	KT_OK(write_text(d, "model-00001-of-00002.safetensors", "short"));
	KT_OK(write_text(d, "model.safetensors.index.json",
			 "{\"weight_map\": {\"model.embed_tokens.weight\": \"model-00001-of-00002.safetensors\"}}"));
	KT_EQ_INT(kv_weights_open(d, &w), KV_ERR_CORRUPT);
	KT_CHECK(strstr(kv_errmsg(), "model-00001-of-00002.safetensors") && strstr(kv_errmsg(), "too short"));
	KT_EQ_U64(kv_mem_used(KV_MEM_WEIGHTS), mem0);

	/* Without an index: model.safetensors. */
	char p[700];
	snprintf(p, sizeof p, "%s/model.safetensors.index.json", d);
	KT_CHECK(unlink(p) == 0);
	KT_OK(write_shard(d, "model.safetensors", s2, 2, 3.0f));
	KT_OK(kv_weights_open(d, &w));
	if (w) {
		KT_EQ_INT(kv_weights_nfiles(w), 1);
		KT_EQ_INT(kv_weights_count(w), 2);
		KT_CHECK(kv_weights_find(w, "lm_head.weight") != NULL);
		kv_weights_close(w);
	}
}

KT_MAIN(dtype_table, half_conversions, roundtrip_memory, roundtrip_file, unaligned_by_hand, writer_rejects,
	writer_failures_leave_nothing, validation_errors, open_errors, sharded_index)
