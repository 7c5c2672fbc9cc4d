/*
 * test_sample.c - the sampler (engine/sample.h): penalties, their
 * per-sequence state, and the random cases tests/ref/sampling_ref.sh
 * compares with a NumPy implementation of Hugging Face's logits
 * processors.
 *
 * dump_cases writes its cases as JSON lines to $KT_SAMPLE_DUMP when that
 * is set (the reference script's input); it always checks what it can
 * alone (probabilities sum to 1, descending, distinct ids).
 */
#include "base/err.h"
#include "engine/sample.h"
#include "kt.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static double urand(uint64_t *st)
{
	return (double)(kt_rand(st) >> 11) * (1.0 / 9007199254740992.0);
}

#define NCASES 600

KT_CASE(dump_cases)
{
	const char *path = getenv("KT_SAMPLE_DUMP");
	FILE *f = path && *path ? fopen(path, "w") : NULL;
	KT_REQUIRE(!path || !*path || f);
	uint64_t st = 12345;
	int32_t *ids = malloc(512 * sizeof *ids);
	double *probs = malloc(512 * sizeof *probs);
	float logits[512];
	int32_t hist[200];
	for (int c = 0; c < NCASES; c++) {
		int V = 2 + (int)(kt_rand(&st) % 300);
		int kind = (int)(kt_rand(&st) % 4); /* 0, 1 random; 2 ties (quantised); 3 some -inf */
		for (int i = 0; i < V; i++) {
			double x = -8 + 16 * urand(&st);
			if (kind == 2)
				x = floor(x * 2) / 2;
			logits[i] = (float)x;
			if (kind == 3 && kt_rand(&st) % 5 == 0)
				logits[i] = -INFINITY;
		}
		if (kind == 3)
			logits[kt_rand(&st) % (uint64_t)V] = 1.0f; /* one finite at least */
		struct ke_sample_params p = {.temperature = 1.0, .top_p = 1.0, .repetition_penalty = 1.0,
					     .seed = (uint64_t)c};
		uint64_t r = kt_rand(&st);
		if (r % 10 == 0)
			p.temperature = 0.0;
		else
			p.temperature = 0.1 + 1.9 * urand(&st);
		if (kt_rand(&st) % 2)
			p.top_k = 1 + (int)(kt_rand(&st) % (uint64_t)(V + 5));
		/* top-p on tied logits depends on the order of equal tokens in
		 * HF's sort: only on distinct ones */
		if (kind != 2 && kt_rand(&st) % 2)
			p.top_p = 0.05 + 0.95 * urand(&st);
		if (kt_rand(&st) % 3 == 0)
			p.min_p = 0.5 * urand(&st);
		if (kt_rand(&st) % 2)
			p.presence_penalty = -2 + 4 * urand(&st);
		if (kt_rand(&st) % 2)
			p.frequency_penalty = -2 + 4 * urand(&st);
		if (kt_rand(&st) % 2)
			p.repetition_penalty = 0.5 + 1.5 * urand(&st);
		int n_prompt = (int)(kt_rand(&st) % 60), n_gen = (int)(kt_rand(&st) % 60);
		for (int i = 0; i < n_prompt + n_gen; i++) /* few distinct ids: repeats */
			hist[i] = (int32_t)(kt_rand(&st) % (uint64_t)(V < 40 ? V : 20 + V / 4));
		struct ke_sampler *s;
		KT_OK(ke_sampler_create(V, &p, &s));
		KT_REQUIRE(s);
		ke_sampler_prompt(s, hist, (size_t)n_prompt);
		for (int i = 0; i < n_gen; i++)
			ke_sampler_accept(s, hist[n_prompt + i]);
		int n = ke_sampler_dist(s, logits, ids, probs);
		KT_CHECK(n >= 1 && n <= V);
		double sum = 0;
		for (int i = 0; i < n; i++) {
			sum += probs[i];
			KT_CHECK(ids[i] >= 0 && ids[i] < V);
			if (i)
				KT_CHECKF(probs[i] <= probs[i - 1], "case %d: not descending at %d", c, i);
			for (int j = 0; j < i; j++)
				KT_CHECK(ids[i] != ids[j]);
		}
		KT_CHECKF(fabs(sum - 1) < 1e-9, "case %d: probabilities sum to %.12f", c, sum);
		/* the draw is always a member of the kept set */
		int32_t t = ke_sample(s, logits);
		int in = 0;
		for (int i = 0; i < n; i++)
			in |= ids[i] == t;
		KT_CHECKF(in, "case %d: drew %d outside the kept set", c, t);
		ke_sampler_destroy(s);
		if (f) {
			fprintf(f, "{\"case\":%d,\"V\":%d,\"temperature\":%.17g,\"top_k\":%d,\"top_p\":%.17g,\"min_p\":%.17g,"
				   "\"presence_penalty\":%.17g,\"frequency_penalty\":%.17g,\"repetition_penalty\":%.17g,\"logits\":[",
				c, V, p.temperature, p.top_k, p.top_p, p.min_p, p.presence_penalty, p.frequency_penalty,
				p.repetition_penalty);
			for (int i = 0; i < V; i++) {
				if (isinf(logits[i]))
					fprintf(f, "%s-Infinity", i ? "," : "");
				else
					fprintf(f, "%s%.9g", i ? "," : "", logits[i]);
			}
			fprintf(f, "],\"prompt\":[");
			for (int i = 0; i < n_prompt; i++)
				fprintf(f, "%s%d", i ? "," : "", hist[i]);
			fprintf(f, "],\"gen\":[");
			for (int i = 0; i < n_gen; i++)
				fprintf(f, "%s%d", i ? "," : "", hist[n_prompt + i]);
			fprintf(f, "],\"ids\":[");
			for (int i = 0; i < n; i++)
				fprintf(f, "%s%d", i ? "," : "", ids[i]);
			fprintf(f, "],\"probs\":[");
			for (int i = 0; i < n; i++)
				fprintf(f, "%s%.17g", i ? "," : "", probs[i]);
			fprintf(f, "]}\n");
		}
	}
	free(ids);
	free(probs);
	if (f)
		fclose(f);
}

