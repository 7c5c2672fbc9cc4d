/*
 * budget.c - see budget.h: pure functions (the machine readers, MemAvailable
 * and the cgroup limit, are base/mem.c's kv_mem_available and
 * kv_mem_cgroup_limit).
 */
#include "cache/budget.h"
#include "base/err.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MIB (1ull << 20)

int kc_budget_parse_u64(const char *s, uint64_t *out)
{
	uint64_t v = 0;
	int digits = 0;

	if (!s)
		return -1;
	while (*s == ' ' || *s == '\t' || *s == '\n' || *s == '\r')
		s++;
	for (; *s >= '0' && *s <= '9'; s++, digits++) {
		unsigned d = (unsigned)(*s - '0');
		if (v > (UINT64_MAX - d) / 10)
			return -1; /* overflow */
		v = v * 10 + d;
	}
	while (*s == ' ' || *s == '\t' || *s == '\n' || *s == '\r')
		s++;
	if (!digits || *s)
		return -1;
	*out = v;
	return 0;
}

uint64_t kc_budget_floor(uint64_t mem_cap, uint64_t weights)
{
	uint64_t f;
	if (!mem_cap || mem_cap <= weights)
		return 0;
	f = (mem_cap - weights) / 3;
	return f < KC_BUDGET_FLOOR_MAX ? f : KC_BUDGET_FLOOR_MAX;
}

int kc_budget_compute(const struct kc_budget_in *in, struct kc_budget *out)
{
	uint64_t v;

	memset(out, 0, sizeof *out);
	if (in->cache_memory_percent >= 0 && !(in->cache_memory_percent > 0 && in->cache_memory_percent <= 1))
		return kv_fail(KV_ERR_INVALID,
			       "--cache-memory-percent %g: expected a fraction in (0, 1], e.g. 0.20",
			       in->cache_memory_percent);

	if (in->env_max_bytes) {
		if (kc_budget_parse_u64(in->env_max_bytes, &v) == 0) {
			out->bytes = v;
			out->source = KC_BUDGET_ENV;
			snprintf(out->note, sizeof out->note,
				 "KVKEEP_PREFIX_CACHE_MAX_BYTES=%llu used as the prefix-cache budget",
				 (unsigned long long)v);
			return KV_OK;
		}
		/* docs/cache.md "Budget and eviction": blank or invalid falls back to
		 * the heuristic, logged once. */
		out->env_ignored = 1;
	}
	if (in->cache_memory_mb >= 0) {
		if ((uint64_t)in->cache_memory_mb > UINT64_MAX / MIB)
			return kv_fail(KV_ERR_INVALID, "--cache-memory-mb %lld: too large",
				       (long long)in->cache_memory_mb);
		out->bytes = (uint64_t)in->cache_memory_mb * MIB;
		out->source = KC_BUDGET_MB;
	} else if (in->cache_memory_percent > 0) {
		out->bytes = (uint64_t)((double)in->avail_ram * in->cache_memory_percent);
		out->source = KC_BUDGET_PERCENT;
	} else {
		uint64_t pct = (uint64_t)((double)in->avail_ram * KC_BUDGET_DEFAULT_PERCENT);
		out->floor = kc_budget_floor(in->mem_cap, in->weights);
		out->bytes = pct;
		out->source = KC_BUDGET_HEURISTIC;
		if (out->floor > pct) {
			out->bytes = out->floor;
			out->source = KC_BUDGET_FLOOR;
		}
	}
	if (out->env_ignored)
		snprintf(out->note, sizeof out->note,
			 "KVKEEP_PREFIX_CACHE_MAX_BYTES=\"%.40s\" is blank or not a byte count; ignored, budget %llu bytes",
			 in->env_max_bytes, (unsigned long long)out->bytes);
	else
		snprintf(out->note, sizeof out->note, "prefix-cache budget %llu bytes (%s)",
			 (unsigned long long)out->bytes,
			 out->source == KC_BUDGET_MB        ? "--cache-memory-mb"
			 : out->source == KC_BUDGET_PERCENT ? "--cache-memory-percent x available RAM"
			 : out->source == KC_BUDGET_FLOOR   ? "floor (cap - weights) / 3"
							    : "0.20 x available RAM");
	return KV_OK;
}

