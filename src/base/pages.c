/*
 * pages.c - see pages.h.
 */
#include "base/pages.h"
#include "base/err.h"
#include "base/mem.h"

#include <pthread.h>
#include <stdlib.h>

struct kv_pages {
	size_t page_bytes;
	size_t max_pages;
	size_t keep_free;
	size_t in_use;      /* under lock */
	size_t n_free;
	struct kv_page *free_list;
	pthread_mutex_t lock;
};

struct kv_pages *kv_pages_create(size_t page_bytes, size_t max_pages, size_t keep_free)
{
	struct kv_pages *p = calloc(1, sizeof *p);
	if (!p)
		return NULL;
	p->page_bytes = page_bytes;
	p->max_pages = max_pages;
	p->keep_free = keep_free;
	pthread_mutex_init(&p->lock, NULL);
	return p;
}

void kv_pages_destroy(struct kv_pages *p)
{
	if (!p)
		return;
	while (p->free_list) {
		struct kv_page *pg = p->free_list;
		p->free_list = pg->next_free;
		kv_free(pg->data);
		free(pg);
	}
	pthread_mutex_destroy(&p->lock);
	free(p);
}

struct kv_page *kv_page_alloc(struct kv_pages *p)
{
	struct kv_page *pg = NULL;

	pthread_mutex_lock(&p->lock);
	if (p->max_pages && p->in_use >= p->max_pages) {
		pthread_mutex_unlock(&p->lock);
		kv_fail(KV_ERR_FULL, "page pool full (%zu pages)", p->max_pages);
		return NULL;
	}
	if (p->free_list) {
		pg = p->free_list;
		p->free_list = pg->next_free;
		p->n_free--;
	}
	p->in_use++;
	pthread_mutex_unlock(&p->lock);
	if (!pg) {
		pg = calloc(1, sizeof *pg);
		if (pg)
			pg->data = kv_alloc(KV_MEM_KV, p->page_bytes);
		if (!pg || !pg->data) {
			free(pg);
			pthread_mutex_lock(&p->lock);
			p->in_use--;
			pthread_mutex_unlock(&p->lock);
			kv_fail(KV_ERR_NOMEM, "cannot allocate a KV page of %zu bytes", p->page_bytes);
			return NULL;
		}
		pg->pool = p;
	}
	pg->next_free = NULL;
	__atomic_store_n(&pg->refs, 1, __ATOMIC_RELEASE);
	return pg;
}

void kv_page_ref(struct kv_page *pg)
{
	__atomic_add_fetch(&pg->refs, 1, __ATOMIC_RELAXED);
}

void kv_page_unref(struct kv_page *pg)
{
	struct kv_pages *p;
	if (!pg)
		return;
	if (__atomic_sub_fetch(&pg->refs, 1, __ATOMIC_ACQ_REL) != 0)
		return;
	p = pg->pool;
	pthread_mutex_lock(&p->lock);
	p->in_use--;
	if (p->n_free < p->keep_free) {
		pg->next_free = p->free_list;
		p->free_list = pg;
		p->n_free++;
		pg = NULL;
	}
	pthread_mutex_unlock(&p->lock);
	if (pg) {
		kv_free(pg->data);
		free(pg);
	}
}

int kv_page_refs(const struct kv_page *pg)
{
	return __atomic_load_n(&pg->refs, __ATOMIC_ACQUIRE);
}

size_t kv_pages_page_bytes(const struct kv_pages *p)
{
	return p->page_bytes;
}

size_t kv_pages_in_use(const struct kv_pages *p)
{
	struct kv_pages *q = (struct kv_pages *)p;
	pthread_mutex_lock(&q->lock);
	size_t n = q->in_use;
	pthread_mutex_unlock(&q->lock);
	return n;
}
