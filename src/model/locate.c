/*
 * locate.c - see locate.h. Reads folders and small JSON files only; the
 * model files themselves are opened by kv_model_probe (headers) when a
 * list is asked for.
 */
#include "model/locate.h"
#include "base/env.h"
#include "base/err.h"
#include "base/io.h"
#include "base/json.h"

#include <ctype.h>
#include <dirent.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#define OLLAMA_HOST "registry.ollama.ai"
#define OLLAMA_MODEL_LAYER "application/vnd.ollama.image.model"

void kv_locate_roots_env(struct kv_locate_roots *r)
{
	const char *hub = kv_env(KV_ENV_HF_HUB_CACHE), *hfh = kv_env(KV_ENV_HF_HOME);
	const char *xdg = kv_env(KV_ENV_XDG_CACHE_HOME), *home = kv_env(KV_ENV_HOME);
	const char *oll = kv_env(KV_ENV_OLLAMA_MODELS);
	memset(r, 0, sizeof *r);
	/* a root that does not fit is left out: a cut path names another folder */
	if (hub && *hub)
		kv_path_fmt(r->hf_hub, sizeof r->hf_hub, "%s", hub);
	else if (hfh && *hfh)
		kv_path_fmt(r->hf_hub, sizeof r->hf_hub, "%s/hub", hfh);
	else if (xdg && *xdg)
		kv_path_fmt(r->hf_hub, sizeof r->hf_hub, "%s/huggingface/hub", xdg);
	else if (home && *home)
		kv_path_fmt(r->hf_hub, sizeof r->hf_hub, "%s/.cache/huggingface/hub", home);
	if (oll && *oll)
		kv_path_fmt(r->ollama, sizeof r->ollama, "%s", oll);
	else if (home && *home)
		kv_path_fmt(r->ollama, sizeof r->ollama, "%s/.ollama/models", home);
	kv_errclear();
}

/* --- small helpers --------------------------------------------------------- */

struct list {
	struct kv_local_model *v;
	size_t n, cap;
	int oom;
};

static struct kv_local_model *list_add(struct list *l)
{
	if (l->n == l->cap) {
		size_t cap = l->cap ? l->cap * 2 : 16;
		struct kv_local_model *v = realloc(l->v, cap * sizeof *v);
		if (!v) {
			l->oom = 1;
			return NULL;
		}
		l->v = v;
		l->cap = cap;
	}
	struct kv_local_model *m = &l->v[l->n++];
	memset(m, 0, sizeof *m);
	return m;
}

