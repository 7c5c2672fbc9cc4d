/*
 * genconfig.c - see genconfig.h.
 */
#include "model/genconfig.h"
#include "model/gguf.h"
#include "base/err.h"
#include "base/io.h"
#include "base/json.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const g_names[KV_GC_N] = {"temperature",      "top_p",
					    "top_k",            "min_p",
					    "presence_penalty", "frequency_penalty",
					    "repetition_penalty"};

const char *kv_gencfg_name(int field)
{
	return field >= 0 && field < KV_GC_N ? g_names[field] : NULL;
}

int kv_gencfg_field(const char *name)
{
	for (int i = 0; name && i < KV_GC_N; i++)
		if (!strcmp(g_names[i], name))
			return i;
	return -1;
}

void kv_gencfg_init(struct kv_gencfg *g)
{
	memset(g, 0, sizeof *g);
}

void kv_gencfg_openai(struct kv_gencfg *g)
{
	static const double d[KV_GC_N] = {1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0};
	kv_gencfg_init(g);
	for (int i = 0; i < KV_GC_N; i++) {
		g->v[i] = d[i];
		g->src[i] = "openai";
	}
}

int kv_gencfg_check(int field, double *v)
{
	double x = *v;
	const char *n = kv_gencfg_name(field);
	if (!n)
		return kv_fail(KV_ERR_INVALID, "unknown sampling field %d", field);
	if (!isfinite(x))
		return kv_fail(KV_ERR_INVALID, "%s must be a finite number", n);
	switch (field) {
	case KV_GC_TEMPERATURE:
		if (x < 0)
			return kv_fail(KV_ERR_INVALID, "temperature %g must be >= 0", x);
		break;
	case KV_GC_TOP_P:
		if (!(x > 0 && x <= 1))
			return kv_fail(KV_ERR_INVALID, "top_p %g must be in (0, 1]", x);
		break;
	case KV_GC_TOP_K:
		if (x != floor(x) || x < -1 || x > 2147483647.0)
			return kv_fail(KV_ERR_INVALID, "top_k %g must be an integer >= 0 (0 or -1 = off)", x);
		if (x < 0)
			*v = 0;
		break;
	case KV_GC_MIN_P:
		if (!(x >= 0 && x <= 1))
			return kv_fail(KV_ERR_INVALID, "min_p %g must be in [0, 1]", x);
		break;
	case KV_GC_PRESENCE_PENALTY:
	case KV_GC_FREQUENCY_PENALTY:
		if (!(x >= -2 && x <= 2))
			return kv_fail(KV_ERR_INVALID, "%s %g must be in [-2, 2]", n, x);
		break;
	case KV_GC_REPETITION_PENALTY:
		if (!(x > 0))
			return kv_fail(KV_ERR_INVALID, "repetition_penalty %g must be > 0 (1 = off)", x);
		break;
	}
	return KV_OK;
}

int kv_gencfg_set(struct kv_gencfg *g, int field, double v, const char *source)
{
	int rc = kv_gencfg_check(field, &v);
	if (rc)
		return rc;
	g->v[field] = v;
	g->src[field] = source ? source : "set";
	return KV_OK;
}

int kv_gencfg_set_gguf(struct kv_gencfg *g, const char *key, double v)
{
	static const struct {
		const char *key;
		int field;
	} map[] = {
		{"temp", KV_GC_TEMPERATURE},
		{"top_k", KV_GC_TOP_K},
		{"top_p", KV_GC_TOP_P},
		{"min_p", KV_GC_MIN_P},
		{"penalty_repeat", KV_GC_REPETITION_PENALTY},
		{"penalty_present", KV_GC_PRESENCE_PENALTY},
		{"penalty_freq", KV_GC_FREQUENCY_PENALTY},
	};
	static const char pre[] = "general.sampling.";
	if (!key || strncmp(key, pre, sizeof pre - 1))
		return kv_fail(KV_ERR_NOT_FOUND, "%s is not a general.sampling key", key ? key : "(null)");
	const char *k = key + sizeof pre - 1;
	for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
		if (!strcmp(map[i].key, k)) {
			int rc = kv_gencfg_set(g, map[i].field, v, "gguf");
			return rc ? kv_fail_ctx(rc, "%s", key) : KV_OK;
		}
	return kv_fail(KV_ERR_UNSUPPORTED, "%s is not a sampling setting kvkeep uses", key);
}

static void add_eos(struct kv_gencfg *g, int32_t id)
{
	for (int i = 0; i < g->n_eos; i++)
		if (g->eos_ids[i] == id)
			return;
	if (g->n_eos < KV_GENCFG_MAX_EOS)
		g->eos_ids[g->n_eos++] = id;
}

void kv_gencfg_overlay(struct kv_gencfg *base, const struct kv_gencfg *top)
{
	for (int i = 0; i < KV_GC_N; i++)
		if (top->src[i]) {
			base->v[i] = top->v[i];
			base->src[i] = top->src[i];
		}
	for (int i = 0; i < top->n_eos; i++)
		add_eos(base, top->eos_ids[i]);
}

