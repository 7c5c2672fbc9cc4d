/*
 * output.c - see output.h.
 *
 * Each stage keeps only what it cannot decide yet: the stop matcher the
 * longest suffix that is a prefix of a stop string, the reasoning splitter
 * a partial "<think>"/"</think>". Both buffers stay a few bytes long.
 */
#include "text/output.h"
#include "base/err.h"
#include "text/harmony.h"
#include "text/toolcall.h"

#include <stdlib.h>
#include <string.h>

#define THINK_OPEN "<think>"
#define THINK_CLOSE "</think>"

enum { TH_UNDECIDED = 0, TH_IN, TH_CONTENT_START, TH_CONTENT };

struct kv_out {
	struct kv_out_params p;
	struct kv_buf stop_pend;   /* text not yet cleared by the stop matcher */
	struct kv_buf think_pend;  /* text not yet classified by the splitter */
	int th;                    /* TH_* */
	int stopped;
	struct kv_tc_parser *tc;   /* tool-call parser (tools on), else NULL */
	struct kv_hm *hm;          /* harmony parser (harmony on), else NULL */
	int oom;                   /* the harmony parser ran out of memory */
};

size_t kv_out_stop_scan(const char *p, size_t n, const char *const *stop, size_t n_stop, int *hit)
{
	size_t best = n, hold = 0;
	*hit = 0;
	for (size_t i = 0; i < n_stop; i++) {
		size_t L = strlen(stop[i]);
		if (!L)
			continue;
		const char *f = memmem(p, n, stop[i], L);
		if (f && (size_t)(f - p) < best) {
			best = (size_t)(f - p);
			*hit = 1;
		}
	}
	if (*hit)
		return best;
	for (size_t i = 0; i < n_stop; i++) {
		size_t L = strlen(stop[i]);
		size_t k = L - 1 < n ? L - 1 : n;
		for (; k > hold; k--)
			if (!memcmp(p + n - k, stop[i], k)) {
				hold = k;
				break;
			}
	}
	return n - hold;
}

int kv_out_create(const struct kv_out_params *p, struct kv_out **out)
{
	struct kv_out *o = calloc(1, sizeof *o);
	*out = NULL;
	if (!o)
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	o->p = *p;
	o->th = !p->split_reasoning ? TH_CONTENT : p->in_think ? TH_IN : TH_UNDECIDED;
	if (p->harmony) {
		struct kv_hm_params hp = {.split_reasoning = p->split_reasoning, .tools = p->tools != NULL, .fn = p->fn,
					  .ctx = p->ctx};
		int rc = kv_hm_create(&hp, &o->hm);
		if (rc) {
			free(o);
			return rc;
		}
	} else if (p->tools) {
		struct kv_tc_params tp = {.format = p->xml_tools, .tools = p->tools};
		int rc = kv_tc_parser_create(&tp, &o->tc);
		if (rc) {
			free(o);
			return rc;
		}
	}
	*out = o;
	return KV_OK;
}

void kv_out_destroy(struct kv_out *o)
{
	if (!o)
		return;
	kv_buf_free(&o->stop_pend);
	kv_buf_free(&o->think_pend);
	kv_tc_parser_free(o->tc);
	kv_hm_destroy(o->hm);
	free(o);
}

int kv_out_n_tool_calls(const struct kv_out *o)
{
	return o->hm ? kv_hm_n_calls(o->hm) : o->tc ? kv_tc_count(o->tc) : 0;
}

static void ev_text(struct kv_out *o, int kind, const char *t, size_t n)
{
	if (!n)
		return;
	struct kv_out_ev e = {.kind = kind, .text = t, .len = n};
	o->p.fn(o->p.ctx, &e);
}

/* The tool-call parser's events, translated. */
static int tc_event(void *ud, const struct kv_tc_event *e)
{
	struct kv_out *o = ud;
	struct kv_out_ev ev = {.index = e->index};
	switch (e->kind) {
	case KV_TC_CONTENT:
		if (!e->len)
			return 0;
		ev.kind = KV_OUT_CONTENT;
		ev.text = e->text;
		ev.len = e->len;
		break;
	case KV_TC_CALL_START: {
		/* the name is not NUL-terminated: hand out a terminated copy */
		char *name = strndup(e->text ? e->text : "", e->text ? e->len : 0);
		ev.kind = KV_OUT_TOOL_START;
		ev.name = name ? name : "";
		o->p.fn(o->p.ctx, &ev);
		free(name);
		return 0;
	}
	case KV_TC_ARGS_DELTA:
		if (!e->len)
			return 0;
		ev.kind = KV_OUT_TOOL_ARGS;
		ev.text = e->text;
		ev.len = e->len;
		break;
	default:
		ev.kind = KV_OUT_TOOL_END;
		break;
	}
	o->p.fn(o->p.ctx, &ev);
	return 0;
}

