/*
 * obj.h - the disk tier's object format: how one block, tail, snapshot or
 * entry manifest is written to a file and validated when read back.
 *
 * Every object is a plain safetensors file (model/safetensors.h: u64 LE
 * header length, JSON header, data section), so standard tools open it.
 * The file name is content-addressed: "<id>.<kind>.safetensors" with <id>
 * the object's 32-hex-digit XXH3-128 name (dir.h shards it by its first
 * byte). docs/disk-format.md is the user-facing version of this page.
 *
 * __metadata__ (every value a string):
 *   "format"       "kvkeep-disk"             the magic
 *   "version"      "1"                       KS_VERSION
 *   "kind"         "block" | "tail" | "snapshot" | "entry"
 *   "namespace"    32 hex                    model fingerprint + salt (ns.h)
 *   "id"           32 hex                    the object's name
 *   "parent"       32 hex                    block: previous chain hash (the
 *                                            namespace for the first block);
 *                                            tail/snapshot: chain hash of the
 *                                            block the position sits in (its
 *                                            node); entry: the node of its end
 *   "pos"          decimal                   block: end position (depth x B);
 *                                            tail/snapshot: the resume point's
 *                                            position; entry: its length n
 *   "n_tokens"     decimal                   length of the "tokens" tensor
 *   "tokens_xxh3"  32 hex                    XXH3-128 of the tokens (int32 LE)
 *   "page_tokens"  decimal                   B of the layout that wrote it
 *   "kv_dtype"     "F32" | "BF16" | "Q8_0"   block and tail: the KV dtype
 *                                            of the layout that wrote it
 *                                            (absent in files written before
 *                                            it existed, all F32 or BF16)
 *   "anchor"       decimal                   snapshot: 1 if the resume point
 *                                            is a protected anchor, else 0;
 *                                            entry: its anchor position (0 none)
 *   "created"      decimal                   unix seconds
 *   "crc32c"       8 hex                     CRC32C of the whole data section
 *   "meta_crc32c"  8 hex                     CRC32C of every other metadata
 *                                            pair as "key=value\n", keys sorted
 *
 * Tensors, in this order, tiling the data section without gaps:
 *   every kind     "tokens"  I32 [n_tokens]  block: its B tokens; tail and
 *                                            snapshot: the t = pos mod B tail
 *                                            tokens; entry: all n tokens
 *   block          "kv.<l>.k", "kv.<l>.v"    KV dtype [kv_heads, B, head_dim]
 *                                            for attention layer l = 0, 1, ...
 *                                            (exactly layout.h's page bytes);
 *                                            Q8_0 KV, which safetensors has no
 *                                            dtype for: U8 [kv_heads, B,
 *                                            row_bytes], the rows' 34-byte
 *                                            blocks as they are in the page
 *   tail           "kv.<l>.k", "kv.<l>.v"    KV dtype [kv_heads, t, head_dim]
 *                                            (a compact tail of t rows; Q8_0:
 *                                            U8 [kv_heads, t, row_bytes])
 *   snapshot       "rec.<L>.conv"            F32 [conv_dim, K-1]   } for every
 *                  "rec.<L>.state"           F32 [Hv, dk, dv]      } recurrent
 *                                            layer L, in layer order (a layer
 *                                            whose dims do not describe its
 *                                            bytes is written as U8 [bytes])
 *   entry          "checkpoints"             I32 [k] ascending positions
 *
 * Validation (ks_obj_open then ks_obj_read), cheapest first, each failure
 * with its reason code for the counters:
 *   1 size      the file size fits the kind (fstat only)        KS_BAD_SIZE
 *   2 header    safetensors rules, magic, kind, fields parse    KS_BAD_HEADER
 *   3 version   "version" == KS_VERSION                         KS_BAD_VERSION
 *   4 namespace "namespace" == ours (else a miss, never a       KS_BAD_NS
 *               corruption: the caller must not quarantine it)
 *   5 metadata  meta_crc32c matches                             KS_BAD_CRC
 *   6 size arithmetic: each tensor has the byte count the
 *               layout implies and they tile the data section   KS_BAD_ARITH
 *   -- ks_obj_read: the data is read into the caller's buffers --
 *   7 crc       crc32c of the data section                      KS_BAD_CRC
 *   8 tokens    tokens_xxh3, the id recomputed from parent and
 *               tokens, the caller's expected tokens            KS_BAD_TOKENS
 *   9 shapes    "kv_dtype" and the dtype and shape of every
 *               tensor vs the layout                            KS_BAD_SHAPE
 *  10 positions pos fits the kind and B; checkpoints ascending
 *               inside (0, n); anchor is 0, n or a checkpoint   KS_BAD_POS
 *  11 coverage  every recurrent layer of the layout present     KS_BAD_COVER
 * Nothing from the file reaches an assert: every failure is an error code
 * (KV_ERR_CORRUPT, or KV_ERR_NOT_OURS / KV_ERR_VERSION for 4 / 3, or
 * KV_ERR_IO when the OS refused a read).
 */
