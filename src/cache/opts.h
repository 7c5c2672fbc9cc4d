/*
 * opts.h - the prefix-cache command-line options and environment turned
 * into kc_params: the one place `kvkeep serve`, `kvkeep bench cache` and
 * tests resolve them, so every command means the same by each flag.
 *
 * Flags (names operators of other local servers know; cli/ declares them as
 * struct kv_flag entries pointing into struct kc_opts):
 *   --enable-prefix-cache / --disable-prefix-cache   (enabled by default)
 *   --prefix-cache-index radix|hash                  (radix)
 *   --prefix-cache-size N     legacy mode: bound entries by count instead of
 *                             bytes
 *   --cache-memory-mb N       byte budget in MiB
 *   --cache-memory-percent F  fraction of available RAM (0.20)
 *   --hybrid-cache-entries N  non-trimmable entries kept (automatic: 8 for
 *                             hybrid models; 0 keeps none)
 *   --memory-cap-mb N         memory cap for the floor, admission and the
 *                             prefill projection (default: the cgroup limit)
 * Environment: KVKEEP_PREFIX_CACHE_MAX_BYTES, KVKEEP_HYBRID_CHECKPOINT_STRIDE,
 * KVKEEP_HYBRID_CHECKPOINT_MAX (budget.h, storage_policy.h).
 */
#ifndef KV_CACHE_OPTS_H
#define KV_CACHE_OPTS_H

#include <stdint.h>

#include "base/hash.h"
#include "cache/budget.h"
#include "cache/cache.h"

#define KC_LEGACY_SIZE_DEFAULT 100

struct kc_opts {
	int enable;                   /* 1 unless --disable-prefix-cache */
	const char *index;            /* "radix" (default) or "hash" */
	int64_t prefix_cache_size;    /* < 0: not given (byte mode) */
	int64_t cache_memory_mb;      /* < 0: not given */
	double cache_memory_percent;  /* < 0: not given */
	int64_t hybrid_cache_entries; /* < 0: automatic */
	int64_t memory_cap_mb;        /* < 0: not given (cgroup limit, if any) */
};

/* Everything "not given". */
void kc_opts_default(struct kc_opts *o);

/* What the machine says, injectable for tests. */
struct kc_machine {
	uint64_t avail_ram;           /* MemAvailable */
	uint64_t cgroup_limit;        /* 0 = none */
	const char *env_max_bytes;    /* KVKEEP_PREFIX_CACHE_MAX_BYTES or NULL */
	const char *env_stride;       /* KVKEEP_HYBRID_CHECKPOINT_STRIDE or NULL */
	const char *env_ckpt_max;     /* KVKEEP_HYBRID_CHECKPOINT_MAX or NULL */
};
/* Read /proc/meminfo, the cgroup limit and the environment. */
void kc_machine_read(struct kc_machine *m);

/*
 * Resolve options for a model: the budget (logged: one line saying which
 * source won, one more if the environment value was ignored), index,
 * count caps, policy and memory cap into *p (p->layout, p->ns, p->policy
 * point into *pol and the given layout; keep them alive while p is used).
 * weights = resident weight bytes. KV_OK or KV_ERR_INVALID (bad flag).
 */
int kc_opts_resolve(const struct kc_opts *o, const struct kc_machine *mach, const struct ke_layout *layout,
		    uint64_t weights, struct kv_h128 ns, struct kc_policy *pol, struct kc_params *p,
		    struct kc_budget *budget);

#endif
