/*
 * request.h - one generation request, from a rendered prompt to its
 * stored entries: the whole path below HTTP.
 *
 * The server parses and renders (server/, text/), then hands the prompt
 * to kss_request on one of its worker threads. Everything else happens
 * here, in this order:
 *
 *   namespace   the request's tier: the default namespace or its
 *               cache_salt's (registry.h)
 *   admission   the projected memory of prompt + max_tokens against the
 *               memory cap; the cache gives up LRU entries before a 503
 *   sampler     the request's own (engine/sample.h)
 *   -> sink.admitted: the request will run (the HTTP status is decided)
 *   run         run.h: flight wait, lookup (RAM, then disk), restore
 *   -> sink.resumed: the resume point and the usage split are known
 *               prefill with the policy's stop points (-> sink.progress)
 *               decode: every token sampled here, its logprobs, its text
 *               through the output pipeline (text/output.h) ->
 *               sink.token, sink.event..., sink.step
 *               store the entries, wake the disk writer
 *   explain     where the prompt departs from the cache (explain.h)
 *
 * Per decoded token control crosses folders twice: the engine returns
 * the logits here, and this file calls the sink. The sink (the server's
 * wire formatter) never calls back down, except kss_service_away when it
 * has to wait for a slow client.
 *
 * Threads: kss_request runs on the caller's thread (the server's worker)
 * and calls the sink there. A service is shared by every request of one
 * server; its functions are thread-safe.
 */
#ifndef KV_SESSION_REQUEST_H
#define KV_SESSION_REQUEST_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "cache/cache.h"
#include "engine/model.h"
#include "engine/sample.h"
#include "session/constrain.h"
#include "session/explain.h"
#include "session/registry.h"
#include "session/run.h"
#include "session/sched.h"
#include "text/output.h"
#include "text/tokbytes.h"
#include "text/tokenizer.h"

#define KSS_MAX_TOP_LOGPROBS 20
#define KSS_MAX_EOS 16

/* What the requests of one server share (borrowed pointers: they must
 * outlive the service). */
struct kss_service_params {
	struct ke_model *model;
	const struct kv_tok *tok;
	const struct kv_tok_bytes *tb;   /* token bytes, for logprobs */
	struct kss_registry *reg;       /* every namespace */
	struct kc_cache *cache;         /* the default namespace's cache */
	struct kss_sched *engine;       /* the engine's scheduler */
	const int32_t *eos;             /* ids that end a generation */
	int n_eos;                      /* <= KSS_MAX_EOS */
	uint64_t mem_cap;               /* admission cap (0: none) */
	int prefill_chunk;              /* tokens per prefill forward (0: engine default) */
	int speculative;                /* --speculative: enum kss_spec_mode (session/spec.h), 0 off */
	int spec_max_draft;             /* longest draft a step verifies (0: run.h's default) */
};

struct kss_service;

int kss_service_create(const struct kss_service_params *p, struct kss_service **out);
void kss_service_destroy(struct kss_service *s);
/* Memory a request needs besides its KV (recurrent state, the sequence's
 * scratch, the logits): the admission projection's constant part. chunk:
 * the prefill chunk (0: 256). */
uint64_t kss_request_overhead(const struct ke_model *m, int chunk);
uint64_t kss_service_request_overhead(const struct kss_service *s);
/* The namespaces the service serves (registry.h), its tokenizer, its
 * compiled constraints (constrain.h). */
struct kss_registry *kss_service_registry(struct kss_service *s);
struct kss_cons *kss_service_cons(struct kss_service *s);
const struct kv_tok *kss_service_tok(const struct kss_service *s);
/* The calling request waits on its client (1) or is back (0): the engine
 * does not wait for it meanwhile (sched.h kss_sched_away). */
void kss_service_away(struct kss_service *s, int away);

/* Speculative decoding over every request so far (for /metrics). Sources
 * as session/spec.h enum kss_spec_src. */
struct kss_spec_totals {
	uint64_t requests;              /* requests that decoded speculatively */
	uint64_t steps;                 /* verifications */
	uint64_t plain;                 /* decode forwards without a draft, in those requests */
	uint64_t drafted[2];            /* draft tokens verified, by source */
	uint64_t accepted[2];           /* of those, kept */
};
void kss_service_spec_totals(struct kss_service *s, struct kss_spec_totals *out);

/* The usage numbers of a request, in one place: every API reports them
 * from this struct. prompt = cached + created + uncached. */
struct kss_usage {
	uint32_t prompt_tokens;         /* the prompt */
	uint32_t cached_tokens;         /* resumed from the cache */
	uint32_t cache_creation_tokens; /* prefilled and kept by the cache */
	uint32_t completion_tokens;     /* generated */
};

