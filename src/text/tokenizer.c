/*
 * tokenizer.c - byte-level BPE tokenizer read from a Hugging Face
 * tokenizer.json (see tokenizer.h for the API, docs/tokenizer.md for the
 * user-facing description).
 *
 * What kv_tok_encode computes is Hugging Face's
 * `tokenizer.encode(text, add_special_tokens=False)`: the post-processor,
 * truncation and padding sections are not applied (the chat template adds
 * every special token itself). With allow_special = 0 it is the same with
 * `encode_special_tokens = True` (special literals are encoded as text).
 *
 * Loading (tokenizer.json, the fields read and what is refused) is
 * tokload.c; the structures both share are tokenizer_int.h.
 *
 * Encode pipeline (HF's order):
 *   1. added tokens whose "normalized" is false are matched on the raw
 *      text, leftmost-longest (a trie walk per candidate position);
 *      a special match is skipped when !allow_special (HF skips the match,
 *      the text under it becomes ordinary text);
 *   2. every gap is NFC-normalised, then added tokens with "normalized"
 *      true are matched in the normalised gap;
 *   3. each remaining gap goes through the Split stages (PCRE2, UTF + UCP,
 *      JIT; each stage sees one piece of the previous stage as its whole
 *      subject, as in HF) and each final piece through byte-level BPE.
 *      The regex runs verbatim, but over a copy of the gap in which the
 *      code points that PCRE2's Unicode 14 tables class differently from
 *      HF's Oniguruma (Unicode 16) are replaced by same-length stand-ins
 *      of the oracle's class (tokenizer_ucd.h, generated); the pieces are
 *      cut from the real text at the same offsets.
 *
 * BPE: the bytes of a piece start as the ids of their byte-level chars;
 * the adjacent pair with the lowest merge rank (leftmost on ties) is
 * merged until no pair has a merge. Short pieces use a linear scan over an
 * array, long ones a 4-ary heap over a linked list (O(n log n), HF's
 * algorithm). The results of pieces up to PC_MAX_KEY bytes are cached in
 * two levels: a lock-free table per encode call (repeats within a long
 * prompt) in front of a table shared by all threads (16 shards, one mutex
 * each: repeats across requests).
 *
 * Decode: each id has its bytes precomputed by the loader: the token
 * string mapped back through the byte-level table, or, when a char of it
 * is not in the table (added tokens such as "<a>\n"), its raw UTF-8 (HF's
 * ByteLevel decoder does the same). Invalid UTF-8 in the joined bytes
 * becomes U+FFFD per maximal subpart (Rust's String::from_utf8_lossy).
 */
#include "text/tokenizer.h"
#include "text/tokenizer_int.h"
#include "text/tokenizer_ucd.h"
#include "base/err.h"
#include "base/hash.h"
#include "base/io.h"
#include "base/json.h"
#include "base/log.h"
#include "base/map.h"
#include "base/mem.h"
#include "base/utf8.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#define BPE_SMALL 48                  /* pieces up to this many bytes use the array scan */

/* The per-call table: no lock. Created after LC_AFTER pieces, so short
 * texts never pay for it; it is what makes a long prompt's repeats cheap
 * (the shared cache's mutex costs more than a hit). */
#define LC_SLOTS 4096
#define LC_ARENA (64u << 10)
#define LC_AFTER 64

/* ------------------------------------------------------------------------ */
/* Unicode whitespace (UTF-8 itself: base/utf8.h)                          */