static int parse_eos(const json_t *v, const char *what, struct kv_gencfg *g)
{
	if (json_is_integer(v)) {
		json_int_t x = json_integer_value(v);
		if (x < 0 || x > INT32_MAX)
			return kv_fail(KV_ERR_INVALID, "%s: eos_token_id %lld is not a token id", what, (long long)x);
		add_eos(g, (int32_t)x);
		return KV_OK;
	}
	if (!json_is_array(v))
		return kv_fail(KV_ERR_INVALID, "%s: eos_token_id must be an integer or a list of integers", what);
	if (json_array_size(v) > KV_GENCFG_MAX_EOS)
		return kv_fail(KV_ERR_INVALID, "%s: eos_token_id lists %zu ids, at most %d are supported", what,
			       json_array_size(v), KV_GENCFG_MAX_EOS);
	for (size_t i = 0; i < json_array_size(v); i++) {
		const json_t *e = json_array_get(v, i);
		if (!json_is_integer(e) || json_integer_value(e) < 0 || json_integer_value(e) > INT32_MAX)
			return kv_fail(KV_ERR_INVALID, "%s: eos_token_id[%zu] is not a token id", what, i);
		add_eos(g, (int32_t)json_integer_value(e));
	}
	return KV_OK;
}

int kv_gencfg_parse(const char *text, size_t len, const char *what, struct kv_gencfg *out)
{
	json_t *root = NULL;
	struct kv_gencfg g;
	int rc;

	kv_gencfg_init(out);
	kv_gencfg_init(&g);
	if ((rc = kv_json_parse(what, text, len, KV_JSON_MAX_DEPTH, &root)))
		return rc;
	if (!json_is_object(root)) {
		rc = kv_fail(KV_ERR_INVALID, "%s: must be a JSON object", what);
		goto out;
	}
	for (int f = 0; f < KV_GC_N; f++) {
		const json_t *v = json_object_get(root, g_names[f]);
		if (!v || json_is_null(v))
			continue;
		if (!json_is_number(v) || (f == KV_GC_TOP_K && !json_is_integer(v))) {
			rc = kv_fail(KV_ERR_INVALID, "%s: %s must be %s", what, g_names[f],
				     f == KV_GC_TOP_K ? "an integer" : "a number");
			goto out;
		}
		if ((rc = kv_gencfg_set(&g, f, json_number_value(v), "generation_config"))) {
			kv_fail_ctx(rc, "%s", what);
			goto out;
		}
	}
	const json_t *ds = json_object_get(root, "do_sample");
	if (ds && !json_is_null(ds)) {
		if (!json_is_boolean(ds)) {
			rc = kv_fail(KV_ERR_INVALID, "%s: do_sample must be true or false", what);
			goto out;
		}
		if (json_is_false(ds)) { /* Hugging Face: no sampling, greedy */
			g.v[KV_GC_TEMPERATURE] = 0.0;
			g.src[KV_GC_TEMPERATURE] = "generation_config";
		}
	}
	const json_t *eos = json_object_get(root, "eos_token_id");
	if (eos && !json_is_null(eos) && (rc = parse_eos(eos, what, &g)))
		goto out;
	*out = g;
	rc = KV_OK;
out:
	json_decref(root);
	return rc;
}

/* A GGUF's general.sampling.* keys (what llama.cpp's converter writes from
 * generation_config.json); keys kvkeep has no field for are skipped. */
static int load_gguf(const char *path, struct kv_gencfg *out)
{
	struct kv_gguf *g = NULL;
	int rc = kv_gguf_open(path, &g);
	if (rc)
		return rc;
	for (size_t i = 0; i < kv_gguf_kv_count(g); i++) {
		const struct kv_gguf_kv *kv = kv_gguf_kv_at(g, i);
		double v;
		int64_t iv;
		if (strncmp(kv->key, "general.sampling.", 17))
			continue;
		if (kv_gguf_get_float(g, kv->key, &v) != KV_OK) {
			if (kv_gguf_get_int(g, kv->key, &iv) != KV_OK)
				continue;
			v = (double)iv;
		}
		rc = kv_gencfg_set_gguf(out, kv->key, v);
		if (rc && rc != KV_ERR_UNSUPPORTED)
			break;
		rc = KV_OK;
	}
	kv_gguf_close(g);
	return rc;
}

int kv_gencfg_load(const char *dir, struct kv_gencfg *out)
{
	char path[4096];
	char *text = NULL;
	size_t len = 0;
	kv_gencfg_init(out);
	if (kv_gguf_is_model_path(dir))
		return load_gguf(dir, out);
	if ((size_t)snprintf(path, sizeof path, "%s/generation_config.json", dir) >= sizeof path)
		return kv_fail(KV_ERR_INVALID, "model folder path too long");
	int rc = kv_io_read_file(path, 1u << 20, &text, &len);
	if (rc)
		return rc;
	rc = kv_gencfg_parse(text, len, "generation_config.json", out);
	free(text);
	return rc;
}
