/*
 * explain.c - see explain.h.
 */
#include "session/explain.h"
#include "base/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Text of ids[0, n) into out (NUL-terminated, cut at cap - 1 bytes). */
static void text_of(const struct kv_tok *tok, const int32_t *ids, size_t n, char *out, size_t cap)
{
	char *t = NULL;
	size_t len = 0;
	out[0] = 0;
	if (!n || kv_tok_decode(tok, ids, n, 0, &t, &len))
		return;
	if (len >= cap)
		len = cap - 1;
	memcpy(out, t, len);
	out[len] = 0;
	free(t);
}

void kss_explain(const struct kv_tok *tok, const int32_t *prompt, uint32_t n, uint32_t shared,
		 const int32_t *cached, uint32_t n_cached, struct kss_explain *e)
{
	memset(e, 0, sizeof *e);
	e->shared = shared;
	e->prompt_tokens = n;
	e->message = -1;
	e->tool = -1;
	if (shared >= n)
		return;
	int32_t im_start = kv_tok_id(tok, "<|im_start|>");
	uint32_t turn = 0;
	int m = -1;
	for (uint32_t i = 0; i <= shared; i++)
		if (prompt[i] == im_start) {
			m++;
			turn = i;
		}
	e->message = m;
	if (m >= 0) {
		/* the role: the text of the few tokens after <|im_start|> up to "\n" */
		uint32_t end = turn + 1;
		while (end < n && end < turn + 6)
			end++;
		char head[64];
		text_of(tok, prompt + turn + 1, end - turn - 1, head, sizeof head);
		size_t rl = strcspn(head, "\n");
		if (rl >= sizeof e->role)
			rl = sizeof e->role - 1;
		memcpy(e->role, head, rl);
		e->role[rl] = 0;
		/* a tool schema: the system turn's text up to the token, after <tools> */
		if (!strcmp(e->role, "system") && shared > turn) {
			char *t = NULL;
			size_t len = 0;
			if (!kv_tok_decode(tok, prompt + turn, shared - turn, 0, &t, &len)) {
				char *open = NULL;
				for (char *p = t; (p = strstr(p, "<tools>")); p++)
					open = p;
				if (open && !strstr(open, "</tools>")) {
					int line = -1;
					for (char *p = open; (p = strchr(p, '\n')); p++)
						line++;
					e->tool = line < 0 ? 0 : line;
				}
				free(t);
			}
		}
	}
	uint32_t a = shared > 8 ? shared - 8 : 0, b = shared + 8 < n ? shared + 8 : n;
	text_of(tok, prompt + a, b - a, e->new_text, sizeof e->new_text);
	if (cached && n_cached) {
		/* the same window, with the cache's tokens after the shared part */
		int32_t w[16];
		uint32_t k = 0;
		for (uint32_t i = a; i < shared; i++)
			w[k++] = prompt[i];
		for (uint32_t i = 0; i < n_cached && k < 16; i++)
			w[k++] = cached[i];
		text_of(tok, w, k, e->cached_text, sizeof e->cached_text);
	}
}

/* A log value: quotes and control bytes escaped, cut at 80 bytes. */
static void log_text(const char *s, char *out, size_t cap)
{
	size_t o = 0;
	for (; *s && o + 5 < cap && o < 80; s++) {
		unsigned char ch = (unsigned char)*s;
		if (ch == '"' || ch == '\\') {
			out[o++] = '\\';
			out[o++] = (char)ch;
		} else if (ch < 0x20) {
			o += (size_t)snprintf(out + o, cap - o, "\\x%02x", ch);
		} else
			out[o++] = (char)ch;
	}
	out[o] = 0;
}

/* The request's own text only: the cached side is another client's, and a
 * log is read by people other than the client (docs/api.md, "Who sees
 * what"). */
void kss_explain_log(const char *route, const struct kss_explain *e)
{
	char nt[200];
	log_text(e->new_text, nt, sizeof nt);
	KV_INFO("cache.miss_reason", "route=%s prompt_tokens=%u shared=%u first_diff=%u message=%d role=%s tool=%d "
		"new=\"%s\"", route, e->prompt_tokens, e->shared, e->shared, e->message,
		e->role[0] ? e->role : "-", e->tool, nt);
}
