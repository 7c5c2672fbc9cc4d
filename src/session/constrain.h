/*
 * constrain.h - structured output in a request: the constraint a request
 * asks for (a JSON Schema, any JSON object, a GBNF grammar, the model's
 * tool calls), compiled once and kept (text/gcache.h), and applied to
 * every token its generation samples (docs/constrain.md, docs/api.md
 * "Structured output").
 *
 * Compiling: kss_constraint_get turns a spec into a grammar over the
 * model's vocabulary. The vocabulary trie is built at the first
 * constrained request of a server (tens of milliseconds) and shared; the
 * compiled grammars are kept by the spec's text (an agent sends the same
 * tools every turn), so a repeated constraint costs a lookup and its
 * token masks are already cached.
 *
 * Decoding (struct kss_cmatch), in phases:
 *   free     inside the model's reasoning (the prompt opened <think>, or
 *            the model opened it as its first token): nothing is masked,
 *            the model reasons as it likes; its </think> ends the phase;
 *   lead     before the constrained output's first byte: the grammar's
 *            tokens; right after a reasoning block also up to KSS_LEAD_WS
 *            newline-only tokens (the "\n\n" the templates put after
 *            </think>); as the very first token, when the model may
 *            reason, <think>;
 *   grammar  every token is one the grammar allows; end-of-sequence ids
 *            only where the grammar may end.
 * Harmony (GPT-OSS, spec.harmony; docs/constrain.md "Harmony"): the
 * grammar holds the message's frame, its markers as the bytes of
 * text/harmony.h (the constraint's vocabulary gives the marker tokens
 * those bytes), and starts with KV_HM_B_FRAME, which the matcher feeds
 * itself: that is how a generation knows its grammar is framed. Phases:
 *   lead     the grammar's first tokens, and when the model may reason
 *            (may_think) also "<|channel|>analysis<|message|>";
 *   free     the analysis body: every token but the markers other than
 *            <|end|> and the end-of-sequence ids; <|end|> ends it;
 *   restart  "<|start|>assistant" (tokens of the text), then the lead
 *            again without the analysis (one analysis message at most);
 *   grammar  the rest: "<|channel|>final<|message|>" + body +
 *            "<|return|>", or " to=functions.NAME<|channel|>commentary
 *            json<|message|>" + arguments + "<|call|>".
 * The mask is applied before sampling (ke_sample_masked), so the
 * penalties, the filters and the reported logprobs all see it. Prefill,
 * the cache and the batch are untouched: the mask is the sequence's own.
 */
#ifndef KV_SESSION_CONSTRAIN_H
#define KV_SESSION_CONSTRAIN_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "text/gmatch.h"

#define KSS_LEAD_WS 2

enum kss_cons_kind {
	KSS_CONS_NONE = 0,
	KSS_CONS_SCHEMA,      /* schema: a JSON Schema (response_format json_schema, json_schema) */
	KSS_CONS_JSON_OBJECT, /* any JSON object (response_format json_object) */
	KSS_CONS_GBNF,        /* gbnf: llama.cpp's grammar field */
	KSS_CONS_TOOLS,       /* tools with tool_choice (text/tcgram.h) */
};

struct kss_cons_spec {
	int kind;              /* enum kss_cons_kind */
	const json_t *schema;  /* SCHEMA */
	int strict;            /* SCHEMA, TOOLS: an unsupported keyword is an error */
	const char *gbnf;      /* GBNF: the grammar's text */
	size_t gbnf_len;
	const json_t *tools;   /* TOOLS: the OpenAI tools array */
	int choice;            /* TOOLS: enum kv_tcg_choice */
	const char *name;      /* TOOLS, KV_TCG_NAMED: the function */
	int parallel;          /* TOOLS: several calls may follow each other */
	int xml;               /* TOOLS: the call syntax, enum kv_tc_format (Qwen3 JSON, Qwen3.5 XML, Nemotron-H list) */
	int harmony;           /* GPT-OSS's harmony frame (TOOLS: required and named only); needs a
				* harmony tokenizer (KV_ERR_UNSUPPORTED otherwise) */
};

struct kss_cons;           /* the compiled-grammar cache of a service */
struct kss_cmatch;         /* one generation's state */

struct kss_cons_params {
	const struct kv_tok *tok;
	int vocab;             /* the model's logits width */
	const int32_t *eos;    /* ids that end a generation */
	int n_eos;
	int max_grammars;      /* compiled grammars kept (0: 64) */
};

int kss_cons_create(const struct kss_cons_params *p, struct kss_cons **out);
void kss_cons_free(struct kss_cons *c);
/* The grammar of a spec (a new reference, kv_grammar_unref): compiled, or
 * found. KV_ERR_INVALID / KV_ERR_UNSUPPORTED with a message naming the
 * problem (a keyword and its place in the schema, a GBNF line and column,
 * a function), for a 400. *hit (may be NULL): it was compiled before. */
int kss_cons_get(struct kss_cons *c, const struct kss_cons_spec *spec, struct kv_grammar **out, int *hit);

/* One generation under g. in_think: the prompt opened a reasoning block;
 * may_think: the model may open one itself (its template reasons and the
 * request did not turn thinking off). */
int kss_cmatch_create(struct kss_cons *c, struct kv_grammar *g, int in_think, int may_think, struct kss_cmatch **out);
void kss_cmatch_free(struct kss_cmatch *m);
/* The mask of the next token (NULL: nothing is masked now: free phase).
 * KV_ERR_NOMEM. */
int kss_cmatch_mask(struct kss_cmatch *m, const uint32_t **mask);
/* The token sampled (from the mask): advance. KV_ERR_INVALID if the
 * grammar refuses it (a token outside the mask). */
int kss_cmatch_accept(struct kss_cmatch *m, int32_t t);
/* The grammar has ended or can take nothing but its end. */
int kss_cmatch_done(const struct kss_cmatch *m);

#endif