/* Rust's char::is_whitespace (Unicode White_Space), for lstrip/rstrip. */
static int is_white(int32_t c)
{
	return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
	       (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
	       c == 0x3000;
}

/* ------------------------------------------------------------------------ */
/* NFC                                                                      */

/*
 * A fast NFC that only calls utf8proc where it can change something.
 * For every code point we precompute two bits:
 *   trig:  NFC may change text around it (a non-zero combining class, a
 *          canonical decomposition that does not compose back, a char that
 *          can be the second of a composition, a Hangul V/T jamo);
 *   inert: NFC never looks across it (combining class 0, no
 *          decomposition, composes with nothing on either side).
 * Text without a trig char is already NFC (the UAX 15 quick check).
 * Otherwise every maximal run of non-inert chars that holds a trig char
 * is normalised on its own: NFC(A x B) = NFC(A) x NFC(B) for inert x.
 */
static uint8_t *g_trig, *g_inert;  /* bitmaps over 0..0x10FFFF */
static uint8_t *g_fix;             /* code points of KV_TOK_UCD_FIX (pretok_gap) */
static pthread_once_t g_nfc_once = PTHREAD_ONCE_INIT;

static inline int bit(const uint8_t *m, int32_t c)
{
	return (m[c >> 3] >> (c & 7)) & 1;
}

static void nfc_init(void)
{
	size_t nb = 0x110000 / 8;
	g_trig = calloc(1, nb);
	g_inert = calloc(1, nb);
	g_fix = calloc(1, nb);
	if (!g_trig || !g_inert || !g_fix) {
		free(g_trig);
		free(g_inert);
		free(g_fix);
		g_trig = g_inert = g_fix = NULL;
		return;
	}
	for (size_t k = 0; k < sizeof KV_TOK_UCD_FIX / sizeof KV_TOK_UCD_FIX[0]; k++)
		for (uint32_t c = KV_TOK_UCD_FIX[k].lo; c <= KV_TOK_UCD_FIX[k].hi; c++)
			g_fix[c >> 3] |= (uint8_t)(1u << (c & 7));
	for (int32_t c = 0; c < 0x110000; c++) {
		const utf8proc_property_t *p;
		int trig, inert;
		if (c >= 0xD800 && c <= 0xDFFF)
			continue;
		p = utf8proc_get_property(c);
		trig = p->combining_class != 0 || (p->comb_index != UINT16_MAX && p->comb_index >= 0x8000) ||
		       (c >= 0x1160 && c <= 0x11FF);
		if (!trig && p->decomp_seqindex != UINT16_MAX && p->decomp_type == 0) {
			/* canonical decomposition: trig unless NFC(c) == c */
			uint8_t in[4], *outp = NULL;
			int l = kv_utf8_encode((uint32_t)c, in);
			utf8proc_ssize_t r = utf8proc_map(in, l, &outp, UTF8PROC_STABLE | UTF8PROC_COMPOSE);
			trig = r != l || memcmp(outp, in, (size_t)l) != 0;
			free(outp);
		}
		inert = !trig && p->combining_class == 0 && p->decomp_seqindex == UINT16_MAX &&
			p->comb_index == UINT16_MAX && !(c >= 0x1100 && c <= 0x11FF) && !(c >= 0xAC00 && c <= 0xD7A3);
		/* HF's normaliser never composes U+11935 U+11930 into U+11938
		 * (DIVES AKURU VOWEL SIGN O), which Unicode does. The model saw
		 * HF's ids, so U+11930 is a boundary here: nothing composes with
		 * it (it has combining class 0 and composes with nothing else). */
		if (c == 0x11930) {
			trig = 0;
			inert = 1;
		}
		if (trig)
			g_trig[c >> 3] |= (uint8_t)(1u << (c & 7));
		if (inert)
			g_inert[c >> 3] |= (uint8_t)(1u << (c & 7));
	}
}

int kv_tok_unicode_init(void)
{
	pthread_once(&g_nfc_once, nfc_init);
	return g_trig ? KV_OK : KV_ERR_NOMEM;
}

int kv_tok_nfc_needed(const uint8_t *p, size_t n)
{
	size_t i = 0;
	while (i < n) {
		if (p[i] < 0x80) {
			i++;
			continue;
		}
		int l;
		int32_t c = kv_utf8_get(p + i, &l);
		if (bit(g_trig, c))
			return 1;
		i += (size_t)l;
	}
	return 0;
}

int kv_tok_nfc_run(const uint8_t *p, size_t n, struct kv_buf *out)
{
	size_t i = 0, run = 0;
	int has_trig = 0;
	kv_buf_reset(out);
	while (i <= n) {
		int l = 1, inert = 1;
		int32_t c = 0;
		if (i < n) {
			c = kv_utf8_get(p + i, &l);
			inert = bit(g_inert, c);
		}
		if (inert) {
			if (has_trig) {
				uint8_t *o = NULL;
				utf8proc_ssize_t r = utf8proc_map(p + run, (utf8proc_ssize_t)(i - run), &o,
								  UTF8PROC_STABLE | UTF8PROC_COMPOSE);
				if (r < 0) {
					free(o);
					return kv_fail(r == UTF8PROC_ERROR_NOMEM ? KV_ERR_NOMEM : KV_ERR_INVALID,
						       "NFC: %s", utf8proc_errmsg(r));
				}
				kv_buf_add(out, o, (size_t)r);
				free(o);
			} else
				kv_buf_add(out, p + run, i - run);
			if (i < n)
				kv_buf_add(out, p + i, (size_t)l);
			run = i + (size_t)l;
			has_trig = 0;
		} else if (bit(g_trig, c))
			has_trig = 1;
		i += (size_t)l;
	}
	return out->oom ? kv_fail(KV_ERR_NOMEM, "NFC: out of memory") : KV_OK;
}

/* ------------------------------------------------------------------------ */
/* Added tokens: the leftmost-longest match (tokload.c builds the tries)   */

/*
 * Leftmost-longest match in p[from..n): returns the added index and sets
 * *ms, *me, or -1 when there is none (Aho-Corasick's LeftmostLongest, as
 * HF uses).
 */
static int32_t trie_find(const struct trie *tr, const uint8_t *p, size_t n, size_t from, size_t *ms, size_t *me)
{
	for (size_t i = from; i < n; i++) {
		int32_t cur = tr->root[p[i]];
		if (cur < 0)
			continue;
		int32_t best = tr->n[cur].tok;
		size_t bend = i + 1;
		for (size_t j = i + 1; j < n; j++) {
			int32_t c = tr->n[cur].child;
			while (c >= 0 && tr->n[c].byte != p[j])
				c = tr->n[c].sib;
			if (c < 0)
				break;
			cur = c;
			if (tr->n[cur].tok >= 0) {
				best = tr->n[cur].tok;
				bend = j + 1;
			}
		}
		if (best >= 0) {
			*ms = i;
			*me = bend;
			return best;
		}
	}
	return -1;
}

/* ------------------------------------------------------------------------ */
/* Piece cache                                                              */

static inline int tab_match(const struct pc_tab *tb, const struct pc_slot *sl, uint64_t h, const uint8_t *p, size_t n)
{
	if (sl->h != h || sl->klen != n)
		return 0;
	if (n <= 8)
		return !memcmp(sl->key, p, n);
	return !memcmp(sl->key, p, 8) && !memcmp(tb->arena + sl->off, p + 8, n - 8);
}

/* Arena layout of one entry at `at`: the key bytes after the 8th, then,
 * for more than one id, the ids at the next 4-byte boundary. Returns the
 * offset of the ids and sets *end to the first byte after the entry. */
static uint32_t tab_layout(uint32_t at, size_t tail, size_t nids, uint32_t *end)
{
	uint32_t ids_at = (uint32_t)((at + tail + 3) & ~(size_t)3);
	*end = nids > 1 ? ids_at + (uint32_t)(nids * sizeof(int32_t)) : at + (uint32_t)tail;
	return ids_at;
}

/* Ids of piece p[0..n) with hash h into ids[], their count, or -1. */
static int tab_get(const struct pc_tab *tb, uint64_t h, const uint8_t *p, size_t n, int32_t *ids)
{
	uint32_t i = (uint32_t)h & (tb->nslots - 1);
	for (;;) {
		const struct pc_slot *sl = &tb->slots[i];
		if (!sl->h)
			return -1;
		if (tab_match(tb, sl, h, p, n)) {
			uint32_t end;
			if (sl->nids == 1)
				ids[0] = sl->id0;
			else if (sl->nids > 1)
				memcpy(ids, tb->arena + tab_layout(sl->off, n > 8 ? n - 8 : 0, sl->nids, &end),
				       sl->nids * sizeof *ids);
			return sl->nids;
		}
		i = (i + 1) & (tb->nslots - 1);
	}
}

/* Insert (a table at 3/4 load or with a full arena is emptied first). */
static void tab_put(struct pc_tab *tb, uint64_t h, const uint8_t *p, size_t n, const int32_t *ids, size_t nids)
{
	size_t tail = n > 8 ? n - 8 : 0;
	uint32_t end, ids_at;
	if (tail + 3 + nids * sizeof *ids > tb->arena_cap)
		return;
	ids_at = tab_layout(tb->used, tail, nids, &end);
	if (tb->count >= tb->nslots / 4 * 3 || end > tb->arena_cap) {
		memset(tb->slots, 0, tb->nslots * sizeof *tb->slots);
		tb->count = 0;
		tb->used = 0;
		ids_at = tab_layout(0, tail, nids, &end);
	}
	uint32_t i = (uint32_t)h & (tb->nslots - 1);
	for (;;) {
		const struct pc_slot *sl = &tb->slots[i];
		if (!sl->h)
			break;
		if (tab_match(tb, sl, h, p, n))
			return; /* already there (another thread put it first) */
		i = (i + 1) & (tb->nslots - 1);
	}
	struct pc_slot *sl = &tb->slots[i];
	*sl = (struct pc_slot){.h = h, .off = tb->used, .klen = (uint16_t)n, .nids = (uint16_t)nids,
			       .id0 = nids ? ids[0] : -1};
	memcpy(sl->key, p, n < 8 ? n : 8);
	if (tail)
		memcpy(tb->arena + tb->used, p + 8, tail);
	if (nids > 1)
		memcpy(tb->arena + ids_at, ids, nids * sizeof *ids);
	tb->used = end;
	tb->count++;
}

static int pc_get(const struct kv_tok *tc, uint64_t h, const uint8_t *p, size_t n, int32_t *ids)
{
	struct pc_shard *s = (struct pc_shard *)&tc->cache[h >> 60];
	int found = -1;
	pthread_mutex_lock(&s->mu);
	if (s->tab.slots)
		found = tab_get(&s->tab, h, p, n, ids);
	if (found >= 0)
		s->hits++;
	else
		s->misses++;
	pthread_mutex_unlock(&s->mu);
	return found;
}

static void pc_put(const struct kv_tok *tc, uint64_t h, const uint8_t *p, size_t n, const int32_t *ids, size_t nids)
{
	struct pc_shard *s = (struct pc_shard *)&tc->cache[h >> 60];
	pthread_mutex_lock(&s->mu);
	if (!s->tab.slots) {
		s->tab.slots = kv_zalloc(KV_MEM_OTHER, PC_SLOTS * sizeof *s->tab.slots);
		s->tab.arena = kv_alloc(KV_MEM_OTHER, PC_ARENA);
		if (!s->tab.slots || !s->tab.arena) {
			kv_free(s->tab.slots);
			kv_free(s->tab.arena);
			s->tab.slots = NULL;
			s->tab.arena = NULL;
			pthread_mutex_unlock(&s->mu);
			return;
		}
		s->tab.nslots = PC_SLOTS;
		s->tab.arena_cap = PC_ARENA;
	}
	tab_put(&s->tab, h, p, n, ids, nids);
	pthread_mutex_unlock(&s->mu);
}

void kv_tok_cache_clear(const struct kv_tok *tc)
{
	for (int k = 0; k < PC_SHARDS; k++) {
		struct pc_shard *s = (struct pc_shard *)&tc->cache[k];
		pthread_mutex_lock(&s->mu);
		if (s->tab.slots)
			memset(s->tab.slots, 0, PC_SLOTS * sizeof *s->tab.slots);
		s->tab.count = 0;
		s->tab.used = 0;
		pthread_mutex_unlock(&s->mu);
	}
}

void kv_tok_cache_stats(const struct kv_tok *tc, uint64_t *hits, uint64_t *misses)
{
	uint64_t h = 0, m = 0;
	for (int k = 0; k < PC_SHARDS; k++) {
		struct pc_shard *s = (struct pc_shard *)&tc->cache[k];
		pthread_mutex_lock(&s->mu);
		h += s->hits;
		m += s->misses;
		pthread_mutex_unlock(&s->mu);
	}
	if (hits)
		*hits = h;
	if (misses)
		*misses = m;
}

/* ------------------------------------------------------------------------ */
/* Encoding                                                                 */

struct enc {
	const struct kv_tok *t;
	int allow_special;
	int use_cache;
	int32_t *ids;          /* malloc'd output */
	size_t n, cap;
	/* scratch sized to the longest piece seen, reused across pieces */
	int32_t *sym;          /* symbol ids */
	int32_t *nxt, *prv;    /* linked list (heap path) */
	uint32_t *prank;       /* rank of the pair starting at each symbol (heap path) */
	uint64_t *heap;        /* rank << 32 | position */
	size_t scap;
	pcre2_match_data *md[KV_TOK_MAX_SPLITS];
	struct kv_buf nfc;     /* normalised gap */
	struct kv_buf shadow;  /* gap with stand-ins for the regex (pretok_gap) */
	struct pc_tab local;   /* per-call piece cache (no lock), LC_* */
	size_t n_pieces;       /* pieces seen so far */
};

/* Room for k more ids. */
static int reserve(struct enc *e, size_t k)
{
	if (e->n + k <= e->cap)
		return KV_OK;
	size_t nc = e->cap ? e->cap * 2 : 256;
	while (nc < e->n + k)
		nc *= 2;
	int32_t *ni = realloc(e->ids, nc * sizeof *ni);
	if (!ni)
		return kv_fail(KV_ERR_NOMEM, "encode: out of memory for %zu ids", nc);
	e->ids = ni;
	e->cap = nc;
	return KV_OK;
}

static inline int emit(struct enc *e, int32_t id)
{
	if (e->n == e->cap) {
		int rc = reserve(e, 1);
		if (rc)
			return rc;
	}
	e->ids[e->n++] = id;
	return KV_OK;
}

static int scratch(struct enc *e, size_t n)
{
	if (n <= e->scap)
		return KV_OK;
	size_t c = e->scap ? e->scap : 256;
	while (c < n)
		c *= 2;
	int32_t *s = realloc(e->sym, c * sizeof *s), *nx, *pv;
	uint32_t *pr;
	uint64_t *hp;
	if (s)
		e->sym = s;
	nx = realloc(e->nxt, c * sizeof *nx);
	if (nx)
		e->nxt = nx;
	pv = realloc(e->prv, c * sizeof *pv);
	if (pv)
		e->prv = pv;
	pr = realloc(e->prank, c * sizeof *pr);
	if (pr)
		e->prank = pr;
	/* live heap entries <= n - 1 initial + 1 net per merge < 2n */
	hp = realloc(e->heap, 2 * c * sizeof *hp);
	if (hp)
		e->heap = hp;
	if (!s || !nx || !pv || !pr || !hp)
		return kv_fail(KV_ERR_NOMEM, "encode: out of memory for a %zu-byte piece", n);
	e->scap = c;
	return KV_OK;
}

/* BPE of symbols sym[0..m) in place for short pieces: linear scan for the
 * lowest rank. Returns the new count. */
static size_t bpe_small(const struct kv_tok *t, int32_t *sym, size_t m)
{
	uint32_t rank[BPE_SMALL];
	int32_t nid[BPE_SMALL];
	if (m < 2)
		return m;
	for (size_t i = 0; i + 1 < m; i++)
		if (!merge_get(t, sym[i], sym[i + 1], &rank[i], &nid[i]))
			rank[i] = UINT32_MAX;
	for (;;) {
		uint32_t best = UINT32_MAX;
		size_t bi = 0;
		for (size_t i = 0; i + 1 < m; i++)
			if (rank[i] < best) {
				best = rank[i];
				bi = i;
			}
		if (best == UINT32_MAX)
			break;
		sym[bi] = nid[bi];
		/* drop symbol bi+1 and pair (bi, bi+1) */
		for (size_t i = bi + 1; i + 1 < m; i++) {
			sym[i] = sym[i + 1];
			rank[i] = rank[i + 1];
			nid[i] = nid[i + 1];
		}
		m--;
		if (bi > 0 && !merge_get(t, sym[bi - 1], sym[bi], &rank[bi - 1], &nid[bi - 1]))
			rank[bi - 1] = UINT32_MAX;
		if (bi + 1 < m && !merge_get(t, sym[bi], sym[bi + 1], &rank[bi], &nid[bi]))
			rank[bi] = UINT32_MAX;
	}
	return m;
}

/* A 4-ary min-heap of uint64 (fewer levels than a binary one, and the
 * four children share a cache line). */
static inline void heap_up(uint64_t *h, size_t i, uint64_t v)
{
	while (i > 0) {
		size_t p = (i - 1) / 4;
		if (h[p] <= v)
			break;
		h[i] = h[p];
		i = p;
	}
	h[i] = v;
}

static inline void heap_down(uint64_t *h, size_t n, size_t i, uint64_t v)
{
	for (;;) {
		size_t c = 4 * i + 1, end = c + 4 < n ? c + 4 : n, best = c;
		if (c >= n)
			break;
		uint64_t bv = h[c];
		for (size_t k = c + 1; k < end; k++)
			if (h[k] < bv) {
				bv = h[k];
				best = k;
			}
		if (v <= bv)
			break;
		h[i] = bv;
		i = best;
	}
	h[i] = v;
}

/*
 * BPE of e->sym[0..m) for long pieces: a min-heap of (rank << 32 | left
 * position) over a linked list of symbols, which is HF's Word::merge_all.
 * prank[i] is the rank of the pair that starts at symbol i now (UINT32_MAX:
 * none); a popped entry whose rank differs is stale (its pair was changed
 * by a neighbouring merge) and is dropped. Equal ranks mean the same merge,
 * so a matching entry is always right. The root slot of a valid entry is
 * reused for the first pair its merge creates. Writes the result compacted
 * to sym[0..) and returns its count.
 */
static size_t bpe_large(const struct kv_tok *t, struct enc *e, size_t m)
{
	int32_t *sym = e->sym, *nx = e->nxt, *pv = e->prv;
	uint32_t *prank = e->prank;
	uint64_t *h = e->heap;
	size_t hn = 0, k = 0;
	uint32_t r;
	int32_t id;
	for (size_t i = 0; i < m; i++) {
		nx[i] = i + 1 < m ? (int32_t)(i + 1) : -1;
		pv[i] = (int32_t)i - 1;
		prank[i] = UINT32_MAX;
		if (i + 1 < m && merge_get(t, sym[i], sym[i + 1], &r, &id)) {
			prank[i] = r;
			h[hn++] = (uint64_t)r << 32 | i;
		}
	}
	for (size_t i = hn / 4 + 1; i-- > 0;)
		if (i < hn)
			heap_down(h, hn, i, h[i]);
	while (hn) {
		uint64_t top = h[0], add[2];
		int32_t i = (int32_t)(uint32_t)top, j = nx[i];
		int na = 0;
		if (prank[i] != (uint32_t)(top >> 32) || j < 0 || !merge_get(t, sym[i], sym[j], &r, &id)) {
			hn--;
			if (hn)
				heap_down(h, hn, 0, h[hn]);
			continue; /* stale */
		}
		sym[i] = id;
		sym[j] = -1;
		nx[i] = nx[j];
		if (nx[j] >= 0)
			pv[nx[j]] = i;
		prank[j] = UINT32_MAX;
		prank[i] = UINT32_MAX;
		if (pv[i] >= 0) {
			int32_t q = pv[i];
			prank[q] = UINT32_MAX;
			if (merge_get(t, sym[q], sym[i], &r, &id)) {
				prank[q] = r;
				add[na++] = (uint64_t)r << 32 | (uint32_t)q;
			}
		}
		if (nx[i] >= 0 && merge_get(t, sym[i], sym[nx[i]], &r, &id)) {
			prank[i] = r;
			add[na++] = (uint64_t)r << 32 | (uint32_t)i;
		}
		if (na) { /* the first new entry takes the root's place */
			heap_down(h, hn, 0, add[0]);
			if (na == 2)
				heap_up(h, hn++, add[1]);
		} else {
			hn--;
			if (hn)
				heap_down(h, hn, 0, h[hn]);
		}
	}
	for (int32_t i = 0; i >= 0 && (size_t)i < m; i = nx[i])
		sym[k++] = sym[i];
	return k;
}

/* SentencePiece's initial symbols of a piece: each character's id, or
 * its bytes as <0xXX> tokens, or unk (a run of unknowns one unk with
 * fuse_unk). Returns the count (<= n). */
static size_t sp_symbols(const struct kv_tok *t, const uint8_t *p, size_t n, int32_t *sym)
{
	size_t m = 0;
	for (size_t i = 0; i < n;) {
		int l;
		uint64_t id;
		kv_utf8_get(p + i, &l);
		if (kv_map_get(t->vocab, p + i, (size_t)l, &id)) {
			sym[m++] = (int32_t)id;
		} else {
			for (int b = 0; b < l; b++) {
				int32_t f = t->fb_id[p[i + (size_t)b]];
				if (f < 0) {
					if (t->unk_id < 0 || (t->fuse_unk && m && sym[m - 1] == t->unk_id))
						continue;
					f = t->unk_id;
				}
				sym[m++] = f;
			}
		}
		i += (size_t)l;
	}
	return m;
}

/* One pre-tokenized piece -> ids. */
static int encode_piece(struct enc *e, const uint8_t *p, size_t n)
{
	const struct kv_tok *t = e->t;
	uint64_t h = 0;
	size_t m = 0;
	int rc;
	if (n == 1 && !t->sp) {
		int32_t id = t->byte_id[p[0]] >= 0 ? t->byte_id[p[0]] : t->unk_id;
		return id >= 0 ? emit(e, id) : KV_OK;
	}
	if (t->ignore_merges) {
		uint64_t id;
		if (kv_map_get(t->raw_vocab, p, n, &id))
			return emit(e, (int32_t)id);
	}
	if (e->use_cache && n <= PC_MAX_KEY) {
		int32_t ids[PC_MAX_IDS];
		int k = -1;
		h = kv_xxh3_64(p, n, 0x746f6b);
		h |= 1; /* 0 marks an empty slot */
		if (e->local.slots)
			k = tab_get(&e->local, h, p, n, ids);
		else if (++e->n_pieces == LC_AFTER) {
			e->local.slots = calloc(LC_SLOTS, sizeof *e->local.slots);
			e->local.arena = malloc(LC_ARENA);
			if (!e->local.slots || !e->local.arena) { /* fine: just slower */
				free(e->local.slots);
				free(e->local.arena);
				e->local.slots = NULL;
				e->local.arena = NULL;
			}
			e->local.nslots = LC_SLOTS;
			e->local.arena_cap = LC_ARENA;
		}
		if (k < 0 && (k = pc_get(t, h, p, n, ids)) >= 0 && e->local.slots)
			tab_put(&e->local, h, p, n, ids, (size_t)k);
		if (k >= 0) {
			if ((rc = reserve(e, (size_t)k)))
				return rc;
			memcpy(e->ids + e->n, ids, (size_t)k * sizeof *ids);
			e->n += (size_t)k;
			return KV_OK;
		}
	}
	if ((rc = scratch(e, n)))
		return rc;
	if (t->sp) {
		m = sp_symbols(t, p, n, e->sym);
	} else {
		for (size_t i = 0; i < n; i++) {
			int32_t id = t->byte_id[p[i]] >= 0 ? t->byte_id[p[i]] : t->unk_id;
			if (id >= 0)
				e->sym[m++] = id;
		}
	}
	m = m <= BPE_SMALL ? bpe_small(t, e->sym, m) : bpe_large(t, e, m);
	if (h && m <= PC_MAX_IDS) {
		pc_put(t, h, p, n, e->sym, m);
		if (e->local.slots)
			tab_put(&e->local, h, p, n, e->sym, m);
	}
	for (size_t i = 0; i < m; i++)
		if ((rc = emit(e, e->sym[i])))
			return rc;
	return KV_OK;
}

/*
 * Split stage k over p[0..n) (its whole subject), Isolated behaviour:
 * matches and the gaps between them both become pieces. Empty matches are
 * handled the way the onig crate's find_iter does (an empty match right
 * after the previous match is skipped by one char). The regex runs over
 * subj, the pieces are taken from orig at the same offsets (subj is orig
 * with the stand-ins of tokenizer_ucd.h, or orig itself).
 */
static int pretok(struct enc *e, int k, const uint8_t *subj, const uint8_t *orig, size_t n)
{
	const uint8_t *p = subj;
	const struct kv_tok *t = e->t;
	size_t last_end = 0, prev = 0, last_match_end = 0;
	int have_last = 0, rc;

	if (n == 0)
		return KV_OK;
	if (k == t->n_splits)
		return encode_piece(e, orig, n);
	const struct split *sp = &t->splits[k];
	pcre2_match_data *md = e->md[k];
	while (last_end <= n) {
		int r = sp->jit ? pcre2_jit_match(sp->re, p, n, last_end, 0, md, NULL)
				: PCRE2_ERROR_JIT_STACKLIMIT;
		if (r == PCRE2_ERROR_JIT_STACKLIMIT)
			r = pcre2_match(sp->re, p, n, last_end, PCRE2_NO_UTF_CHECK, md, NULL);
		if (r == PCRE2_ERROR_NOMATCH)
			break;
		if (r < 0) {
			PCRE2_UCHAR msg[128];
			pcre2_get_error_message(r, msg, sizeof msg);
			return kv_fail(KV_ERR_INVALID, "encode: the pre-tokenizer regex failed near byte %zu: %s", last_end,
				       (const char *)msg);
		}
		PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
		size_t s = ov[0], en = ov[1];
		if (s == en && have_last && last_match_end == en) {
			if (last_end >= n)
				break;
			int l;
			kv_utf8_get(p + last_end, &l);
			last_end += (size_t)l;
			continue;
		}
		last_end = en;
		last_match_end = en;
		have_last = 1;
		if (prev < s && (rc = pretok(e, k + 1, p + prev, orig + prev, s - prev)))
			return rc;
		if (s < en && (rc = pretok(e, k + 1, p + s, orig + s, en - s)))
			return rc;
		prev = en;
	}
	if (prev < n && (rc = pretok(e, k + 1, p + prev, orig + prev, n - prev)))
		return rc;
	return KV_OK;
}

/* The stand-in of a code point of KV_TOK_UCD_FIX (binary search). */
static uint32_t ucd_standin(int32_t c)
{
	size_t lo = 0, hi = sizeof KV_TOK_UCD_FIX / sizeof KV_TOK_UCD_FIX[0];
	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		if ((uint32_t)c > KV_TOK_UCD_FIX[mid].hi)
			lo = mid + 1;
		else if ((uint32_t)c < KV_TOK_UCD_FIX[mid].lo)
			hi = mid;
		else
			return KV_TOK_UCD_FIX[mid].standin;
	}
	return (uint32_t)c;
}

