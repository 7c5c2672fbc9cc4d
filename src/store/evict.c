/*
 * evict.c - disk eviction: the caps (bytes, objects, the checkpoint area's
 * own cap) and the free-space reserve enforced by deleting least recently
 * used objects, leaves before the prefixes they extend (the catalog's
 * order, catalog.h), and the one-at-a-time eviction `kvkeep cache prune`
 * steps through (store.h ks_store_next_victim / ks_store_evict_next).
 *
 * The writer makes room before each object (ks_evict_make_room) and the
 * scan and the writer enforce the caps (ks_evict_enforce_caps). Deletion
 * runs under the store's mu so the catalog and the folder agree.
 */
#include "base/clock.h"
#include "base/err.h"
#include "base/io.h"
#include "store/store_int.h"

#include <errno.h>
#include <stdlib.h>

void ks_evict_locked(struct ks_store *s, int32_t i, int ckpt_rule)
{
	const struct ks_rec *r = ks_cat_at(s->cat, i);
	char path[4096];
	if (!r)
		return;
	/* unlink under the lock: a short metadata call, and it keeps the
	 * catalog and the folder in agreement (a path that cannot be built
	 * names no file: nothing to unlink) */
	if (ks_store_path(s, r->area, r->kind, r->id, path, sizeof path) == KV_OK && kv_io_unlink(path) != 0 &&
	    errno != ENOENT)
		return;
	if (ckpt_rule)
		s->st.ckpt_evictions++;
	else
		s->st.evictions++;
	ks_cat_del(s->cat, i);
}

/* Evict from `order` until need_free bytes are freed. Returns bytes freed. */
static uint64_t evict_order(struct ks_store *s, int32_t *order, size_t n, int ckpt_rule, uint64_t need_free)
{
	uint64_t freed = 0;
	for (size_t k = 0; k < n && freed < need_free; k++) {
		const struct ks_rec *r = ks_cat_at(s->cat, order[k]);
		if (!r)
			continue;
		uint64_t b = r->bytes;
		size_t before = ks_cat_count(s->cat, -1);
		ks_evict_locked(s, order[k], ckpt_rule);
		if (ks_cat_count(s->cat, -1) < before)
			freed += b;
	}
	return freed;
}

/* Evict up to k records in order; returns how many went. */
static size_t evict_count(struct ks_store *s, int32_t *order, size_t n, size_t k)
{
	size_t gone = 0;
	for (size_t i = 0; i < n && gone < k; i++) {
		size_t before = ks_cat_count(s->cat, -1);
		if (!ks_cat_at(s->cat, order[i]))
			continue;
		ks_evict_locked(s, order[i], 0);
		gone += before - ks_cat_count(s->cat, -1);
	}
	return gone;
}

int ks_evict_make_room(struct ks_store *s, uint64_t need)
{
	uint64_t total = 0, avail = 0, used, over = 0;
	int have_fs = ks_dir_fs(s->dir[KS_AREA_MAIN], &total, &avail) == KV_OK;
	int32_t *order = NULL;
	size_t n = 0;
	pthread_mutex_lock(&s->mu);
	used = ks_cat_bytes(s->cat, -1);
	if (used + need > s->cap_bytes)
		over = used + need - s->cap_bytes;
	if (have_fs && avail < need + s->reserve_bytes && need + s->reserve_bytes - avail > over)
		over = need + s->reserve_bytes - avail;
	if (over && ks_cat_order(s->cat, -1, 0, &order, &n) == KV_OK) {
		uint64_t freed = evict_order(s, order, n, 0, over);
		free(order);
		if (freed < over) {
			pthread_mutex_unlock(&s->mu);
			return kv_fail(KV_ERR_FULL, "disk cache cap: %llu bytes more do not fit (cap %llu, free %llu)",
				       (unsigned long long)need, (unsigned long long)s->cap_bytes,
				       (unsigned long long)avail);
		}
	}
	/* the object cap bounds the index's memory and the startup scan: past
	 * it, evict down to 95% so the sort is not paid on every write */
	size_t cnt = ks_cat_count(s->cat, -1), add = need ? 1 : 0;
	if (s->max_files && cnt + add > s->max_files) {
		size_t target = s->max_files - s->max_files / 20;
		order = NULL;
		if (ks_cat_order(s->cat, -1, 0, &order, &n) == KV_OK) {
			evict_count(s, order, n, cnt + add - target);
			free(order);
		}
		if (ks_cat_count(s->cat, -1) + add > s->max_files) {
			pthread_mutex_unlock(&s->mu);
			return kv_fail(KV_ERR_FULL, "disk cache cap: %zu objects (the object cap)", s->max_files);
		}
	}
	pthread_mutex_unlock(&s->mu);
	return KV_OK;
}

void ks_evict_enforce_caps(struct ks_store *s)
{
	int32_t *order = NULL;
	size_t n = 0;
	ks_evict_make_room(s, 0);
	pthread_mutex_lock(&s->mu);
	uint64_t cb = ks_cat_bytes(s->cat, KS_AREA_CKPT);
	if (s->ckpt_cap_bytes && cb > s->ckpt_cap_bytes && ks_cat_order(s->cat, KS_AREA_CKPT, 1, &order, &n) == KV_OK) {
		evict_order(s, order, n, 1, cb - s->ckpt_cap_bytes);
		free(order);
	}
	s->last_enforce_ns = (int64_t)kv_now_ns();
	pthread_mutex_unlock(&s->mu);
}

/* The next live record of the tool order (caller holds mu); -1 none. */
static int32_t next_victim_locked(struct ks_store *s)
{
	if (!s->tool_order && ks_cat_order(s->cat, -1, 0, &s->tool_order, &s->tool_n) != KV_OK)
		return -1;
	while (s->tool_i < s->tool_n && !ks_cat_at(s->cat, s->tool_order[s->tool_i]))
		s->tool_i++;
	return s->tool_i < s->tool_n ? s->tool_order[s->tool_i] : -1;
}

int64_t ks_store_next_victim(struct ks_store *s)
{
	pthread_mutex_lock(&s->mu);
	int32_t i = next_victim_locked(s);
	int64_t k = i >= 0 ? ks_cat_at(s->cat, i)->eff : INT64_MAX;
	pthread_mutex_unlock(&s->mu);
	return k;
}

uint64_t ks_store_evict_next(struct ks_store *s)
{
	uint64_t freed = 0;
	pthread_mutex_lock(&s->mu);
	int32_t i = next_victim_locked(s);
	if (i >= 0) {
		uint64_t b = ks_cat_at(s->cat, i)->bytes;
		ks_evict_locked(s, i, 0);
		if (!ks_cat_at(s->cat, i))
			freed = b;
		else
			s->tool_i++; /* could not delete it: move on */
	}
	pthread_mutex_unlock(&s->mu);
	return freed;
}
