/*
 * harmony.c - see harmony.h.
 *
 * The parser keeps the input it has not decided yet (pend), the header of
 * the message being read (hdr) and the body of a tool call (args). A body
 * is released as it arrives except the longest suffix that could begin a
 * marker, so pend stays a few bytes long outside headers.
 */
#include "text/harmony.h"
#include "base/buf.h"
#include "base/err.h"

#include <stdlib.h>
#include <string.h>

#define M_START "<|start|>"
#define M_CHANNEL "<|channel|>"
#define M_MESSAGE "<|message|>"

/* what ends a body: its end markers, or a new message's start */
static const char *const body_end[] = {"<|end|>", "<|call|>", "<|return|>", M_START};

enum { HS_HEADER = 0, HS_BODY, HS_BETWEEN, HS_RAW };
enum { K_CONTENT = 0, K_REASONING, K_CALL };

struct kv_hm {
	struct kv_hm_params p;
	int st;               /* HS_* */
	int kind;             /* K_*: the body being read */
	struct kv_buf pend;   /* input not yet consumed */
	struct kv_buf hdr;    /* the header so far */
	struct kv_buf name;   /* the tool call's name */
	struct kv_buf args;   /* the tool call's body */
	int n_calls;
};

int kv_hm_create(const struct kv_hm_params *p, struct kv_hm **out)
{
	struct kv_hm *h = calloc(1, sizeof *h);
	*out = NULL;
	if (!h)
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	h->p = *p;
	*out = h;
	return KV_OK;
}

void kv_hm_destroy(struct kv_hm *h)
{
	if (!h)
		return;
	kv_buf_free(&h->pend);
	kv_buf_free(&h->hdr);
	kv_buf_free(&h->name);
	kv_buf_free(&h->args);
	free(h);
}

int kv_hm_n_calls(const struct kv_hm *h)
{
	return h->n_calls;
}

static void emit(struct kv_hm *h, int kind, const char *t, size_t n)
{
	if (!n)
		return;
	struct kv_out_ev e = {.kind = kind, .text = t, .len = n};
	h->p.fn(h->p.ctx, &e);
}

static int is_blank(char c)
{
	return c == ' ' || c == '\n' || c == '\r' || c == '\t';
}

/* The word that starts at s (up to a blank or a marker). */
static size_t word_len(const char *s, size_t n)
{
	size_t k = 0;
	while (k < n && !is_blank(s[k]) && s[k] != '<')
		k++;
	return k;
}

/* Classify the message from its header: channel and recipient. */
static void header_parse(struct kv_hm *h)
{
	const char *s = h->hdr.p ? h->hdr.p : "";
	size_t n = h->hdr.len;
	const char *chan = NULL, *to = NULL;
	size_t chan_n = 0, to_n = 0;
	const char *c = memmem(s, n, M_CHANNEL, strlen(M_CHANNEL));
	if (c) {
		chan = c + strlen(M_CHANNEL);
		chan_n = word_len(chan, n - (size_t)(chan - s));
	}
	/* "to=" at the start of a word: before the channel (the template's
	 * form) or after it (the form the model writes) */
	for (size_t i = 0; i + 3 <= n; i++)
		if (!memcmp(s + i, "to=", 3) && (i == 0 || is_blank(s[i - 1]) || s[i - 1] == '>')) {
			to = s + i + 3;
			to_n = word_len(to, n - i - 3);
			break;
		}
	h->kind = K_CONTENT;
	if (to && to_n && !(to_n == 9 && !memcmp(to, "assistant", 9))) {
		if (h->p.tools) {
			const char *pre = "functions.";
			size_t pl = strlen(pre);
			if (to_n > pl && !memcmp(to, pre, pl)) {
				to += pl;
				to_n -= pl;
			}
			h->kind = K_CALL;
			kv_buf_reset(&h->name);
			kv_buf_add(&h->name, to, to_n);
			kv_buf_reset(&h->args);
		}
	} else if (chan && chan_n == 8 && !memcmp(chan, "analysis", 8) && h->p.split_reasoning) {
		h->kind = K_REASONING;
	}
}

