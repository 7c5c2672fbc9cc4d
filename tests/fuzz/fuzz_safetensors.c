/*
 * fuzz_safetensors.c - libFuzzer target for the safetensors reader.
 *
 * Any input must either be refused with an error or yield a table whose
 * every entry lies inside the input; then every accessor is exercised and
 * the file is written back with the writer and re-read, which must give
 * the same tensors. A violated invariant traps (a bug of ours, which is
 * what the fuzzer is looking for). `make fuzz` builds it with clang;
 * `make test` replays tests/fuzz/corpus/safetensors through replay.c.
 */
#include "model/safetensors.h"
#include "base/err.h"
#include "base/log.h"
#include "base/mem.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(x) do { if (!(x)) __builtin_trap(); } while (0)

static void roundtrip(const struct kv_st *st)
{
	struct kv_stw *w = kv_stw_create();
	struct kv_st *again = NULL;
	void *p = NULL;
	size_t len = 0;
	if (!w)
		return;
	for (size_t i = 0; i < kv_st_count(st); i++) {
		const struct kv_tensor *t = kv_st_tensor(st, i);
		/* The writer refuses some names the reader accepts (""): skip. */
		if (kv_stw_add(w, t->name, t->dtype, t->ndim, t->shape, t->data, t->nbytes))
			goto out;
	}
	for (size_t i = 0; i < kv_st_meta_count(st); i++) {
		const char *k, *v;
		CHECK(kv_st_meta_at(st, i, &k, &v) == KV_OK);
		if (kv_stw_meta(w, k, v))
			goto out;
	}
	if (kv_stw_to_mem(w, &p, &len))
		goto out;
	CHECK(len == kv_stw_size(w));
	CHECK(kv_st_open_mem(p, len, "fuzz-again", &again) == KV_OK);
	CHECK(kv_st_count(again) == kv_st_count(st));
	for (size_t i = 0; i < kv_st_count(st); i++) {
		const struct kv_tensor *a = kv_st_tensor(st, i), *b = kv_st_find(again, a->name);
		CHECK(b && b->dtype == a->dtype && b->ndim == a->ndim && b->nbytes == a->nbytes);
		CHECK(!a->nbytes || !memcmp(a->data, b->data, a->nbytes));
	}
	CHECK(kv_st_meta_count(again) == kv_st_meta_count(st));
out:
	kv_st_close(again);
	free(p);
	kv_stw_destroy(w);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static int init;
	struct kv_st *st = NULL;
	if (!init) {
		kv_log_set_level(KV_LOG_OFF); /* KV_CORRUPT logs every rejection */
		init = 1;
	}
	if (kv_st_open_mem(data, size, "fuzz", &st) != KV_OK) {
		CHECK(st == NULL);
		return 0;
	}
	CHECK(kv_st_header_len(st) + 8 <= size);
	for (size_t i = 0; i < kv_st_count(st); i++) {
		const struct kv_tensor *t = kv_st_tensor(st, i);
		const uint8_t *p = t->data;
		CHECK(t->offset >= 8 + kv_st_header_len(st));
		CHECK(t->offset <= size && t->nbytes <= size - t->offset);
		CHECK(p == data + t->offset);
		CHECK(t->nbytes == t->numel * kv_dtype_size(t->dtype));
		CHECK(kv_st_find(st, t->name) == t);
		if (t->numel) {
			volatile float f = kv_tensor_getf(t, 0) + kv_tensor_getf(t, t->numel - 1);
			(void)f;
		}
		float buf[64];
		uint64_t n = t->numel < 64 ? t->numel : 64;
		int rc = kv_tensor_to_f32(t, buf, t->numel - n, n);
		CHECK(rc == KV_OK || (t->dtype != KV_DT_F32 && t->dtype != KV_DT_BF16 && t->dtype != KV_DT_F16 &&
				      t->dtype != KV_DT_F64));
		if (kv_tensor_view(t, t->dtype))
			CHECK(kv_tensor_is_aligned(t));
		void *d = kv_tensor_dup(t, KV_MEM_OTHER);
		CHECK(d && (!t->nbytes || !memcmp(d, t->data, t->nbytes)));
		kv_free(d);
	}
	for (size_t i = 0; i < kv_st_meta_count(st); i++) {
		const char *k, *v;
		CHECK(kv_st_meta_at(st, i, &k, &v) == KV_OK && kv_st_meta(st, k));
	}
	roundtrip(st);
	kv_st_close(st);
	return 0;
}