KT_CASE(penalties_follow_the_history)
{
	float l[3] = {1.0f, 0.5f, 0.0f};
	struct ke_sampler *s;
	/* presence 2, greedy: each token once, then the best of the penalised */
	struct ke_sample_params p = {.temperature = 0, .top_p = 1, .presence_penalty = 2};
	KT_OK(ke_sampler_create(3, &p, &s));
	int want[] = {0, 1, 2, 0, 0};
	for (int i = 0; i < 5; i++)
		KT_EQ_INT(ke_sample(s, l), want[i]);
	/* frequency 0.3: the count grows, token 0 (1.0 - 0.3c) gives way */
	ke_sampler_destroy(s);
	p.presence_penalty = 0;
	p.frequency_penalty = 0.3;
	KT_OK(ke_sampler_create(3, &p, &s));
	KT_EQ_INT(ke_sample(s, l), 0); /* 1.0 */
	KT_EQ_INT(ke_sample(s, l), 0); /* 0.7 > 0.5 */
	KT_EQ_INT(ke_sample(s, l), 1); /* 0.4 < 0.5 */
	/* reset: a new sequence, no history */
	ke_sampler_reset(s, 0);
	KT_EQ_INT(ke_sample(s, l), 0);
	ke_sampler_destroy(s);
	/* repetition 3 on a prompt token: 1.0 / 3 < 0.5; prompt tokens do not
	 * count for presence / frequency */
	p.frequency_penalty = 0;
	p.repetition_penalty = 3;
	KT_OK(ke_sampler_create(3, &p, &s));
	int32_t prompt[] = {0, 0, 0};
	ke_sampler_prompt(s, prompt, 3);
	KT_EQ_INT(ke_sample(s, l), 1);
	ke_sampler_destroy(s);
	p.repetition_penalty = 1;
	p.presence_penalty = 2;
	KT_OK(ke_sampler_create(3, &p, &s));
	ke_sampler_prompt(s, prompt, 3);
	KT_EQ_INT(ke_sample(s, l), 0);
	/* a forced token counts as generated */
	ke_sampler_accept(s, 1);
	KT_EQ_INT(ke_sample(s, l), 2);
	ke_sampler_destroy(s);
	/* a negative logit is multiplied: -1 x 2 = -2 < -1.5 */
	float n[2] = {-1.0f, -1.5f};
	p = (struct ke_sample_params){.temperature = 0, .top_p = 1, .repetition_penalty = 2};
	KT_OK(ke_sampler_create(2, &p, &s));
	ke_sampler_prompt(s, prompt, 1);
	KT_EQ_INT(ke_sample(s, n), 1);
	ke_sampler_destroy(s);
	/* bad penalties */
	struct ke_sample_params bad[] = {
		{.temperature = 1, .top_p = 1, .repetition_penalty = -1},
		{.temperature = 1, .top_p = 1, .presence_penalty = NAN},
		{.temperature = 1, .top_p = 1, .frequency_penalty = INFINITY},
	};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
		KT_EQ_INT(ke_sampler_create(3, &bad[i], &s), KV_ERR_INVALID);
}

