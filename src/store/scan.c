/*
 * scan.c - the startup scan (store.h).
 *
 * Runs once, in the background after the server reports ready:
 *   1. every file of our namespace (both areas) is looked at: "*.tmp.*"
 *      debris is deleted; an object's header is checked (obj.h steps 1-6,
 *      no data read) and put in the catalog; a corrupt one is quarantined;
 *      a file of another namespace or format version is left alone;
 *   2. other namespaces whose marker (or folder) was not used for 7 days
 *      are removed with their checkpoint folder;
 *   3. KVKEEP_KV_CHECKPOINT_MAX_BYTES is read again and the caps applied.
 * The scan stops at its time cap; then `scan_done` stays 0 and lookups go
 * on probing file names directly.
 */
#include "base/clock.h"
#include "base/corrupt.h"
#include "base/durable.h"
#include "base/env.h"
#include "base/err.h"
#include "base/io.h"
#include "base/log.h"
#include "store/ns.h"
#include "store/dir.h"
#include "store/store_int.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

struct scan {
	struct ks_store *s;
	int area;
	uint64_t t0, deadline;
	uint64_t files, debris, corrupt, foreign;
	int cut;
};

static int scan_file(void *ctx, const char *path, const char *name, uint64_t size, int64_t mtime)
{
	struct scan *sc = ctx;
	struct ks_store *s = sc->s;
	struct kv_h128 id;
	int kind, bad = KS_BAD_NONE, rc;
	struct ks_obj *o;
	(void)size;
	pthread_mutex_lock(&s->mu);
	int stopping = s->stop;
	pthread_mutex_unlock(&s->mu);
	if (kv_now_ns() > sc->deadline || stopping) {
		sc->cut = 1; /* out of time, or the server is going down */
		return 1;
	}
	if (kv_dw_is_temp_name(name) && !s->p.tool && !s->ns_busy) {
		if (kv_io_unlink(path) == 0)
			sc->debris++;
		return 0;
	}
	if (ks_obj_parse_name(name, &kind, &id))
		return 0; /* not an object name (the marker, a stray file): not ours to judge */
	sc->files++;
	pthread_mutex_lock(&s->mu);
	int known = ks_cat_find(s->cat, sc->area, kind, id) >= 0;
	pthread_mutex_unlock(&s->mu);
	if (known)
		return 0; /* the writer got there first */
	rc = ks_obj_open(path, &s->L, kind, &s->p.ns, &o, &bad);
	if (rc == KV_OK) {
		const struct ks_obj_info *in = ks_obj_info(o);
		if (!kv_h128_eq(in->id, id)) {
			bad = KS_BAD_HEADER;
			rc = KV_CORRUPT(path, 0, "file name and header id differ");
		} else {
			struct ks_rec r = {.id = in->id,
					   .parent = in->parent,
					   .bytes = in->file_size,
					   .mtime = mtime,
					   .pos = in->pos,
					   .n = in->n_tokens,
					   .kind = (uint8_t)kind,
					   .area = (uint8_t)sc->area,
					   .anchor = (uint8_t)(kind == KS_SNAP ? in->anchor_flag : in->anchor != 0),
					   .anchor_pos = kind == KS_ENTRY ? in->anchor : 0};
			pthread_mutex_lock(&s->mu);
			ks_cat_put(s->cat, &r);
			pthread_mutex_unlock(&s->mu);
		}
		ks_obj_close(o);
	}
	if (rc == KV_OK)
		return 0;
	if (s->p.tool || s->ns_busy)
		return 0; /* tools report, they do not move files; nor does a second server */
	if (bad == KS_BAD_NS || bad == KS_BAD_VERSION)
		sc->foreign++;
	else if (bad != KS_BAD_IO && bad != KS_BAD_NONE)
		sc->corrupt++;
	ks_store_reject(s, path, sc->area, kind, id, bad);
	return 0;
}

