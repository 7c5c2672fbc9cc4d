/*
 * cmd_cache.c - `kvkeep cache ls|stats|verify|prune`: look at and tidy
 * the disk cache folder offline (store/dir.h has its layout).
 *
 *   kvkeep cache ls     [--dir D] [--json]   namespaces and their entries:
 *                                            tokens, anchor, checkpoints,
 *                                            bytes (the entry's files,
 *                                            shared blocks included), last use
 *   kvkeep cache stats  [--dir D] [--json]   files and bytes per namespace,
 *                                            kind and area; quarantine; debris
 *   kvkeep cache verify [--dir D] [--json]   the server's own loader
 *                                            (store/obj.h, every validation
 *                                            step, data included) on every
 *                                            file; exit 1 on any corruption
 *   kvkeep cache prune  --max-mb N [--dir D] delete corrupt objects (and,
 *                                            in a namespace no server holds,
 *                                            temp debris), then least
 *                                            recently used objects (leaves
 *                                            first, across namespaces) until
 *                                            the folder holds at most N MiB
 *
 * The folder: --dir D, else the server's rule (KVKEEP_CACHE_DIR,
 * $XDG_CACHE_HOME/kvkeep, ~/.cache/kvkeep). Each namespace's layout comes
 * from its marker file (store/ns.h), so no model is needed. Nothing here
 * moves or deletes a file except prune.
 *
 * Exit status: 0 fine, 1 corruption found (verify) or the operation
 * failed (prune: the limit was not reached), 2 bad usage (a --dir that is
 * not a folder, --max-mb missing or negative).
 */
#include "cli/cli.h"
#include "base/err.h"
#include "base/hash.h"
#include "base/io.h"
#include "base/log.h"
#include "cache/names.h"
#include "store/dir.h"
#include "store/ns.h"
#include "store/obj.h"
#include "store/store.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

struct copts {
	const char *dir;
	int json;
	int64_t max_mb;
	char root[4096];
};

static int parse(const char *usage, int argc, char **argv, struct copts *o, int with_max)
{
	struct kv_flag flags[] = {
		{"dir", KV_FLAG_STR, &o->dir, "D",
		 "cache folder, as serve's --cache-dir (default: KVKEEP_CACHE_DIR, XDG_CACHE_HOME/kvkeep, ~/.cache/kvkeep)",
		 NULL, "--cache-dir"},
		{"json", KV_FLAG_BOOL, &o->json, NULL, "print JSON instead of a table"},
		{with_max ? "max-mb" : NULL, KV_FLAG_INT, &o->max_mb, "N", "keep at most N MiB (prune)"},
		{0},
	};
	o->max_mb = INT64_MIN; /* not given */
	int rc = kv_flags_parse(usage, flags, argc, argv, NULL, 0, NULL);
	if (rc)
		return rc == 1 ? -1 : 2;
	if (ks_dir_root(o->dir, o->root, sizeof o->root)) {
		fprintf(stderr, "kvkeep cache: %s\n", kv_errmsg());
		return 2;
	}
	/* a folder named on the command line must exist: a typo must not
	 * read as "an empty, healthy cache" */
	struct stat sb;
	if (o->dir && *o->dir) {
		int st = stat(o->root, &sb);
		if (st != 0 || !S_ISDIR(sb.st_mode)) {
			fprintf(stderr, "kvkeep cache: --dir %s: %s\n", o->root, st ? strerror(errno) : "not a folder");
			return 2;
		}
	}
	return 0;
}

/* The main and checkpoint folders of the namespace folder `name`: 0, or 1
 * (said on stderr) when a path does not fit, and the namespace is skipped. */
static int ns_dirs(const char *cmd, const char *root, const char *name, char base[2][4096])
{
	if (kv_path_fmt(base[0], sizeof base[0], "%s/%s", root, name) == KV_OK &&
	    kv_path_fmt(base[1], sizeof base[1], "%s/%s/%s", root, KS_CKPT_DIR, name) == KV_OK)
		return 0;
	fprintf(stderr, "kvkeep cache %s: %s: skipped\n", cmd, kv_errmsg());
	return 1;
}