/*
 * The state is the sequence's own: a sampler gives the same tokens
 * whether other samplers run between its steps or not (what batching
 * several sequences does), and the same after a reset as when new.
 */
KT_CASE(samplers_are_independent_and_deterministic)
{
	enum { V = 200, N = 300 };
	float *l = malloc(V * sizeof *l);
	uint64_t st = 7;
	for (int i = 0; i < V; i++)
		l[i] = (float)(-3 + 6 * urand(&st));
	struct ke_sample_params p = {.temperature = 0.9, .top_k = 40, .top_p = 0.9, .min_p = 0.01,
				     .presence_penalty = 0.5, .frequency_penalty = 0.2, .repetition_penalty = 1.1,
				     .seed = 2024};
	struct ke_sample_params q = {.temperature = 1.3, .top_p = 1, .frequency_penalty = 1, .seed = 5};
	int32_t prompt[] = {3, 4, 5, 3};
	struct ke_sampler *a, *b, *other;
	KT_OK(ke_sampler_create(V, &p, &a));
	KT_OK(ke_sampler_create(V, &p, &b));
	KT_OK(ke_sampler_create(V, &q, &other));
	ke_sampler_prompt(a, prompt, 4);
	ke_sampler_prompt(b, prompt, 4);
	ke_sampler_prompt(other, prompt, 2);
	int32_t alone[N];
	for (int i = 0; i < N; i++)
		alone[i] = ke_sample(a, l);
	int same = 1, varied = 0;
	for (int i = 0; i < N; i++) {
		ke_sample(other, l);
		same &= ke_sample(b, l) == alone[i];
		ke_sample(other, l);
		varied |= alone[i] != alone[0];
	}
	KT_CHECK(same);
	KT_CHECK(varied); /* the penalties and the draw do move the choice */
	ke_sampler_reset(a, 2024);
	ke_sampler_prompt(a, prompt, 4);
	same = 1;
	for (int i = 0; i < N; i++)
		same &= ke_sample(a, l) == alone[i];
	KT_CHECK(same);
	ke_sampler_destroy(a);
	ke_sampler_destroy(b);
	ke_sampler_destroy(other);
	free(l);
}

/* Small top_k is found by selection from the logits, large top_k from the
 * sorted distribution: both keep exactly the k best, in proportion. */
KT_CASE(top_k_paths_agree)
{
	enum { V = 3000 };
	float *l = malloc(V * sizeof *l);
	int32_t *ids = malloc(V * sizeof *ids);
	double *pr = malloc(V * sizeof *pr);
	for (int i = 0; i < V; i++)
		l[i] = -6.0f + 12.0f * (float)((i * 7919) % V) / V; /* distinct */
	int ks[] = {1, 5, 1000, 1024, 1025, 2999, 3000};
	for (size_t j = 0; j < sizeof ks / sizeof ks[0]; j++) {
		struct ke_sample_params p = {.temperature = 0.7, .top_k = ks[j], .top_p = 1, .seed = 1};
		struct ke_sampler *s;
		KT_OK(ke_sampler_create(V, &p, &s));
		int n = ke_sampler_dist(s, l, ids, pr);
		KT_EQ_INT(n, ks[j]);
		float lowest = INFINITY;
		for (int i = 0; i < n; i++)
			lowest = l[ids[i]] < lowest ? l[ids[i]] : lowest;
		int above = 0; /* no token outside is better than the worst inside */
		for (int i = 0; i < V; i++)
			above += l[i] >= lowest;
		KT_EQ_INT(above, n);
		for (int i = 1; i < n; i++)
			KT_CHECK(fabs(pr[i] / pr[0] - exp((l[ids[i]] - l[ids[0]]) / 0.7)) < 1e-9);
		ke_sampler_destroy(s);
	}
	free(l);
	free(ids);
	free(pr);
}


/* ke_sample_masked is ke_sample on the logits with the masked-out ones at
 * -inf (penalties, filters and draws see the masked distribution), and it
 * never returns a masked-out token; the logits are not written. */
