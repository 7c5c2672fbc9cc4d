/*
 * fingerprint.h - the model fingerprint that names a prefix cache.
 *
 * Cached KV is only valid for the exact model, tokenizer, template,
 * weights and numerics that computed it, so the cache namespace (h_{-1} of
 * every chain hash, docs/cache.md) is derived from all of them:
 *
 *   XXH3_128( "kvkeep-ns-2|" KE_NUMERICS_VERSION "|" kv_dtype "|B=" page_tokens "|"
 *             ["qa=q8|" when the model multiplies quantized matrices with
 *              int8 activations (--quant-act q8): other numerics than f32]
 *             then, for each of config.json, tokenizer.json,
 *             tokenizer_config.json, chat_template.jinja,
 *             model.safetensors.index.json: name NUL XXH3_128(bytes)
 *             (a missing file contributes its name only),
 *             then for every *.safetensors file in name order:
 *             name NUL XXH3_128(every byte of the file) )
 *
 * Every weight byte counts: a fine-tune, a re-quantization or a merged
 * LoRA with the same tensor table gets another namespace. Hashing GBs at
 * every start would be slow, so the content hash of a weight file is
 * remembered in a memo folder beside the cache (<cache root>/weights/),
 * one small text file per file identity:
 *
 *   file name   "<st_dev hex>-<st_ino hex>"
 *   content     "kvkeep-weights-1 size=<bytes> mtime_ns=<n> ctime_ns=<n> xxh3=<32 hex>\n"
 *
 * A memo is used only when device, inode, size, mtime and ctime (in ns)
 * all match the file's stat; anything else (a rewrite in place, a copy,
 * a new file under the old name, touch -d restoring the mtime: ctime
 * still moves) hashes the file again and replaces the memo. ctime cannot
 * be set by a user, which is why it is part of the key. A memo folder
 * that cannot be written only costs the hash at every start.
 */
#ifndef KV_SERVER_FINGERPRINT_H
#define KV_SERVER_FINGERPRINT_H

#include <stdint.h>

#include "base/hash.h"

#define KSV_FP_MEMO_DIR "weights" /* below the cache root */

struct ksv_fp_params {
	const char *model_dir;
	const char *kv_dtype;
	int page_tokens;
	const char *quant_act; /* "q8" when matrices multiply with int8 activations, else NULL */
	const char *memo_dir; /* the memo folder (created if needed); NULL: hash every time */
	int skip_weights;     /* 1: weight files contribute their names only (no disk tier:
				 the namespace never outlives the process) */
};

struct ksv_fp_stats {
	uint32_t weight_files;   /* *.safetensors files seen */
	uint32_t memo_hits;      /* of them, taken from the memo */
	uint64_t bytes_hashed;   /* weight bytes read and hashed now */
	double seconds;          /* the whole fingerprint */
};

/* Never fails: unreadable files count as missing (and are not memoised).
 * stats may be NULL. */
struct kv_h128 ksv_model_fingerprint(const struct ksv_fp_params *p, struct ksv_fp_stats *stats);

#endif