/*
 * A gap, as the pre-tokenizer sees it. When it holds a code point that
 * PCRE2's Unicode tables class differently from the oracle's, the regex
 * runs over a copy where such code points are replaced by stand-ins of
 * the same UTF-8 length (so every offset still points into the text).
 */
static int pretok_gap(struct enc *e, const uint8_t *p, size_t n)
{
	size_t i = 0, first = n;
	while (i < n) {
		if (p[i] < 0x80) {
			i++;
			continue;
		}
		int l;
		int32_t c = kv_utf8_get(p + i, &l);
		if (bit(g_fix, c)) {
			first = i;
			break;
		}
		i += (size_t)l;
	}
	if (first == n)
		return pretok(e, 0, p, p, n);
	kv_buf_reset(&e->shadow);
	kv_buf_add(&e->shadow, p, n);
	if (e->shadow.oom)
		return kv_fail(KV_ERR_NOMEM, "encode: out of memory");
	uint8_t *q = (uint8_t *)e->shadow.p;
	for (i = first; i < n;) {
		int l;
		int32_t c = kv_utf8_get(p + i, &l);
		if (c >= 0x80 && bit(g_fix, c))
			kv_utf8_encode(ucd_standin(c), q + i); /* same length: the table says so */
		i += (size_t)l;
	}
	return pretok(e, 0, q, p, n);
}

