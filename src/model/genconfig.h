/*
 * genconfig.h - a model's own sampling defaults and end-of-sequence ids:
 * generation_config.json of a Hugging Face (or MLX) folder, GGUF
 * general.sampling.* keys through kv_gencfg_set_gguf. The stop-token set
 * every generation uses is text/stop.h (it needs the tokenizer).
 *
 * generation_config.json, the fields read (everything else is ignored):
 *   temperature          number >= 0
 *   top_p                number in (0, 1]
 *   top_k                integer >= 0 (0 = off; -1 also means off)
 *   min_p                number in [0, 1]
 *   repetition_penalty   number > 0 (1 = off)
 *   presence_penalty     number in [-2, 2] (0 = off)
 *   frequency_penalty    number in [-2, 2] (0 = off)
 *   do_sample            bool; false means greedy as in Hugging Face: the
 *                        temperature default becomes 0 whatever the file's
 *                        temperature says
 *   eos_token_id         integer or list of integers (at most 16)
 * A null value is the same as an absent field. A file that is not JSON,
 * not an object, or has any of these fields with a wrong type or out of
 * range is refused as a whole (KV_ERR_INVALID naming the field): the
 * caller logs one warning and goes on without it, so a server with an odd
 * file still starts, on documented defaults.
 *
 * A kv_gencfg is a set of optional values, each with the source it came
 * from; kv_gencfg_overlay layers them (OpenAI defaults < the model's file
 * < command-line flags). Plain data, no handles: copy it freely.
 */
#ifndef KV_MODEL_GENCONFIG_H
#define KV_MODEL_GENCONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "model/config.h"

enum kv_gencfg_field {
	KV_GC_TEMPERATURE = 0,
	KV_GC_TOP_P,
	KV_GC_TOP_K,
	KV_GC_MIN_P,
	KV_GC_PRESENCE_PENALTY,
	KV_GC_FREQUENCY_PENALTY,
	KV_GC_REPETITION_PENALTY,
	KV_GC_N
};

#define KV_GENCFG_MAX_EOS 16

struct kv_gencfg {
	double v[KV_GC_N];          /* value of each field (top_k as a whole number) */
	const char *src[KV_GC_N];   /* where it came from (static string), NULL: not set */
	int32_t eos_ids[KV_GENCFG_MAX_EOS]; /* generation_config eos_token_id */
	int n_eos;
};

/* "temperature", "top_p", "top_k", "min_p", "presence_penalty",
 * "frequency_penalty", "repetition_penalty"; NULL out of range. */
const char *kv_gencfg_name(int field);
/* Field of a name, or -1. */
int kv_gencfg_field(const char *name);

/* Nothing set. */
void kv_gencfg_init(struct kv_gencfg *g);
/* The OpenAI API's defaults, every field set, source "openai":
 * temperature 1, top_p 1, top_k 0, min_p 0, penalties 0 / 0 / 1. */
void kv_gencfg_openai(struct kv_gencfg *g);
/* Range check of one value (the ranges above); KV_ERR_INVALID naming the
 * field. top_k -1 is accepted and stored as 0 (off). */
int kv_gencfg_check(int field, double *v);
/* Set one field (range-checked, source a static string such as "gguf"). */
int kv_gencfg_set(struct kv_gencfg *g, int field, double v, const char *source);
/*
 * Set a field from a GGUF metadata key, for the GGUF reader:
 *   general.sampling.temp -> temperature, .top_k, .top_p, .min_p,
 *   .penalty_repeat -> repetition_penalty, .penalty_present ->
 *   presence_penalty, .penalty_freq -> frequency_penalty
 * (source "gguf"). Other general.sampling.* keys (mirostat, xtc, ...) are
 * KV_ERR_UNSUPPORTED, so the caller can skip them; a key outside
 * general.sampling is KV_ERR_NOT_FOUND.
 */
int kv_gencfg_set_gguf(struct kv_gencfg *g, const char *key, double v);
/* Copy every field set in `top` over `base` (eos ids are appended). */
void kv_gencfg_overlay(struct kv_gencfg *base, const struct kv_gencfg *top);

/* Parse generation_config.json text; `what` names it in messages. Sets the
 * fields present, source "generation_config". */
int kv_gencfg_parse(const char *text, size_t len, const char *what, struct kv_gencfg *out);
/* Read <dir>/generation_config.json: KV_ERR_NOT_FOUND when the folder has
 * none (out left empty), else as kv_gencfg_parse. For a GGUF model path,
 * its general.sampling.* metadata instead (no key: out left empty). */
int kv_gencfg_load(const char *dir, struct kv_gencfg *out);

#endif