/* One generated token, for logprobs (the sink copies what it keeps). */
struct kss_token {
	int32_t id;
	const char *bytes;              /* the token's raw bytes */
	size_t len;
	float logprob;
	int n_top;                      /* alternatives, most likely first */
	int32_t top_id[KSS_MAX_TOP_LOGPROBS];
	float top_lp[KSS_MAX_TOP_LOGPROBS];
	const char *top_bytes[KSS_MAX_TOP_LOGPROBS];
	size_t top_len[KSS_MAX_TOP_LOGPROBS];
};

/* Where the request's results go (every callback optional). */
struct kss_sink {
	void (*admitted)(void *ctx);
	void (*resumed)(void *ctx, const struct kss_usage *u);
	void (*progress)(void *ctx, uint32_t done, uint32_t total);
	/* with logprobs: t has them; without: t->logprob etc. are 0 */
	void (*token)(void *ctx, const struct kss_token *t);
	void (*event)(void *ctx, const struct kv_out_ev *e);
	void (*step)(void *ctx);
};

struct kss_request_params {
	const char *route;              /* for log lines ("/v1/messages") */
	const char *salt;               /* cache_salt (NULL: the default namespace) */
	const int32_t *prompt;          /* n_prompt tokens */
	uint32_t n_prompt;
	const uint32_t *bounds;         /* message boundaries (may be NULL) */
	size_t n_bounds;
	uint32_t max_tokens;            /* tokens to generate */
	struct ke_sample_params sp;
	int logprobs;                   /* report the chosen tokens' logprobs */
	int top_logprobs;               /* 0..KSS_MAX_TOP_LOGPROBS */
	int ignore_eos;
	int no_speculation;             /* decode without drafts ("speculative": false; the output
					 * is the same, only slower or faster) */
	struct kv_out_params out;       /* stop strings, reasoning split, tools (fn/ctx ignored) */
	struct kv_grammar *grammar;     /* structured output (constrain.h; borrowed), or NULL */
	int may_think;                  /* the model may open a reasoning block before the constraint */
	const atomic_int *cancel;       /* set when the client leaves */
};

enum kss_fail { KSS_OK = 0, KSS_FAIL_BUSY, KSS_FAIL_MEMORY, KSS_FAIL_SAMPLER, KSS_FAIL_ENGINE, KSS_FAIL_CANCELLED };

struct kss_request_result {
	int fail;                       /* enum kss_fail */
	int admitted;                   /* sink.admitted was called */
	char err[300];                  /* why, when fail */
	struct kss_usage usage;
	uint32_t generated;             /* sampled tokens */
	const char *finish;             /* "stop", "length", "tool_calls" */
	int stop_hit;                   /* a stop string ended the output */
	int n_tool_calls;
	const char *resume_kind;        /* "miss", "hit", "snap", "anchor" */
	uint32_t from_disk;             /* resume point loaded from disk (0: none) */
	uint32_t from_remote;           /* resume point loaded from the remote tier (0: none) */
	int have_explain;
	struct kss_explain ex;
	uint64_t t_first_ns;            /* the first decode step (kv_now_ns), 0: none */
	uint64_t t_last_ns;             /* the last one */
	double prefill_ms, decode_ms;
	uint64_t reserved_bytes;        /* the admission projection */
	int speculative;                /* the mode this request decoded with (0: plain) */
	struct kss_run_spec spec;       /* what speculation did (run.h) */
};

/*
 * Run one request; *r says how it went (r->fail). Sink callbacks run on
 * this thread. The request's tier is taken and given back here.
 */
void kss_request(struct kss_service *s, const struct kss_request_params *p, const struct kss_sink *sink, void *ctx,
		 struct kss_request_result *r);

/* What POST /v1/cache/probe reports: how much of a prompt each tier of
 * its namespace holds, without running anything. */
struct kss_probe_result {
	int open;                       /* the namespace is open (always for no salt) */
	uint32_t ram_pos;               /* resume point in RAM */
	uint32_t ram_shared;            /* tokens shared with RAM's best sequence */
	int have_disk;                  /* the namespace has a disk tier */
	uint32_t disk_pos;              /* resume point on disk */
	struct kss_explain ex;          /* where the prompt departs from RAM */
	int have_explain;
};
void kss_probe(struct kss_service *s, const char *salt, const int32_t *prompt, uint32_t n, const uint32_t *bounds,
	       size_t n_bounds, struct kss_probe_result *r);

#endif