/* Start of the whitespace run that ends at p[end] (for lstrip). */
static size_t white_start(const uint8_t *p, size_t end)
{
	size_t i = end;
	while (i > 0) {
		size_t j = i - 1;
		while (j > 0 && (p[j] & 0xC0) == 0x80)
			j--;
		int l;
		if (!is_white(kv_utf8_get(p + j, &l)))
			break;
		i = j;
	}
	return i;
}

/* Length of the whitespace run at p[0..n) (for rstrip). */
static size_t white_len(const uint8_t *p, size_t n)
{
	size_t i = 0;
	while (i < n) {
		int l;
		if (!is_white(kv_utf8_get(p + i, &l)))
			break;
		i += (size_t)l;
	}
	return i;
}

/*
 * Split p[0..n) at the added tokens of trie `tr`; gaps go to `gap`
 * (with normalisation pending or done, see callers), tokens are emitted.
 */
static int split_added(struct enc *e, const struct trie *tr, const uint8_t *p, size_t n,
		       int (*gap)(struct enc *, const uint8_t *, size_t))
{
	size_t pos = 0, start_off = 0, ms, me;
	int32_t k;
	int rc;
	while (pos < n && (k = trie_find(tr, p, n, pos, &ms, &me)) >= 0) {
		const struct added *a = &e->t->added[k];
		size_t start = ms, stop = me;
		pos = me;
		if (a->special && !e->allow_special)
			continue;
		if (a->lstrip) {
			start = white_start(p, ms);
			if (start < start_off)
				start = start_off;
		}
		if (a->rstrip)
			stop += white_len(p + me, n - me);
		if (start_off < start && (rc = gap(e, p + start_off, start - start_off)))
			return rc;
		if ((rc = emit(e, a->id)))
			return rc;
		start_off = stop;
		pos = stop;
	}
	if (start_off < n)
		return gap(e, p + start_off, n - start_off);
	return KV_OK;
}