static void body_text(struct kv_hm *h, const char *t, size_t n)
{
	if (h->kind == K_CALL)
		kv_buf_add(&h->args, t, n);
	else
		emit(h, h->kind == K_REASONING ? KV_OUT_REASONING : KV_OUT_CONTENT, t, n);
}

/* The end of a message: a tool call comes out whole. */
static void body_end_msg(struct kv_hm *h)
{
	if (h->kind != K_CALL)
		return;
	const char *a = h->args.p ? h->args.p : "";
	size_t n = h->args.len;
	while (n && is_blank(*a)) {
		a++;
		n--;
	}
	while (n && is_blank(a[n - 1]))
		n--;
	struct kv_out_ev e = {.kind = KV_OUT_TOOL_START, .index = h->n_calls, .name = h->name.p ? h->name.p : ""};
	h->p.fn(h->p.ctx, &e);
	e = (struct kv_out_ev){.kind = KV_OUT_TOOL_ARGS, .index = h->n_calls, .text = n ? a : "{}", .len = n ? n : 2};
	h->p.fn(h->p.ctx, &e);
	e = (struct kv_out_ev){.kind = KV_OUT_TOOL_END, .index = h->n_calls};
	h->p.fn(h->p.ctx, &e);
	h->n_calls++;
	h->kind = K_CONTENT;
}

/* Length of the longest suffix of s[0, n) that is a proper prefix of one
 * of the markers. */
static size_t partial_marker(const char *s, size_t n, const char *const *m, size_t nm)
{
	size_t hold = 0;
	for (size_t i = 0; i < nm; i++) {
		size_t L = strlen(m[i]);
		for (size_t k = (L - 1 < n ? L - 1 : n); k > hold; k--)
			if (!memcmp(s + n - k, m[i], k)) {
				hold = k;
				break;
			}
	}
	return hold;
}

/* Not harmony after all: the header and the rest are content from now on. */
static void go_raw(struct kv_hm *h)
{
	emit(h, KV_OUT_CONTENT, h->hdr.p, h->hdr.len);
	kv_buf_reset(&h->hdr);
	h->st = HS_RAW;
}

/* One step on pend; returns the bytes consumed (0: wait for more). */
static size_t step(struct kv_hm *h, const char *p, size_t n, int final)
{
	if (h->st == HS_RAW) {
		emit(h, KV_OUT_CONTENT, p, n);
		return n;
	}
	if (h->st == HS_HEADER) {
		/* the header is kept whole until "<|message|>" shows up in it */
		size_t before = h->hdr.len, ml = strlen(M_MESSAGE);
		kv_buf_add(&h->hdr, p, n);
		const char *s = h->hdr.p;
		size_t from = before >= ml ? before - ml + 1 : 0;
		const char *m = memmem(s + from, h->hdr.len - from, M_MESSAGE, ml);
		if (!m) {
			if (h->hdr.len > KV_HM_MAX_HEADER || final)
				go_raw(h);
			return n;
		}
		size_t at = (size_t)(m - s), rest = h->hdr.len - at - ml;
		h->hdr.len = at;
		header_parse(h);
		kv_buf_reset(&h->hdr);
		h->st = HS_BODY;
		return n - rest; /* what follows the marker is the body */
	}
	if (h->st == HS_BETWEEN) {
		size_t k = 0, sl = strlen(M_START);
		while (k < n && is_blank(p[k]))
			k++;
		if (k == n)
			return n;
		if (n - k >= sl && !memcmp(p + k, M_START, sl)) {
			h->st = HS_HEADER;
			return k + sl;
		}
		if (!final && n - k < sl && !memcmp(p + k, M_START, n - k))
			return k; /* may still be "<|start|>" */
		if (!memcmp(p + k, M_CHANNEL, n - k < strlen(M_CHANNEL) ? n - k : strlen(M_CHANNEL))) {
			h->st = HS_HEADER; /* a header without "<|start|>assistant" */
			return k;
		}
		h->st = HS_RAW;
		return k;
	}
	/* HS_BODY: up to the first end marker */
	size_t nm = sizeof body_end / sizeof body_end[0], best = n, which = nm;
	for (size_t i = 0; i < nm; i++) {
		const char *f = memmem(p, n, body_end[i], strlen(body_end[i]));
		if (f && (size_t)(f - p) < best) {
			best = (size_t)(f - p);
			which = i;
		}
	}
	if (which < nm) {
		body_text(h, p, best);
		body_end_msg(h);
		h->st = !strcmp(body_end[which], M_START) ? HS_HEADER : HS_BETWEEN;
		return best + strlen(body_end[which]);
	}
	size_t hold = final ? 0 : partial_marker(p, n, body_end, nm);
	body_text(h, p, n - hold);
	return n - hold;
}

