/*
 * fuzz_gguf.c - libFuzzer target for the GGUF reader and the Qwen mapping.
 *
 * Any input must be refused with an error or yield tables whose every
 * entry lies inside the input; then every tensor is dequantized (first
 * and last block), the metadata getters run, the config, the HF view and
 * the tokenizer conversion are attempted (errors allowed, crashes not),
 * and the file is written back and re-read, which must give the same
 * tensors. `make fuzz` builds it with clang; `make test` replays
 * tests/fuzz/corpus/gguf through replay.c.
 */
#include "model/gguf.h"
#include "model/gguf_model.h"
#include "model/quant.h"
#include "base/err.h"
#include "base/log.h"
#include "base/mem.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(x) do { if (!(x)) __builtin_trap(); } while (0)

static void roundtrip(const struct kv_gguf *g)
{
	struct kv_ggufw *w = kv_ggufw_create();
	struct kv_gguf *again = NULL;
	void *p = NULL;
	size_t len = 0;
	if (!w)
		return;
	for (size_t i = 0; i < kv_gguf_tensor_count(g); i++) {
		const struct kv_tensor *t = kv_gguf_tensor_at(g, i);
		if (kv_ggufw_add(w, t->name, t->dtype, t->ndim, t->shape, t->data, t->nbytes))
			goto out; /* types the writer does not write (I8 ...) */
	}
	if (kv_ggufw_to_mem(w, &p, &len))
		goto out;
	CHECK(kv_gguf_open_mem(p, len, "fuzz-again", &again) == KV_OK);
	CHECK(kv_gguf_tensor_count(again) == kv_gguf_tensor_count(g));
	for (size_t i = 0; i < kv_gguf_tensor_count(g); i++) {
		const struct kv_tensor *a = kv_gguf_tensor_at(g, i), *b = kv_gguf_tensor_find(again, a->name);
		CHECK(b && b->dtype == a->dtype && b->ndim == a->ndim && b->nbytes == a->nbytes);
		CHECK(!memcmp(a->data, b->data, a->nbytes));
	}
out:
	kv_gguf_close(again);
	free(p);
	kv_ggufw_destroy(w);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static int init;
	struct kv_gguf *g = NULL;
	if (!init) {
		kv_log_set_level(KV_LOG_OFF); /* KV_CORRUPT logs every rejection */
		init = 1;
	}
	if (kv_gguf_open_mem(data, size, "fuzz", &g) != KV_OK) {
		CHECK(g == NULL);
		return 0;
	}
	for (size_t i = 0; i < kv_gguf_tensor_count(g); i++) {
		const struct kv_tensor *t = kv_gguf_tensor_at(g, i);
		const uint8_t *p = t->data;
		CHECK(p >= data && t->offset <= size && t->nbytes <= size - t->offset && p == data + t->offset);
		CHECK(kv_gguf_tensor_find(g, t->name) == t);
		int qk = kv_dtype_block_elems(t->dtype);
		CHECK(qk > 0 && t->numel % (uint64_t)qk == 0 && t->shape[t->ndim - 1] % qk == 0);
		float buf[256];
		uint64_t n = (uint64_t)qk;
		if (t->dtype == KV_DT_F32 || t->dtype == KV_DT_F16 || t->dtype == KV_DT_BF16 || kv_dtype_is_quant(t->dtype)) {
			CHECK(kv_tensor_to_f32(t, buf, 0, n) == KV_OK);
			CHECK(kv_tensor_to_f32(t, buf, t->numel - n, n) == KV_OK);
		}
	}
	for (size_t i = 0; i < kv_gguf_kv_count(g); i++) {
		const struct kv_gguf_kv *kv = kv_gguf_kv_at(g, i);
		int64_t v;
		double f;
		char *s = NULL;
		CHECK(kv_gguf_kv_find(g, kv->key) == kv);
		kv_gguf_get_int(g, kv->key, &v);
		kv_gguf_get_float(g, kv->key, &f);
		kv_gguf_get_str(g, kv->key, &s);
		free(s);
		if (kv->type == KV_GGUF_ARR && kv->n)
			kv_gguf_arr_int(kv, kv->n - 1, &v);
	}
	struct kv_model_config c;
	if (kv_gguf_config(g, &c) == KV_OK) {
		struct kv_tensor *hv = NULL;
		size_t nh = 0;
		void *blob = NULL;
		if (kv_gguf_hf_tensors(g, &c, &hv, &nh, &blob) == KV_OK) {
			kv_gguf_hf_free(hv, nh);
			kv_free(blob);
		}
	}
	char *j = NULL;
	size_t jl = 0;
	if (kv_gguf_tokenizer_json(g, &j, &jl) == KV_OK)
		free(j);
	if (kv_gguf_tokenizer_config_json(g, &j, &jl) == KV_OK)
		free(j);
	roundtrip(g);
	kv_gguf_close(g);
	return 0;
}
