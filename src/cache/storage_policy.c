/*
 * storage_policy.c - the storage policy (see storage_policy.h).
 */
#include "cache/storage_policy.h"
#include "cache/budget.h"
#include "base/env.h"
#include "base/log.h"

#include <stdlib.h>
#include <string.h>

void kc_policy_default(struct kc_policy *p, int hybrid)
{
	memset(p, 0, sizeof *p);
	p->hybrid = hybrid ? 1 : 0;
	p->stride = KC_STRIDE_DEFAULT;
	p->ckpt_max = KC_CKPT_MAX_DEFAULT;
	p->anchor = 1;
	p->min_reuse = KC_MIN_REUSE_DEFAULT;
}

int kc_policy_env(struct kc_policy *p, const char *stride_env, const char *max_env)
{
	uint64_t v;
	int bad = 0;

	if (stride_env) {
		if (kc_budget_parse_u64(stride_env, &v) == 0 && v > 0 && v <= (1u << 30)) {
			p->stride = (uint32_t)v;
		} else {
			KV_WARN("cache.env_invalid", "name=KVKEEP_HYBRID_CHECKPOINT_STRIDE value=\"%.40s\" using=%u",
				stride_env, (unsigned)p->stride);
			bad++;
		}
	}
	if (max_env) {
		if (kc_budget_parse_u64(max_env, &v) == 0 && v <= KC_CKPT_HARD) {
			p->ckpt_max = (uint32_t)v;
		} else {
			KV_WARN("cache.env_invalid", "name=KVKEEP_HYBRID_CHECKPOINT_MAX value=\"%.40s\" using=%u",
				max_env, (unsigned)p->ckpt_max);
			bad++;
		}
	}
	return bad;
}

int kc_policy_from_env(struct kc_policy *p)
{
	return kc_policy_env(p, kv_env(KV_ENV_HYBRID_CHECKPOINT_STRIDE), kv_env(KV_ENV_HYBRID_CHECKPOINT_MAX));
}

uint32_t kc_policy_last_boundary(uint32_t n, const uint32_t *bounds, size_t n_bounds)
{
	uint32_t last = 0;
	for (size_t i = 0; i < n_bounds; i++)
		if (bounds[i] > last && bounds[i] < n)
			last = bounds[i];
	return last;
}

size_t kc_policy_stops(const struct kc_policy *p, uint32_t n, const uint32_t *bounds, size_t n_bounds,
		       uint32_t resume, uint32_t *out, size_t cap)
{
	size_t k = 0, bi = 0;
	uint64_t prev = resume, s;
	uint32_t last_b = kc_policy_last_boundary(n, bounds, n_bounds);

	if (resume >= n)
		return 0;
	if (p->hybrid && p->ckpt_max == 0 && last_b > resume) {
		if (k < cap)
			out[k] = last_b;
		k++;
	} else if (p->hybrid && p->ckpt_max > 0) {
		/* Merge boundaries (a boundary not above the previous stop is
		 * ignored, so unsorted input cannot repeat a stop) with stride
		 * multiples, everything in (resume, n). */
		s = p->stride ? ((uint64_t)resume / p->stride + 1) * p->stride : n;
		for (;;) {
			uint64_t b = n, m;
			while (bi < n_bounds && (bounds[bi] <= prev || bounds[bi] >= n))
				bi++;
			if (bi < n_bounds)
				b = bounds[bi];
			while (p->stride && s <= prev)
				s += p->stride;
			m = b < s ? b : s;
			if (m >= n)
				break;
			if (k < cap)
				out[k] = (uint32_t)m;
			k++;
			prev = m;
		}
	}
	if (k < cap)
		out[k] = n;
	return k + 1;
}

uint32_t kc_policy_anchor(const struct kc_policy *p, uint32_t n, const uint32_t *bounds, size_t n_bounds,
			  uint32_t resume, uint32_t inherited_anchor)
{
	uint32_t b0 = 0;
	if (!p->hybrid)
		return 0;
	if (inherited_anchor && inherited_anchor <= resume)
		return inherited_anchor;
	if (!p->anchor || p->ckpt_max == 0)
		return 0;
	for (size_t i = 0; i < n_bounds; i++)
		if (bounds[i] > 0 && bounds[i] < n) {
			b0 = bounds[i];
			break;
		}
	return b0 && b0 >= resume ? b0 : 0;
}

uint32_t kc_policy_ckpt_add(const struct kc_policy *p, struct kc_ckpts *s, uint32_t pos)
{
	uint32_t victim_pos;
	int best = -1;
	uint32_t best_gap = 0;

	if (pos == 0 || (s->n && pos <= s->pos[s->n - 1]))
		return 0;
	s->pos[s->n++] = pos;
	if (s->n <= p->ckpt_max)
		return 0;
	/* Never the newest (the last slot), never the anchor; smallest gap to
	 * the predecessor, ties to the oldest. */
	for (uint32_t i = 0; i + 1 < s->n; i++) {
		uint32_t gap;
		if (s->anchor && s->pos[i] == s->anchor)
			continue;
		gap = s->pos[i] - (i ? s->pos[i - 1] : 0);
		if (best < 0 || gap < best_gap) {
			best = (int)i;
			best_gap = gap;
		}
	}
	if (best < 0)
		best = (int)s->n - 1; /* only the anchor is left besides it */
	victim_pos = s->pos[best];
	memmove(&s->pos[best], &s->pos[best + 1], (s->n - (uint32_t)best - 1) * sizeof s->pos[0]);
	s->n--;
	return victim_pos;
}

int kc_policy_store_prompt(const struct kc_policy *p, uint32_t n, uint32_t last_boundary)
{
	if (!p->hybrid || !last_boundary || last_boundary >= n)
		return 1;
	return n - last_boundary > p->min_reuse;
}

int kc_policy_store_completion(const struct kc_policy *p, uint64_t both_bytes, uint64_t budget)
{
	if (!p->hybrid)
		return 1;
	return both_bytes <= budget;
}

uint64_t kc_policy_node_bytes(const struct ke_layout *L)
{
	return (uint64_t)L->page_bytes + (uint64_t)L->page_tokens * sizeof(int32_t);
}

uint64_t kc_policy_rp_bytes(const struct ke_layout *L, uint32_t t, int with_snap)
{
	return (uint64_t)t * (L->kv_bytes_per_token + sizeof(int32_t)) + (with_snap ? L->snapshot_bytes : 0);
}

uint64_t kc_policy_entry_bytes(const struct ke_layout *L, uint32_t n, const uint32_t *ckpt, uint32_t n_ckpt)
{
	uint32_t B = (uint32_t)L->page_tokens;
	int hyb = ke_layout_nontrim(L);
	uint64_t b;

	if (B == 0)
		return 0;
	b = (uint64_t)(n / B) * kc_policy_node_bytes(L) + kc_policy_rp_bytes(L, n % B, hyb);
	for (uint32_t i = 0; i < n_ckpt; i++)
		b += kc_policy_rp_bytes(L, ckpt[i] % B, hyb);
	return b;
}
