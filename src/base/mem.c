/*
 * mem.c - see mem.h.
 *
 * Block layout: [header 64 B: magic u32, cat u32, size u64, pad][user data].
 * Blocks of 1 MiB and more start on a 2 MiB boundary (huge pages).
 * The raw block comes from posix_memalign(64), so user data is aligned too.
 */
#include "base/mem.h"
#include "base/err.h"
#include "base/io.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define HDR 64
#define HUGE_ALIGN ((size_t)2 << 20)
#define HUGE_MIN ((size_t)1 << 20)
#define MAGIC 0x6b766d6du /* "kvmm" */

struct hdr {
	uint32_t magic;
	uint32_t cat;
	uint64_t size;
};

static int64_t g_used[KV_MEM__COUNT];
static int64_t g_peak[KV_MEM__COUNT];

static int clamp_cat(int cat)
{
	return (cat < 0 || cat >= KV_MEM__COUNT) ? KV_MEM_OTHER : cat;
}

void kv_mem_note(int cat, int64_t delta)
{
	cat = clamp_cat(cat);
	int64_t now = __atomic_add_fetch(&g_used[cat], delta, __ATOMIC_RELAXED);
	int64_t pk = __atomic_load_n(&g_peak[cat], __ATOMIC_RELAXED);
	while (now > pk && !__atomic_compare_exchange_n(&g_peak[cat], &pk, now, 1, __ATOMIC_RELAXED,
							 __ATOMIC_RELAXED))
		;
}

/*
 * Weight files are mapped, never copied (a model can be most of the
 * machine's memory: a mapping costs no copy, and its pages stay in the
 * page cache for a restarted server), and a forward walks every page of
 * them. On this project's machines (virtual machines) the
 * first access to each 4 KiB page of a mapping costs about 0.9 us however
 * the page got mapped, so the first forward after a server start ran at a
 * fifth of its speed: 1.06-1.27 s against 0.15-0.25 s for a 3-token
 * forward of a 5 GB qwen35-9b Q4_K_M file already in the page cache. On a
 * file mapping, MADV_HUGEPAGE asks the kernel to read the file into 2 MiB
 * page-cache folios and to map those whole (ext4 and other filesystems
 * with large folios, THP "madvise" or "always"): 2,500 mappings instead of
 * 1.3 million, for this process and for every later one while the file
 * stays cached, which is the case of a restarted server. engine/model.c
 * also touches the weight pages at load, for the kernels that cannot.
 */
void kv_mem_advise_huge(void *p, size_t n)
{
#ifdef MADV_HUGEPAGE
	(void)madvise(p, n, MADV_HUGEPAGE);
#else
	(void)p, (void)n;
#endif
}

void *kv_alloc(int cat, size_t size)
{
	void *raw = NULL;
	struct hdr *h;

	cat = clamp_cat(cat);
	/* Large blocks (snapshots, scratch, recurrent state) are 2 MiB-aligned
	 * and marked for transparent huge pages: on virtual machines the first
	 * touch of fresh memory costs a fault per 4 KiB page, which made
	 * filling a 12 MiB snapshot several times slower than copying it. */
	size_t align = size >= HUGE_MIN ? HUGE_ALIGN : 64;
	if (size > SIZE_MAX - HDR - HUGE_ALIGN || posix_memalign(&raw, align, size + HDR) != 0) {
		kv_fail(KV_ERR_NOMEM, "allocation of %zu bytes (%s) failed", size, kv_mem_cat_name(cat));
		return NULL;
	}
	if (align == HUGE_ALIGN) {
		size_t whole = (size + HDR) & ~(HUGE_ALIGN - 1);
		if (whole)
			kv_mem_advise_huge(raw, whole);
	}
	h = raw;
	h->magic = MAGIC;
	h->cat = (uint32_t)cat;
	h->size = size;
	kv_mem_note(cat, (int64_t)size);
	return (char *)raw + HDR;
}

/* --- per-thread scratch --- */

struct tls_buf {
	void *p;
	size_t cap;
};

static __thread struct tls_buf tl_scratch[KV_TLS__COUNT];
static pthread_key_t tls_key;
static pthread_once_t tls_once = PTHREAD_ONCE_INIT;
static int tls_key_ok;

/* At thread exit: the value is that thread's tl_scratch. */
static void tls_free(void *v)
{
	struct tls_buf *b = v;
	for (int i = 0; i < KV_TLS__COUNT; i++) {
		kv_free(b[i].p);
		b[i].p = NULL;
		b[i].cap = 0;
	}
}

static void tls_init(void)
{
	tls_key_ok = pthread_key_create(&tls_key, tls_free) == 0;
}

void *kv_tls_scratch(int slot, size_t bytes)
{
	if (slot < 0 || slot >= KV_TLS__COUNT)
		return NULL;
	struct tls_buf *b = &tl_scratch[slot];
	if (bytes <= b->cap && b->p)
		return b->p;
	pthread_once(&tls_once, tls_init);
	void *nb = kv_alloc(KV_MEM_SCRATCH, bytes ? bytes : 1);
	if (!nb)
		return NULL;
	/* the first buffer of this thread: have its exit free them all (a
	 * thread without the key, which cannot happen short of running out of
	 * keys, keeps them until the process ends, as before) */
	if (tls_key_ok && !pthread_getspecific(tls_key))
		pthread_setspecific(tls_key, tl_scratch);
	kv_free(b->p);
	b->p = nb;
	b->cap = bytes;
	return nb;
}