#ifndef KV_STORE_OBJ_H
#define KV_STORE_OBJ_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "base/durable.h"
#include "base/hash.h"
#include "engine/layout.h"

#define KS_MAGIC "kvkeep-disk"
#define KS_VERSION 1
#define KS_HEADER_MAX (256u * 1024)       /* bytes of JSON header we accept */
#define KS_ENTRY_MAX_TOKENS (16u << 20)   /* longest entry manifest accepted */
#define KS_MAX_CKPT 64                    /* checkpoints per manifest (KC_CKPT_HARD) */

enum ks_kind { KS_BLOCK = 1, KS_TAIL = 2, KS_SNAP = 3, KS_ENTRY = 4, KS_KIND__END = 5 };

/* Why a file was refused (counters, `kvkeep cache verify`). */
enum ks_bad {
	KS_BAD_NONE = 0,
	KS_BAD_SIZE,
	KS_BAD_HEADER,
	KS_BAD_VERSION,
	KS_BAD_NS,
	KS_BAD_ARITH,
	KS_BAD_CRC,
	KS_BAD_TOKENS,
	KS_BAD_SHAPE,
	KS_BAD_POS,
	KS_BAD_COVER,
	KS_BAD_IO,
	KS_BAD__COUNT
};

/* "block", "tail", "snapshot", "entry"; NULL for anything else. */
const char *ks_kind_name(int kind);
/* The kind from a file-name suffix ("block", ..., "entry" as written in
 * names: "block", "tail", "snap", "entry"); 0 if none. */
int ks_kind_from_suffix(const char *s, size_t n);
/* Short name of a reason ("crc", "tokens", ...). */
const char *ks_bad_name(int bad);

/*
 * "<32 hex>.<block|tail|snap|entry>.safetensors" into out (>= 64 bytes).
 * Parse one back: KV_OK and kind/id, or KV_ERR_INVALID for any other name
 * (temp debris, stray files).
 */
void ks_obj_name(int kind, struct kv_h128 id, char out[64]);
int ks_obj_parse_name(const char *name, int *kind, struct kv_h128 *id);

/* What to write. Pointers are borrowed for the duration of the call. */
struct ks_obj_src {
	int kind;                 /* enum ks_kind */
	struct kv_h128 ns, id, parent;
	uint32_t pos;             /* see the table above */
	const int32_t *tokens;    /* n_tokens: B (block), t (tail, snapshot), n (entry) */
	uint32_t n_tokens;
	const void *kv;           /* block: one page (B rows per segment); tail: compact t rows */
	const void *snap;         /* snapshot: layout.snapshot_bytes */
	int anchor_flag;          /* snapshot: the rp is an anchor */
	const uint32_t *ckpt;     /* entry: ascending checkpoint positions */
	uint32_t n_ckpt;
	uint32_t anchor;          /* entry: anchor position (0 none) */
	int64_t created;          /* unix seconds (0: now) */
};

/*
 * Write one object to `path` with the durable protocol (temp file, data
 * sync, rename; dw_flags from base/durable.h, usually KV_DW_NO_DIRSYNC so
 * the caller syncs each folder once per batch). Tensor bytes go straight
 * from the caller's memory to the file: nothing is copied. deadline_ns >
 * 0: the write gives up with KV_ERR_TIMEOUT (nothing left on disk) as
 * soon as the monotonic clock passes it between two 4 MiB pieces.
 * *bytes = file size written (may be NULL). KV_ERR_INVALID for a source
 * that breaks the rules above.
 */
int ks_obj_write(const char *path, const struct ke_layout *L, const struct ks_obj_src *s, unsigned dw_flags,
		 uint64_t deadline_ns, uint64_t *bytes);

/*
 * The same in two halves, so a batch of objects can be written first and
 * made durable together (one journal commit instead of one per file):
 * ks_obj_stage creates the temp file and writes everything (deadline as
 * above); ks_obj_stage_commit does the data sync, close and rename (and
 * always releases the temp file); ks_obj_stage_abort removes it. Sources
 * may be released once ks_obj_stage returned.
 */