/* SentencePiece: every space becomes U+2581; the result is one piece, or
 * with Metaspace's split one piece per U+2581 it starts with. */
static int sp_gap(struct enc *e, const uint8_t *p, size_t n)
{
	int rc;
	kv_buf_reset(&e->shadow);
	for (size_t i = 0; i < n; i++) {
		if (p[i] == ' ')
			kv_buf_add(&e->shadow, "\xe2\x96\x81", 3);
		else
			kv_buf_addc(&e->shadow, (char)p[i]);
	}
	if (e->shadow.oom)
		return kv_fail(KV_ERR_NOMEM, "encode: out of memory");
	const uint8_t *q = (const uint8_t *)e->shadow.p;
	size_t m = e->shadow.len, start = 0;
	if (!e->t->sp_split)
		return encode_piece(e, q, m);
	for (size_t i = 3; i + 3 <= m; i++)
		if (!memcmp(q + i, "\xe2\x96\x81", 3)) {
			if ((rc = encode_piece(e, q + start, i - start)))
				return rc;
			start = i;
		}
	return start < m ? encode_piece(e, q + start, m - start) : KV_OK;
}

static int gap_normalized(struct enc *e, const uint8_t *p, size_t n)
{
	return e->t->sp ? sp_gap(e, p, n) : pretok_gap(e, p, n);
}