KT_CASE(masked_sampling_equals_masking_the_logits)
{
	uint64_t st = 777;
	float logits[700], copy[700], keep[700];
	uint32_t mask[(700 + 31) / 32];
	int32_t ids_a[700], ids_b[700];
	double pa[700], pb[700];
	for (int c = 0; c < 300; c++) {
		int V = 2 + (int)(kt_rand(&st) % 650);
		for (int i = 0; i < V; i++)
			logits[i] = (float)(-6 + 12 * urand(&st));
		if (c % 7 == 0)
			logits[kt_rand(&st) % (uint64_t)V] = -INFINITY;
		memset(mask, 0, sizeof mask);
		int dens = (int)(kt_rand(&st) % 4); /* one token, sparse, half, nearly all */
		for (int i = 0; i < V; i++) {
			int on = dens == 0 ? 0 : dens == 1 ? kt_rand(&st) % 20 == 0 : dens == 2 ? kt_rand(&st) % 2 : kt_rand(&st) % 50 != 0;
			if (on)
				mask[i >> 5] |= 1u << (i & 31);
		}
		int32_t one = (int32_t)(kt_rand(&st) % (uint64_t)V);
		mask[one >> 5] |= 1u << (one & 31);
		logits[one] = 1.0f; /* some allowed token is finite */
		memcpy(copy, logits, (size_t)V * sizeof *copy);
		memcpy(keep, logits, (size_t)V * sizeof *keep);
		ke_logits_mask(copy, V, mask);
		struct ke_sample_params p = {.temperature = (c % 5) ? 0.2 + 1.5 * urand(&st) : 0.0,
					     .top_k = c % 3 ? 0 : 1 + (int)(kt_rand(&st) % 40),
					     .top_p = c % 4 ? 1.0 : 0.3 + 0.7 * urand(&st),
					     .min_p = c % 6 ? 0.0 : 0.1 * urand(&st),
					     .presence_penalty = c % 2 ? 0.5 : 0.0,
					     .frequency_penalty = c % 3 == 1 ? 0.3 : 0.0,
					     .repetition_penalty = c % 4 == 2 ? 1.3 : 1.0,
					     .seed = (uint64_t)c};
		struct ke_sampler *a, *b;
		KT_OK(ke_sampler_create(V, &p, &a));
		KT_OK(ke_sampler_create(V, &p, &b));
		int32_t hist[8];
		for (int h = 0; h < 8; h++)
			hist[h] = (int32_t)(kt_rand(&st) % (uint64_t)V);
		ke_sampler_prompt(a, hist, 4);
		ke_sampler_prompt(b, hist, 4);
		for (int h = 4; h < 8; h++) {
			ke_sampler_accept(a, hist[h]);
			ke_sampler_accept(b, hist[h]);
		}
		int na = ke_sampler_dist_masked(a, logits, mask, ids_a, pa);
		int nb = ke_sampler_dist(b, copy, ids_b, pb);
		KT_EQ_INT(na, nb);
		for (int i = 0; i < na && i < nb; i++) {
			KT_EQ_INT(ids_a[i], ids_b[i]);
			KT_CHECK(pa[i] == pb[i]);
		}
		for (int k = 0; k < 5; k++) {
			int32_t ta = ke_sample_masked(a, logits, mask), tb = ke_sample(b, copy);
			KT_EQ_INT(ta, tb);
			KT_CHECK((mask[ta >> 5] >> (ta & 31)) & 1);
		}
		KT_CHECK(!memcmp(logits, keep, (size_t)V * sizeof *logits));
		ke_sampler_destroy(a);
		ke_sampler_destroy(b);
	}
	/* every allowed logit -inf: the lowest allowed id, never a masked one */
	struct ke_sample_params g = {.temperature = 0.7, .top_p = 1.0};
	struct ke_sampler *s;
	KT_OK(ke_sampler_create(64, &g, &s));
	for (int i = 0; i < 64; i++)
		logits[i] = i < 40 ? -INFINITY : 5.0f;
	uint32_t m2[2] = {0, (1u << 3) | (1u << 5)}; /* ids 35 and 37 */
	KT_EQ_INT(ke_sample_masked(s, logits, m2), 35);
	g.temperature = 0.0;
	ke_sampler_destroy(s);
	KT_OK(ke_sampler_create(64, &g, &s));
	KT_EQ_INT(ke_sample_masked(s, logits, m2), 35);
	logits[37] = 1.0f;
	KT_EQ_INT(ke_sample_masked(s, logits, m2), 37);
	ke_sampler_destroy(s);
}

KT_MAIN(dump_cases, masked_sampling_equals_masking_the_logits, penalties_follow_the_history, samplers_are_independent_and_deterministic, top_k_paths_agree)