struct ks_obj_staged {
	struct kv_dw dw;
	uint64_t bytes;           /* file size */
};
int ks_obj_stage(const char *path, const struct ke_layout *L, const struct ks_obj_src *s, uint64_t deadline_ns,
		 struct ks_obj_staged *st);
int ks_obj_stage_commit(struct ks_obj_staged *st, unsigned dw_flags);
void ks_obj_stage_abort(struct ks_obj_staged *st);

/*
 * The same bytes as ks_obj_write, in pieces for a socket (the remote
 * tier, store/remote.h): iov[0] is the header (in *owned, malloc'd: free
 * it after the send), then each tensor straight from the source's memory
 * (valid as long as the source is). Nothing of the data is copied.
 * Returns the number of pieces (at most KS_OBJ_MAX_IOV) and *total, the
 * byte count; a negative error (KV_ERR_INVALID, KV_ERR_NOMEM) otherwise.
 */
#define KS_OBJ_MAX_IOV (3 + 2 * KV_MAX_LAYERS)
int ks_obj_iov(const struct ke_layout *L, const struct ks_obj_src *s, struct iovec *iov, void **owned,
	       uint64_t *total);

/* Exact file size ks_obj_write would produce (header included). */
uint64_t ks_obj_file_size(const struct ke_layout *L, const struct ks_obj_src *s);
/* Bytes of the data section of an object (no header). */
uint64_t ks_obj_data_bytes(const struct ke_layout *L, int kind, uint32_t n_tokens, uint32_t n_ckpt);

/* What the header said, valid after ks_obj_open. */
struct ks_obj_info {
	int kind;
	struct kv_h128 ns, id, parent, tokens_hash;
	uint32_t pos, n_tokens, n_ckpt, anchor;
	int anchor_flag;          /* snapshot */
	uint32_t crc;             /* "crc32c" */
	int64_t created;
	uint64_t file_size, data_off, data_bytes;
};

struct ks_obj;

/*
 * Open and check steps 1-6. want_kind 0 accepts any kind. ns NULL skips
 * the namespace check (for tools listing other namespaces). On failure
 * *bad says why (KS_BAD_NONE on success) and nothing is returned;
 * KV_ERR_NOT_OURS for another namespace, KV_ERR_VERSION for another
 * version, KV_ERR_NOT_FOUND for a missing file, KV_ERR_IO, else
 * KV_ERR_CORRUPT (reported through KV_CORRUPT where found).
 */
int ks_obj_open(const char *path, const struct ke_layout *L, int want_kind, const struct kv_h128 *ns,
		struct ks_obj **out, int *bad);
/* The same steps on an object held in memory (a value from the remote
 * tier): len bytes at buf, which must outlive the handle; `what` names it
 * in messages. Step 1 checks len instead of a file size. */
int ks_obj_open_mem(const void *buf, size_t len, const char *what, const struct ke_layout *L, int want_kind,
		    const struct kv_h128 *ns, struct ks_obj **out, int *bad);
const struct ks_obj_info *ks_obj_info(const struct ks_obj *o);
void ks_obj_close(struct ks_obj *o);

/*
 * Where ks_obj_read puts the data. Any pointer may be NULL: that part is
 * read into a scratch buffer only to be checked. Sizes are the object's
 * (ks_obj_info): tokens n_tokens int32; kv page_bytes (block) or
 * t x kv_bytes_per_token (tail); snap layout.snapshot_bytes; ckpt n_ckpt.
 */
struct ks_obj_dst {
	int32_t *tokens;
	void *kv;
	void *snap;
	uint32_t *ckpt;
	const int32_t *expect;    /* if set: the tokens must equal these (n_tokens) */
};

/* Steps 7-11 (see the top). KV_OK, or an error with *bad set. The
 * destination buffers hold garbage after a failure. */
int ks_obj_read(struct ks_obj *o, const struct ks_obj_dst *d, int *bad);

/* Open + read + close, the data checked and thrown away: what `kvkeep
 * cache verify` and the tests run on every file. */
int ks_obj_verify(const char *path, const struct ke_layout *L, int want_kind, const struct kv_h128 *ns,
		  struct ks_obj_info *info, int *bad);

/* Ask the kernel to drop the file's cached pages (benchmarks). */
void ks_obj_drop_cache(const char *path);

#endif
