/*
 * server_int.h - what server.c (lifecycle, routes, metrics), reply.c (answers), prompt.c
 * (rendering) and gen.c (a generation request over HTTP) share. Private to src/server.
 */
#ifndef KV_SERVER_SERVER_INT_H
#define KV_SERVER_SERVER_INT_H

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "cache/budget.h"
#include "cache/cache.h"
#include "engine/model.h"
#include "model/config.h"
#include "model/genconfig.h"
#include "text/template.h"
#include "text/tokenizer.h"
#include "text/stop.h"
#include "text/tokbytes.h"
#include "server/httpd.h"
#include "server/metrics.h"
#include "server/auth.h"
#include "server/options.h"
#include "server/recent.h"
#include "server/inflight.h"
#include "server/wire.h"
#include "server/queue.h"
#include "session/explain.h"
#include "session/registry.h"
#include "session/request.h"
#include "session/sched.h"
#include "store/store.h"

#define JSON_MAX_DEPTH 64
#define KSV_MAX_NAMES 16          /* --served-model-name a,b,... */

#define MiB (1024ull * 1024ull)

struct ksv_server {
	struct ksv_opts o;
	char model_name[256];             /* the first served name: what answers report by default */
	char *names_buf;                  /* --served-model-name split at commas (owned) */
	const char *names[KSV_MAX_NAMES]; /* every served name (into names_buf) */
	int n_names;
	struct kv_tok *tok;
	struct kv_chat *chat;
	struct ke_model *model;
	const struct kv_model_config *cfg;
	const struct ke_layout *lay;
	struct kc_cache *cache;
	struct ks_store *store;           /* the disk tier (NULL: none, e.g. --disable-prefix-cache) */
	struct ks_remote *remote;         /* the remote tier (--remote-cache; NULL: none), shared by every
					     namespace's store */
	struct ksv_queue *queue;          /* the request queue: max_running workers */
	struct kss_sched *engine;         /* the engine's scheduler (session/sched.h) */
	struct kss_service *svc;          /* a request's path below HTTP (session/request.h) */
	int max_running;
	int spec_mode;                    /* --speculative (session/spec.h enum kss_spec_mode) */
	struct ksv_metrics *m;
	struct ksv_httpd *http;
	int vocab;
	int32_t eos[16];                  /* ids that end a generation (kv_gencfg_stop_ids) */
	int n_eos;
	struct kv_gencfg sdef;            /* sampling defaults, every field set (flag > file > OpenAI) */
	const char *gc_mode;              /* "auto", "none" or the folder of --generation-config */
	int ctx_len;
	int hybrid;
	int xml_tools;
	int harmony;                      /* GPT-OSS harmony template (text/harmony.h) */
	unsigned norm_rules;              /* --prompt-normalize (normalize.h) */
	struct ksv_recent *recent;        /* the last requests, for the dashboard (recent.h) */
	struct ksv_inflight *inflight;    /* the requests running now, for the dashboard (inflight.h) */
	uint64_t mem_cap;
	struct kc_budget budget;
	struct kv_h128 ns;                /* namespace of the default tier */
	struct kv_h128 fingerprint;       /* the model's (the namespace without a salt) */
	struct kc_params cache_params;    /* the default cache's; salted tiers copy them */
	struct kc_policy policy;
	uint64_t budget_total;            /* RAM tier budget, shared by all namespaces */
	struct kss_registry *reg;         /* every namespace: default + salted (session/registry.h) */
	int64_t created;
	struct kv_tok_bytes *tb;           /* token id -> raw bytes: logprobs, grammars (text/tokbytes.h) */
	/* stop */
	int stop_pipe[2];
	atomic_int stopping;
	atomic_int ready;                 /* 1 once loaded: until then only /health (503) and the page answer */
	/* metric families */
	struct ksv_family *f_requests, *f_prompt_tok, *f_gen_tok, *f_cached_tok, *f_resume, *f_ttft, *f_itl, *f_e2e,
		*f_queue_wait, *f_running, *f_waiting, *f_cancelled, *f_timeouts, *f_conns, *f_mem, *f_mem_peak,
		*f_pages, *f_rej_503, *f_rej_429, *f_corrupt, *f_info;
	/* one per row of the tables in server.c (metrics section) */
	struct ksv_family *fe[20];        /* the engine's scheduler (engine_rows) */
	struct ksv_family *fc[24];        /* the RAM cache (cache_rows) */
	struct ksv_family *fd[40];        /* the disk tier (disk_rows) */
	struct ksv_family *fr[48];        /* the remote tier (remote_rows) */
};

/* server.c: the served model names. 1 if name is one of them. */
int ksv_server_serves(const struct ksv_server *s, const char *name);
/* access.c: the server's keys (--api-key/--admin-key, else the
 * environment's) and the key a request presents (NULL: none). */
