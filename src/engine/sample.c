/*
 * sample.c - see sample.h.
 *
 * The candidate set for top-p is found without sorting the whole
 * vocabulary: tokens with p >= t for t = p_max / 2, / 4, ... are gathered
 * until they hold enough mass (or everything is in), and only those are
 * sorted. Every token not gathered is less probable than every gathered
 * one, so the result equals a full sort.
 */
#include "engine/sample.h"
#include "base/err.h"
#include "base/mem.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct cand {
	double p;
	int32_t id;
};

struct ke_sampler {
	int vocab;
	struct ke_sample_params p;
	uint64_t s[4];        /* xoshiro256** state */
	double *prob;         /* [vocab] */
	struct cand *cand;    /* [vocab] */
};

static uint64_t splitmix(uint64_t *x)
{
	uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
	return z ^ (z >> 31);
}

static inline uint64_t rotl(uint64_t x, int k)
{
	return (x << k) | (x >> (64 - k));
}

static uint64_t next_u64(struct ke_sampler *s)
{
	uint64_t r = rotl(s->s[1] * 5, 7) * 9, t = s->s[1] << 17;
	s->s[2] ^= s->s[0];
	s->s[3] ^= s->s[1];
	s->s[1] ^= s->s[2];
	s->s[0] ^= s->s[3];
	s->s[2] ^= t;
	s->s[3] = rotl(s->s[3], 45);
	return r;
}

void ke_sampler_seed(struct ke_sampler *s, uint64_t seed)
{
	uint64_t x = seed;
	for (int i = 0; i < 4; i++)
		s->s[i] = splitmix(&x);
}

int ke_sampler_create(int vocab, const struct ke_sample_params *p, struct ke_sampler **out)
{
	*out = NULL;
	if (vocab <= 0)
		return kv_fail(KV_ERR_INVALID, "sampler: vocabulary size %d", vocab);
	if (!(p->temperature >= 0.0) || !isfinite(p->temperature))
		return kv_fail(KV_ERR_INVALID, "temperature %g must be a finite number >= 0", p->temperature);
	if (p->top_k < 0)
		return kv_fail(KV_ERR_INVALID, "top_k %d must be >= 0", p->top_k);
	if (!(p->top_p > 0.0 && p->top_p <= 1.0))
		return kv_fail(KV_ERR_INVALID, "top_p %g must be in (0, 1]", p->top_p);
	if (!(p->min_p >= 0.0 && p->min_p <= 1.0))
		return kv_fail(KV_ERR_INVALID, "min_p %g must be in [0, 1]", p->min_p);
	struct ke_sampler *s = calloc(1, sizeof *s);
	if (!s)
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	s->vocab = vocab;
	s->p = *p;
	s->prob = kv_alloc(KV_MEM_SCRATCH, (size_t)vocab * sizeof *s->prob);
	s->cand = kv_alloc(KV_MEM_SCRATCH, (size_t)vocab * sizeof *s->cand);
	if (!s->prob || !s->cand) {
		ke_sampler_destroy(s);
		return kv_fail(KV_ERR_NOMEM, "sampler: out of memory for %d tokens", vocab);
	}
	ke_sampler_seed(s, p->seed);
	*out = s;
	return KV_OK;
}

void ke_sampler_destroy(struct ke_sampler *s)
{
	if (!s)
		return;
	kv_free(s->prob);
	kv_free(s->cand);
	free(s);
}

int32_t ke_argmax(const float *logits, int n)
{
	int32_t best = 0;
	float bv = -INFINITY;
	int found = 0;
	for (int i = 0; i < n; i++) {
		float v = logits[i];
		if (isnan(v))
			continue;
		if (!found || v > bv) {
			bv = v;
			best = i;
			found = 1;
		}
	}
	return best;
}

/* Descending probability, then ascending id: a total order. */
static int cand_cmp(const void *a, const void *b)
{
	const struct cand *x = a, *y = b;
	if (x->p > y->p)
		return -1;
	if (x->p < y->p)
		return 1;
	return x->id < y->id ? -1 : x->id > y->id;
}

/* Gather the tokens with prob >= t into cand; returns count and mass. */
static int gather(const struct ke_sampler *s, double t, double *mass)
{
	int n = 0;
	double m = 0.0;
	for (int i = 0; i < s->vocab; i++)
		if (s->prob[i] >= t && s->prob[i] > 0.0) {
			s->cand[n].p = s->prob[i];
			s->cand[n].id = i;
			m += s->prob[i];
			n++;
		}
	*mass = m;
	return n;
}

