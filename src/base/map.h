/*
 * map.h - a hash map from byte strings to uint64 values.
 *
 * Open addressing with linear probing and backward-shift deletion; keys
 * are copied into an arena owned by the map (compacted on growth). Used
 * for vocabularies, merge ranks, piece caches and indexes. Not
 * thread-safe.
 */
#ifndef KV_BASE_MAP_H
#define KV_BASE_MAP_H

#include <stddef.h>
#include <stdint.h>

struct kv_map;

struct kv_map *kv_map_create(size_t expected);
void kv_map_destroy(struct kv_map *m);
/* Insert or overwrite. KV_OK or KV_ERR_NOMEM. */
int kv_map_put(struct kv_map *m, const void *key, size_t klen, uint64_t val);
/* 1 and *val set if present, else 0. val may be NULL. */
int kv_map_get(const struct kv_map *m, const void *key, size_t klen, uint64_t *val);
/* 1 if removed, 0 if absent. */
int kv_map_del(struct kv_map *m, const void *key, size_t klen);
size_t kv_map_count(const struct kv_map *m);
/* Remove everything (keeps capacity). */
void kv_map_clear(struct kv_map *m);
/* Iterate: start with *it = 0; returns 0 at the end. The key pointer is
 * valid until the next modification. */
int kv_map_next(const struct kv_map *m, size_t *it, const void **key, size_t *klen, uint64_t *val);

#endif