struct ksv_auth ksv_server_auth(const struct ksv_server *s);
const char *ksv_server_key(struct ksv_conn *c);
/* May the request on c see text other clients sent (auth.h
 * ksv_auth_trusted)? Does it present the admin key (ksv_auth_is_admin)? */
int ksv_server_trusted(const struct ksv_server *s, struct ksv_conn *c);
int ksv_server_admin(const struct ksv_server *s, struct ksv_conn *c);
/* "'a', 'b'" for messages (cut to cap). */
void ksv_server_names_text(const struct ksv_server *s, char *out, size_t cap);

/* reply.c */
void ksv_reply_json(struct ksv_conn *c, int status, json_t *j);
void ksv_reply_error(struct ksv_server *s, struct ksv_conn *c, int status, const char *param, const char *fmt, ...)
	__attribute__((format(printf, 5, 6)));
/* The same in the error shape of an API (enum ksv_wire). */
void ksv_reply_error_wire(struct ksv_server *s, struct ksv_conn *c, int wire, int status, const char *param,
			  const char *fmt, ...) __attribute__((format(printf, 6, 7)));
/* The same with an OpenAI error code of its own (NULL: the status's). */
void ksv_reply_error_code(struct ksv_server *s, struct ksv_conn *c, int wire, int status, const char *param,
			  const char *code, const char *fmt, ...) __attribute__((format(printf, 7, 8)));

/* prompt.c: a request's prompt, rendered (or tokenized) */
struct ksv_prompt {
	int32_t *tokens;          /* n_tokens (malloc'd) */
	uint32_t n_tokens;
	uint32_t *bounds;         /* message boundaries, ascending, in (0, n_tokens) (malloc'd) */
	size_t n_bounds;
	int in_think;             /* the generation prompt opened a think block */
	/* where the generation prompt starts (the end of the last message),
	 * for the answer's record (session/echo.h); gp_text NULL: unknown */
	uint32_t gp_tok;
	char *gp_text;            /* the generation prompt's text (malloc'd) */
	size_t gp_len;
	/* the server's own answers the prompt restored (session/echo.h) */
	uint32_t *restored;       /* their message indices (malloc'd) */
	size_t n_restored;
};
/* Render a chat request's messages (or tokenize a completion's prompt)
 * into pr; salt: the request's namespace (its remembered answers). 0, or
 * the HTTP status of the failure (400 with the field in param, 500) with
 * the message in kv_errmsg(). */
int ksv_prompt_make(struct ksv_server *s, const struct ksv_req *r, const char *salt, struct ksv_prompt *pr,
		    char *param, size_t cap);
/* Append text's tokens to the prompt (*n: how many). */
int ksv_prompt_append(struct ksv_server *s, struct ksv_prompt *pr, const char *text, uint32_t *n);
void ksv_prompt_free(struct ksv_prompt *pr);

/* intake.c: a generation request's way in */
struct ksv_intake {
	json_t *raw;              /* the body as sent (owned): cache_salt is read here */
	struct ksv_req req;       /* the validated chat request (wire.h parse) */
	json_t *norm_report;      /* what --prompt-normalize changed (NULL: nothing) */
	const char *salt;         /* cache_salt (borrowed from raw, or salt_hdr), NULL: none */
	char *salt_hdr;           /* the X-Cache-Salt header's copy (owned), or NULL */
	struct ksv_prompt pr;     /* the rendered prompt (prompt.c) */
	struct kv_grammar *grammar; /* structured output (session/constrain.h; a reference), or NULL */
	int cons_kind;            /* enum kss_cons_kind */
	int cons_hit;             /* the grammar was compiled before */
	int max_tokens;           /* tokens to generate */
	int trusted;              /* may see other clients' text (ksv_server_trusted) */
};
/* Parse, check and render a generation request in its API (enum
 * ksv_wire_id): 0, or nonzero after replying with the refusal (in is
 * then freeable). route names it in log lines. */
int ksv_intake_gen(struct ksv_server *s, const struct ksv_request *rq, int wire, int api, const char *route,
		   struct ksv_intake *in);
void ksv_intake_free(struct ksv_intake *in);
/* POST /v1/messages/count_tokens. */
void ksv_intake_count_tokens(struct ksv_server *s, const struct ksv_request *rq);
/* POST /v1/cache/probe. */
void ksv_intake_probe(struct ksv_server *s, const struct ksv_request *rq);

/* gen.c */
/* POST /v1/chat/completions (api KSV_API_CHAT, wire OPENAI),
 * /v1/completions (KSV_API_COMPLETION), /v1/messages (KSV_API_CHAT, wire
 * ANTHROPIC) and /v1/responses (KSV_API_CHAT, wire RESPONSES). */
void ksv_gen_handle(struct ksv_server *s, const struct ksv_request *rq, int api, int wire);

static inline void ksv_observe(struct ksv_family *f, double v)
{
	ksv_metrics_observe(f, v);
}

#endif