int32_t ke_sample(struct ke_sampler *s, const float *logits)
{
	const struct ke_sample_params *p = &s->p;
	int V = s->vocab;
	if (p->temperature == 0.0 || p->top_k == 1)
		return ke_argmax(logits, V);

	/* softmax(logits / T) in double; non-finite -> probability 0 */
	double mx = -INFINITY;
	for (int i = 0; i < V; i++)
		if (isfinite(logits[i]) && logits[i] > mx)
			mx = logits[i];
	if (mx == -INFINITY)
		return 0;
	double total = 0.0;
	for (int i = 0; i < V; i++) {
		double e = isfinite(logits[i]) ? exp(((double)logits[i] - mx) / p->temperature) : 0.0;
		s->prob[i] = e;
		total += e;
	}
	for (int i = 0; i < V; i++)
		s->prob[i] /= total;

	if (p->top_k == 0 && p->top_p >= 1.0 && p->min_p == 0.0) {
		/* No filter: walk the vocabulary in id order, no sort needed. */
		double u = (double)(next_u64(s) >> 11) * (1.0 / 9007199254740992.0);
		double acc = 0.0;
		int32_t last = 0;
		for (int i = 0; i < V; i++) {
			if (s->prob[i] <= 0.0)
				continue;
			acc += s->prob[i];
			last = i;
			if (u < acc)
				return i;
		}
		return last;
	}

	/* Candidates: enough of the top to decide top-k and top-p exactly. */
	int n;
	double mass;
	double need = p->top_p < 1.0 ? p->top_p : 1.0;
	double pmax = exp(0.0) / total; /* the max token's probability */
	if (p->top_k == 0 && p->top_p >= 1.0) {
		n = gather(s, p->min_p * pmax, &mass);
	} else {
		double t = pmax;
		for (;;) {
			t *= 0.5;
			n = gather(s, t, &mass);
			int enough_k = p->top_k > 0 && n >= p->top_k;
			int enough_p = p->top_k == 0 && mass >= need;
			if (enough_k || enough_p || t < 1e-300) {
				if (t < 1e-300)
					n = gather(s, 0.0, &mass);
				break;
			}
		}
	}
	qsort(s->cand, (size_t)n, sizeof *s->cand, cand_cmp);

	if (p->top_k > 0 && n > p->top_k)
		n = p->top_k;
	if (p->top_p < 1.0) {
		/* mass of what survived top-k: the k candidates, or everything */
		double kept = 1.0;
		if (p->top_k > 0) {
			kept = 0.0;
			for (int i = 0; i < n; i++)
				kept += s->cand[i].p;
		}
		double acc = 0.0;
		int keep = n;
		for (int i = 0; i < n; i++) {
			acc += s->cand[i].p;
			if (acc >= p->top_p * kept) {
				keep = i + 1;
				break;
			}
		}
		n = keep;
	}
	if (p->min_p > 0.0) {
		double lim = p->min_p * s->cand[0].p;
		int keep = 0;
		while (keep < n && s->cand[keep].p >= lim)
			keep++;
		n = keep > 0 ? keep : 1;
	}
	double kept = 0.0;
	for (int i = 0; i < n; i++)
		kept += s->cand[i].p;
	double u = (double)(next_u64(s) >> 11) * (1.0 / 9007199254740992.0) * kept;
	double acc = 0.0;
	for (int i = 0; i < n; i++) {
		acc += s->cand[i].p;
		if (u < acc)
			return s->cand[i].id;
	}
	return s->cand[n - 1].id;
}

void ke_logsoftmax(const float *logits, int n, float *out)
{
	double mx = -INFINITY, sum = 0.0;
	for (int i = 0; i < n; i++)
		if (logits[i] > mx)
			mx = logits[i];
	for (int i = 0; i < n; i++)
		sum += exp((double)logits[i] - mx);
	double lse = mx + log(sum);
	for (int i = 0; i < n; i++)
		out[i] = (float)((double)logits[i] - lse);
}

static double lse_of(const float *logits, int n)
{
	double mx = -INFINITY, sum = 0.0;
	for (int i = 0; i < n; i++)
		if (logits[i] > mx)
			mx = logits[i];
	for (int i = 0; i < n; i++)
		sum += exp((double)logits[i] - mx);
	return mx + log(sum);
}

float ke_token_logprob(const float *logits, int n, int32_t id)
{
	if (id < 0 || id >= n)
		return -INFINITY;
	return (float)((double)logits[id] - lse_of(logits, n));
}

int ke_top_logprobs(const float *logits, int n, int top_n, int32_t *ids, float *lps)
{
	if (top_n > n)
		top_n = n;
	if (top_n <= 0)
		return 0;
	double lse = lse_of(logits, n);
	/* Insertion into a small sorted list: top_n is at most a few dozen. */
	int k = 0;
	for (int i = 0; i < n; i++) {
		float v = logits[i];
		if (k == top_n && !(v > logits[ids[k - 1]]))
			continue;
		int j = k < top_n ? k++ : top_n - 1;
		while (j > 0 && v > logits[ids[j - 1]]) {
			ids[j] = ids[j - 1];
			j--;
		}
		ids[j] = i;
	}
	for (int i = 0; i < k; i++)
		lps[i] = (float)((double)logits[ids[i]] - lse);
	return k;
}
