/*
 * opts.c - see opts.h.
 */
#include "cache/opts.h"
#include "base/env.h"
#include "base/err.h"
#include "base/mem.h"
#include "base/log.h"

#include <stdlib.h>
#include <string.h>

#define MIB (1ull << 20)

void kc_opts_default(struct kc_opts *o)
{
	memset(o, 0, sizeof *o);
	o->enable = 1;
	o->index = "radix";
	o->prefix_cache_size = -1;
	o->cache_memory_mb = -1;
	o->cache_memory_percent = -1;
	o->hybrid_cache_entries = -1;
	o->memory_cap_mb = -1;
}

void kc_machine_read(struct kc_machine *m)
{
	memset(m, 0, sizeof *m);
	if (kv_mem_available(NULL, &m->avail_ram) != KV_OK)
		m->avail_ram = 0;
	kv_mem_cgroup_limit("/sys/fs/cgroup", "/proc/self/cgroup", &m->cgroup_limit);
	m->env_max_bytes = kv_env(KV_ENV_PREFIX_CACHE_MAX_BYTES);
	m->env_stride = kv_env(KV_ENV_HYBRID_CHECKPOINT_STRIDE);
	m->env_ckpt_max = kv_env(KV_ENV_HYBRID_CHECKPOINT_MAX);
}

int kc_opts_resolve(const struct kc_opts *o, const struct kc_machine *mach, const struct ke_layout *layout,
		    uint64_t weights, struct kv_h128 ns, struct kc_policy *pol, struct kc_params *p,
		    struct kc_budget *budget)
{
	struct kc_budget_in in = {0};
	int hybrid = ke_layout_nontrim(layout), rc, kind;

	memset(p, 0, sizeof *p);
	if ((rc = kc_index_parse(o->index ? o->index : "radix", &kind)))
		return rc;
	if (o->prefix_cache_size == 0 || o->prefix_cache_size > UINT32_MAX)
		return kv_fail(KV_ERR_INVALID, "--prefix-cache-size %lld: expected 1 .. %u entries",
			       (long long)o->prefix_cache_size, UINT32_MAX);
	if (o->hybrid_cache_entries > INT32_MAX)
		return kv_fail(KV_ERR_INVALID, "--hybrid-cache-entries %lld: too large", (long long)o->hybrid_cache_entries);
	if (o->memory_cap_mb == 0 || (o->memory_cap_mb > 0 && (uint64_t)o->memory_cap_mb > UINT64_MAX / MIB))
		return kv_fail(KV_ERR_INVALID, "--memory-cap-mb %lld: expected a positive size",
			       (long long)o->memory_cap_mb);
	in.avail_ram = mach->avail_ram;
	in.mem_cap = o->memory_cap_mb > 0 ? (uint64_t)o->memory_cap_mb * MIB : mach->cgroup_limit;
	in.weights = weights;
	in.cache_memory_mb = o->cache_memory_mb;
	in.cache_memory_percent = o->cache_memory_percent;
	in.env_max_bytes = mach->env_max_bytes;
	if ((rc = kc_budget_compute(&in, budget)))
		return rc;
	if (budget->env_ignored)
		KV_WARN("cache.env_invalid", "name=KVKEEP_PREFIX_CACHE_MAX_BYTES msg=\"%s\"", budget->note);

	kc_policy_default(pol, hybrid);
	kc_policy_env(pol, mach->env_stride, mach->env_ckpt_max);

	p->layout = layout;
	p->ns = ns;
	p->index = kind;
	p->disabled = !o->enable;
	p->policy = pol;
	p->mem_cap = in.mem_cap;
	if (o->prefix_cache_size > 0) {
		/* Legacy count mode: entries are bounded by count, not bytes
		 * (admission and the prefill projection still watch the cap). */
		p->max_entries = (uint32_t)o->prefix_cache_size;
		p->budget_bytes = 0;
	} else {
		/* 0 bytes from the environment means "hold nothing": the
		 * smallest non-zero budget keeps only the entry in use. */
		p->budget_bytes = budget->bytes ? budget->bytes : 1;
	}
	p->max_hybrid_entries = o->hybrid_cache_entries < 0   ? 0
				: o->hybrid_cache_entries == 0 ? KC_HYBRID_NONE
							       : (int32_t)o->hybrid_cache_entries;
	KV_INFO("cache.config",
		"enabled=%d index=%s budget_bytes=%llu mode=%s mem_cap=%llu floor=%llu stride=%u ckpt_max=%u "
		"hybrid_entries=%lld msg=\"%s\"",
		o->enable, kc_index_name(kind), (unsigned long long)p->budget_bytes,
		p->max_entries ? "count" : "bytes", (unsigned long long)p->mem_cap, (unsigned long long)budget->floor,
		pol->stride, pol->ckpt_max, (long long)o->hybrid_cache_entries, budget->note);
	return KV_OK;
}
