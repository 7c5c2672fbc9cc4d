/*
 * explain.h - the miss explainer: where a prompt departs from what the
 * prefix cache holds, in the terms of the request (which message, which
 * role, which tool), so a user whose agent keeps missing can see what
 * changed.
 *
 * Input: the rendered prompt's tokens and `shared`, the number of leading
 * tokens the cache's best stored sequence has in common with it (the
 * lookup computes it; cache.h kc_hit.shared). The first differing token is
 * prompt[shared]. The explainer maps that position onto the ChatML turns
 * of the Qwen templates:
 *   message  the turn that holds the token: the number of <|im_start|>
 *            tokens at or before it, minus one (the rendered messages, in
 *            order: the system turn first when there is one);
 *   role     the word after that turn's <|im_start|>;
 *   tool     when the turn is the system turn and the token lies between
 *            "<tools>" and "</tools>" (where the templates put one tool
 *            schema per line), the index of that line: the tool whose
 *            schema changed;
 *   new      the prompt's text around the token (up to 8 tokens each
 *            side, at most 160 bytes);
 *   cached   the cached sequence's text from the same place, when the
 *            caller has it (cached tokens after `shared`).
 * Positions past the end of the prompt (a full hit) give message -1.
 * The server turns the struct into the "kvkeep" usage extension
 * (server/wire.c) and the dashboard's record.
 */
#ifndef KV_SESSION_EXPLAIN_H
#define KV_SESSION_EXPLAIN_H

#include <stdint.h>

#include "text/tokenizer.h"

struct kss_explain {
	uint32_t shared;          /* tokens in common with the cache */
	uint32_t prompt_tokens;
	int message;              /* rendered turn index of the first differing token, -1: none */
	char role[24];            /* that turn's role, "" when unknown */
	int tool;                 /* tool schema line index, -1: not in the tools block */
	char new_text[168];       /* the prompt's text around the token */
	char cached_text[168];    /* the cache's text from the same place ("" unknown) */
};

/* cached / n_cached: the cached sequence's tokens from position `shared`
 * on (may be NULL / 0). */
void kss_explain(const struct kv_tok *tok, const int32_t *prompt, uint32_t n, uint32_t shared,
		 const int32_t *cached, uint32_t n_cached, struct kss_explain *out);
/* One log line: event=cache.miss_reason first_diff=.. message=.. role=..
 * tool=.. new=.. (never the cached side's text). */
void kss_explain_log(const char *route, const struct kss_explain *e);

#endif
