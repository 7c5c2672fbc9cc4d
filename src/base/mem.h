/*
 * mem.h - the accounting allocator (docs/style.md).
 *
 * Memory that the budget or /metrics counts goes through here, tagged with
 * a category. Every block is 64-byte aligned (AVX-512 friendly) and carries
 * a 64-byte header in front of it holding its size and category, so
 * kv_free() needs no size. Memory that is not malloc'd (mmap'd weights) is
 * reported with kv_mem_note(). Counters are process-wide atomics.
 *
 * Use it for large or budgeted buffers (weights, KV pages, snapshots,
 * scratch); small bookkeeping strings may use plain malloc.
 */
#ifndef KV_BASE_MEM_H
#define KV_BASE_MEM_H

#include <stddef.h>
#include <stdint.h>

enum kv_mem_cat {
	KV_MEM_WEIGHTS = 0, /* model weights (malloc'd copies or mmap'd, noted) */
	KV_MEM_KV,          /* KV pages of the page pool */
	KV_MEM_CACHE,       /* prefix-cache bookkeeping, snapshots, tails */
	KV_MEM_SCRATCH,     /* activations and per-sequence scratch */
	KV_MEM_OTHER,       /* anything else worth counting */
	KV_MEM__COUNT
};

/* Returns NULL on failure (and records a kv_fail message). 64-byte aligned. */
void *kv_alloc(int cat, size_t size);
/* Like kv_alloc, memory zeroed. */
void *kv_zalloc(int cat, size_t size);
/* Resize, keeping the category; NULL in -> kv_alloc. On failure the old
 * block is untouched and NULL is returned. */
void *kv_realloc(int cat, void *p, size_t size);
/* Frees a block from kv_alloc/kv_zalloc/kv_realloc; NULL is a no-op. */
void kv_free(void *p);
/* Size the caller asked for when allocating p. */
size_t kv_alloc_size(const void *p);

/* Asks for transparent huge pages on [p, p + n) (MADV_HUGEPAGE): kv_alloc's
 * large blocks and the read-only weight file mappings. Errors are ignored:
 * where the kernel cannot, nothing changes. */
void kv_mem_advise_huge(void *p, size_t n);
/* Adjust a category by delta bytes for memory not from kv_alloc (mmap). */
void kv_mem_note(int cat, int64_t delta);
/* Bytes currently in use in a category / in all categories. */
uint64_t kv_mem_used(int cat);
uint64_t kv_mem_total(void);
/* Per-thread scratch: the calling thread's buffer `slot`, at least `bytes`
 * long (KV_MEM_SCRATCH, 64-byte aligned, contents not kept when it grows),
 * or NULL when it cannot grow (the old one stays). A thread's buffers are
 * freed when it exits: kernels run on pool threads that live as long as the
 * process, but also on threads that do not (a scheduler's engine thread),
 * which leaked theirs. */
enum kv_tls_slot {
	KV_TLS_GEMM_WIDE,         /* engine/gemm.c: bf16 rows widened to f32 */
	KV_TLS_QGEMM_ACT,         /* engine/qgemm.c: quantized activation rows */
	KV_TLS_QDOT_PACK,         /* engine/qdot.c: repacked weight panels */
	KV_TLS_MLX_BLOCK,         /* engine/mlxgemm.c: dequantized weight blocks */
	KV_TLS__COUNT
};
void *kv_tls_scratch(int slot, size_t bytes);
/* Highest value kv_mem_used(cat) has had. */
uint64_t kv_mem_peak(int cat);
/* Short lowercase name ("weights", "kv_pages", ...). */
const char *kv_mem_cat_name(int cat);
/* MemAvailable of a meminfo file (NULL: "/proc/meminfo") in bytes.
 * KV_ERR_NOT_FOUND / KV_ERR_IO / KV_ERR_CORRUPT with a message. */
int kv_mem_available(const char *meminfo_path, uint64_t *out);
/*
 * The cgroup memory limit of this process, read under `root` (normally
 * "/sys/fs/cgroup"): cgroup v2 <root>/<own path from proc_self_cgroup>/
 * memory.max, then <root>/memory.max, then cgroup v1
 * <root>/memory/memory.limit_in_bytes. "max" and v1's "unlimited" values
 * (>= 2^62) mean no limit. proc_self_cgroup may be NULL (skip the own
 * path). *out = 0 when there is no limit or nothing could be read; always
 * returns KV_OK (a missing cgroup is not an error).
 */
int kv_mem_cgroup_limit(const char *root, const char *proc_self_cgroup, uint64_t *out);

#endif
