/*
 * pages.h - a pool of fixed-size, refcounted pages.
 *
 * KV lives in pages of B tokens (docs/cache.md). A page is shared by
 * reference between live sequences and the prefix cache: whoever holds a
 * pointer holds a reference. A page with more than one reference is
 * immutable (only its single owner may write it); a full page is
 * immutable forever by convention of its users.
 *
 * Memory comes from the accounting allocator (KV_MEM_KV; pages of 1 MiB
 * and more are huge-page aligned there). Freed pages are kept on a short free
 * list for reuse (at most `keep_free`), the rest go back to the system, so
 * kv_mem_used(KV_MEM_KV) tracks what is really held. Thread-safe.
 */
#ifndef KV_BASE_PAGES_H
#define KV_BASE_PAGES_H

#include <stddef.h>
#include <stdint.h>

struct kv_page {
	int32_t refs;       /* atomic; 0 only while on the free list */
	uint32_t pad;
	struct kv_pages *pool;
	struct kv_page *next_free;
	void *data;         /* page_bytes, 64-byte aligned */
};

struct kv_pages;

/* max_pages 0 = no limit besides memory. */
struct kv_pages *kv_pages_create(size_t page_bytes, size_t max_pages, size_t keep_free);
/* All pages must have been released. */
void kv_pages_destroy(struct kv_pages *p);
/* A new page with one reference, contents undefined; NULL when the limit
 * is reached or memory runs out (kv_fail message set). */
struct kv_page *kv_page_alloc(struct kv_pages *p);
void kv_page_ref(struct kv_page *pg);
/* Drop a reference; the last one returns the page to the pool. NULL ok. */
void kv_page_unref(struct kv_page *pg);
int kv_page_refs(const struct kv_page *pg);
size_t kv_pages_page_bytes(const struct kv_pages *p);
/* Pages currently referenced by someone. */
size_t kv_pages_in_use(const struct kv_pages *p);

#endif
