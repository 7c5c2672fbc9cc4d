/*
 * sample.h - choosing the next token from logits, and log-probabilities.
 *
 * The processors run in the order Hugging Face's generate() applies them
 * (transformers generation/utils.py _get_logits_processor: penalties
 * first, then the sampling warpers temperature, top-k, top-p, min-p):
 *   1. repetition_penalty r != 1 (HF RepetitionPenaltyLogitsProcessor):
 *      every token in the prompt or generated so far, once however often
 *      it occurs: logit < 0 ? logit x r : logit / r;
 *   2. frequency_penalty f, presence_penalty q (OpenAI; HF has neither,
 *      vLLM applies them right after the repetition penalty): a token
 *      generated c > 0 times gets logit - c f - q; prompt tokens are not
 *      counted;
 *   3. temperature == 0: greedy, the lowest id among the maximal
 *      (penalised) logits;
 *      else p = softmax(logits / T) in double;
 *   4. top_k > 0: keep the tokens whose p is >= the k-th largest p (ties
 *      with the k-th are kept, as HF's TopKLogitsWarper does);
 *   5. top_p < 1: keep the smallest most-probable prefix whose mass
 *      (within what is kept) reaches top_p (HF TopPLogitsWarper);
 *   6. min_p > 0: keep tokens with p >= min_p x p_max (HF MinPLogitsWarper);
 *   draw u in [0, 1) from the sampler's generator (xoshiro256**, seeded
 *   with splitmix64(seed)) and walk the kept tokens in descending order
 *   (in id order when no filter and no penalty is set, which needs no sort).
 * Same seed + same logits + same history -> same tokens, on every machine.
 *
 * A sampler is one sequence's: its generator state and its penalty counts
 * live in it and nowhere else (no global state), so a sequence samples the
 * same tokens alone or batched with others. Penalty state is per-token
 * counts, updated in O(1) per token; applying the penalties costs O(distinct
 * tokens seen), never O(vocab x generated). Scratch is sized once for the
 * vocabulary (KV_MEM_SCRATCH); nothing is allocated per token. Not
 * thread-safe; one per sequence.
 */
#ifndef KV_ENGINE_SAMPLE_H
#define KV_ENGINE_SAMPLE_H

#include <stddef.h>
#include <stdint.h>

struct ke_sample_params {
	double temperature;        /* 0 = greedy */
	int top_k;                 /* 0 = off */
	double top_p;              /* 1 = off; must be in (0, 1] */
	double min_p;              /* 0 = off; in [0, 1] */
	double presence_penalty;   /* 0 = off; finite */
	double frequency_penalty;  /* 0 = off; finite */
	double repetition_penalty; /* 1 (or 0, meaning unset) = off; else > 0 */
	uint64_t seed;
};

struct ke_sampler;

/* KV_ERR_INVALID for out-of-range parameters (message names the field). */
int ke_sampler_create(int vocab, const struct ke_sample_params *p, struct ke_sampler **out);
void ke_sampler_destroy(struct ke_sampler *s);
/* Reseed (same sequence of draws as a fresh sampler with this seed); the
 * penalty history is kept. */
void ke_sampler_seed(struct ke_sampler *s, uint64_t seed);
/* Forget the history (prompt and generated tokens) and reseed: the
 * sampler is then as new, for another sequence. */
void ke_sampler_reset(struct ke_sampler *s, uint64_t seed);
/* The prompt's tokens (they count for the repetition penalty only). Ids
 * outside the vocabulary are ignored. May be called more than once. */
void ke_sampler_prompt(struct ke_sampler *s, const int32_t *ids, size_t n);
/* A token appended to the sequence that ke_sample did not choose (a
 * forced token): it counts as generated. */
void ke_sampler_accept(struct ke_sampler *s, int32_t id);
/* Next token id from vocab logits; the token counts as generated from
 * then on. Non-finite logits count as -inf; if every logit is -inf/NaN,
 * returns token 0 greedily. */
int32_t ke_sample(struct ke_sampler *s, const float *logits);
/*
 * The distribution ke_sample would draw from, without drawing or
 * recording anything: ids[i] / probs[i] for the kept tokens, most
 * probable first (ties by lower id), probs summing to 1. A greedy choice
 * gives one token with probability 1. ids and probs have room for vocab
 * entries; returns how many were written. For tests and diagnostics.
 */
int ke_sampler_dist(struct ke_sampler *s, const float *logits, int32_t *ids, double *probs);

/*
 * A token mask (the constraint engine, text/gmatch.h): bit i of mask[i /
 * 32] (least significant first) set = token i allowed; (vocab + 31) / 32
 * words. ke_sample_masked is ke_sample on the logits with every
 * masked-out one replaced by -inf before anything else, so the penalties
 * and every filter see the masked distribution; it reads the logits
 * without writing them. When no allowed token has a finite logit it
 * returns the lowest allowed id (0 if the mask allows nothing), never a
 * masked-out one. ke_sampler_dist_masked is ke_sampler_dist the same way.
 * ke_logits_mask writes the -infs into a logits buffer, for callers whose
 * logprobs must see the mask (ke_top_logprobs on the masked buffer).
 */
int32_t ke_sample_masked(struct ke_sampler *s, const float *logits, const uint32_t *mask);
int ke_sampler_dist_masked(struct ke_sampler *s, const float *logits, const uint32_t *mask, int32_t *ids, double *probs);
void ke_logits_mask(float *logits, int n, const uint32_t *mask);

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
