/*
 * budget.h - how many bytes the RAM prefix cache may hold (docs/cache.md).
 *
 * The budget is a pure function of its inputs so the numbers of docs/cache.md are
 * testable without touching the machine. First match wins:
 *
 *   1. KVKEEP_PREFIX_CACHE_MAX_BYTES: a decimal byte count, used as is
 *      (0 is a valid hard cap: the RAM tier holds nothing). Set but blank
 *      or invalid (not a plain non-negative integer, overflow): ignored,
 *      and the caller logs one line saying so (note is filled).
 *   2. --cache-memory-mb N: N MiB.
 *   3. max(percent x available RAM, floor), percent = --cache-memory-percent
 *      (a fraction in (0, 1], default 0.20). The floor is
 *          min((memory cap - resident weights) / 3, 4 GiB)
 *      and applies only when a memory cap is known (--memory-cap-mb, else
 *      the cgroup limit) and no size or percent was given explicitly: an
 *      explicit number is never raised. Seeds: an 18 GB machine with an
 *      11.6 GB cap and 5.2 GB of weights has a floor of 2.1 GB; a 16 GB
 *      one (cap 9.6 GB) 1.5 GB.
 *
 * "Available RAM" is what the OS reports after the weights are resident
 * (MemAvailable), so the budget is recomputed when a model is (re)loaded.
 *
 * The readers of the machine (the cgroup limit, MemAvailable) are base/mem.h's
 * kv_mem_cgroup_limit and kv_mem_available (the engine sizes its prepacked
 * panels by them too); they take their root folders as arguments so tests
 * can point them at fixtures.
 */
#ifndef KV_CACHE_BUDGET_H
#define KV_CACHE_BUDGET_H

#include <stdint.h>

#define KC_BUDGET_DEFAULT_PERCENT 0.20
#define KC_BUDGET_FLOOR_MAX (4ull << 30) /* the floor never exceeds 4 GiB */

enum kc_budget_src {
	KC_BUDGET_ENV = 0,      /* KVKEEP_PREFIX_CACHE_MAX_BYTES */
	KC_BUDGET_MB,           /* --cache-memory-mb */
	KC_BUDGET_PERCENT,      /* explicit --cache-memory-percent x available */
	KC_BUDGET_HEURISTIC,    /* default percent x available (>= floor, or no cap) */
	KC_BUDGET_FLOOR,        /* the floor won over the default percent */
};

struct kc_budget_in {
	uint64_t avail_ram;          /* bytes available now (weights already resident) */
	uint64_t mem_cap;            /* memory cap in bytes, 0 = none configured */
	uint64_t weights;            /* resident weight bytes */
	int64_t cache_memory_mb;     /* --cache-memory-mb, < 0 = not given */
	double cache_memory_percent; /* --cache-memory-percent, < 0 = not given */
	const char *env_max_bytes;   /* KVKEEP_PREFIX_CACHE_MAX_BYTES, NULL = unset */
};

struct kc_budget {
	uint64_t bytes;     /* the budget */
	uint64_t floor;     /* the floor that was computed (0 when it does not apply) */
	int source;         /* enum kc_budget_src */
	int env_ignored;    /* 1: the env variable was set but blank/invalid */
	char note[192];     /* one human line: what was chosen and why */
};

/*
 * Compute the budget. KV_OK, or KV_ERR_INVALID (with a kv_fail message)
 * for a bad flag value: a percent outside (0, 1] or a negative size. A
 * bad environment value is not an error (docs/cache.md): see env_ignored.
 */
int kc_budget_compute(const struct kc_budget_in *in, struct kc_budget *out);

/* The floor rule alone: min((cap - weights) / 3, 4 GiB), 0 if cap <= weights
 * or cap == 0. */
uint64_t kc_budget_floor(uint64_t mem_cap, uint64_t weights);

/* Parse a non-negative decimal integer that fills the whole string
 * (surrounding blanks allowed). 0 on success, -1 if invalid or blank. */
int kc_budget_parse_u64(const char *s, uint64_t *out);

#endif
