/*
 * sample.c - see sample.h.
 *
 * Working values: the logits are copied once into prob[] as doubles, the
 * penalties adjust the few entries of tokens seen so far (the `touched`
 * list), and the softmax runs in place. The candidate set for top-p is
 * found without sorting the whole vocabulary: tokens with p >= t for
 * t = p_max / 2, / 4, ... are gathered until they hold enough mass (or
 * everything is in), and only those are sorted. Every token not gathered
 * is less probable than every gathered one, so the result equals a full
 * sort. A top_k up to TOPK_SELECT_MAX (the model cards ask for 20) skips
 * the softmax over the vocabulary: the k-th largest logit comes from a
 * size-k heap and only the survivors are exponentiated (3.5-7x faster at
 * 152k tokens), since after top-k only the kept set's own mass counts.
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

enum { SEEN_PROMPT = 1, SEEN_GEN = 2 };

struct ke_sampler {
	int vocab;
	struct ke_sample_params p;
	int penalties;        /* any of the three penalties is on */
	int rep_on;           /* repetition_penalty != 1 */
	uint64_t s[4];        /* xoshiro256** state */
	double *prob;         /* [vocab] working logits, then probabilities */
	struct cand *cand;    /* [vocab] */
	/* penalty history (allocated only when a penalty is on) */
	uint32_t *count;      /* [vocab] times generated */
	uint8_t *seen;        /* [vocab] SEEN_* bits */
	int32_t *touched;     /* [vocab] ids with seen != 0, in first-seen order */
	int n_touched;
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