static int gap_raw(struct enc *e, const uint8_t *p, size_t n)
{
	const struct kv_tok *t = e->t;
	if (t->nfc && kv_tok_nfc_needed(p, n)) {
		/* gaps are processed one at a time and nothing below normalises
		 * again, so one buffer serves them all */
		int rc = kv_tok_nfc_run(p, n, &e->nfc);
		if (rc)
			return rc;
		p = (const uint8_t *)e->nfc.p;
		n = e->nfc.len;
	}
	if (t->has_norm_added)
		return split_added(e, &t->trie_norm, p, n, gap_normalized);
	return t->sp ? sp_gap(e, p, n) : pretok_gap(e, p, n);
}

int kv_tok_encode_opt(const struct kv_tok *t, const char *text, size_t len, int allow_special, int use_cache,
		      int32_t **ids, size_t *n)
{
	struct enc e = {.t = t, .allow_special = allow_special, .use_cache = use_cache, .nfc = KV_BUF_INIT,
			.shadow = KV_BUF_INIT};
	const uint8_t *p = (const uint8_t *)text;
	size_t bad;
	int rc = KV_OK;

	*ids = NULL;
	*n = 0;
	if (len && !text)
		return kv_fail(KV_ERR_INVALID, "encode: NULL text");
	bad = kv_utf8_valid_prefix(p, len);
	if (bad != len)
		return kv_fail(KV_ERR_INVALID, "encode: invalid UTF-8 at byte offset %zu (byte 0x%02X)", bad, p[bad]);
	for (int k = 0; k < t->n_splits; k++) {
		e.md[k] = pcre2_match_data_create_from_pattern(t->splits[k].re, NULL);
		if (!e.md[k]) {
			rc = kv_fail(KV_ERR_NOMEM, "encode: out of memory");
			goto done;
		}
	}
	/* ~1 id per 3-4 bytes of text: start near the final size */
	e.cap = len / 3 + 16;
	e.ids = malloc(e.cap * sizeof *e.ids);
	if (!e.ids) {
		rc = kv_fail(KV_ERR_NOMEM, "encode: out of memory");
		goto done;
	}
	rc = split_added(&e, &t->trie_raw, p, len, gap_raw);
done:
	for (int k = 0; k < t->n_splits; k++)
		pcre2_match_data_free(e.md[k]);
	free(e.sym);
	free(e.nxt);
	free(e.prv);
	free(e.prank);
	free(e.heap);
	free(e.local.slots);
	free(e.local.arena);
	kv_buf_free(&e.nfc);
	kv_buf_free(&e.shadow);
	if (rc) {
		free(e.ids);
		return rc;
	}
	*ids = e.ids;
	*n = e.n;
	return KV_OK;
}