void *kv_zalloc(int cat, size_t size)
{
	void *p = kv_alloc(cat, size);
	if (p)
		memset(p, 0, size);
	return p;
}

static struct hdr *hdr_of(const void *p)
{
	struct hdr *h = (struct hdr *)((char *)p - HDR);
	/* A wrong pointer here is our own bug, never input data. */
	if (h->magic != MAGIC)
		abort();
	return h;
}

size_t kv_alloc_size(const void *p)
{
	return p ? hdr_of(p)->size : 0;
}

void *kv_realloc(int cat, void *p, size_t size)
{
	void *q;
	size_t old;

	if (!p)
		return kv_alloc(cat, size);
	old = hdr_of(p)->size;
	q = kv_alloc(hdr_of(p)->cat, size);
	if (!q)
		return NULL;
	memcpy(q, p, old < size ? old : size);
	kv_free(p);
	return q;
}

void kv_free(void *p)
{
	struct hdr *h;
	if (!p)
		return;
	h = hdr_of(p);
	kv_mem_note((int)h->cat, -(int64_t)h->size);
	h->magic = 0;
	free(h);
}

uint64_t kv_mem_used(int cat)
{
	int64_t v = __atomic_load_n(&g_used[clamp_cat(cat)], __ATOMIC_RELAXED);
	return v < 0 ? 0 : (uint64_t)v;
}

uint64_t kv_mem_peak(int cat)
{
	int64_t v = __atomic_load_n(&g_peak[clamp_cat(cat)], __ATOMIC_RELAXED);
	return v < 0 ? 0 : (uint64_t)v;
}

uint64_t kv_mem_total(void)
{
	uint64_t t = 0;
	for (int i = 0; i < KV_MEM__COUNT; i++)
		t += kv_mem_used(i);
	return t;
}

const char *kv_mem_cat_name(int cat)
{
	static const char *n[KV_MEM__COUNT] = {"weights", "kv_pages", "cache", "scratch", "other"};
	return n[clamp_cat(cat)];
}

int kv_mem_available(const char *meminfo_path, uint64_t *out)
{
	char buf[8192];
	const char *p;
	uint64_t kb = 0;

	if (!meminfo_path)
		meminfo_path = "/proc/meminfo";
	int rc = kv_io_read_small(meminfo_path, buf, sizeof buf);
	if (rc != KV_OK)
		return rc;
	p = strstr(buf, "MemAvailable:");
	if (!p)
		return kv_fail(KV_ERR_NOT_FOUND, "%s: no MemAvailable line", meminfo_path);
	p += strlen("MemAvailable:");
	while (*p == ' ' || *p == '\t')
		p++;
	if (!isdigit((unsigned char)*p))
		return kv_fail(KV_ERR_CORRUPT, "%s: MemAvailable is not a number", meminfo_path);
	while (isdigit((unsigned char)*p)) {
		if (kb > UINT64_MAX / 10 / 1024)
			return kv_fail(KV_ERR_CORRUPT, "%s: MemAvailable too large", meminfo_path);
		kb = kb * 10 + (uint64_t)(*p++ - '0');
	}
	*out = kb * 1024;
	return KV_OK;
}

/* 1 and *out set if the file holds a limit, -1 if it says "unlimited",
 * 0 if it cannot be read or parsed (try the next file). */
static int read_limit(const char *path, uint64_t *out)
{
	char buf[64];
	uint64_t v;
	if (kv_io_read_small(path, buf, sizeof buf) != KV_OK)
		return 0;
	if (!strncmp(buf, "max", 3))
		return -1; /* readable and explicitly unlimited */
	char *end;
	errno = 0;
	v = strtoull(buf, &end, 10);
	if (end == buf || errno || (*end && *end != '\n'))
		return 0;
	if (v >= (1ull << 62))
		return -1; /* cgroup v1 "unlimited" is a page-rounded LONG_MAX */
	*out = v;
	return 1;
}

int kv_mem_cgroup_limit(const char *root, const char *proc_self_cgroup, uint64_t *out)
{
	char path[1024];
	char own[512];
	int r;

	*out = 0;
	if (!root)
		root = "/sys/fs/cgroup";
	/* cgroup v2: "0::/some/path" names our own group. */
	if (proc_self_cgroup && kv_io_read_small(proc_self_cgroup, own, sizeof own) == KV_OK) {
		char *p = strstr(own, "0::");
		if (p) {
			char *nl;
			p += 3;
			nl = strchr(p, '\n');
			if (nl)
				*nl = 0;
			if (*p == '/' && p[1] && !strstr(p, "..")) {
				snprintf(path, sizeof path, "%s%s/memory.max", root, p);
				r = read_limit(path, out);
				if (r != 0)
					return KV_OK;
			}
		}
	}
	snprintf(path, sizeof path, "%s/memory.max", root);
	r = read_limit(path, out);
	if (r != 0)
		return KV_OK;
	snprintf(path, sizeof path, "%s/memory/memory.limit_in_bytes", root);
	read_limit(path, out);
	kv_errclear();
	return KV_OK;
}