void ke_sampler_reset(struct ke_sampler *s, uint64_t seed)
{
	for (int i = 0; i < s->n_touched; i++) {
		s->count[s->touched[i]] = 0;
		s->seen[s->touched[i]] = 0;
	}
	s->n_touched = 0;
	ke_sampler_seed(s, seed);
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
	if (!isfinite(p->presence_penalty))
		return kv_fail(KV_ERR_INVALID, "presence_penalty %g must be finite", p->presence_penalty);
	if (!isfinite(p->frequency_penalty))
		return kv_fail(KV_ERR_INVALID, "frequency_penalty %g must be finite", p->frequency_penalty);
	if (!(p->repetition_penalty >= 0.0) || !isfinite(p->repetition_penalty))
		return kv_fail(KV_ERR_INVALID, "repetition_penalty %g must be > 0", p->repetition_penalty);
	struct ke_sampler *s = calloc(1, sizeof *s);
	if (!s)
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	s->vocab = vocab;
	s->p = *p;
	if (s->p.repetition_penalty == 0.0)
		s->p.repetition_penalty = 1.0; /* unset */
	s->rep_on = s->p.repetition_penalty != 1.0;
	s->penalties = s->rep_on || s->p.presence_penalty != 0.0 || s->p.frequency_penalty != 0.0;
	s->prob = kv_alloc(KV_MEM_SCRATCH, (size_t)vocab * sizeof *s->prob);
	s->cand = kv_alloc(KV_MEM_SCRATCH, (size_t)vocab * sizeof *s->cand);
	int ok = s->prob && s->cand;
	if (ok && s->penalties) {
		s->count = kv_zalloc(KV_MEM_SCRATCH, (size_t)vocab * sizeof *s->count);
		s->seen = kv_zalloc(KV_MEM_SCRATCH, (size_t)vocab);
		s->touched = kv_alloc(KV_MEM_SCRATCH, (size_t)vocab * sizeof *s->touched);
		ok = s->count && s->seen && s->touched;
	}
	if (!ok) {
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
	kv_free(s->count);
	kv_free(s->seen);
	kv_free(s->touched);
	free(s);
}

static void mark(struct ke_sampler *s, int32_t id, int bit)
{
	if (!s->seen[id])
		s->touched[s->n_touched++] = id;
	s->seen[id] |= (uint8_t)bit;
}

void ke_sampler_prompt(struct ke_sampler *s, const int32_t *ids, size_t n)
{
	if (!s->rep_on) /* only the repetition penalty looks at the prompt */
		return;
	for (size_t i = 0; i < n; i++)
		if (ids[i] >= 0 && ids[i] < s->vocab)
			mark(s, ids[i], SEEN_PROMPT);
}

void ke_sampler_accept(struct ke_sampler *s, int32_t id)
{
	if (!s->penalties || id < 0 || id >= s->vocab)
		return;
	mark(s, id, SEEN_GEN);
	if (s->count[id] < UINT32_MAX)
		s->count[id]++;
}

static inline int allowed(const uint32_t *mask, int i)
{
	return (mask[i >> 5] >> (i & 31)) & 1;
}

/* The lowest allowed id (0 when the mask allows nothing). */
static int32_t first_allowed(const uint32_t *mask, int n)
{
	for (int w = 0; w < (n + 31) / 32; w++)
		if (mask[w]) {
			int i = w * 32 + __builtin_ctz(mask[w]);
			return i < n ? i : 0;
		}
	return 0;
}

/* ke_argmax over the allowed ids: the lowest id among the maximal
 * finite logits, else the lowest allowed id. */
static int32_t argmax_masked(const float *logits, int n, const uint32_t *mask)
{
	int32_t best = -1;
	float bv = -INFINITY;
	for (int w = 0; w < (n + 31) / 32; w++) {
		uint32_t m = mask[w];
		while (m) {
			int i = w * 32 + __builtin_ctz(m);
			m &= m - 1;
			if (i >= n)
				break;
			float v = logits[i];
			if (v > bv) { /* NaN and -inf never win */
				bv = v;
				best = i;
			}
		}
	}
	return best >= 0 ? best : first_allowed(mask, n);
}

void ke_logits_mask(float *logits, int n, const uint32_t *mask)
{
	for (int w = 0; w < (n + 31) / 32; w++) {
		uint32_t m = mask[w];
		if (m == 0xFFFFFFFFu)
			continue;
		int end = w * 32 + 32 < n ? w * 32 + 32 : n;
		for (int i = w * 32; i < end; i++)
			if (!((m >> (i & 31)) & 1))
				logits[i] = -INFINITY;
	}
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

static int filters_on(const struct ke_sample_params *p)
{
	return p->top_k > 0 || p->top_p < 1.0 || p->min_p > 0.0;
}

/* top_k up to this takes the selection path (no exp over the vocabulary) */
#define TOPK_SELECT_MAX 1024

enum { PREP_DIST = -1, PREP_TOPK = -2 };

/*
 * Steps 1-3 of sample.h: penalties, then greedy (returns the id), or
 * PREP_TOPK with prob[] = the penalised logits (*mx their maximum) when
 * a small top_k lets the kept set be found from the logits alone, or
 * PREP_DIST with prob[] = softmax(logits / T) and *pmax its largest
 * probability.
 */
static int32_t prepare(struct ke_sampler *s, const float *logits, const uint32_t *mask, double *pmax, double *mx_out)
{
	const struct ke_sample_params *p = &s->p;
	int V = s->vocab;
	int greedy = p->temperature == 0.0;
	if (greedy && !s->penalties)
		return mask ? argmax_masked(logits, V, mask) : ke_argmax(logits, V);
	double *w = s->prob;
	if (mask)
		for (int i = 0; i < V; i++)
			w[i] = allowed(mask, i) && isfinite(logits[i]) ? (double)logits[i] : -INFINITY;
	else
		for (int i = 0; i < V; i++)
			w[i] = isfinite(logits[i]) ? (double)logits[i] : -INFINITY;
	if (s->penalties) {
		double r = p->repetition_penalty, f = p->frequency_penalty, q = p->presence_penalty;
		for (int j = 0; j < s->n_touched; j++) {
			int32_t id = s->touched[j];
			double x = w[id];
			if (x == -INFINITY)
				continue;
			if (s->rep_on)
				x = x < 0 ? x * r : x / r;
			if (s->count[id])
				x -= f * (double)s->count[id] + q;
			w[id] = x;
		}
	}
	double mx = -INFINITY;
	int32_t best = 0;
	for (int i = 0; i < V; i++)
		if (w[i] > mx) {
			mx = w[i];
			best = i;
		}
	if (greedy || mx == -INFINITY)
		return mx == -INFINITY ? (mask ? first_allowed(mask, V) : 0) : best;
	*mx_out = mx;
	if (p->top_k > 0 && p->top_k <= TOPK_SELECT_MAX && p->top_k < V)
		return PREP_TOPK;
	double total = 0.0;
	for (int i = 0; i < V; i++) {
		double e = w[i] == -INFINITY ? 0.0 : exp((w[i] - mx) / p->temperature);
		w[i] = e;
		total += e;
	}
	for (int i = 0; i < V; i++)
		w[i] /= total;
	*pmax = 1.0 / total; /* the max token's exp() is 1 */
	return PREP_DIST;
}

/* Steps 5-6 on cand[0..n) sorted: returns the new n and the mass kept.
 * topk_cut: top_k made the candidates (their own mass is what top_p is
 * relative to); else they come from a normalised distribution (mass 1). */
static int cut(struct ke_sampler *s, int n, int topk_cut, double *kept_mass)
{
	const struct ke_sample_params *p = &s->p;
	if (p->top_p < 1.0) {
		/* mass of what survived top-k: the k candidates, or everything */
		double kept = 1.0;
		if (topk_cut) {
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
	*kept_mass = kept;
	return n;
}

/* Steps 4-6 from a normalised prob[]: the kept tokens in cand[0..n),
 * descending; *kept their mass. */
static int filter(struct ke_sampler *s, double pmax, double *kept_mass)
{
	const struct ke_sample_params *p = &s->p;
	int n;
	double mass;
	double need = p->top_p < 1.0 ? p->top_p : 1.0;
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
	if (p->top_k > 0 && n > p->top_k) {
		/* HF keeps every token tied with the k-th */
		int k = p->top_k;
		while (k < n && s->cand[k].p == s->cand[p->top_k - 1].p)
			k++;
		n = k;
	}
	return cut(s, n, p->top_k > 0, kept_mass);
}

/* Sift the heap (a min-heap of the k largest logits) down from i. */
static void heap_down(double *h, int k, int i)
{
	for (;;) {
		int l = 2 * i + 1, r = l + 1, m = i;
		if (l < k && h[l] < h[m])
			m = l;
		if (r < k && h[r] < h[m])
			m = r;
		if (m == i)
			return;
		double t = h[i];
		h[i] = h[m];
		h[m] = t;
		i = m;
	}
}

/*
 * Steps 4-6 for a small top_k from the penalised logits in prob[]: the
 * k-th largest logit by a size-k min-heap (O(V log k), no exp), then
 * exp() of the survivors only. Only the kept set's own mass matters after
 * top-k (HF renormalises), so the result is the same as filter()'s.
 */
static int filter_topk(struct ke_sampler *s, double mx, double *kept_mass)
{
	const struct ke_sample_params *p = &s->p;
	int k = p->top_k, V = s->vocab, n = 0;
	double *h = (double *)s->cand; /* k doubles fit: cand holds V x 16 bytes */
	for (int i = 0; i < V; i++) {
		double x = s->prob[i];
		if (n < k) {
			int j = n++;
			h[j] = x;
			while (j > 0 && h[(j - 1) / 2] > h[j]) { /* sift up */
				double t = h[j];
				h[j] = h[(j - 1) / 2];
				h[(j - 1) / 2] = t;
				j = (j - 1) / 2;
			}
		} else if (x > h[0]) {
			h[0] = x;
			heap_down(h, k, 0);
		}
	}
	double kth = h[0];
	n = 0;
	for (int i = 0; i < V; i++) {
		double x = s->prob[i];
		if (x >= kth && x > -INFINITY) {
			s->cand[n].p = exp((x - mx) / p->temperature);
			s->cand[n].id = i;
			n++;
		}
	}
	qsort(s->cand, (size_t)n, sizeof *s->cand, cand_cmp);
	return cut(s, n, 1, kept_mass);
}

static int32_t choose(struct ke_sampler *s, const float *logits, const uint32_t *mask)
{
	double pmax = 1.0, mx = 0.0, kept;
	int32_t g = prepare(s, logits, mask, &pmax, &mx);
	if (g >= 0)
		return g;
	int n;
	if (g == PREP_TOPK) {
		n = filter_topk(s, mx, &kept);
	} else if (!filters_on(&s->p)) {
		/* No filter: walk the vocabulary in id order, no sort needed. */
		double u = (double)(next_u64(s) >> 11) * (1.0 / 9007199254740992.0);
		double acc = 0.0;
		int32_t last = 0;
		for (int i = 0; i < s->vocab; i++) {
			if (s->prob[i] <= 0.0)
				continue;
			acc += s->prob[i];
			last = i;
			if (u < acc)
				return i;
		}
		return last;
	} else {
		n = filter(s, pmax, &kept);
	}
	double u = (double)(next_u64(s) >> 11) * (1.0 / 9007199254740992.0) * kept;
	double acc = 0.0;
	for (int i = 0; i < n; i++) {
		acc += s->cand[i].p;
		if (u < acc)
			return s->cand[i].id;
	}
	return s->cand[n - 1].id;
}

int32_t ke_sample(struct ke_sampler *s, const float *logits)
{
	int32_t t = choose(s, logits, NULL);
	ke_sampler_accept(s, t);
	return t;
}

int32_t ke_sample_masked(struct ke_sampler *s, const float *logits, const uint32_t *mask)
{
	int32_t t = choose(s, logits, mask);
	ke_sampler_accept(s, t);
	return t;
}

int ke_sampler_dist(struct ke_sampler *s, const float *logits, int32_t *ids, double *probs)
{
	return ke_sampler_dist_masked(s, logits, NULL, ids, probs);
}

int ke_sampler_dist_masked(struct ke_sampler *s, const float *logits, const uint32_t *mask, int32_t *ids, double *probs)
{
	double pmax = 1.0, mx = 0.0, kept;
	int32_t g = prepare(s, logits, mask, &pmax, &mx);
	if (g >= 0) {
		ids[0] = g;
		probs[0] = 1.0;
		return 1;
	}
	int n = g == PREP_TOPK ? filter_topk(s, mx, &kept) : filter(s, pmax, &kept);
	for (int i = 0; i < n; i++) {
		ids[i] = s->cand[i].id;
		probs[i] = s->cand[i].p / kept;
	}
	return n;
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