int kv_tok_encode(const struct kv_tok *t, const char *text, size_t len, int allow_special, int32_t **ids, size_t *n)
{
	return kv_tok_encode_opt(t, text, len, allow_special, 1, ids, n);
}

/* ------------------------------------------------------------------------ */
/* Decoding and lookups                                                     */

static int check_id(const struct kv_tok *t, int32_t id)
{
	if (id < 0 || id >= t->n_ids || !t->flags[id])
		return kv_fail(KV_ERR_INVALID, "decode: unknown token id %d (vocabulary has ids 0..%d)", id,
			       t->n_ids - 1);
	return KV_OK;
}

int kv_tok_decode(const struct kv_tok *t, const int32_t *ids, size_t n, int skip_special, char **text, size_t *len)
{
	struct kv_buf raw = KV_BUF_INIT, out = KV_BUF_INIT;
	int rc;
	*text = NULL;
	if (len)
		*len = 0;
	kv_buf_reserve(&raw, n * 4 + 1);
	for (size_t i = 0; i < n; i++) {
		int32_t id = ids[i];
		if ((rc = check_id(t, id))) {
			kv_buf_free(&raw);
			return kv_fail_ctx(rc, "ids[%zu]", i);
		}
		if (skip_special && (t->flags[id] & TF_SPECIAL))
			continue;
		kv_buf_add(&raw, t->dec + t->dec_off[id], t->dec_len[id]);
	}
	kv_buf_add(&raw, "", 0); /* NUL-terminates even when nothing was added */
	if (raw.oom) {
		kv_buf_free(&raw);
		return kv_fail(KV_ERR_NOMEM, "decode: out of memory");
	}
	if (kv_utf8_valid_prefix((const uint8_t *)raw.p, raw.len) == raw.len) {
		if (len)
			*len = raw.len;
		*text = kv_buf_take(&raw);
		return KV_OK;
	}
	kv_buf_reserve(&out, raw.len + 16);
	kv_utf8_lossy_append(&out, (const uint8_t *)raw.p, raw.len, 1);
	kv_buf_free(&raw);
	if (out.oom) {
		kv_buf_free(&out);
		return kv_fail(KV_ERR_NOMEM, "decode: out of memory");
	}
	if (len)
		*len = out.len;
	*text = kv_buf_take(&out);
	return KV_OK;
}