/* Remove namespaces not used for max_age seconds. */
static uint64_t age_out(struct ks_store *s)
{
	char ours[33];
	uint64_t removed = 0;
	int64_t now = (int64_t)time(NULL);
	DIR *d = opendir(s->root);
	struct dirent *e;
	if (!d)
		return 0;
	kv_h128_hex(s->p.ns, ours);
	while ((e = readdir(d))) {
		char p[4096], c[4096];
		struct ks_ns_info ni;
		struct stat sb;
		int64_t last;
		if (!ks_dir_is_ns_name(e->d_name) || !strcmp(e->d_name, ours))
			continue;
		if (kv_path_fmt(p, sizeof p, "%s/%s", s->root, e->d_name) || lstat(p, &sb) || !S_ISDIR(sb.st_mode))
			continue;
		last = ks_ns_read(p, &ni) == KV_OK ? ni.mtime : (int64_t)sb.st_mtime;
		if (now - last <= s->p.ns_max_age_s)
			continue;
		/* a server holding the lock is using it, however old the marker */
		int lk;
		if (ks_ns_lock_for_removal(p, &lk)) {
			KV_DEBUG("store.ns_live", "namespace=%s marker_days=%.1f msg=\"locked by a running server: kept\"",
				 e->d_name, (double)(now - last) / 86400);
			continue;
		}
		if (kv_path_fmt(c, sizeof c, "%s/%s/%s", s->root, KS_CKPT_DIR, e->d_name) == KV_OK)
			ks_dir_rmtree(c);
		if (ks_dir_rmtree(p) == KV_OK) {
			removed++;
			KV_INFO("store.ns_removed", "namespace=%s unused_days=%.1f", e->d_name, (double)(now - last) / 86400);
		}
		if (lk >= 0)
			kv_io_close(lk);
	}
	closedir(d);
	return removed;
}

void ks_scan_run(struct ks_store *s)
{
	struct scan sc = {.s = s};
	sc.t0 = kv_now_ns();
	sc.deadline = sc.t0 + (uint64_t)(s->p.scan_max_s * 1e9);
	for (int a = 0; a < KS_AREA__COUNT && !sc.cut; a++) {
		sc.area = a;
		ks_dir_walk(s->dir[a], scan_file, &sc);
	}
	uint64_t removed = sc.cut || s->p.tool || s->ns_busy ? 0 : age_out(s);
	/* the checkpoint cap is read again at every scan */
	const char *env = s->p.env_ckpt_max ? s->p.env_ckpt_max : kv_env(KV_ENV_KV_CHECKPOINT_MAX_BYTES);
	uint64_t cap = ks_ckpt_cap_parse(env);
	pthread_mutex_lock(&s->mu);
	s->ckpt_cap_bytes = cap;
	pthread_mutex_unlock(&s->mu);
	double secs = (double)(kv_now_ns() - sc.t0) / 1e9;
	pthread_mutex_lock(&s->mu);
	s->st.scan_files = sc.files;
	s->st.scan_seconds = secs;
	s->st.debris_removed += sc.debris;
	s->st.ns_removed += removed;
	size_t nf = ks_cat_count(s->cat, -1);
	uint64_t nb = ks_cat_bytes(s->cat, -1);
	pthread_mutex_unlock(&s->mu);
	if (!sc.cut)
		atomic_store(&s->scan_done, 1);
	if (!s->p.tool && !s->ns_busy)
		ks_evict_enforce_caps(s);
	KV_INFO("store.scan", "files=%llu known=%zu bytes=%llu debris=%llu corrupt=%llu foreign=%llu ns_removed=%llu "
			      "ms=%.1f complete=%d",
		(unsigned long long)sc.files, nf, (unsigned long long)nb, (unsigned long long)sc.debris,
		(unsigned long long)sc.corrupt, (unsigned long long)sc.foreign, (unsigned long long)removed, secs * 1e3,
		!sc.cut);
}

void *ks_scan_main(void *arg)
{
	ks_scan_run(arg);
	return NULL;
}
