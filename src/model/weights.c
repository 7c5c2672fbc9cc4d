/*
 * weights.c - see weights.h. Safetensors shards are opened through
 * model/safetensors.c and indexed by name here (a name in two shards is
 * an error); a GGUF model is opened through model/gguf.c and mapped to
 * Hugging Face names by model/gguf_model.c.
 */
#include "model/weights.h"
#include "model/gguf.h"
#include "model/gguf_model.h"
#include "model/safetensors.h"
#include "base/corrupt.h"
#include "base/err.h"
#include "base/json.h"
#include "base/map.h"
#include "base/mem.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* Largest model.safetensors.index.json we read. */
#define ST_MAX_INDEX (64u * 1024 * 1024)

struct kv_weights {
	struct kv_st **files;
	size_t nfiles;
	const struct kv_tensor **all; /* every tensor of every shard */
	size_t n;
	struct kv_map *idx;           /* name -> index into all */
	uint64_t bytes;               /* tensor data bytes */
	uint64_t mapped;              /* file bytes noted under KV_MEM_WEIGHTS */
	/* A GGUF model: the file, its tensors under HF names, permuted copies. */
	struct kv_gguf *gguf;
	struct kv_tensor *gt;
	size_t n_gt;
	void *gblob;
};

void kv_weights_close(struct kv_weights *w)
{
	if (!w)
		return;
	for (size_t i = 0; i < w->nfiles; i++)
		kv_st_close(w->files[i]);
	if (w->mapped)
		kv_mem_note(KV_MEM_WEIGHTS, -(int64_t)w->mapped);
	kv_gguf_hf_free(w->gt, w->n_gt);
	kv_free(w->gblob);
	kv_gguf_close(w->gguf);
	free(w->files);
	free(w->all);
	kv_map_destroy(w->idx);
	free(w);
}

static int w_add_file(struct kv_weights *w, const char *path)
{
	struct kv_st *st, **nf;
	int rc = kv_st_open(path, &st);
	if (rc)
		return rc;
	nf = realloc(w->files, (w->nfiles + 1) * sizeof *nf);
	if (!nf) {
		kv_st_close(st);
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	}
	w->files = nf;
	w->files[w->nfiles++] = st;
	kv_mem_note(KV_MEM_WEIGHTS, (int64_t)kv_st_file_size(st));
	w->mapped += kv_st_file_size(st);
	return KV_OK;
}

/* Build the name table over every opened file; a name in two shards is an
 * error (which copy would be the model?). */
static int w_index(struct kv_weights *w)
{
	size_t total = 0;
	for (size_t f = 0; f < w->nfiles; f++)
		total += kv_st_count(w->files[f]);
	w->all = calloc(total ? total : 1, sizeof *w->all);
	w->idx = kv_map_create(total);
	if (!w->all || !w->idx)
		return kv_fail(KV_ERR_NOMEM, "out of memory indexing %zu tensors", total);
	for (size_t f = 0; f < w->nfiles; f++) {
		for (size_t i = 0; i < kv_st_count(w->files[f]); i++) {
			const struct kv_tensor *t = kv_st_tensor(w->files[f], i);
			uint64_t prev;
			if (kv_map_get(w->idx, t->name, strlen(t->name), &prev))
				return KV_CORRUPT(t->file, t->offset, "tensor '%s' is also in %s", t->name,
						  w->all[prev]->file);
			if (kv_map_put(w->idx, t->name, strlen(t->name), w->n))
				return kv_fail(KV_ERR_NOMEM, "out of memory");
			w->all[w->n++] = t;
			w->bytes += t->nbytes;
		}
	}
	return KV_OK;
}