static int is_dir(const char *p)
{
	struct stat sb;
	return stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static int is_file(const char *p)
{
	struct stat sb;
	return stat(p, &sb) == 0 && S_ISREG(sb.st_mode); /* follows the snapshot's symlinks */
}

static int is_dangling(const char *p)
{
	struct stat sb;
	return lstat(p, &sb) == 0 && S_ISLNK(sb.st_mode) && stat(p, &sb) != 0;
}

static int ends_with(const char *s, const char *suf)
{
	size_t a = strlen(s), b = strlen(suf);
	return a >= b && !strcmp(s + a - b, suf);
}

/* "-00002-of-00003.gguf": the part number (2), 0 when not a split name. */
static int split_part(const char *name, size_t *stem)
{
	size_t L = strlen(name);
	int k, n, used = 0;
	if (L < 20 || !ends_with(name, ".gguf"))
		return 0;
	const char *p = name + L - 20; /* "-NNNNN-of-NNNNN.gguf" */
	if (sscanf(p, "-%5d-of-%5d.gguf%n", &k, &n, &used) != 2 || used != 20 || k < 1 || n < 1)
		return 0;
	*stem = L - 20;
	return k;
}

/* The tag of a GGUF file name: the last '-' or '.' separated word of its
 * stem ("Qwen3-8B-Q4_K_M.gguf" -> "Q4_K_M"). */
static void gguf_tag(const char *name, char *out, size_t cap)
{
	size_t stem = strlen(name) - 5;
	size_t s2;
	if (split_part(name, &s2))
		stem = s2;
	size_t b = stem;
	while (b > 0 && name[b - 1] != '-' && name[b - 1] != '.')
		b--;
	if (b == stem) /* ends with a separator: the whole stem */
		b = 0;
	snprintf(out, cap, "%.*s", (int)(stem - b), name + b);
}

static int contains_ci(const char *hay, const char *needle)
{
	size_t n = strlen(needle);
	for (const char *p = hay; *p; p++)
		if (!strncasecmp(p, needle, n))
			return 1;
	return 0;
}

/* --- the Hugging Face hub cache ------------------------------------------------- */

/* "models--ORG--NAME" -> "ORG/NAME" (0), else 1. */
static int hf_repo_id(const char *dir_name, char *out, size_t cap)
{
	if (strncmp(dir_name, "models--", 8) || !dir_name[8])
		return 1;
	const char *p = dir_name + 8, *sep = strstr(p, "--");
	if (sep)
		snprintf(out, cap, "%.*s/%s", (int)(sep - p), p, sep + 2);
	else
		snprintf(out, cap, "%s", p);
	return 0;
}

/* The snapshot a repository folder serves: refs/main's commit, else the
 * newest snapshot. 0, or 1 when there is none. */
static int hf_snapshot(const char *repo, char *out, size_t cap)
{
	char p[4200], *ref = NULL;
	size_t len = 0;
	if (!kv_path_fmt(p, sizeof p, "%s/refs/main", repo) && kv_io_read_file(p, 256, &ref, &len) == KV_OK) {
		while (len && isspace((unsigned char)ref[len - 1]))
			ref[--len] = 0;
		int bad = !len || strchr(ref, '/') || ref[0] == '.';
		int ok = !bad && !kv_path_fmt(out, cap, "%s/snapshots/%s", repo, ref) && is_dir(out);
		free(ref);
		if (ok)
			return 0;
	}
	kv_errclear();
	if (kv_path_fmt(p, sizeof p, "%s/snapshots", repo))
		return 1;
	DIR *d = opendir(p);
	if (!d)
		return 1;
	struct dirent *e;
	int64_t best = -1;
	while ((e = readdir(d))) {
		char s[4400];
		struct stat sb;
		if (e->d_name[0] == '.' || kv_path_fmt(s, sizeof s, "%s/%s", p, e->d_name))
			continue;
		if (stat(s, &sb) == 0 && S_ISDIR(sb.st_mode) && (int64_t)sb.st_mtime > best &&
		    kv_path_fmt(out, cap, "%s", s) == KV_OK)
			best = sb.st_mtime;
	}
	closedir(d);
	kv_errclear();
	return best < 0;
}

/* The GGUF files of a snapshot (top level and one folder down; the first
 * part of a split set), as paths relative to it. */
static void hf_ggufs(const char *snap, const char *sub, char (*out)[512], int max, int *n)
{
	char p[4200];
	if (kv_path_fmt(p, sizeof p, "%s%s%s", snap, sub ? "/" : "", sub ? sub : ""))
		return;
	DIR *d = opendir(p);
	if (!d)
		return;
	struct dirent *e;
	while ((e = readdir(d))) {
		char f[4800];
		size_t stem;
		if (e->d_name[0] == '.' || kv_path_fmt(f, sizeof f, "%s/%s", p, e->d_name))
			continue;
		if (!sub && is_dir(f)) {
			hf_ggufs(snap, e->d_name, out, max, n);
			continue;
		}
		/* a symlink whose blob is missing is listed too (and said to be
		 * incomplete): the download was interrupted */
		if (!ends_with(e->d_name, ".gguf") || !(is_file(f) || is_dangling(f)) || split_part(e->d_name, &stem) > 1)
			continue;
		if (*n < max)
			snprintf(out[(*n)++], 512, "%s%s%s", sub ? sub : "", sub ? "/" : "", e->d_name);
	}
	closedir(d);
	kv_errclear();
}

#define MAX_GGUFS 64

/* Every model of one repository folder into l. */
static void hf_repo_models(const char *repo_dir, const char *id, struct list *l)
{
	char snap[4096], p[4400];
	if (hf_snapshot(repo_dir, snap, sizeof snap))
		return;
	if (!kv_path_fmt(p, sizeof p, "%s/config.json", snap) && is_file(p)) {
		struct kv_local_model *m = list_add(l);
		if (!m)
			return;
		snprintf(m->name, sizeof m->name, "%s", id);
		snprintf(m->path, sizeof m->path, "%s", snap);
		m->source = "huggingface";
	}
	char (*files)[512] = malloc(MAX_GGUFS * sizeof *files);
	int n = 0;
	if (!files) {
		l->oom = 1;
		return;
	}
	hf_ggufs(snap, NULL, files, MAX_GGUFS, &n);
	for (int i = 0; i < n; i++) {
		char tag[128];
		const char *base = strrchr(files[i], '/');
		gguf_tag(base ? base + 1 : files[i], tag, sizeof tag);
		struct kv_local_model *m = list_add(l);
		if (!m)
			break;
		snprintf(m->name, sizeof m->name, "%s:%s", id, tag);
		if (kv_path_fmt(m->path, sizeof m->path, "%s/%s", snap, files[i])) {
			l->n--;
			continue;
		}
		m->source = "huggingface";
	}
	free(files);
	kv_errclear();
}

static void hf_list(const char *root, struct list *l)
{
	DIR *d = *root ? opendir(root) : NULL;
	if (!d)
		return;
	struct dirent *e;
	while ((e = readdir(d))) {
		char id[512], p[4400];
		if (hf_repo_id(e->d_name, id, sizeof id) || kv_path_fmt(p, sizeof p, "%s/%s", root, e->d_name))
			continue;
		hf_repo_models(p, id, l);
	}
	closedir(d);
	kv_errclear();
}

/* "ORG/NAME[:TAG]" in the hub cache: 0 found (*m), KV_ERR_NOT_FOUND when
 * the repository is not there, another error when it is but the name
 * does not pick one model (message set). */
static int hf_find(const char *root, const char *name, struct kv_local_model *out)
{
	char repo[512], tag[128] = "", dir[4400];
	const char *slash = strchr(name, '/'), *colon = strrchr(name, ':');
	if (!*root || !slash || strchr(slash + 1, '/'))
		return KV_ERR_NOT_FOUND;
	if (colon && colon > slash) {
		snprintf(repo, sizeof repo, "%.*s", (int)(colon - name), name);
		snprintf(tag, sizeof tag, "%s", colon + 1);
	} else {
		snprintf(repo, sizeof repo, "%s", name);
	}
	const char *s2 = strchr(repo, '/');
	if (kv_path_fmt(dir, sizeof dir, "%s/models--%.*s--%s", root, (int)(s2 - repo), repo, s2 + 1) || !is_dir(dir)) {
		kv_errclear();
		return KV_ERR_NOT_FOUND;
	}
	struct list l = {0};
	hf_repo_models(dir, repo, &l);
	int rc = KV_OK, pick = -1, n_pick = 0, n_gguf = 0, folder = -1;
	char names[400] = "";
	size_t at = 0;
	for (size_t i = 0; i < l.n; i++) {
		const char *c = strrchr(l.v[i].name, ':');
		if (!c || c < strchr(l.v[i].name, '/')) {
			folder = (int)i; /* the snapshot's config.json model */
			continue;
		}
		n_gguf++;
		if (at < sizeof names - 40)
			at += (size_t)snprintf(names + at, sizeof names - at, "%s%s", at ? ", " : "", c + 1);
		if (*tag ? contains_ci(strrchr(l.v[i].path, '/') + 1, tag) : 1) {
			n_pick++;
			pick = (int)i;
		}
	}
	if (!*tag && folder >= 0) {
		pick = folder;
		n_pick = 1;
	}
	if (n_pick != 1) {
		if (!l.n)
			rc = kv_fail(KV_ERR_NOT_FOUND, "%s is in the Hugging Face cache (%s) but holds no model files "
						       "(a download that did not finish?)", repo, dir);
		else if (*tag && !n_pick)
			rc = kv_fail(KV_ERR_NOT_FOUND, "%s: no GGUF file of %s in the Hugging Face cache matches '%s' (it has %s)",
				     name, repo, tag, names);
		else if (*tag)
			rc = kv_fail(KV_ERR_INVALID, "%s: %d GGUF files of %s match '%s' (%s): give a longer tag", name, n_pick,
				     repo, tag, names);
		else
			rc = kv_fail(KV_ERR_INVALID, "%s has %d GGUF files in the Hugging Face cache: give one as %s:TAG (%s)",
				     repo, n_gguf, repo, names);
		goto out;
	}
	*out = l.v[pick];
out:
	free(l.v);
	return rc;
}

/* A name without '/' as the NAME of exactly one cached repository. */
static int hf_find_short(const char *root, const char *name, char *full, size_t cap)
{
	char base[256];
	const char *colon = strchr(name, ':');
	snprintf(base, sizeof base, "%.*s", (int)(colon ? (size_t)(colon - name) : strlen(name)), name);
	DIR *d = *root ? opendir(root) : NULL;
	if (!d)
		return KV_ERR_NOT_FOUND;
	struct dirent *e;
	int hits = 0;
	while ((e = readdir(d))) {
		char id[512];
		if (hf_repo_id(e->d_name, id, sizeof id))
			continue;
		const char *s = strchr(id, '/');
		if (s && !strcmp(s + 1, base) && hits++ == 0)
			snprintf(full, cap, "%s%s", id, colon ? colon : "");
	}
	closedir(d);
	return hits == 1 ? KV_OK : KV_ERR_NOT_FOUND;
}

/* --- Ollama's store ---------------------------------------------------------- */

/* The GGUF blob a manifest names (0), else 1. */
static int ollama_blob(const char *root, const char *manifest, char *out, size_t cap)
{
	char *text = NULL;
	size_t len = 0;
	json_t *j = NULL;
	int rc = 1;
	if (kv_io_read_file(manifest, 1u << 20, &text, &len) || kv_json_parse(manifest, text, len, 16, &j))
		goto out;
	json_t *layers = json_object_get(j, "layers");
	for (size_t i = 0; i < json_array_size(layers); i++) {
		json_t *L = json_array_get(layers, i);
		const char *mt = json_string_value(json_object_get(L, "mediaType"));
		const char *dg = json_string_value(json_object_get(L, "digest"));
		if (!mt || !dg || strcmp(mt, OLLAMA_MODEL_LAYER))
			continue;
		/* "sha256:HEX" is stored as blobs/sha256-HEX; nothing else may
		 * reach the path (no '/', no "..") */
		char blob[160];
		if (strlen(dg) >= sizeof blob || strchr(dg, '/') || strstr(dg, ".."))
			break;
		snprintf(blob, sizeof blob, "%s", dg);
		char *c = strchr(blob, ':');
		if (c)
			*c = '-';
		rc = kv_path_fmt(out, cap, "%s/blobs/%s", root, blob) ? 1 : 0;
		break;
	}
out:
	free(text);
	json_decref(j);
	kv_errclear();
	return rc;
}

/* The name Ollama shows for HOST/NS/MODEL:TAG. */
static void ollama_name(const char *host, const char *ns, const char *model, const char *tag, char *out, size_t cap)
{
	if (!strcmp(host, OLLAMA_HOST) && !strcmp(ns, "library"))
		snprintf(out, cap, "%s:%s", model, tag);
	else if (!strcmp(host, OLLAMA_HOST))
		snprintf(out, cap, "%s/%s:%s", ns, model, tag);
	else
		snprintf(out, cap, "%s/%s/%s:%s", host, ns, model, tag);
}

/* Calls fn for each sub-folder (or file, files = 1) name of dir. */
static void each_entry(const char *dir, int files, void (*fn)(void *ctx, const char *path, const char *name), void *ctx)
{
	DIR *d = opendir(dir);
	if (!d)
		return;
	struct dirent *e;
	while ((e = readdir(d))) {
		char p[4400];
		if (e->d_name[0] == '.' || kv_path_fmt(p, sizeof p, "%s/%s", dir, e->d_name))
			continue;
		if (files ? is_file(p) : is_dir(p))
			fn(ctx, p, e->d_name);
	}
	closedir(d);
	kv_errclear();
}

struct oll_walk {
	const char *root;
	struct list *l;
	const char *part[3];      /* host, namespace, model */
	int depth;
};

static void oll_visit(void *ctx, const char *path, const char *name)
{
	struct oll_walk *w = ctx;
	if (w->depth < 3) {
		w->part[w->depth++] = name;
		each_entry(path, w->depth == 3, oll_visit, w);
		w->depth--;
		return;
	}
	char blob[4096];
	if (ollama_blob(w->root, path, blob, sizeof blob))
		return;
	struct kv_local_model *m = list_add(w->l);
	if (!m)
		return;
	ollama_name(w->part[0], w->part[1], w->part[2], name, m->name, sizeof m->name);
	snprintf(m->path, sizeof m->path, "%s", blob);
	m->source = "ollama";
}

static void ollama_list(const char *root, struct list *l)
{
	char man[4200];
	if (!*root || kv_path_fmt(man, sizeof man, "%s/manifests", root))
		return;
	struct oll_walk w = {.root = root, .l = l};
	each_entry(man, 0, oll_visit, &w);
}

/* NAME[:TAG], NS/NAME[:TAG] or HOST/NS/NAME[:TAG] in Ollama's store. */
static int ollama_find(const char *root, const char *name, struct kv_local_model *out)
{
	char base[256], tag[128] = "latest", host[256] = OLLAMA_HOST, ns[256] = "library", model[256], man[4400];
	const char *slash = strrchr(name, '/'), *colon = strrchr(name, ':');
	if (!*root || strstr(name, "..") || name[0] == '/')
		return KV_ERR_NOT_FOUND;
	if (strlen(name) >= sizeof base)
		return KV_ERR_NOT_FOUND;
	if (colon && (!slash || colon > slash)) {
		snprintf(base, sizeof base, "%.*s", (int)(colon - name), name);
		snprintf(tag, sizeof tag, "%s", colon + 1);
	} else {
		snprintf(base, sizeof base, "%s", name);
	}
	int parts = 1;
	for (const char *p = base; *p; p++)
		parts += *p == '/';
	if (parts == 1)
		snprintf(model, sizeof model, "%s", base);
	else if (parts == 2)
		sscanf(base, "%255[^/]/%255s", ns, model);
	else if (sscanf(base, "%255[^/]/%255[^/]/%255s", host, ns, model) != 3)
		return KV_ERR_NOT_FOUND;
	if (!*tag || !*model || kv_path_fmt(man, sizeof man, "%s/manifests/%s/%s/%s/%s", root, host, ns, model, tag) ||
	    !is_file(man)) {
		kv_errclear();
		return KV_ERR_NOT_FOUND;
	}
	memset(out, 0, sizeof *out);
	if (ollama_blob(root, man, out->path, sizeof out->path))
		return kv_fail(KV_ERR_NOT_FOUND, "%s: Ollama's manifest %s names no model layer", name, man);
	ollama_name(host, ns, model, tag, out->name, sizeof out->name);
	out->source = "ollama";
	return KV_OK;
}

/* --- the two together ------------------------------------------------------------ */

static int cmp_model(const void *a, const void *b)
{
	const struct kv_local_model *x = a, *y = b;
	int c = strcmp(x->source, y->source);
	return c ? c : strcmp(x->name, y->name);
}

int kv_locate_list(const struct kv_locate_roots *r, struct kv_local_model **out, size_t *n)
{
	struct list l = {0};
	*out = NULL;
	*n = 0;
	hf_list(r->hf_hub, &l);
	ollama_list(r->ollama, &l);
	if (l.oom) {
		free(l.v);
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	}
	for (size_t i = 0; i < l.n; i++) {
		struct kv_local_model *m = &l.v[i];
		m->ok = kv_model_probe(m->path, &m->probe) == KV_OK;
		if (!m->ok && is_dangling(m->path))
			snprintf(m->err, sizeof m->err, "its file is a link to a missing blob (a download that did not finish?)");
		else if (!m->ok)
			snprintf(m->err, sizeof m->err, "%s", kv_errmsg());
	}
	kv_errclear();
	if (l.n)
		qsort(l.v, l.n, sizeof *l.v, cmp_model);
	*out = l.v;
	*n = l.n;
	return KV_OK;
}

int kv_locate_find(const struct kv_locate_roots *r, const char *name, struct kv_local_model *out)
{
	char full[600];
	memset(out, 0, sizeof *out);
	if (!name || !*name)
		return kv_fail(KV_ERR_INVALID, "no model name given");
	int rc = hf_find(r->hf_hub, name, out);
	if (rc != KV_ERR_NOT_FOUND)
		return rc;
	rc = ollama_find(r->ollama, name, out);
	if (rc != KV_ERR_NOT_FOUND)
		return rc;
	if (!strchr(name, '/') && hf_find_short(r->hf_hub, name, full, sizeof full) == KV_OK)
		return hf_find(r->hf_hub, full, out);
	return kv_fail(KV_ERR_NOT_FOUND, "no model named '%s' in the Hugging Face cache (%s) or Ollama's store (%s)",
		       name, *r->hf_hub ? r->hf_hub : "none: HOME is not set", *r->ollama ? r->ollama : "none");
}
