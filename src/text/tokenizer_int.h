/*
 * tokenizer_int.h - the tokenizer's structures, shared by its two files
 * and by nothing else: tokload.c builds a struct kv_tok from a
 * tokenizer.json, tokenizer.c encodes and decodes with it. The fields are
 * filled once by the loader and read-only afterwards (the piece cache
 * aside, which has its own locks).
 */
#ifndef KV_TEXT_TOKENIZER_INT_H
#define KV_TEXT_TOKENIZER_INT_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "text/tokenizer.h"
#include "base/buf.h"

#define KV_TOK_MAX_FILE (512u << 20)  /* tokenizer.json larger than this is refused */
#define KV_TOK_MAX_ID (1 << 24)       /* ids above this are refused (16M) */
#define KV_TOK_MAX_SPLITS 8           /* Split stages in the pre-tokenizer */

struct added {
	char *content;       /* malloc'd, len bytes (+NUL) */
	uint32_t len;
	int32_t id;
	uint8_t special, lstrip, rstrip, normalized;
};

/* Trie over added-token contents: first-child / next-sibling lists. */
struct trie_node {
	int32_t child;   /* first child, -1 none */
	int32_t sib;     /* next sibling, -1 none */
	int32_t tok;     /* index into t->added ending here, -1 none */
	uint8_t byte;
};

struct trie {
	struct trie_node *n;
	int32_t nn, cap;
	int32_t root[256];   /* node of the first byte, -1 none */
};

/* Merge table: open addressing, key = a << 32 | b (a, b < 2^24). */
struct mslot {
	uint64_t key;    /* MKEY_EMPTY when free */
	uint32_t rank;
	int32_t id;      /* id of the merged token */
};
#define MKEY_EMPTY UINT64_MAX

struct split {
	pcre2_code *re;
	int jit;         /* JIT compiled */
};

/*
 * Piece cache: PC_SHARDS shards picked by the top bits of the hash, each
 * a fixed table of PC_SLOTS slots (linear probing) and a PC_ARENA byte
 * arena. A slot holds the first 8 key bytes and, for one-id pieces (most
 * of them), the id itself, so a hit on a short word touches one cache
 * line; longer keys and id lists continue in the arena. A full shard is
 * simply emptied: the cache only ever changes speed, never the ids. HF
 * caches words up to 256 chars; so do we (bytes).
 */
#define PC_SHARDS 16
#define PC_SLOTS 2048
#define PC_ARENA (64u << 10)
#define PC_MAX_KEY 256
#define PC_MAX_IDS 256

struct pc_slot {
	uint64_t h;      /* 0 = empty */
	uint8_t key[8];  /* first min(klen, 8) key bytes */
	uint32_t off;    /* arena: key bytes after the 8th, then the ids when nids > 1 (4-aligned) */
	uint16_t klen;
	uint16_t nids;
	int32_t id0;     /* the id when nids == 1 */
	uint32_t pad;
};

/* One hash table of pieces: nslots (power of two) slots + an arena. */
struct pc_tab {
	struct pc_slot *slots;   /* NULL until first use */
	uint8_t *arena;
	uint32_t nslots;
	uint32_t arena_cap;      /* bytes */
	uint32_t used;           /* arena bytes used */
	uint32_t count;          /* live slots */
};

struct pc_shard {
	pthread_mutex_t mu;
	struct pc_tab tab;       /* PC_SLOTS slots, PC_ARENA bytes, kv_alloc'd lazily */
	uint64_t hits, misses;
	char pad[64];            /* keep shards on separate cache lines */
};

struct kv_tok {
	char *what;               /* source name for messages */
	int32_t n_ids;            /* max id + 1 */
	/* per id */
	uint32_t *piece_off;      /* [n_ids] offset into pieces */
	uint32_t *piece_len;
	char *pieces;             /* token strings, each NUL-terminated */
	uint32_t *dec_off;        /* [n_ids] offset into dec */
	uint32_t *dec_len;
	uint8_t *dec;             /* decoded bytes of every id */
	uint8_t *flags;           /* [n_ids] TF_* */
	struct kv_map *vocab;     /* model token string -> id */
	struct kv_map *raw_vocab; /* decoded bytes -> id (ignore_merges only) */
	/* added tokens */
	struct added *added;
	int32_t n_added;
	struct trie trie_raw;     /* normalized == false */
	struct trie trie_norm;    /* normalized == true (content NFC'd) */
	int has_norm_added;
	/* model */
	int32_t byte_id[256];     /* id of each byte's byte-level char, -1 none */
	int32_t unk_id;           /* -1 none */
	int ignore_merges;
	struct mslot *merges;     /* kv_alloc'd, mcap slots */
	uint64_t mmask;
	int mshift;
	/* SentencePiece-style BPE (Gemma): spaces become U+2581 before BPE, a
	 * piece's initial symbols are its characters (one without a vocab entry
	 * becomes its UTF-8 bytes as <0xXX> tokens), and decoding turns U+2581
	 * back into spaces and <0xXX> tokens into their bytes. */
	int sp;                   /* decoder Replace + ByteFallback + Fuse, or Metaspace */
	int sp_space;             /* normalizer Replace " " -> U+2581 (or Metaspace) */
	int sp_split;             /* Metaspace split: a piece starts at each U+2581 */
	int byte_fallback;        /* model.byte_fallback */
	int fuse_unk;             /* model.fuse_unk: a run of unknowns is one unk */
	int32_t fb_id[256];       /* <0xXX> ids (byte_fallback), -1 none */
	/* normalizer / pre-tokenizer */
	int nfc;
	struct split splits[KV_TOK_MAX_SPLITS];
	int n_splits;
	/* cache */
	struct pc_shard cache[PC_SHARDS];
};

enum { TF_VALID = 1, TF_ADDED = 2, TF_SPECIAL = 4 };

/* --- the merge table (open addressing; filled by tokload.c) --- */

static inline uint64_t mhash(uint64_t key, int shift)
{
	return (key * 0x9E3779B97F4A7C15ull) >> shift;
}

static inline int merge_get(const struct kv_tok *t, int32_t a, int32_t b, uint32_t *rank, int32_t *id)
{
	uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
	uint64_t i = mhash(key, t->mshift);
	for (;;) {
		const struct mslot *s = &t->merges[i];
		if (s->key == key) {
			*rank = s->rank;
			*id = s->id;
			return 1;
		}
		if (s->key == MKEY_EMPTY)
			return 0;
		i = (i + 1) & t->mmask;
	}
}

/* --- tokenizer.c: Unicode tables both sides use --- */

/* Build the NFC and stand-in tables once per process: KV_OK, or
 * KV_ERR_NOMEM (no message) when they cannot be allocated. */
int kv_tok_unicode_init(void);
/* 1 if p[0..n) (valid UTF-8) may change under NFC. */
int kv_tok_nfc_needed(const uint8_t *p, size_t n);
/* NFC of p[0..n) (valid UTF-8) into out (reset first). */
int kv_tok_nfc_run(const uint8_t *p, size_t n, struct kv_buf *out);

#endif