static int run(struct kv_hm *h, int final)
{
	for (;;) {
		size_t n = h->pend.len;
		if (!n)
			break;
		int st0 = h->st;
		size_t used = step(h, h->pend.p, n, final);
		if (!used && h->st == st0)
			break;
		memmove(h->pend.p, h->pend.p + used, n - used);
		h->pend.len = n - used;
		h->pend.p[h->pend.len] = 0;
	}
	if (h->pend.oom || h->hdr.oom || h->args.oom || h->name.oom)
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	return KV_OK;
}

int kv_hm_feed(struct kv_hm *h, const char *text, size_t n)
{
	if (!n)
		return KV_OK;
	kv_buf_add(&h->pend, text, n);
	return run(h, 0);
}

int kv_hm_finish(struct kv_hm *h)
{
	int rc = run(h, 1);
	if (h->st == HS_HEADER && h->hdr.len)
		go_raw(h);
	if (h->st == HS_BODY)
		body_end_msg(h);
	return rc;
}

/* --- the constraint engine's side ------------------------------------------- */

static const char *const markers[KV_HM_N_MARKERS] = {M_START,	  M_CHANNEL,  M_MESSAGE, "<|end|>",
						     "<|constrain|>", "<|call|>", "<|return|>"};

const char *const kv_hm_body_words[] = {"<|end|>", "<|call|>", "<|return|>", M_START, NULL};

const char *kv_hm_marker(int i)
{
	return i >= 0 && i < KV_HM_N_MARKERS ? markers[i] : NULL;
}

int kv_hm_vocab_mark(struct kv_tok_bytes *b, const struct kv_tok *t, int32_t ids[KV_HM_N_MARKERS])
{
	int32_t id[KV_HM_N_MARKERS];
	for (int i = 0; i < KV_HM_N_MARKERS; i++) {
		id[i] = kv_tok_id(t, markers[i]);
		/* a marker's text is longer than one byte, so its byte fits where
		 * its text was */
		if (id[i] < 0 || id[i] >= b->n || !b->len[id[i]])
			return 0;
	}
	for (int32_t k = 0; k < b->n; k++) {
		if (b->special[k])
			continue;
		const unsigned char *p = (const unsigned char *)b->data + b->off[k];
		for (uint32_t j = 0; j < b->len[k]; j++)
			if (p[j] >= KV_HM_B_START) {
				b->len[k] = 0;
				break;
			}
	}
	for (int i = 0; i < KV_HM_N_MARKERS; i++) {
		b->data[b->off[id[i]]] = (char)(KV_HM_B_START + i);
		b->len[id[i]] = 1;
		b->special[id[i]] = 0;
		if (ids)
			ids[i] = id[i];
	}
	return 1;
}

int kv_hm_gram_final(struct kv_gram *g, int body)
{
	static const char open[] = {(char)KV_HM_B_FRAME, (char)KV_HM_B_CHANNEL, 'f', 'i', 'n', 'a', 'l',
				    (char)KV_HM_B_MESSAGE};
	static const char close[] = {(char)KV_HM_B_RETURN};
	return kv_gram_seq3(g, kv_gram_lit(g, open, sizeof open), body, kv_gram_lit(g, close, sizeof close));
}
