/*
 * fingerprint.h - the model fingerprint that names a prefix cache.
 *
 * Cached KV is only valid for the exact model, tokenizer, template and
 * numerics that computed it, so the cache namespace (h_{-1} of every chain
 * hash, DESIGN.md 4) is derived from all of them:
 *
 *   XXH3_128( "kvkeep-ns-1|" KE_NUMERICS_VERSION "|" kv_dtype "|B=" page_tokens "|"
 *             then, for each of config.json, tokenizer.json,
 *             tokenizer_config.json, chat_template.jinja,
 *             model.safetensors.index.json: name NUL XXH3_128(bytes)
 *             (a missing file contributes its name only),
 *             then for every *.safetensors file in name order:
 *             name XXH3_128(its JSON header, i.e. the tensor table) )
 *
 * Weight values are not read (they are GBs): any change to the config or
 * the tensor table (names, dtypes, shapes, offsets) changes the
 * fingerprint. The disk tier derives its namespace from this value and
 * the cache salt (store/ns.h); `kvkeep serve` uses it for the RAM tier.
 */
#ifndef KV_SERVER_FINGERPRINT_H
#define KV_SERVER_FINGERPRINT_H

#include "base/hash.h"

/* Never fails: unreadable files count as missing. */
struct kv_h128 ksv_model_fingerprint(const char *model_dir, const char *kv_dtype, int page_tokens);

#endif
