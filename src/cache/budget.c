/*
 * budget.c - see budget.h. The compute function is pure; the two readers
 * are the only places that look at the machine.
 */
#include "cache/budget.h"
#include "base/err.h"
#include "base/io.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
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
	if (kc_budget_parse_u64(buf, &v) != 0)
		return 0;
	if (v >= (1ull << 62))
		return -1; /* cgroup v1 "unlimited" is a page-rounded LONG_MAX */
	*out = v;
	return 1;
}

int kc_budget_cgroup_limit(const char *root, const char *proc_self_cgroup, uint64_t *out)
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