static int w_open_index(struct kv_weights *w, const char *dir, const char *index_path)
{
	json_t *root = NULL, *map, *v;
	const char *name;
	char **files = NULL;
	size_t nfiles = 0;
	int rc;

	rc = kv_json_load_file(index_path, ST_MAX_INDEX, &root);
	if (rc) {
		if (rc == KV_ERR_INVALID)
			return KV_CORRUPT(index_path, 0, "not valid JSON (%s)", kv_errmsg());
		return rc;
	}
	map = json_is_object(root) ? json_object_get(root, "weight_map") : NULL;
	if (!json_is_object(map)) {
		json_decref(root);
		return KV_CORRUPT(index_path, 0, "no \"weight_map\" object");
	}
	/* Shards in order of first mention; file names must be plain names in
	 * the model folder (no paths: an index must not reach outside it). */
	json_object_foreach(map, name, v) {
		const char *fn = json_string_value(v);
		size_t k;
		if (!json_is_string(v) || !fn[0] || strchr(fn, '/') || !strcmp(fn, ".") || !strcmp(fn, "..")) {
			rc = KV_CORRUPT(index_path, 0, "weight_map['%s'] is not a plain file name in the folder", name);
			goto out;
		}
		for (k = 0; k < nfiles && strcmp(files[k], fn); k++)
			;
		if (k == nfiles) {
			char **nf = realloc(files, (nfiles + 1) * sizeof *nf);
			if (!nf) {
				rc = kv_fail(KV_ERR_NOMEM, "out of memory");
				goto out;
			}
			files = nf;
			files[nfiles++] = (char *)fn;
		}
	}
	if (!nfiles) {
		rc = KV_CORRUPT(index_path, 0, "weight_map is empty");
		goto out;
	}
	for (size_t k = 0; k < nfiles; k++) {
		char path[4096];
		if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, files[k]) >= sizeof path) {
			rc = kv_fail(KV_ERR_INVALID, "%s: shard path too long", index_path);
			goto out;
		}
		if ((rc = w_add_file(w, path))) {
			kv_fail_ctx(rc, "%s", index_path);
			goto out;
		}
	}
	if ((rc = w_index(w)))
		goto out;
	/* Every tensor the index names must be in the shard it names. */
	json_object_foreach(map, name, v) {
		const struct kv_tensor *t = kv_weights_find(w, name);
		const char *fn = json_string_value(v), *base = NULL;
		if (t) {
			base = strrchr(t->file, '/');
			base = base ? base + 1 : t->file;
		}
		if (!t || strcmp(base, fn)) {
			rc = KV_CORRUPT(index_path, 0, "weight_map names tensor '%s' in %s, which does not hold it", name,
					fn);
			goto out;
		}
	}
out:
	free(files);
	json_decref(root);
	return rc;
}

int kv_weights_open(const char *model_dir, struct kv_weights **out)
{
	struct kv_weights *w = calloc(1, sizeof *w);
	char ipath[4096], spath[4096];
	struct stat sb;
	int rc;

	*out = NULL;
	if (!w)
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	if (kv_gguf_is_model_path(model_dir)) {
		struct kv_model_config c;
		if (!(rc = kv_gguf_open(model_dir, &w->gguf)) && !(rc = kv_gguf_config(w->gguf, &c)) &&
		    !(rc = kv_gguf_hf_tensors(w->gguf, &c, &w->gt, &w->n_gt, &w->gblob))) {
			w->all = calloc(w->n_gt ? w->n_gt : 1, sizeof *w->all);
			w->idx = kv_map_create(w->n_gt);
			if (!w->all || !w->idx)
				rc = kv_fail(KV_ERR_NOMEM, "out of memory");
			for (size_t i = 0; !rc && i < w->n_gt; i++) {
				if (kv_map_put(w->idx, w->gt[i].name, strlen(w->gt[i].name), w->n))
					rc = kv_fail(KV_ERR_NOMEM, "out of memory");
				w->all[w->n++] = &w->gt[i];
				w->bytes += w->gt[i].nbytes;
			}
		}
		if (rc) {
			kv_weights_close(w);
			return rc;
		}
		*out = w;
		return KV_OK;
	}
	if ((size_t)snprintf(ipath, sizeof ipath, "%s/model.safetensors.index.json", model_dir) >= sizeof ipath ||
	    (size_t)snprintf(spath, sizeof spath, "%s/model.safetensors", model_dir) >= sizeof spath) {
		free(w);
		return kv_fail(KV_ERR_INVALID, "model folder path too long");
	}
	if (stat(ipath, &sb) == 0) {
		rc = w_open_index(w, model_dir, ipath);
	} else if (stat(spath, &sb) == 0) {
		rc = w_add_file(w, spath);
		if (!rc)
			rc = w_index(w);
	} else {
		rc = kv_fail(KV_ERR_NOT_FOUND, "%s: no model.safetensors or model.safetensors.index.json", model_dir);
	}
	if (rc) {
		kv_weights_close(w);
		return rc;
	}
	*out = w;
	return KV_OK;
}

const struct kv_tensor *kv_weights_find(const struct kv_weights *w, const char *name)
{
	uint64_t i;
	if (!w->idx || !kv_map_get(w->idx, name, strlen(name), &i))
		return NULL;
	return w->all[i];
}

size_t kv_weights_count(const struct kv_weights *w)
{
	return w->n;
}

const struct kv_tensor *kv_weights_at(const struct kv_weights *w, size_t i)
{
	return i < w->n ? w->all[i] : NULL;
}

uint64_t kv_weights_bytes(const struct kv_weights *w)
{
	return w->bytes;
}

size_t kv_weights_nfiles(const struct kv_weights *w)
{
	if (w->gguf)
		return kv_gguf_nfiles(w->gguf);
	return w->nfiles;
}

const struct kv_gguf *kv_weights_gguf(const struct kv_weights *w)
{
	return w->gguf;
}

uint64_t kv_weights_owned_bytes(const struct kv_weights *w)
{
	return w->gblob ? (uint64_t)kv_alloc_size(w->gblob) : 0;
}