/* Content stage: the tool-call parser when tools are on, else pass through. */
static void content(struct kv_out *o, const char *t, size_t n)
{
	if (o->tc)
		kv_tc_feed(o->tc, t, n, tc_event, o);
	else
		ev_text(o, KV_OUT_CONTENT, t, n);
}

/* 1 if s[0, n) is a prefix of tag. */
static int prefix_of(const char *s, size_t n, const char *tag)
{
	size_t L = strlen(tag);
	return n <= L && !memcmp(s, tag, n);
}

/* Reasoning stage: consumes think_pend as far as it can. */
static void think_run(struct kv_out *o, int final)
{
	struct kv_buf *b = &o->think_pend;
	for (;;) {
		const char *p = b->p ? b->p : "";
		size_t n = b->len, used = 0;
		if (!n)
			return;
		if (o->th == TH_CONTENT) {
			content(o, p, n);
			used = n;
		} else if (o->th == TH_UNDECIDED) {
			size_t ws = 0;
			while (ws < n && (p[ws] == ' ' || p[ws] == '\n' || p[ws] == '\r' || p[ws] == '\t'))
				ws++;
			size_t rest = n - ws, L = strlen(THINK_OPEN);
			if (rest >= L && !memcmp(p + ws, THINK_OPEN, L)) {
				o->th = TH_IN;
				used = ws + L;
			} else if (!final && prefix_of(p + ws, rest, THINK_OPEN)) {
				return; /* wait: may still become "<think>" */
			} else {
				o->th = TH_CONTENT;
				continue;
			}
		} else if (o->th == TH_IN) {
			const char *e = memmem(p, n, THINK_CLOSE, strlen(THINK_CLOSE));
			if (e) {
				ev_text(o, KV_OUT_REASONING, p, (size_t)(e - p));
				used = (size_t)(e - p) + strlen(THINK_CLOSE);
				o->th = TH_CONTENT_START;
			} else {
				/* hold back a suffix that may begin "</think>" */
				size_t hold = 0, L = strlen(THINK_CLOSE);
				if (!final)
					for (size_t k = (L - 1 < n ? L - 1 : n); k > 0; k--)
						if (!memcmp(p + n - k, THINK_CLOSE, k)) {
							hold = k;
							break;
						}
				ev_text(o, KV_OUT_REASONING, p, n - hold);
				used = n - hold;
				if (!used)
					return;
			}
		} else { /* TH_CONTENT_START: drop newlines right after </think> */
			size_t k = 0;
			while (k < n && (p[k] == '\n' || p[k] == '\r'))
				k++;
			used = k;
			if (k < n)
				o->th = TH_CONTENT;
			else if (!used)
				return;
		}
		/* drop the consumed prefix */
		memmove(b->p, b->p + used, n - used);
		b->len = n - used;
		b->p[b->len] = 0;
	}
}

static void release(struct kv_out *o, const char *t, size_t n)
{
	if (!n)
		return;
	if (o->hm) {
		if (kv_hm_feed(o->hm, t, n))
			o->oom = 1;
		return;
	}
	kv_buf_add(&o->think_pend, t, n);
	think_run(o, 0);
}

int kv_out_feed(struct kv_out *o, const char *text, size_t n)
{
	if (o->stopped)
		return 1;
	if (!o->p.n_stop) {
		release(o, text, n);
		return o->think_pend.oom || o->oom ? kv_fail(KV_ERR_NOMEM, "out of memory") : 0;
	}
	kv_buf_add(&o->stop_pend, text, n);
	if (o->stop_pend.oom)
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	int hit;
	size_t ok = kv_out_stop_scan(o->stop_pend.p, o->stop_pend.len, o->p.stop, o->p.n_stop, &hit);
	release(o, o->stop_pend.p, ok);
	if (hit) {
		o->stopped = 1;
		kv_buf_reset(&o->stop_pend);
		return 1;
	}
	memmove(o->stop_pend.p, o->stop_pend.p + ok, o->stop_pend.len - ok);
	o->stop_pend.len -= ok;
	o->stop_pend.p[o->stop_pend.len] = 0;
	return 0;
}

int kv_out_finish(struct kv_out *o)
{
	if (!o->stopped && o->stop_pend.len) {
		if (o->hm)
			kv_hm_feed(o->hm, o->stop_pend.p, o->stop_pend.len);
		else
			kv_buf_add(&o->think_pend, o->stop_pend.p, o->stop_pend.len);
		kv_buf_reset(&o->stop_pend);
	}
	if (o->hm)
		return kv_hm_finish(o->hm);
	think_run(o, 1);
	if (o->tc)
		kv_tc_finish(o->tc, tc_event, o);
	return KV_OK;
}
