/*
 * sample.h - choosing the next token from logits, and log-probabilities.
 *
 * Order of the filters (the one vLLM and llama.cpp's default chain use):
 *   temperature == 0 (or top_k == 1): greedy, the lowest id among the
 *     maximal logits;
 *   else p = softmax(logits / T) in double;
 *   top_k > 0: keep the k most probable (ties broken by lower id);
 *   top_p < 1: keep the smallest most-probable prefix whose mass (within
 *     what is kept) reaches top_p;
 *   min_p > 0: keep tokens with p >= min_p x p_max;
 *   draw u in [0, 1) from the sampler's generator (xoshiro256**, seeded
 *   with splitmix64(seed)) and walk the kept tokens in descending order
 *   (in id order when no filter is set, which needs no sort).
 * Same seed + same logits -> same tokens, on every machine.
 *
 * A sampler holds scratch sized once for the vocabulary (KV_MEM_SCRATCH);
 * nothing is allocated per token. Not thread-safe; one per request.
 */
#ifndef KV_ENGINE_SAMPLE_H
#define KV_ENGINE_SAMPLE_H

#include <stdint.h>

struct ke_sample_params {
	double temperature;  /* 0 = greedy */
	int top_k;           /* 0 = off */
	double top_p;        /* 1 = off; must be in (0, 1] */
	double min_p;        /* 0 = off; in [0, 1] */
	uint64_t seed;
};

struct ke_sampler;

/* KV_ERR_INVALID for out-of-range parameters (message names the field). */
int ke_sampler_create(int vocab, const struct ke_sample_params *p, struct ke_sampler **out);
void ke_sampler_destroy(struct ke_sampler *s);
/* Reseed (same sequence of draws as a fresh sampler with this seed). */
void ke_sampler_seed(struct ke_sampler *s, uint64_t seed);
/* Next token id from vocab logits. Non-finite logits count as -inf; if
 * every logit is -inf/NaN, returns token 0 greedily. */
int32_t ke_sample(struct ke_sampler *s, const float *logits);

/* Greedy choice (lowest id among ties). */
int32_t ke_argmax(const float *logits, int n);
/* log-softmax of n logits (double accumulation) into out (may alias). */
void ke_logsoftmax(const float *logits, int n, float *out);
/* log-probability of one token, and the top_n most likely tokens with
 * theirs (descending, ties by lower id). ids/lps have room for top_n;
 * returns how many were written (min(top_n, n)). */
int ke_top_logprobs(const float *logits, int n, int top_n, int32_t *ids, float *lps);
float ke_token_logprob(const float *logits, int n, int32_t id);

#endif