/* The namespace folders under the root, sorted. *out malloc'd strings. */
static size_t list_ns(const char *root, char ***out)
{
	DIR *d = opendir(root);
	struct dirent *e;
	char **v = NULL;
	size_t n = 0;
	*out = NULL;
	if (!d)
		return 0;
	while ((e = readdir(d))) {
		if (!ks_dir_is_ns_name(e->d_name))
			continue;
		char **nv = realloc(v, (n + 1) * sizeof *v);
		if (!nv)
			break;
		v = nv;
		v[n++] = strdup(e->d_name);
	}
	closedir(d);
	for (size_t i = 1; i < n; i++)
		for (size_t j = i; j > 0 && strcmp(v[j - 1], v[j]) > 0; j--) {
			char *t = v[j];
			v[j] = v[j - 1];
			v[j - 1] = t;
		}
	*out = v;
	return n;
}

static void free_list(char **v, size_t n)
{
	for (size_t i = 0; i < n; i++)
		free(v[i]);
	free(v);
}

static void fmt_time(int64_t t, char *out, size_t cap)
{
	struct tm tm;
	time_t tt = (time_t)t;
	gmtime_r(&tt, &tm);
	strftime(out, cap, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

static uint64_t file_size(const char *path)
{
	struct stat sb;
	return stat(path, &sb) == 0 ? (uint64_t)sb.st_size : 0;
}

/* --- ls ------------------------------------------------------------------ */

struct ls_ctx {
	const char *base[2];        /* area folders */
	const struct ke_layout *L;
	struct kv_h128 ns;
	int area;
	json_t *entries;
};

static int ls_file(void *ctx, const char *path, const char *name, uint64_t size, int64_t mtime)
{
	struct ls_ctx *c = ctx;
	int kind, bad;
	struct kv_h128 id;
	struct ks_obj *o;
	(void)size;
	if (ks_obj_parse_name(name, &kind, &id) || kind != KS_ENTRY)
		return 0;
	if (ks_obj_open(path, c->L, KS_ENTRY, &c->ns, &o, &bad))
		return 0;
	const struct ks_obj_info *in = ks_obj_info(o);
	int32_t *tok = malloc((size_t)in->n_tokens * 4 + 4);
	uint32_t ck[KS_MAX_CKPT];
	struct ks_obj_dst d = {.tokens = tok, .ckpt = ck};
	if (!tok || ks_obj_read(o, &d, &bad)) {
		free(tok);
		ks_obj_close(o);
		return 0;
	}
	/* the entry's bytes: its manifest, blocks, and the files of its end
	 * and checkpoints */
	uint32_t B = (uint32_t)c->L->page_tokens, n = in->n_tokens;
	uint64_t bytes = in->file_size;
	struct kv_h128 h = c->ns, *hs = malloc(((size_t)n / B + 1) * sizeof *hs);
	char p[4096];
	if (hs) {
		hs[0] = h;
		for (uint32_t k = 1; k <= n / B; k++) {
			hs[k] = kc_chain_hash(hs[k - 1], tok + (size_t)(k - 1) * B, B);
			if (ks_dir_obj_path(c->base[0], KS_BLOCK, hs[k], p, sizeof p) == KV_OK)
				bytes += file_size(p);
		}
		for (uint32_t i = 0; i <= in->n_ckpt; i++) {
			uint32_t pos = i < in->n_ckpt ? ck[i] : n;
			struct kv_h128 rid = kc_rp_id(hs[pos / B], tok + (size_t)(pos / B) * B, pos % B);
			for (int a = 0; a < 2; a++)
				for (int k = KS_TAIL; k <= KS_SNAP; k++) {
					if (ks_dir_obj_path(c->base[a], k, rid, p, sizeof p) == KV_OK)
						bytes += file_size(p);
				}
		}
	}
	json_t *e = json_object(), *cks = json_array();
	for (uint32_t i = 0; i < in->n_ckpt; i++)
		json_array_append_new(cks, json_integer(ck[i]));
	json_object_set_new(e, "tokens", json_integer(n));
	json_object_set_new(e, "anchor", json_integer(in->anchor));
	json_object_set_new(e, "checkpoints", cks);
	json_object_set_new(e, "bytes", json_integer((json_int_t)bytes));
	json_object_set_new(e, "last_use", json_integer(mtime / 1000000000));
	json_object_set_new(e, "area", json_string(c->area ? "kv_checkpoints" : "main"));
	json_array_append_new(c->entries, e);
	free(hs);
	free(tok);
	ks_obj_close(o);
	return 0;
}

static int cmp_entry(const void *a, const void *b)
{
	json_int_t x = json_integer_value(json_object_get(*(json_t *const *)a, "last_use"));
	json_int_t y = json_integer_value(json_object_get(*(json_t *const *)b, "last_use"));
	return x < y ? 1 : x > y ? -1 : 0;
}

static int cmd_cache_ls(int argc, char **argv)
{
	struct copts o = {0};
	int rc = parse("usage: kvkeep cache ls [--dir D | --cache-dir D] [--json]", argc, argv, &o, 0);
	if (rc)
		return rc < 0 ? 0 : rc;
	char **ns;
	size_t nn = list_ns(o.root, &ns);
	json_t *out = json_object(), *arr = json_array();
	json_object_set_new(out, "dir", json_string(o.root));
	for (size_t i = 0; i < nn; i++) {
		char base[2][4096];
		struct ks_ns_info ni;
		if (ns_dirs("ls", o.root, ns[i], base))
			continue;
		json_t *j = json_object();
		int have = ks_ns_read(base[0], &ni) == KV_OK && ni.has_layout;
		json_object_set_new(j, "namespace", json_string(ns[i]));
		json_object_set_new(j, "label", json_string(have ? ni.label : ""));
		json_object_set_new(j, "last_use", json_integer(have ? ni.mtime : 0));
		json_t *ents = json_array();
		if (have) {
			struct ls_ctx c = {.base = {base[0], base[1]}, .L = &ni.layout, .ns = ni.ns, .entries = ents};
			for (c.area = 0; c.area < 2; c.area++)
				ks_dir_walk(base[c.area], ls_file, &c);
			/* newest first */
			size_t ne = json_array_size(ents);
			json_t **v = malloc((ne + 1) * sizeof *v);
			if (v) {
				for (size_t k = 0; k < ne; k++)
					v[k] = json_incref(json_array_get(ents, k));
				qsort(v, ne, sizeof *v, cmp_entry);
				json_array_clear(ents);
				for (size_t k = 0; k < ne; k++)
					json_array_append_new(ents, v[k]);
				free(v);
			}
		} else {
			json_object_set_new(j, "error", json_string("no readable namespace marker"));
		}
		json_object_set_new(j, "entries", ents);
		json_array_append_new(arr, j);
	}
	json_object_set_new(out, "namespaces", arr);
	if (o.json) {
		char *s = json_dumps(out, JSON_INDENT(1));
		printf("%s\n", s ? s : "{}");
		free(s);
	} else {
		printf("cache folder: %s\n", o.root);
		if (!nn)
			printf("(no namespaces)\n");
		for (size_t i = 0; i < json_array_size(arr); i++) {
			json_t *j = json_array_get(arr, i), *ents = json_object_get(j, "entries");
			char t[32];
			fmt_time(json_integer_value(json_object_get(j, "last_use")), t, sizeof t);
			printf("\nnamespace %s  %s  last used %s  %zu entries\n", json_string_value(json_object_get(j, "namespace")),
			       json_string_value(json_object_get(j, "label")), t, json_array_size(ents));
			if (json_object_get(j, "error"))
				printf("  %s\n", json_string_value(json_object_get(j, "error")));
			if (json_array_size(ents))
				printf("  %8s %8s %-28s %12s %-20s %s\n", "tokens", "anchor", "checkpoints", "bytes", "last use",
				       "area");
			for (size_t k = 0; k < json_array_size(ents); k++) {
				json_t *e = json_array_get(ents, k), *cks = json_object_get(e, "checkpoints");
				char cs[29] = "", lu[32];
				size_t off = 0;
				for (size_t c = 0; c < json_array_size(cks) && off < sizeof cs - 8; c++)
					off += (size_t)snprintf(cs + off, sizeof cs - off, "%s%lld", c ? "," : "",
								(long long)json_integer_value(json_array_get(cks, c)));
				if (!json_array_size(cks))
					snprintf(cs, sizeof cs, "-");
				fmt_time(json_integer_value(json_object_get(e, "last_use")), lu, sizeof lu);
				printf("  %8lld %8lld %-28s %12lld %-20s %s\n",
				       (long long)json_integer_value(json_object_get(e, "tokens")),
				       (long long)json_integer_value(json_object_get(e, "anchor")), cs,
				       (long long)json_integer_value(json_object_get(e, "bytes")), lu,
				       json_string_value(json_object_get(e, "area")));
			}
		}
	}
	json_decref(out);
	free_list(ns, nn);
	return 0;
}

/* --- stats ----------------------------------------------------------------- */

struct st_ctx {
	uint64_t files[2][KS_KIND__END + 1], bytes[2][KS_KIND__END + 1];
	uint64_t debris, other, other_bytes;
	int area;
};

static int st_file(void *ctx, const char *path, const char *name, uint64_t size, int64_t mtime)
{
	struct st_ctx *c = ctx;
	int kind;
	struct kv_h128 id;
	(void)path;
	(void)mtime;
	if (strstr(name, ".tmp.")) {
		c->debris++;
		return 0;
	}
	if (ks_obj_parse_name(name, &kind, &id)) {
		c->other++;
		c->other_bytes += size;
		return 0;
	}
	c->files[c->area][kind]++;
	c->bytes[c->area][kind] += size;
	return 0;
}

static int q_file(void *ctx, const char *path, const char *name, uint64_t size, int64_t mtime)
{
	uint64_t *q = ctx;
	(void)path;
	(void)name;
	(void)mtime;
	q[0]++;
	q[1] += size;
	return 0;
}

static int cmd_cache_stats(int argc, char **argv)
{
	struct copts o = {0};
	int rc = parse("usage: kvkeep cache stats [--dir D] [--json]", argc, argv, &o, 0);
	if (rc)
		return rc < 0 ? 0 : rc;
	char **ns;
	size_t nn = list_ns(o.root, &ns);
	json_t *out = json_object(), *arr = json_array();
	uint64_t total = 0, q[2] = {0, 0}, fs_total = 0, fs_avail = 0;
	char qd[4200];
	snprintf(qd, sizeof qd, "%s/%s", o.root, KS_QUARANTINE_DIR);
	ks_dir_walk(qd, q_file, q);
	for (size_t i = 0; i < nn; i++) {
		struct st_ctx c = {0};
		char base[2][4096];
		struct ks_ns_info ni;
		if (ns_dirs("stats", o.root, ns[i], base))
			continue;
		for (c.area = 0; c.area < 2; c.area++)
			ks_dir_walk(base[c.area], st_file, &c);
		json_t *j = json_object(), *kinds = json_object();
		uint64_t nsb = c.other_bytes;
		json_object_set_new(j, "namespace", json_string(ns[i]));
		json_object_set_new(j, "label", json_string(ks_ns_read(base[0], &ni) == KV_OK ? ni.label : ""));
		for (int a = 0; a < 2; a++)
			for (int k = KS_BLOCK; k < KS_KIND__END; k++) {
				char key[48];
				snprintf(key, sizeof key, "%s%s", a ? "ckpt_" : "", ks_kind_name(k));
				json_t *kv = json_object();
				json_object_set_new(kv, "files", json_integer((json_int_t)c.files[a][k]));
				json_object_set_new(kv, "bytes", json_integer((json_int_t)c.bytes[a][k]));
				json_object_set_new(kinds, key, kv);
				nsb += c.bytes[a][k];
			}
		json_object_set_new(j, "kinds", kinds);
		json_object_set_new(j, "bytes", json_integer((json_int_t)nsb));
		json_object_set_new(j, "temp_debris", json_integer((json_int_t)c.debris));
		total += nsb;
		json_array_append_new(arr, j);
	}
	ks_dir_fs(o.root, &fs_total, &fs_avail);
	json_object_set_new(out, "dir", json_string(o.root));
	json_object_set_new(out, "namespaces", arr);
	json_object_set_new(out, "bytes", json_integer((json_int_t)total));
	json_object_set_new(out, "quarantine_files", json_integer((json_int_t)q[0]));
	json_object_set_new(out, "quarantine_bytes", json_integer((json_int_t)q[1]));
	json_object_set_new(out, "fs_bytes", json_integer((json_int_t)fs_total));
	json_object_set_new(out, "fs_free_bytes", json_integer((json_int_t)fs_avail));
	if (o.json) {
		char *s = json_dumps(out, JSON_INDENT(1));
		printf("%s\n", s ? s : "{}");
		free(s);
	} else {
		printf("cache folder: %s  %.1f MiB in %zu namespaces; quarantine %llu files %.1f MiB; filesystem %.1f of "
		       "%.1f GiB free\n",
		       o.root, (double)total / 1048576, nn, (unsigned long long)q[0], (double)q[1] / 1048576,
		       (double)fs_avail / 1073741824, (double)fs_total / 1073741824);
		for (size_t i = 0; i < json_array_size(arr); i++) {
			json_t *j = json_array_get(arr, i), *kinds = json_object_get(j, "kinds");
			printf("\nnamespace %s  %s  %.2f MiB  temp debris %lld\n", json_string_value(json_object_get(j, "namespace")),
			       json_string_value(json_object_get(j, "label")),
			       (double)json_integer_value(json_object_get(j, "bytes")) / 1048576,
			       (long long)json_integer_value(json_object_get(j, "temp_debris")));
			const char *key;
			json_t *kv;
			json_object_foreach(kinds, key, kv)
			{
				json_int_t f = json_integer_value(json_object_get(kv, "files"));
				if (f)
					printf("  %-16s %8lld files %12lld bytes\n", key, (long long)f,
					       (long long)json_integer_value(json_object_get(kv, "bytes")));
			}
		}
	}
	json_decref(out);
	free_list(ns, nn);
	return 0;
}

/* --- verify ---------------------------------------------------------------- */

struct vf_ctx {
	const struct ke_layout *L;
	struct kv_h128 ns;
	uint64_t ok, corrupt, foreign, debris, stray;
	uint64_t bad[KS_BAD__COUNT];
	json_t *problems;
	int json;
};

static void problem(struct vf_ctx *c, const char *path, const char *what, const char *why)
{
	json_t *p = json_object();
	json_object_set_new(p, "file", json_string(path));
	json_object_set_new(p, "problem", json_string(what));
	json_object_set_new(p, "detail", json_string(why));
	json_array_append_new(c->problems, p);
	if (!c->json)
		printf("%-10s %s: %s\n", what, path, why);
}

static int vf_file(void *ctx, const char *path, const char *name, uint64_t size, int64_t mtime)
{
	struct vf_ctx *c = ctx;
	int kind, bad = KS_BAD_NONE;
	struct kv_h128 id;
	struct ks_obj_info info;
	(void)size;
	(void)mtime;
	if (strstr(name, ".tmp.")) {
		c->debris++;
		return 0;
	}
	if (!strcmp(name, KS_NS_FILE))
		return 0;
	if (ks_obj_parse_name(name, &kind, &id)) {
		c->stray++;
		return 0;
	}
	int rc = ks_obj_verify(path, c->L, kind, &c->ns, &info, &bad);
	if (rc == KV_OK && !kv_h128_eq(info.id, id)) {
		rc = KV_ERR_CORRUPT;
		bad = KS_BAD_HEADER;
		kv_fail(KV_ERR_CORRUPT, "the file name and the header id differ");
	}
	if (rc == KV_OK) {
		c->ok++;
		return 0;
	}
	if (bad > 0 && bad < KS_BAD__COUNT)
		c->bad[bad]++;
	if (rc == KV_ERR_NOT_OURS || rc == KV_ERR_VERSION) {
		c->foreign++;
		problem(c, path, "foreign", kv_errmsg());
	} else {
		c->corrupt++;
		problem(c, path, "corrupt", kv_errmsg());
	}
	return 0;
}

static int cmd_cache_verify(int argc, char **argv)
{
	struct copts o = {0};
	int rc = parse("usage: kvkeep cache verify [--dir D] [--json]", argc, argv, &o, 0);
	if (rc)
		return rc < 0 ? 0 : rc;
	kv_log_set_level(KV_LOG_OFF); /* findings are printed once, below */
	char **ns;
	size_t nn = list_ns(o.root, &ns);
	struct vf_ctx tot = {.problems = json_array(), .json = o.json};
	uint64_t ns_bad = 0;
	for (size_t i = 0; i < nn; i++) {
		char dirs[2][4096], *base = dirs[0], *ck = dirs[1];
		struct ks_ns_info ni;
		if (ns_dirs("verify", o.root, ns[i], dirs)) {
			ns_bad++; /* a namespace that cannot be checked is not a clean one */
			continue;
		}
		if (ks_ns_read(base, &ni) != KV_OK || !ni.has_layout) {
			char m[4200];
			snprintf(m, sizeof m, "%s/%s", base, KS_NS_FILE);
			problem(&tot, m, "corrupt", "namespace marker missing or unreadable: its objects cannot be checked");
			ns_bad++;
			continue;
		}
		char hex[33];
		kv_h128_hex(ni.ns, hex);
		if (strcmp(hex, ns[i])) {
			problem(&tot, base, "corrupt", "the marker names another namespace than its folder");
			ns_bad++;
			continue;
		}
		tot.L = &ni.layout;
		tot.ns = ni.ns;
		ks_dir_walk(base, vf_file, &tot);
		ks_dir_walk(ck, vf_file, &tot);
	}
	int corrupt = tot.corrupt || ns_bad;
	if (o.json) {
		json_t *out = json_object(), *br = json_object();
		json_object_set_new(out, "dir", json_string(o.root));
		json_object_set_new(out, "ok", json_integer((json_int_t)tot.ok));
		json_object_set_new(out, "corrupt", json_integer((json_int_t)(tot.corrupt + ns_bad)));
		json_object_set_new(out, "foreign", json_integer((json_int_t)tot.foreign));
		json_object_set_new(out, "temp_debris", json_integer((json_int_t)tot.debris));
		json_object_set_new(out, "stray", json_integer((json_int_t)tot.stray));
		for (int b = 1; b < KS_BAD__COUNT; b++)
			if (tot.bad[b])
				json_object_set_new(br, ks_bad_name(b), json_integer((json_int_t)tot.bad[b]));
		json_object_set_new(out, "reasons", br);
		json_object_set_new(out, "problems", tot.problems);
		char *s = json_dumps(out, JSON_INDENT(1));
		printf("%s\n", s ? s : "{}");
		free(s);
		json_decref(out);
	} else {
		printf("%s: %llu objects ok, %llu corrupt, %llu of another namespace or version, %llu temp files, %llu "
		       "other files\n",
		       o.root, (unsigned long long)tot.ok, (unsigned long long)(tot.corrupt + ns_bad),
		       (unsigned long long)tot.foreign, (unsigned long long)tot.debris, (unsigned long long)tot.stray);
		json_decref(tot.problems);
	}
	free_list(ns, nn);
	return corrupt ? 1 : 0;
}

/* --- prune ----------------------------------------------------------------- */

struct pr_ctx {
	const struct ke_layout *L;
	struct kv_h128 ns;
	int live;                 /* a server holds the namespace: its temp files are writes in progress */
	size_t files, corrupt;
	uint64_t bytes;
};

/* Delete a corrupt object (never one of another namespace or version) or,
 * when no server holds the namespace, temp debris. */
static int pr_file(void *ctx, const char *path, const char *name, uint64_t size, int64_t mtime)
{
	struct pr_ctx *c = ctx;
	int kind, bad = KS_BAD_NONE;
	struct kv_h128 id;
	struct ks_obj_info info;
	(void)mtime;
	int debris = strstr(name, ".tmp.") != NULL;
	if (debris && c->live)
		return 0;
	if (!debris) {
		if (ks_obj_parse_name(name, &kind, &id))
			return 0; /* the marker, the lock, a stray file: not ours to judge */
		int rc = ks_obj_verify(path, c->L, kind, &c->ns, &info, &bad);
		if (rc == KV_OK && !kv_h128_eq(info.id, id))
			rc = KV_ERR_CORRUPT;
		if (rc == KV_OK || rc == KV_ERR_NOT_OURS || rc == KV_ERR_VERSION || bad == KS_BAD_IO)
			return 0;
	}
	if (kv_io_unlink(path) == 0) {
		c->files++;
		c->corrupt += !debris;
		c->bytes += size;
	} else if (errno != ENOENT) {
		fprintf(stderr, "kvkeep cache prune: %s: %s\n", path, strerror(errno));
	}
	return 0;
}

static int cmd_cache_prune(int argc, char **argv)
{
	struct copts o = {0};
	int rc = parse("usage: kvkeep cache prune --max-mb N [--dir D]", argc, argv, &o, 1);
	if (rc)
		return rc < 0 ? 0 : rc;
	if (o.max_mb == INT64_MIN) {
		fprintf(stderr, "kvkeep cache prune: --max-mb N is required\n");
		return 2;
	}
	if (o.max_mb < 0 || o.max_mb > (INT64_MAX >> 20)) {
		fprintf(stderr, "kvkeep cache prune: --max-mb must be 0 or more MiB, got %lld\n", (long long)o.max_mb);
		return 2;
	}
	kv_log_set_level(KV_LOG_WARN);
	char **ns;
	size_t nn = list_ns(o.root, &ns);
	struct ks_store **st = calloc(nn + 1, sizeof *st);
	struct ke_layout *lay = calloc(nn + 1, sizeof *lay);
	uint64_t total = 0, freed = 0, limit = (uint64_t)o.max_mb << 20;
	size_t files = 0, corrupt = 0;
	int err = 0;
	for (size_t i = 0; st && lay && i < nn; i++) {
		char dirs[2][4096], *base = dirs[0];
		struct ks_ns_info ni;
		if (ns_dirs("prune", o.root, ns[i], dirs))
			continue;
		if (ks_ns_read(base, &ni) != KV_OK || !ni.has_layout) {
			fprintf(stderr, "kvkeep cache prune: %s: no readable namespace marker, skipped\n", base);
			continue;
		}
		lay[i] = ni.layout;
		/* corrupt objects can never be a hit: they go first, whatever
		 * the limit (the server would quarantine them) */
		char ck[4200];
		snprintf(ck, sizeof ck, "%s/%s/%s", o.root, KS_CKPT_DIR, ns[i]);
		struct pr_ctx pc = {.L = &lay[i], .ns = ni.ns};
		int lk = -1;
		pc.live = ks_ns_lock_for_removal(base, &lk);
		ks_dir_walk(base, pr_file, &pc);
		ks_dir_walk(ck, pr_file, &pc);
		if (lk >= 0)
			kv_io_close(lk);
		files += pc.files;
		freed += pc.bytes;
		corrupt += pc.corrupt;
		struct ks_params p = {.root = o.root, .ns = ni.ns, .layout = &lay[i], .tool = 1};
		if (ks_store_open(&p, &st[i])) {
			fprintf(stderr, "kvkeep cache prune: %s: %s\n", base, kv_errmsg());
			err = 1;
			continue;
		}
		ks_store_start_scan(st[i]);
		total += ks_store_disk_bytes(st[i]);
	}
	/* least recently used first, across namespaces */
	while (total > limit) {
		size_t best = nn;
		int64_t key = INT64_MAX;
		for (size_t i = 0; i < nn; i++)
			if (st[i]) {
				int64_t k = ks_store_next_victim(st[i]);
				if (k < key) {
					key = k;
					best = i;
				}
			}
		if (best == nn)
			break;
		uint64_t f = ks_store_evict_next(st[best]);
		freed += f;
		total -= f < total ? f : total;
		files += f ? 1 : 0;
	}
	for (size_t i = 0; i < nn; i++)
		ks_store_close(st ? st[i] : NULL);
	free(st);
	free(lay);
	free_list(ns, nn);
	printf("%s: deleted %zu files (%.1f MiB, %zu of them corrupt); %.1f MiB left, limit %lld MiB\n", o.root, files,
	       (double)freed / 1048576, corrupt, (double)total / 1048576, (long long)o.max_mb);
	if (total > limit) {
		fprintf(stderr, "kvkeep cache prune: %.1f MiB are left, more than the limit of %lld MiB\n",
			(double)total / 1048576, (long long)o.max_mb);
		err = 1;
	}
	return err;
}

KV_COMMAND(cache_ls, "cache ls", "list the disk cache: namespaces and entries", cmd_cache_ls);
KV_COMMAND(cache_stats, "cache stats", "disk cache files and bytes per namespace and kind", cmd_cache_stats);
KV_COMMAND(cache_verify, "cache verify", "check every disk cache file with the server's loader (exit 1: corrupt)",
	   cmd_cache_verify);
KV_COMMAND(cache_prune, "cache prune", "delete least recently used disk cache objects down to --max-mb",
	   cmd_cache_prune);