int kv_tok_vocab_size(const struct kv_tok *t)
{
	return t->n_ids;
}

int32_t kv_tok_id(const struct kv_tok *t, const char *token)
{
	uint64_t id;
	size_t n = strlen(token);
	if (n && kv_map_get(t->vocab, token, n, &id))
		return (int32_t)id;
	for (int32_t k = 0; k < t->n_added; k++)
		if (t->added[k].len == n && !memcmp(t->added[k].content, token, n))
			return t->added[k].id;
	return -1;
}

const char *kv_tok_piece(const struct kv_tok *t, int32_t id)
{
	if (id < 0 || id >= t->n_ids || !t->flags[id])
		return NULL;
	return t->pieces + t->piece_off[id];
}

int kv_tok_is_special(const struct kv_tok *t, int32_t id)
{
	return id >= 0 && id < t->n_ids && (t->flags[id] & TF_SPECIAL) != 0;
}

/* ------------------------------------------------------------------------ */
/* Streaming decoder                                                        */

void kv_tok_stream_init(struct kv_tok_stream *s, const struct kv_tok *t, int skip_special)
{
	memset(s, 0, sizeof *s);
	s->t = t;
	s->skip_special = skip_special;
}

/*
 * Held-back bytes (a valid, incomplete prefix of one character) are
 * completed from the front of the new bytes; what cannot complete them
 * turns them into one U+FFFD, as the batch decoder does for the same
 * joined bytes. The rest goes through lossy_append, whose incomplete tail
 * is held back again. So the concatenated output of a stream equals
 * kv_tok_decode of all its ids.
 */
int kv_tok_stream_feed(struct kv_tok_stream *s, int32_t id, struct kv_buf *out)
{
	const struct kv_tok *t = s->t;
	const uint8_t *p;
	size_t n, i = 0, held;
	int rc;
	if ((rc = check_id(t, id)))
		return rc;
	if (s->skip_special && (t->flags[id] & TF_SPECIAL))
		return KV_OK;
	p = t->dec + t->dec_off[id];
	n = t->dec_len[id];
	while (s->n_pending > 0 && i < n) {
		uint8_t tmp[8];
		int k;
		memcpy(tmp, s->pending, (size_t)s->n_pending);
		tmp[s->n_pending] = p[i];
		k = kv_utf8_seq(tmp, (size_t)s->n_pending + 1);
		if (k == 0) { /* still incomplete */
			s->pending[s->n_pending++] = p[i++];
			continue;
		}
		if (k > 0) { /* completed */
			kv_buf_add(out, tmp, (size_t)k);
			i++;
		} else /* p[i] does not continue it: the held bytes are one maximal subpart */
			kv_buf_add(out, KV_UTF8_FFFD, 3);
		s->n_pending = 0;
	}
	held = kv_utf8_lossy_append(out, p + i, n - i, 0);
	if (held) {
		memcpy(s->pending, p + n - held, held);
		s->n_pending = (int)held;
	}
	return out->oom ? kv_fail(KV_ERR_NOMEM, "decode: out of memory") : KV_OK;
}

int kv_tok_stream_finish(struct kv_tok_stream *s, struct kv_buf *out)
{
	if (s->n_pending)
		kv_buf_add(out, KV_UTF8_FFFD, 3);
	s->n_pending = 0;
	return out->oom ? kv_fail(KV_ERR_NOMEM, "decode: out of memory") : KV_OK;
}
