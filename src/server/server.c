/*
 * server.c - see server.h: loading, the route table and the small routes,
 * metrics, and the server's life (run, stop, destroy). Generation requests
 * are gen.c.
 */
#include "server/server.h"
#include "server/server_int.h"
#include "server/anthropic.h"
#include "server/dashboard.h"
#include "server/normalize.h"
#include "server/fingerprint.h"
#include "server/auth.h"
#include "server/browser.h"
#include "base/buf.h"
#include "base/clock.h"
#include "base/corrupt.h"
#include "base/env.h"
#include "base/err.h"
#include "base/hash.h"
#include "base/io.h"
#include "base/json.h"
#include "base/log.h"
#include "base/mem.h"
#include "base/pages.h"
#include "base/redis.h"
#include "cache/budget.h"
#include "cache/cache.h"
#include "cache/opts.h"
#include "cache/storage_policy.h"
#include "session/sched.h"
#include "session/spec.h"
#include "engine/model.h"
#include "engine/qdot.h"
#include "engine/sample.h"
#include "engine/seq.h"
#include "model/config.h"
#include "model/probe.h"
#include "base/pool.h"
#include "engine/isa.h"
#include "text/template.h"
#include "text/tokenizer.h"
#include "server/httpd.h"
#include "server/metrics.h"
#include "server/openai.h"
#include "server/request.h"
#include "server/queue.h"
#include "store/dir.h"
#include "store/ns.h"
#include "store/remote.h"
#include "store/store.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* --- other routes ---------------------------------------------------------- */

static const char *index_name(const struct ksv_server *s)
{
	return s->o.prefix_cache_index;
}

/* The RAM cache's counters as JSON (cache_rows, with the metrics below). */
static json_t *stats_json(const struct kc_stats *st);

/* The disk tier in GET /v1/cache/info. */
static json_t *disk_json(struct ksv_server *s)
{
	struct ks_stats st;
	char nsx[33];
	ks_store_stats(s->store, &st);
	kv_h128_hex(s->ns, nsx);
	json_t *d = json_object(), *we = json_object(), *bad = json_object();
	json_object_set_new(d, "dir", json_string(ks_store_root(s->store)));
	json_object_set_new(d, "namespace_dir", json_string(ks_store_ns_dir(s->store)));
	json_object_set_new(d, "salted", json_boolean(s->o.cache_salt && *s->o.cache_salt));
	json_object_set_new(d, "writable", json_boolean(st.writable));
	json_object_set_new(d, "scan_done", json_boolean(st.scan_done));
	json_object_set_new(d, "files", json_integer((json_int_t)st.files[0]));
	json_object_set_new(d, "bytes", json_integer((json_int_t)st.bytes[0]));
	json_object_set_new(d, "checkpoint_files", json_integer((json_int_t)st.files[1]));
	json_object_set_new(d, "checkpoint_bytes", json_integer((json_int_t)st.bytes[1]));
	json_object_set_new(d, "cap_bytes", json_integer((json_int_t)st.cap_bytes));
	json_object_set_new(d, "reserve_bytes", json_integer((json_int_t)st.reserve_bytes));
	json_object_set_new(d, "checkpoint_cap_bytes", json_integer((json_int_t)st.ckpt_cap_bytes));
	json_object_set_new(d, "checkpoint_interval", json_integer(ks_store_ckpt_interval(s->store)));
	json_object_set_new(d, "written_objects", json_integer((json_int_t)(st.written[KS_BLOCK] + st.written[KS_TAIL] +
									     st.written[KS_SNAP] + st.written[KS_ENTRY])));
	json_object_set_new(d, "written_bytes", json_integer((json_int_t)st.written_bytes));
	json_object_set_new(d, "loads", json_integer((json_int_t)st.loads));
	json_object_set_new(d, "load_bytes", json_integer((json_int_t)st.load_bytes));
	json_object_set_new(d, "quarantined", json_integer((json_int_t)st.quarantined));
	json_object_set_new(d, "dirty_objects", json_integer((json_int_t)kc_cache_dirty_count(s->cache)));
	for (int w = 0; w < KS_WERR__COUNT; w++)
		json_object_set_new(we, ks_werr_name(w), json_integer((json_int_t)st.write_errors[w]));
	for (int b = 1; b < KS_BAD__COUNT; b++)
		json_object_set_new(bad, ks_bad_name(b), json_integer((json_int_t)st.bad[b]));
	json_object_set_new(d, "write_errors", we);
	json_object_set_new(d, "refused_files", bad);
	return d;
}

/* The remote tier in GET /v1/cache/info (its counters: remote_rows). */
static json_t *remote_json(struct ksv_server *s);

/* One namespace in GET /v1/cache/info (registry locked). */
static void ns_info(void *ctx, const struct kss_tier *t, struct kv_h128 ns, int salted)
{
	json_t *arr = ctx, *o = json_object();
	char nsx[33];
	struct kc_stats st;
	kv_h128_hex(ns, nsx);
	kc_cache_stats(t->cache, &st);
	json_object_set_new(o, "namespace", json_string(nsx));
	json_object_set_new(o, "kind", json_string(salted ? "request_salt" : "default"));
	json_object_set_new(o, "disk_tier", json_boolean(t->store != NULL));
	json_object_set_new(o, "remote_tier", json_boolean(ks_store_has_remote(t->store)));
	json_object_set_new(o, "stats", stats_json(&st));
	json_array_append_new(arr, o);
}

static void handle_cache_info(struct ksv_server *s, struct ksv_conn *c)
{
	static const char *srcs[] = {"KVKEEP_PREFIX_CACHE_MAX_BYTES", "--cache-memory-mb", "--cache-memory-percent",
				     "default percent", "floor"};
	const struct kc_policy *pol = kc_cache_policy(s->cache);
	json_t *j = json_object(), *b = json_object(), *p = json_object(), *tiers = json_array();
	json_array_append_new(tiers, json_string("ram"));
	if (s->store)
		json_array_append_new(tiers, json_string("disk"));
	if (s->remote)
		json_array_append_new(tiers, json_string("remote"));
	json_object_set_new(j, "enabled", json_boolean(s->o.prefix_cache));
	json_object_set_new(j, "model", json_string(s->model_name));
	json_object_set_new(j, "index", json_string(index_name(s)));
	json_object_set_new(j, "tiers", tiers);
	json_object_set_new(j, "disk_tier", json_boolean(s->store != NULL));
	json_object_set_new(j, "salt_tiers_open", json_integer(s->reg ? kss_registry_salted(s->reg) : 0));
	if (s->store)
		json_object_set_new(j, "disk", disk_json(s));
	json_object_set_new(j, "remote_tier", json_boolean(s->remote != NULL));
	if (s->remote)
		json_object_set_new(j, "remote", remote_json(s));
	json_object_set_new(j, "hybrid", json_boolean(s->hybrid));
	json_object_set_new(j, "page_tokens", json_integer(s->lay->page_tokens));
	json_object_set_new(j, "kv_bytes_per_token", json_integer((json_int_t)s->lay->kv_bytes_per_token));
	json_object_set_new(j, "snapshot_bytes", json_integer((json_int_t)s->lay->snapshot_bytes));
	char nsx[33];
	kv_h128_hex(s->ns, nsx);
	json_object_set_new(j, "namespace", json_string(nsx));
	json_object_set_new(b, "bytes", json_integer((json_int_t)kc_cache_budget(s->cache)));
	json_object_set_new(b, "source", json_string(s->budget.source >= 0 && s->budget.source < 5 ? srcs[s->budget.source] : "?"));
	json_object_set_new(b, "note", json_string(s->budget.note));
	json_object_set_new(b, "memory_cap_bytes", json_integer((json_int_t)s->mem_cap));
	json_object_set_new(j, "budget", b);
	json_t *ad = json_object();
	json_object_set_new(ad, "memory_cap_bytes", json_integer((json_int_t)s->mem_cap));
	json_object_set_new(ad, "memory_used_bytes", json_integer((json_int_t)kv_mem_total()));
	json_object_set_new(ad, "per_request_bytes", json_integer((json_int_t)kss_service_request_overhead(s->svc)));
	json_object_set_new(ad, "kv_bytes_per_token", json_integer((json_int_t)s->lay->kv_bytes_per_token));
	json_object_set_new(j, "admission", ad);
	json_object_set_new(p, "checkpoint_stride", json_integer(pol->stride));
	json_object_set_new(p, "checkpoint_max", json_integer(pol->ckpt_max));
	json_object_set_new(p, "anchor", json_boolean(pol->anchor));
	json_object_set_new(p, "min_reuse", json_integer(pol->min_reuse));
	json_object_set_new(p, "prefix_cache_size", json_integer(s->o.prefix_cache_size));
	json_object_set_new(p, "hybrid_cache_entries", json_integer(s->o.hybrid_cache_entries));
	json_object_set_new(j, "policy", p);
	/* "stats": the default namespace (as before salts existed);
	 * "all_stats": every namespace together; "namespaces": each one */
	struct kc_stats st;
	kc_cache_stats(s->cache, &st);
	json_object_set_new(j, "stats", stats_json(&st));
	kss_registry_stats(s->reg, &st);
	json_object_set_new(j, "all_stats", stats_json(&st));
	json_t *nss = json_array();
	kss_registry_each(s->reg, ns_info, nss);
	json_object_set_new(j, "namespaces", nss);
	ksv_reply_json(c, 200, j);
}

static void handle_cache_clear(struct ksv_server *s, struct ksv_conn *c)
{
	/* every namespace, the salted ones too */
	struct kc_stats a, b;
	kss_registry_clear(s->reg, &a, &b);
	json_t *j = json_object();
	json_object_set_new(j, "cleared_entries", json_integer((json_int_t)(a.entries - b.entries)));
	json_object_set_new(j, "freed_bytes", json_integer((json_int_t)(a.bytes_in_use - b.bytes_in_use)));
	json_object_set_new(j, "entries", json_integer((json_int_t)b.entries));
	json_object_set_new(j, "bytes_in_use", json_integer((json_int_t)b.bytes_in_use));
	ksv_reply_json(c, 200, j);
}

/* The served names from --served-model-name (a,b: every name reaches the
 * one model; Claude Code sends its main and its small/fast model name),
 * else the model folder's name. */
static int set_names(struct ksv_server *s, const struct ksv_opts *o)
{
	if (o->served_model_name && *o->served_model_name) {
		if (!(s->names_buf = strdup(o->served_model_name)))
			return kv_fail(KV_ERR_NOMEM, "out of memory");
		for (char *p = s->names_buf, *e; p; p = e) {
			e = strchr(p, ',');
			if (e)
				*e++ = 0;
			if (!*p)
				return kv_fail(KV_ERR_INVALID, "--served-model-name: an empty name in '%s'", o->served_model_name);
			if (s->n_names == KSV_MAX_NAMES)
				return kv_fail(KV_ERR_INVALID, "--served-model-name: at most %d names", KSV_MAX_NAMES);
			s->names[s->n_names++] = p;
		}
		snprintf(s->model_name, sizeof s->model_name, "%s", s->names[0]);
		return KV_OK;
	}
	const char *dir = o->model_dir;
	size_t l = strlen(dir);
	while (l > 1 && dir[l - 1] == '/')
		l--;
	const char *b = dir + l;
	while (b > dir && b[-1] != '/')
		b--;
	/* "Qwen3-8B-Q4_K_M.gguf" answers to "Qwen3-8B-Q4_K_M" */
	if (dir + l - b > 5 && !strncmp(dir + l - 5, ".gguf", 5))
		l -= 5;
	snprintf(s->model_name, sizeof s->model_name, "%.*s", (int)(dir + l - b), b);
	s->names[s->n_names++] = s->model_name;
	return KV_OK;
}

static json_t *model_json(struct ksv_server *s, const char *name)
{
	json_t *m = json_object();
	json_object_set_new(m, "id", json_string(name));
	json_object_set_new(m, "object", json_string("model"));
	json_object_set_new(m, "created", json_integer(s->created));
	json_object_set_new(m, "owned_by", json_string("kvkeep"));
	json_object_set_new(m, "max_model_len", json_integer(s->ctx_len));
	/* kvkeep's extension: what a request that sets no sampling field gets */
	json_t *sd = json_object(), *src = json_object(), *st = json_array();
	for (int i = 0; i < KV_GC_N; i++) {
		const char *n = kv_gencfg_name(i);
		json_object_set_new(sd, n, i == KV_GC_TOP_K ? json_integer((json_int_t)s->sdef.v[i]) : json_real(s->sdef.v[i]));
		json_object_set_new(src, n, json_string(s->sdef.src[i]));
	}
	json_object_set_new(sd, "source", src);
	json_object_set_new(sd, "generation_config", json_string(s->gc_mode));
	for (int i = 0; i < s->n_eos; i++)
		json_array_append_new(st, json_integer(s->eos[i]));
	json_object_set_new(sd, "stop_token_ids", st);
	json_object_set_new(m, "sampling_defaults", sd);
	return m;
}

static void handle_models(struct ksv_server *s, struct ksv_conn *c, const char *id)
{
	if (id) {
		if (!ksv_server_serves(s, id)) {
			char names[512];
			ksv_server_names_text(s, names, sizeof names);
			ksv_reply_error(s, c, 404, "model", "the model '%s' does not exist (this server serves %s)", id, names);
			return;
		}
		ksv_reply_json(c, 200, model_json(s, id));
		return;
	}
	json_t *j = json_object(), *d = json_array();
	for (int i = 0; i < s->n_names; i++)
		json_array_append_new(d, model_json(s, s->names[i]));
	json_object_set_new(j, "object", json_string("list"));
	json_object_set_new(j, "data", d);
	ksv_reply_json(c, 200, j);
}

static void handle_metrics(struct ksv_server *s, struct ksv_conn *c)
{
	struct kv_buf b = KV_BUF_INIT;
	ksv_metrics_render(s->m, &b);
	if (b.oom) {
		kv_buf_free(&b);
		ksv_reply_error(s, c, 500, NULL, "out of memory");
		return;
	}
	ksv_conn_reply(c, 200, KSV_METRICS_CONTENT_TYPE, b.p ? b.p : "", b.len);
	kv_buf_free(&b);
}

/* --- routes --------------------------------------------------------------- */

/* Every route's handler has this shape: rest is what follows a prefix
 * route's path (NULL on an exact one), is_head a HEAD on a GET route. */
typedef void (*route_fn)(struct ksv_server *s, const struct ksv_request *rq, const char *rest, int is_head);

static void route_chat(struct ksv_server *s, const struct ksv_request *rq, const char *rest, int is_head)
{
	(void)rest, (void)is_head;
	ksv_gen_handle(s, rq, KSV_API_CHAT, KSV_WIRE_OPENAI);
}

static void route_completions(struct ksv_server *s, const struct ksv_request *rq, const char *rest, int is_head)
{
	(void)rest, (void)is_head;
	ksv_gen_handle(s, rq, KSV_API_COMPLETION, KSV_WIRE_OPENAI);
}

static void route_messages(struct ksv_server *s, const struct ksv_request *rq, const char *rest, int is_head)
{
	(void)rest, (void)is_head;
	ksv_gen_handle(s, rq, KSV_API_CHAT, KSV_WIRE_ANTHROPIC);
}

static void route_count_tokens(struct ksv_server *s, const struct ksv_request *rq, const char *rest, int is_head)
{
	(void)rest, (void)is_head;
	ksv_intake_count_tokens(s, rq);
}

static void route_responses(struct ksv_server *s, const struct ksv_request *rq, const char *rest, int is_head)
{
	(void)rest, (void)is_head;
	ksv_gen_handle(s, rq, KSV_API_CHAT, KSV_WIRE_RESPONSES);
}

/* /v1/models and /v1/models/{id} */
static void route_models(struct ksv_server *s, const struct ksv_request *rq, const char *rest, int is_head)
{
	(void)is_head;
	handle_models(s, rq->conn, rest);
}

static void route_health(struct ksv_server *s, const struct ksv_request *rq, const char *rest, int is_head)
{
	(void)rest, (void)is_head;
	int stopping = atomic_load(&s->stopping), ready = atomic_load_explicit(&s->ready, memory_order_acquire);
	json_t *j = json_object();
	json_object_set_new(j, "status", json_string(stopping ? "shutting_down" : !ready ? "loading" : "ok"));
	json_object_set_new(j, "model", json_string(s->model_name));
	if (!ready && !stopping) {
		/* llama.cpp's answer while loading, so its clients wait the same way */
		json_object_set_new(j, "error", json_pack("{s:s, s:s, s:i}", "message", "Loading model", "type",
							  "unavailable_error", "code", 503));
		KV_DEBUG("http.health", "status=503 msg=\"loading\"");
	}
	if (stopping)
		KV_INFO("http.error", "route=/health status=503 param=\"-\" msg=\"shutting down\"");
	ksv_reply_json(rq->conn, stopping || !ready ? 503 : 200, j);
}

static void route_metrics(struct ksv_server *s, const struct ksv_request *rq, const char *rest, int is_head)
{
	(void)rest, (void)is_head;
	handle_metrics(s, rq->conn);
}

static void route_cache_info(struct ksv_server *s, const struct ksv_request *rq, const char *rest, int is_head)
{
	(void)rest, (void)is_head;
	handle_cache_info(s, rq->conn);
}

static void route_cache_clear(struct ksv_server *s, const struct ksv_request *rq, const char *rest, int is_head)
{
	(void)rest, (void)is_head;
	handle_cache_clear(s, rq->conn);
}

static void route_probe(struct ksv_server *s, const struct ksv_request *rq, const char *rest, int is_head)
{
	(void)rest, (void)is_head;
	ksv_intake_probe(s, rq);
}

/* A browser gets the dashboard; HEAD / is how some clients (Claude Code)
 * check the server is up. */
static void route_root(struct ksv_server *s, const struct ksv_request *rq, const char *rest, int is_head)
{
	(void)rest;
	struct ksv_conn *c = rq->conn;
	const char *acc = ksv_conn_req_header(c, "Accept");
	if (!is_head && acc && strstr(acc, "text/html")) {
		ksv_dashboard_handle_page(s, c);
		return;
	}
	json_t *j = json_object();
	json_object_set_new(j, "name", json_string("kvkeep"));
	json_object_set_new(j, "version", json_string(KVKEEP_VERSION));
	json_object_set_new(j, "model", json_string(s->model_name));
	ksv_reply_json(c, 200, j);
}

static void route_dashboard(struct ksv_server *s, const struct ksv_request *rq, const char *rest, int is_head)
{
	(void)rest, (void)is_head;
	ksv_dashboard_handle_page(s, rq->conn);
}

static void route_dashboard_state(struct ksv_server *s, const struct ksv_request *rq, const char *rest, int is_head)
{
	(void)rest, (void)is_head;
	ksv_dashboard_handle_state(s, rq->conn);
}

/*
 * The route table: looked up in one place (route_find), first match wins.
 * A GET route answers HEAD too. Access (server/auth.h) is checked before
 * the method, so a caller without the key learns nothing about a route.
 */
struct route {
	const char *method;
	const char *path;         /* the exact path, or (prefix) its start */
	int prefix;               /* 1: path + at least one more byte (the id) */
	const char *name;         /* the route in logs and metrics */
	enum ksv_auth_class auth;
	int wire;                 /* the error shape (enum ksv_wire) */
	route_fn fn;
};

#define OAI KSV_WIRE_OPENAI
#define ANT KSV_WIRE_ANTHROPIC
static const struct route routes[] = {
	{"POST", "/v1/chat/completions", 0, "/v1/chat/completions", KSV_AUTH_API, OAI, route_chat},
	{"POST", "/v1/completions", 0, "/v1/completions", KSV_AUTH_API, OAI, route_completions},
	{"GET", "/v1/models", 0, "/v1/models", KSV_AUTH_API, OAI, route_models},
	{"GET", "/health", 0, "/health", KSV_AUTH_OPEN, OAI, route_health},
	{"GET", "/metrics", 0, "/metrics", KSV_AUTH_OPEN, OAI, route_metrics},
	{"GET", "/v1/cache/info", 0, "/v1/cache/info", KSV_AUTH_ADMIN, OAI, route_cache_info},
	{"POST", "/v1/cache/clear", 0, "/v1/cache/clear", KSV_AUTH_ADMIN, OAI, route_cache_clear},
	{"POST", "/v1/cache/probe", 0, "/v1/cache/probe", KSV_AUTH_ADMIN, OAI, route_probe},
	/* the Messages routes answer in Anthropic's error shape */
	{"POST", "/v1/messages", 0, "/v1/messages", KSV_AUTH_API, ANT, route_messages},
	{"POST", "/v1/messages/count_tokens", 0, "/v1/messages/count_tokens", KSV_AUTH_API, ANT, route_count_tokens},
	{"POST", "/v1/responses", 0, "/v1/responses", KSV_AUTH_API, OAI, route_responses},
	{"GET", "/", 0, "/", KSV_AUTH_OPEN, OAI, route_root},
	/* the dashboard page holds no data; what it reads is admin */
	{"GET", "/dashboard", 0, "/dashboard", KSV_AUTH_OPEN, OAI, route_dashboard},
	{"GET", "/v1/dashboard/state", 0, "/v1/dashboard/state", KSV_AUTH_ADMIN, OAI, route_dashboard_state},
	{"GET", "/v1/models/", 1, "/v1/models", KSV_AUTH_API, OAI, route_models},
};
#undef OAI
#undef ANT

/* The route of a path, or NULL; *rest: what follows a prefix route's path. */
static const struct route *route_find(const char *path, const char **rest)
{
	*rest = NULL;
	for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++) {
		const struct route *r = &routes[i];
		size_t n = strlen(r->path);
		if (!r->prefix && !strcmp(path, r->path))
			return r;
		if (r->prefix && !strncmp(path, r->path, n) && path[n]) {
			*rest = path + n;
			return r;
		}
	}
	return NULL;
}

static const char *route_of(void *ctx, const char *path)
{
	(void)ctx;
	const char *rest;
	const struct route *r = route_find(path, &rest);
	return r ? r->name : "other";
}

static void handler(void *ctx, const struct ksv_request *rq)
{
	struct ksv_server *s = ctx;
	struct ksv_conn *c = rq->conn;
	const char *path = rq->path, *rest;
	const struct route *r = route_find(path, &rest);
	if (!r) {
		ksv_reply_error(s, c, 404, NULL, "unknown route: %s %s", rq->method, path);
		return;
	}
	ksv_conn_set_route(c, r->name);
	/* browsers first: a page the user did not mean to allow learns
	 * nothing, and a preflight carries no key (server/browser.h) */
	char msg[600];
	const char *api_key = s->o.api_key ? s->o.api_key : s->o.env_api_key;
	struct ksv_browser br = {.host = s->o.host, .allowed_origin = s->o.allowed_origin,
				 .allowed_host = s->o.allowed_host, .open_api = !api_key || !*api_key};
	int refused = ksv_browser_check(&br, c, msg, sizeof msg);
	if (refused) {
		ksv_reply_error_wire(s, c, r->wire, refused, NULL, "%s", msg);
		return;
	}
	if (!strcmp(rq->method, "OPTIONS")) {
		ksv_browser_preflight(c, r->method);
		ksv_conn_reply(c, 204, NULL, "", 0);
		return;
	}
	if (!atomic_load_explicit(&s->ready, memory_order_acquire) && r->fn != route_health && r->fn != route_dashboard) {
		/* the port is bound before the model loads (a busy port fails
		 * fast); until it is ready only /health and the page answer */
		ksv_reply_error_wire(s, c, r->wire, 503, NULL,
				     "Loading model: the server answers once it is loaded (GET /health is 200 then)");
		return;
	}
	struct ksv_auth au = ksv_server_auth(s);
	const char *key = ksv_server_key(c);
	switch (ksv_auth_check(&au, r->auth, key)) {
	case KSV_AUTH_OK:
		break;
	case KSV_AUTH_UNAUTHORIZED:
		ksv_conn_header(c, "WWW-Authenticate", "Bearer");
		/* which key would open it, so the dashboard asks for the right one */
		ksv_conn_header(c, "X-Kvkeep-Key", r->auth == KSV_AUTH_ADMIN && au.admin_key && *au.admin_key ? "admin" : "api");
		ksv_reply_error_wire(s, c, r->wire, 401, NULL, "%s",
				     key ? "invalid API key" : "an API key is required (Authorization: Bearer KEY or x-api-key: KEY)");
		return;
	case KSV_AUTH_FORBIDDEN:
		ksv_reply_error_wire(s, c, r->wire, 403, NULL,
				"the cache admin routes are off: this server listens beyond loopback (--host %s) and has no "
				"--admin-key",
				s->o.host);
		return;
	}
	if (r->auth == KSV_AUTH_ADMIN) {
		/* probes can recover other clients' cached prefixes (docs/api.md):
		 * every admin call leaves a line at the default level */
		char peer[96];
		ksv_conn_peer(c, peer, sizeof peer);
		/* except the dashboard's poll, once a second while a page is open
		 * (3,600 lines an hour at info): at debug */
		if (r->fn == route_dashboard_state)
			KV_DEBUG("cache.admin", "route=%s peer=%s body_bytes=%zu", r->name, peer, rq->body_len);
		else
			KV_INFO("cache.admin", "route=%s peer=%s body_bytes=%zu", r->name, peer, rq->body_len);
	}
	int is_head = !strcmp(rq->method, "HEAD") && !strcmp(r->method, "GET");
	if (strcmp(rq->method, r->method) && !is_head) {
		ksv_conn_header(c, "Allow", r->method);
		ksv_reply_error_wire(s, c, r->wire, 405, NULL, "%s does not accept %s (use %s)", path, rq->method, r->method);
		return;
	}
	if (!strcmp(r->method, "POST") && (refused = ksv_browser_json_body(c, rq->body_len, msg, sizeof msg))) {
		ksv_reply_error_wire(s, c, r->wire, refused, NULL, "%s", msg);
		return;
	}
	r->fn(s, rq, rest, is_head);
}

static void on_done(void *ctx, const char *route, int status, int gone, double seconds)
{
	struct ksv_server *s = ctx;
	char st[16];
	(void)gone;
	(void)seconds;
	if (!atomic_load_explicit(&s->ready, memory_order_acquire))
		return; /* no metrics yet: the model is loading */
	snprintf(st, sizeof st, "%d", status);
	ksv_series_add(ksv_series_get(s->f_requests, "route", route, "status", st, NULL), 1);
}

static void on_timeout(void *ctx)
{
	struct ksv_server *s = ctx;
	if (!atomic_load_explicit(&s->ready, memory_order_acquire))
		return;
	ksv_metrics_add(s->f_timeouts, 1);
}

/* --- metrics ------------------------------------------------------------ */

/*
 * Metrics read from a stats struct at scrape time. One row says all there
 * is about one: its name, type and help, the field it reads (divided by
 * `div`), and for the cache's counters the key in GET /v1/cache/info.
 * Registration, the scrape and the JSON walk the same rows, so a new
 * counter is one line in one table. Rows register in table order, which
 * is the order of /metrics.
 */
struct stat_row {
	const char *name;
	int type;                 /* KSV_COUNTER or KSV_GAUGE */
	const char *help;
	size_t off;               /* offsetof the field in the view struct */
	char vt;                  /* the field's type: 'u' uint64_t, 'i' int, 'd' double; 'l' labelled */
	double div;               /* metric = field / div */
	const char *json;         /* key in the JSON view; NULL: not in it */
	void (*labelled)(struct ksv_family *f, const void *view); /* 'l': sets the series */
};
#define STAT_VT(T, f) _Generic(((T *)0)->f, uint64_t: 'u', int: 'i', double: 'd')
#define ROW(T, f, name, type, div, json, help) {name, type, help, offsetof(T, f), STAT_VT(T, f), div, json, NULL}
#define LROW(fn, name, type, help) {name, type, help, 0, 'l', 1, NULL, fn}
#define N_ROWS(t) ((int)(sizeof t / sizeof t[0]))
#define C KSV_COUNTER
#define G KSV_GAUGE

static double stat_field(const struct stat_row *r, const void *view)
{
	const char *p = (const char *)view + r->off;
	uint64_t u;
	int i;
	double d;
	switch (r->vt) {
	case 'u':
		memcpy(&u, p, sizeof u);
		return (double)u;
	case 'i':
		memcpy(&i, p, sizeof i);
		return i;
	default:
		memcpy(&d, p, sizeof d);
		return d;
	}
}

static int stat_register(struct ksv_metrics *m, const struct stat_row *t, int n, struct ksv_family **fam)
{
	for (int i = 0; i < n; i++)
		if (!(fam[i] = ksv_metrics_family(m, t[i].name, t[i].help, t[i].type, NULL, 0)))
			return kv_fail(KV_ERR_NOMEM, "out of memory");
	return KV_OK;
}

static void stat_scrape(const struct stat_row *t, int n, struct ksv_family **fam, const void *view)
{
	for (int i = 0; i < n; i++) {
		if (t[i].vt == 'l')
			t[i].labelled(fam[i], view);
		else
			ksv_metrics_set(fam[i], stat_field(&t[i], view) / t[i].div); /* x / 1 is x exactly */
	}
}

/* The rows with a JSON key, as an object: the field as it is (integers,
 * doubles as reals), not divided. */
static json_t *stat_json(const struct stat_row *t, int n, const void *view)
{
	json_t *j = json_object();
	for (int i = 0; i < n; i++) {
		if (!t[i].json)
			continue;
		double v = stat_field(&t[i], view);
		json_object_set_new(j, t[i].json, t[i].vt == 'd' ? json_real(v) : json_integer((json_int_t)v));
	}
	return j;
}

/* The RAM cache (every namespace together in /metrics; GET /v1/cache/info
 * shows the same keys per namespace). */
static const struct stat_row cache_rows[] = {
	ROW(struct kc_stats, lookups, "kvkeep_prefix_cache_lookups_total", C, 1, "lookups", "Prefix-cache lookups."),
	ROW(struct kc_stats, hits, "kvkeep_prefix_cache_hits_total", C, 1, "hits", "Lookups that found a resume point."),
	ROW(struct kc_stats, misses, "kvkeep_prefix_cache_misses_total", C, 1, "misses", "Lookups that found nothing."),
	ROW(struct kc_stats, tokens_saved, "kvkeep_prefix_cache_tokens_saved_total", C, 1, "tokens_saved",
	    "Prompt tokens not prefilled thanks to hits."),
	ROW(struct kc_stats, evictions, "kvkeep_prefix_cache_evictions_total", C, 1, "evictions",
	    "Entries evicted for any reason."),
	ROW(struct kc_stats, pressure_evictions, "kvkeep_prefix_cache_pressure_evictions_total", C, 1, "pressure_evictions",
	    "Entries evicted by budget pressure or prefill reclaim."),
	ROW(struct kc_stats, nontrim_skips, "kvkeep_prefix_cache_nontrimmable_skips_total", C, 1, "nontrimmable_skips",
	    "Hybrid entries the policy chose not to store."),
	ROW(struct kc_stats, snaps, "kvkeep_prefix_cache_snaps_total", C, 1, "snaps",
	    "Hybrid lookups snapped down to a checkpoint."),
	ROW(struct kc_stats, stores, "kvkeep_prefix_cache_stores_total", C, 1, "stores", "Entries stored."),
	ROW(struct kc_stats, bytes_in_use, "kvkeep_prefix_cache_bytes", G, 1, "bytes_in_use",
	    "Bytes held by the RAM prefix cache."),
	ROW(struct kc_stats, cap_bytes, "kvkeep_prefix_cache_budget_bytes", G, 1, "budget_bytes",
	    "Byte budget of the RAM prefix cache (0 = none)."),
	ROW(struct kc_stats, entries, "kvkeep_prefix_cache_entries", G, 1, "entries", "Entries in the RAM prefix cache."),
	ROW(struct kc_stats, nodes, "kvkeep_prefix_cache_nodes", G, 1, "nodes", "Block nodes in the index."),
	ROW(struct kc_stats, rps, "kvkeep_prefix_cache_resume_points", G, 1, "resume_points", "Resume points held."),
	ROW(struct kc_stats, snapshots, "kvkeep_prefix_cache_snapshots", G, 1, "snapshots", "Recurrent snapshots held."),
	ROW(struct kc_stats, dedup_bytes_saved, "kvkeep_prefix_cache_dedup_bytes_saved", G, 1, "dedup_bytes_saved",
	    "KV bytes not stored twice because entries share blocks."),
	ROW(struct kc_stats, lookup_p50_ms, "kvkeep_prefix_cache_lookup_p50_seconds", G, 1e3, "lookup_p50_ms",
	    "Median lookup latency over the last 4096 lookups."),
	ROW(struct kc_stats, lookup_p99_ms, "kvkeep_prefix_cache_lookup_p99_seconds", G, 1e3, "lookup_p99_ms",
	    "99th percentile lookup latency over the last 4096 lookups."),
};

static json_t *stats_json(const struct kc_stats *st)
{
	return stat_json(cache_rows, N_ROWS(cache_rows), st);
}

/* The engine's scheduler, and the server's own limit beside it. */
struct engine_view {
	struct kss_sched_stats es;
	int max_running;
	struct kss_spec_totals sp;       /* speculative decoding (session/request.h) */
};

/* Speculative decoding's draft tokens and kept ones by source. */
static const char *const g_spec_src[2] = {"lookup", "mtp"};

static void spec_drafted(struct ksv_family *f, const void *view)
{
	const struct kss_spec_totals *sp = &((const struct engine_view *)view)->sp;
	for (int i = 0; i < 2; i++)
		ksv_series_set(ksv_series_get(f, "source", g_spec_src[i], NULL), (double)sp->drafted[i]);
}

static void spec_accepted(struct ksv_family *f, const void *view)
{
	const struct kss_spec_totals *sp = &((const struct engine_view *)view)->sp;
	for (int i = 0; i < 2; i++)
		ksv_series_set(ksv_series_get(f, "source", g_spec_src[i], NULL), (double)sp->accepted[i]);
}

static void spec_acceptance(struct ksv_family *f, const void *view)
{
	const struct kss_spec_totals *sp = &((const struct engine_view *)view)->sp;
	for (int i = 0; i < 2; i++)
		ksv_series_set(ksv_series_get(f, "source", g_spec_src[i], NULL),
			       sp->drafted[i] ? (double)sp->accepted[i] / (double)sp->drafted[i] : 0.0);
}
static const struct stat_row engine_rows[] = {
	ROW(struct engine_view, es.steps, "kvkeep_engine_steps_total", C, 1, NULL, "Engine steps (one batched forward each)."),
	ROW(struct engine_view, es.rows, "kvkeep_engine_step_tokens_total", C, 1, NULL,
	    "Tokens through engine steps (decode and prefill)."),
	ROW(struct engine_view, es.prefill_rows, "kvkeep_engine_prefill_tokens_total", C, 1, NULL,
	    "Of those, tokens of prefill chunks."),
	ROW(struct engine_view, es.step_s, "kvkeep_engine_step_seconds_total", C, 1, NULL,
	    "Seconds spent in engine steps (divide by steps: mean step time)."),
	ROW(struct engine_view, es.last_batch, "kvkeep_engine_batch_size", G, 1, NULL, "Sequences in the last engine step."),
	ROW(struct engine_view, es.max_batch, "kvkeep_engine_batch_size_max", G, 1, NULL,
	    "Most sequences one engine step has run."),
	ROW(struct engine_view, es.last_step_s, "kvkeep_engine_last_step_seconds", G, 1, NULL,
	    "Duration of the last engine step."),
	ROW(struct engine_view, es.joined, "kvkeep_engine_sequences", G, 1, NULL,
	    "Sequences on the engine now (prefilling or decoding)."),
	ROW(struct engine_view, es.away, "kvkeep_engine_sequences_away", G, 1, NULL,
	    "Of those, waiting for a slow client (the engine does not wait for them)."),
	ROW(struct engine_view, es.flight_waits, "kvkeep_engine_prefix_waits_total", C, 1, NULL,
	    "Requests that waited for another request's prefill of a shared prefix instead of computing it again."),
	ROW(struct engine_view, es.flight_tokens, "kvkeep_engine_prefix_wait_tokens_total", C, 1, NULL,
	    "Prompt tokens those waits found in the cache."),
	ROW(struct engine_view, max_running, "kvkeep_engine_max_running", G, 1, NULL,
	    "Requests that may generate together (--max-running)."),
	ROW(struct engine_view, es.verify_rows, "kvkeep_engine_verify_tokens_total", C, 1, NULL,
	    "Tokens through engine steps in verifications of drafts (speculative decoding)."),
	ROW(struct engine_view, sp.steps, "kvkeep_spec_verifications_total", C, 1, NULL,
	    "Decode forwards that verified a draft (speculative decoding)."),
	ROW(struct engine_view, sp.plain, "kvkeep_spec_plain_steps_total", C, 1, NULL,
	    "Decode forwards of speculating requests that verified no draft (none paid)."),
	LROW(spec_drafted, "kvkeep_spec_draft_tokens_total", C, "Draft tokens verified, by source."),
	LROW(spec_accepted, "kvkeep_spec_accepted_tokens_total", C,
	     "Draft tokens kept (the model chose them), by source."),
	LROW(spec_acceptance, "kvkeep_spec_acceptance_ratio", G, "Kept / verified draft tokens so far, by source."),
};

/* The disk tier's counters (store.h struct ks_stats), copied at scrape
 * time, and the RAM cache's objects not yet written. */
struct disk_view {
	struct ks_stats st;
	double dirty;
};

static void disk_written(struct ksv_family *f, const void *view)
{
	const struct ks_stats *st = &((const struct disk_view *)view)->st;
	for (int k = KS_BLOCK; k < KS_KIND__END; k++)
		ksv_series_set(ksv_series_get(f, "kind", ks_kind_name(k), NULL), (double)st->written[k]);
}

static void disk_write_errors(struct ksv_family *f, const void *view)
{
	const struct ks_stats *st = &((const struct disk_view *)view)->st;
	for (int w = 0; w < KS_WERR__COUNT; w++)
		ksv_series_set(ksv_series_get(f, "kind", ks_werr_name(w), NULL), (double)st->write_errors[w]);
}

static void disk_refused(struct ksv_family *f, const void *view)
{
	const struct ks_stats *st = &((const struct disk_view *)view)->st;
	for (int b = 1; b < KS_BAD__COUNT; b++)
		ksv_series_set(ksv_series_get(f, "reason", ks_bad_name(b), NULL), (double)st->bad[b]);
}

#define DROW(f, name, type, help) ROW(struct disk_view, f, name, type, 1, NULL, help)
static const struct stat_row disk_rows[] = {
	DROW(st.files[0], "kvkeep_disk_files", G, "Object files of this namespace on disk (main area)."),
	DROW(st.bytes[0], "kvkeep_disk_bytes", G, "Bytes of those files."),
	DROW(st.files[1], "kvkeep_disk_checkpoint_files", G, "Files under kv_checkpoints/ for this namespace."),
	DROW(st.bytes[1], "kvkeep_disk_checkpoint_bytes", G, "Bytes under kv_checkpoints/ for this namespace."),
	DROW(st.cap_bytes, "kvkeep_disk_cap_bytes", G, "Disk cap (--disk-cache-max-mb)."),
	DROW(st.ckpt_cap_bytes, "kvkeep_disk_checkpoint_cap_bytes", G, "KVKEEP_KV_CHECKPOINT_MAX_BYTES (0 = no cap)."),
	LROW(disk_written, "kvkeep_disk_written_objects_total", C, "Objects written, by kind."),
	DROW(st.written_bytes, "kvkeep_disk_written_bytes_total", C, "Bytes written."),
	LROW(disk_write_errors, "kvkeep_disk_write_errors_total", C,
	     "Writes that failed, by kind (enospc, eio, fsync, readonly, cap)."),
	LROW(disk_refused, "kvkeep_disk_refused_files_total", C, "Files refused by the loader, by reason."),
	DROW(st.quarantined, "kvkeep_disk_quarantined_files_total", C, "Corrupt files moved to quarantine/."),
	DROW(st.echo_written, "kvkeep_disk_answer_records_written_total", C,
	     "The server's own answers written to disk (so a client that sends one back after a restart hits)."),
	DROW(st.echo_loaded, "kvkeep_disk_answer_records_loaded_total", C, "Answer records loaded at start."),
	DROW(st.echo_rejected, "kvkeep_disk_answer_records_rejected_total", C,
	     "Answer record files refused at start (checksum, size, vocabulary) and quarantined."),
	DROW(st.incomplete, "kvkeep_disk_incomplete_entries_total", C,
	     "Manifests not written because a dependency was missing."),
	DROW(st.loads, "kvkeep_disk_loads_total", C, "Lookups served by loading from disk."),
	DROW(st.load_bytes, "kvkeep_disk_load_bytes_total", C, "Bytes read to serve them."),
	DROW(st.load_files, "kvkeep_disk_load_files_total", C, "Files read to serve them."),
	DROW(st.load_tokens, "kvkeep_disk_load_tokens_total", C, "Prompt tokens made available by them."),
	DROW(st.load_seconds, "kvkeep_disk_load_seconds_total", C, "Time spent loading them."),
	DROW(st.direct_lookups, "kvkeep_disk_direct_lookups_total", C, "Disk lookups made before the startup scan was done."),
	DROW(st.evictions, "kvkeep_disk_evictions_total", C, "Files deleted by the disk cap or the free-space reserve."),
	DROW(st.ckpt_evictions, "kvkeep_disk_checkpoint_evictions_total", C, "Checkpoint files deleted by their cap."),
	DROW(st.ns_removed, "kvkeep_disk_namespaces_removed_total", C, "Namespaces unused for 7 days that the scan removed."),
	DROW(st.debris_removed, "kvkeep_disk_temp_files_removed_total", C,
	     "Temp debris of interrupted writes deleted at startup."),
	DROW(st.ckpts_queued, "kvkeep_disk_checkpoints_queued_total", C, "Interval checkpoints queued for the writer."),
	DROW(st.ckpts_written, "kvkeep_disk_checkpoints_written_total", C, "Interval checkpoints written."),
	DROW(st.drops, "kvkeep_disk_queue_drops_total", C, "Interval checkpoints dropped: the writer queue was full."),
	DROW(st.queue_len, "kvkeep_disk_queue_length", G, "Interval checkpoints waiting for the writer."),
	DROW(st.scan_seconds, "kvkeep_disk_scan_seconds", G, "Duration of the startup scan."),
	DROW(st.scan_done, "kvkeep_disk_scan_done", G, "1 once the startup scan has finished."),
	DROW(st.writable, "kvkeep_disk_writable", G, "0 when writes are off (read-only cache folder)."),
	DROW(st.write_bps, "kvkeep_disk_write_bytes_per_second", G, "Recently observed write rate."),
	DROW(st.flush_entries_saved, "kvkeep_disk_flush_entries_saved_total", C, "Entries the shutdown flush wrote."),
	DROW(st.flush_entries_skipped, "kvkeep_disk_flush_entries_skipped_total", C,
	     "Entries the shutdown flush skipped (budget)."),
	DROW(st.flush_bytes, "kvkeep_disk_flush_bytes_total", C, "Bytes the shutdown flush wrote."),
	DROW(dirty, "kvkeep_disk_dirty_objects", G, "Cache objects not yet written to disk."),
};
#undef DROW
#undef C
#undef G

_Static_assert(N_ROWS(cache_rows) <= (int)(sizeof((struct ksv_server *)0)->fc / sizeof(struct ksv_family *)),
	       "server_int.h: fc[] too small");
_Static_assert(N_ROWS(engine_rows) <= (int)(sizeof((struct ksv_server *)0)->fe / sizeof(struct ksv_family *)),
	       "server_int.h: fe[] too small");
_Static_assert(N_ROWS(disk_rows) <= (int)(sizeof((struct ksv_server *)0)->fd / sizeof(struct ksv_family *)),
	       "server_int.h: fd[] too small");

static void scrape_disk(struct ksv_server *s)
{
	struct disk_view v;
	if (!s->store)
		return;
	ks_store_stats(s->store, &v.st);
	v.dirty = (double)kc_cache_dirty_count(s->cache);
	stat_scrape(disk_rows, N_ROWS(disk_rows), s->fd, &v);
}

static int setup_disk_metrics(struct ksv_server *s)
{
	int rc = stat_register(s->m, disk_rows, N_ROWS(disk_rows), s->fd);
	if (rc)
		return rc;
	scrape_disk(s); /* every series exists from the first scrape */
	return KV_OK;
}

/* The remote tier's counters (store/remote.h struct ks_remote_stats). */
static void remote_dropped(struct ksv_family *f, const void *view)
{
	const struct ks_remote_stats *st = view;
	for (int w = 0; w < KS_RDROP__COUNT; w++)
		ksv_series_set(ksv_series_get(f, "why", ks_rdrop_name(w), NULL), (double)st->dropped[w]);
}

static void remote_refused(struct ksv_family *f, const void *view)
{
	const struct ks_remote_stats *st = view;
	for (int b = 1; b < KS_BAD__COUNT; b++)
		ksv_series_set(ksv_series_get(f, "reason", ks_bad_name(b), NULL), (double)st->bad[b]);
}

#define C KSV_COUNTER
#define G KSV_GAUGE
#define RROW(f, name, type, div, json, help) ROW(struct ks_remote_stats, f, name, type, div, json, help)
static const struct stat_row remote_rows[] = {
	RROW(up, "kvkeep_remote_up", G, 1, "up", "1 while the remote tier (Redis Cluster) is up: lookups and writes go to it."),
	RROW(lookups, "kvkeep_remote_lookups_total", C, 1, "lookups", "Lookups that asked the remote tier (RAM and disk lacked part of the prompt)."),
	RROW(hits, "kvkeep_remote_hits_total", C, 1, "hits", "Of those, lookups that loaded a resume point from it."),
	RROW(misses, "kvkeep_remote_misses_total", C, 1, "misses", "Lookups the remote tier could not extend."),
	RROW(skipped, "kvkeep_remote_skipped_total", C, 1, "skipped", "Lookups that skipped the remote tier: it was down."),
	RROW(hit_tokens, "kvkeep_remote_hit_tokens_total", C, 1, "hit_tokens", "Prompt tokens made available by remote hits."),
	RROW(read_bytes, "kvkeep_remote_read_bytes_total", C, 1, "read_bytes", "Bytes of valid objects read from Redis."),
	RROW(read_objects, "kvkeep_remote_read_objects_total", C, 1, "read_objects", "Valid objects read from Redis."),
	RROW(fetch_seconds, "kvkeep_remote_lookup_seconds_total", C, 1, "lookup_seconds", "Time spent in remote lookups (divide by lookups: the mean)."),
	RROW(fetch_p50_ms, "kvkeep_remote_lookup_p50_seconds", G, 1000, "lookup_p50_ms", "Median remote lookup time over the last 1024 lookups."),
	RROW(fetch_p99_ms, "kvkeep_remote_lookup_p99_seconds", G, 1000, "lookup_p99_ms", "99th percentile remote lookup time over the last 1024 lookups."),
	RROW(written_objects, "kvkeep_remote_written_objects_total", C, 1, "written_objects", "Objects written to Redis."),
	RROW(written_bytes, "kvkeep_remote_written_bytes_total", C, 1, "written_bytes", "Bytes written to Redis."),
	RROW(present_objects, "kvkeep_remote_present_objects_total", C, 1, "present_objects", "Objects not sent: Redis had them (content-addressed)."),
	RROW(incomplete, "kvkeep_remote_incomplete_entries_total", C, 1, "incomplete_entries", "Entry manifests not written: a part was missing in Redis."),
	LROW(remote_dropped, "kvkeep_remote_dropped_objects_total", C, "Objects the write-behind did not send, by why (down, queue, shutdown, error)."),
	RROW(queue_len, "kvkeep_remote_queue_length", G, 1, "queue_length", "Cache views waiting for the remote writers."),
	RROW(queue_bytes, "kvkeep_remote_queue_bytes", G, 1, "queue_bytes", "Bytes of those views."),
	LROW(remote_refused, "kvkeep_remote_refused_values_total", C, "Values that failed validation (a miss for that part), by reason."),
	RROW(deleted, "kvkeep_remote_deleted_values_total", C, 1, "deleted_values", "Refused values deleted from Redis."),
	RROW(downs, "kvkeep_remote_down_total", C, 1, "downs", "Times the tier went down (a call failed: timeout, lost node)."),
	RROW(ups, "kvkeep_remote_up_total", C, 1, "ups", "Times a probe found every slot's master answering."),
	RROW(calls, "kvkeep_remote_calls_total", C, 1, "calls", "Calls to the cluster (each a pipelined batch)."),
	RROW(call_seconds, "kvkeep_remote_call_seconds_total", C, 1, "call_seconds", "Time spent in those calls."),
	RROW(timeouts, "kvkeep_remote_timeouts_total", C, 1, "timeouts", "Operations that ran past --remote-cache-timeout-ms."),
	RROW(io_errors, "kvkeep_remote_io_errors_total", C, 1, "io_errors", "Operations no node could take (connection refused or lost)."),
	RROW(error_replies, "kvkeep_remote_error_replies_total", C, 1, "error_replies", "Operations Redis refused (OOM, NOAUTH, ...)."),
	RROW(moved, "kvkeep_remote_moved_total", C, 1, "moved", "MOVED redirects followed (the slot map changed)."),
	RROW(ask, "kvkeep_remote_ask_total", C, 1, "ask", "ASK redirects followed (a slot migrating)."),
	RROW(tryagain, "kvkeep_remote_retried_total", C, 1, "retried", "TRYAGAIN, CLUSTERDOWN, LOADING replies retried after a backoff."),
	RROW(refreshes, "kvkeep_remote_slot_refreshes_total", C, 1, "slot_refreshes", "Slot maps read (CLUSTER SLOTS)."),
	RROW(connects, "kvkeep_remote_connects_total", C, 1, "connects", "Connections opened to Redis nodes."),
	RROW(nodes, "kvkeep_remote_nodes", G, 1, "nodes", "Redis nodes known."),
	RROW(masters, "kvkeep_remote_masters", G, 1, "masters", "Nodes owning slots in the current slot map."),
	RROW(slots_covered, "kvkeep_remote_slots_covered", G, 1, "slots_covered", "Slots with an owner in the current slot map (16384 when healthy)."),
};
#undef RROW
#undef C
#undef G
_Static_assert(N_ROWS(remote_rows) <= (int)(sizeof((struct ksv_server *)0)->fr / sizeof(struct ksv_family *)),
	       "server_int.h: fr[] too small");

static void scrape_remote(struct ksv_server *s)
{
	struct ks_remote_stats st;
	if (!s->remote)
		return;
	ks_remote_stats(s->remote, &st);
	stat_scrape(remote_rows, N_ROWS(remote_rows), s->fr, &st);
}

static json_t *remote_json(struct ksv_server *s)
{
	struct ks_remote_stats st;
	char last[256];
	ks_remote_stats(s->remote, &st);
	ks_remote_last_error(s->remote, last, sizeof last);
	json_t *d = stat_json(remote_rows, N_ROWS(remote_rows), &st), *dr = json_object(), *bad = json_object();
	json_object_set_new(d, "url", json_string(ks_remote_url_safe(s->remote)));
	json_object_set_new(d, "prefix", json_string(ks_remote_prefix(s->remote)));
	json_object_set_new(d, "timeout_ms", json_integer(ks_remote_timeout_ms(s->remote)));
	json_object_set_new(d, "to_disk", json_boolean(ks_remote_to_disk(s->remote)));
	json_object_set_new(d, "queue_cap_bytes", json_integer((json_int_t)ks_remote_queue_cap(s->remote)));
	json_object_set_new(d, "standalone", json_boolean(st.standalone));
	json_object_set_new(d, "last_error", json_string(last));
	for (int w = 0; w < KS_RDROP__COUNT; w++)
		json_object_set_new(dr, ks_rdrop_name(w), json_integer((json_int_t)st.dropped[w]));
	for (int b = 1; b < KS_BAD__COUNT; b++)
		json_object_set_new(bad, ks_bad_name(b), json_integer((json_int_t)st.bad[b]));
	json_object_set_new(d, "dropped_objects", dr);
	json_object_set_new(d, "refused_values", bad);
	return d;
}

static void scrape(void *ctx, struct ksv_metrics *m)
{
	struct ksv_server *s = ctx;
	struct kc_stats st;
	(void)m;
	kss_registry_stats(s->reg, &st); /* every namespace */
	stat_scrape(cache_rows, N_ROWS(cache_rows), s->fc, &st);
	for (int i = 0; i < KV_MEM__COUNT; i++) {
		ksv_series_set(ksv_series_get(s->f_mem, "category", kv_mem_cat_name(i), NULL), (double)kv_mem_used(i));
		ksv_series_set(ksv_series_get(s->f_mem_peak, "category", kv_mem_cat_name(i), NULL), (double)kv_mem_peak(i));
	}
	ksv_metrics_set(s->f_pages, (double)kv_pages_in_use(ke_model_pages(s->model)));
	ksv_metrics_set(s->f_running, ksv_queue_running(s->queue));
	ksv_metrics_set(s->f_waiting, ksv_queue_queued(s->queue));
	struct engine_view ev = {.max_running = s->max_running};
	kss_sched_stats(s->engine, &ev.es);
	kss_service_spec_totals(s->svc, &ev.sp);
	stat_scrape(engine_rows, N_ROWS(engine_rows), s->fe, &ev);
	struct ksv_httpd *http = __atomic_load_n(&s->http, __ATOMIC_ACQUIRE);
	ksv_metrics_set(s->f_conns, http ? ksv_httpd_connections(http) : 0);
	ksv_metrics_set(s->f_corrupt, (double)kv_corrupt_count());
	scrape_disk(s);
	scrape_remote(s);
}

static int setup_metrics(struct ksv_server *s)
{
	static const double ttft_b[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120};
	static const double itl_b[] = {0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1};
	static const double e2e_b[] = {0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300};
	struct ksv_metrics *m = s->m = ksv_metrics_create();
	if (!m)
		return kv_fail(KV_ERR_NOMEM, "out of memory");
#define F(var, name, help, type) s->var = ksv_metrics_family(m, name, help, type, NULL, 0)
#define H(var, name, help, b) s->var = ksv_metrics_family(m, name, help, KSV_HISTOGRAM, b, (int)(sizeof b / sizeof b[0]))
	F(f_info, "kvkeep_info", "Build and model of this server (value 1).", KSV_GAUGE);
	F(f_requests, "kvkeep_requests_total", "HTTP requests by route and status.", KSV_COUNTER);
	F(f_prompt_tok, "kvkeep_prompt_tokens_total", "Prompt tokens of generation requests.", KSV_COUNTER);
	F(f_cached_tok, "kvkeep_cached_tokens_total", "Prompt tokens resumed from the prefix cache.", KSV_COUNTER);
	F(f_gen_tok, "kvkeep_generation_tokens_total", "Tokens generated.", KSV_COUNTER);
	F(f_resume, "kvkeep_resume_total", "Generation requests by resume kind (miss, hit, snap, anchor).", KSV_COUNTER);
	H(f_ttft, "kvkeep_time_to_first_token_seconds", "Time from request arrival to the first generated token.", ttft_b);
	H(f_itl, "kvkeep_inter_token_latency_seconds", "Time between consecutive generated tokens.", itl_b);
	H(f_e2e, "kvkeep_request_duration_seconds", "Time from arrival to the end of a generation request.", e2e_b);
	H(f_queue_wait, "kvkeep_queue_wait_seconds", "Time a generation request waited for the engine.", e2e_b);
	F(f_running, "kvkeep_requests_running", "Generation requests on the engine now.", KSV_GAUGE);
	if (stat_register(m, engine_rows, N_ROWS(engine_rows), s->fe))
		return KV_ERR_NOMEM;
	F(f_waiting, "kvkeep_requests_waiting", "Generation requests queued for the engine.", KSV_GAUGE);
	F(f_cancelled, "kvkeep_requests_cancelled_total", "Generations stopped because the client went away.", KSV_COUNTER);
	F(f_rej_503, "kvkeep_admission_rejections_total", "Requests answered 503: the cache could free nothing.", KSV_COUNTER);
	F(f_rej_429, "kvkeep_queue_rejections_total", "Requests answered 429: the queue was full.", KSV_COUNTER);
	F(f_timeouts, "kvkeep_http_header_timeouts_total", "Connections closed for a late request head or a stalled reader.", KSV_COUNTER);
	F(f_conns, "kvkeep_http_connections", "Open HTTP connections.", KSV_GAUGE);
	F(f_mem, "kvkeep_memory_bytes", "Bytes in use by category (accounting allocator).", KSV_GAUGE);
	F(f_mem_peak, "kvkeep_memory_peak_bytes", "Highest bytes in use by category.", KSV_GAUGE);
	F(f_pages, "kvkeep_kv_pages_in_use", "KV pages referenced by sequences or the cache.", KSV_GAUGE);
	F(f_corrupt, "kvkeep_corrupt_reports_total", "Corruption reports (bad bytes found in files).", KSV_COUNTER);
	if (stat_register(m, cache_rows, N_ROWS(cache_rows), s->fc))
		return KV_ERR_NOMEM;
#undef F
#undef H
	ksv_series_set(ksv_series_get(s->f_info, "version", KVKEEP_VERSION, "model", s->model_name, "index",
				      index_name(s), NULL), 1);
	/* series that should exist from the first scrape */
	ksv_metrics_add(s->f_prompt_tok, 0);
	ksv_metrics_add(s->f_cached_tok, 0);
	ksv_metrics_add(s->f_gen_tok, 0);
	ksv_metrics_add(s->f_cancelled, 0);
	ksv_metrics_add(s->f_rej_503, 0);
	ksv_metrics_add(s->f_rej_429, 0);
	ksv_metrics_add(s->f_timeouts, 0);
	ksv_metrics_on_scrape(m, scrape, s);
	return KV_OK;
}

/*
 * The sampling defaults (request > flag > generation_config.json > OpenAI)
 * and the stop ids. generation_config.json is read from the model folder
 * (or the --generation-config folder) even with "none": its eos ids
 * describe the model and keep ending generations; "none" drops only its
 * sampling values. A file that cannot be used is one warning, not an
 * error.
 */
static void setup_sampling(struct ksv_server *s)
{
	const struct ksv_opts *o = &s->o;
	struct kv_gencfg file, flags;
	int none = !strcmp(o->generation_config, "none") || !strcmp(o->generation_config, "vllm");
	int autom = !strcmp(o->generation_config, "auto");
	const char *dir = autom || none ? o->model_dir : o->generation_config;
	s->gc_mode = autom ? "auto" : none ? "none" : o->generation_config;
	int rc = kv_gencfg_load(dir, &file);
	if (rc && (rc != KV_ERR_NOT_FOUND || (!autom && !none))) {
		KV_WARN("serve.generation_config", "dir=%s err=\"%s\" msg=\"generation_config.json ignored\"", dir,
			kv_errmsg());
		kv_gencfg_init(&file);
	}
	kv_gencfg_openai(&s->sdef);
	struct kv_gencfg vals = file;
	if (none)
		for (int i = 0; i < KV_GC_N; i++)
			vals.src[i] = NULL;
	kv_gencfg_overlay(&s->sdef, &vals);
	kv_gencfg_init(&flags);
	for (int i = 0; i < KV_GC_N; i++)
		if (!isnan(o->default_sp[i]))
			kv_gencfg_set(&flags, i, o->default_sp[i], "flag"); /* checked by ksv_opts_check */
	kv_gencfg_overlay(&s->sdef, &flags);
	s->n_eos = kv_gencfg_stop_ids(s->cfg, &file, s->tok, s->chat, s->eos, 16);

	char ids[200];
	size_t at = 0;
	ids[0] = 0;
	for (int i = 0; i < s->n_eos && at < sizeof ids - 16; i++)
		at += (size_t)snprintf(ids + at, sizeof ids - at, "%s%d", i ? "," : "", s->eos[i]);
	const struct kv_gencfg *d = &s->sdef;
	KV_INFO("serve.sampling",
		"generation_config=%s temperature=%g(%s) top_p=%g(%s) top_k=%g(%s) min_p=%g(%s) presence_penalty=%g(%s) "
		"frequency_penalty=%g(%s) repetition_penalty=%g(%s) stop_token_ids=%s",
		s->gc_mode, d->v[KV_GC_TEMPERATURE], d->src[KV_GC_TEMPERATURE], d->v[KV_GC_TOP_P], d->src[KV_GC_TOP_P],
		d->v[KV_GC_TOP_K], d->src[KV_GC_TOP_K], d->v[KV_GC_MIN_P], d->src[KV_GC_MIN_P],
		d->v[KV_GC_PRESENCE_PENALTY], d->src[KV_GC_PRESENCE_PENALTY], d->v[KV_GC_FREQUENCY_PENALTY],
		d->src[KV_GC_FREQUENCY_PENALTY], d->v[KV_GC_REPETITION_PENALTY], d->src[KV_GC_REPETITION_PENALTY], ids);
}

static uint64_t cache_mem_used(void *ctx)
{
	(void)ctx;
	return kv_mem_total();
}

/*
 * The disk tier (docs/persistence.md), unless the prefix cache is off. A folder
 * that cannot be resolved or opened leaves the server without one (one
 * log line); a folder that cannot be written gives a read-only one.
 */
/* Open the disk tier of namespace ns over `cache` (*out NULL when there is
 * none: prefix cache off, no usable folder). */
static void open_store(struct ksv_server *s, struct kv_h128 ns, struct kc_cache *cache, int salted, struct ks_store **out)
{
	const struct ksv_opts *o = &s->o;
	char root[4096];
	*out = NULL;
	if (!o->prefix_cache)
		return;
	const char *flag = o->cache_dir && *o->cache_dir ? o->cache_dir : o->env_cache_dir;
	if (ks_dir_root_from(flag, NULL, kv_env(KV_ENV_XDG_CACHE_HOME), kv_env(KV_ENV_HOME), root, sizeof root)) {
		KV_WARN("store.disabled", "err=\"%s\" msg=\"no disk tier: serving from RAM only\"", kv_errmsg());
		return;
	}
	struct ks_params sp = {.root = root,
			       .ns = ns,
			       .label = s->model_name,
			       .salted = salted,
			       .layout = s->lay,
			       .cache = cache,
			       .pages = ke_model_pages(s->model),
			       .stride = s->policy.stride,
			       .max_bytes = o->disk_cache_max_mb > 0 ? (uint64_t)o->disk_cache_max_mb * MiB : 0,
			       .max_files = o->disk_cache_max_files > 0 ? (uint64_t)o->disk_cache_max_files : 0,
			       .env_ckpt_max = o->env_kv_checkpoint_max_bytes,
			       .ckpt_interval = (uint32_t)o->kv_disk_checkpoint_interval,
			       .vocab = s->vocab,
			       .remote = s->remote};
	if (ks_store_open(&sp, out)) {
		KV_WARN("store.disabled", "root=%s err=\"%s\" msg=\"no disk tier: serving from RAM only\"", root,
			kv_errmsg());
		*out = NULL;
	}
}

/* The registry's open_store: a salted namespace's disk tier. */
static void open_salted_store(void *ctx, struct kv_h128 ns, struct kc_cache *cache, struct ks_store **out)
{
	open_store(ctx, ns, cache, 1, out);
}

/*
 * The remote tier (--remote-cache, docs/cluster.md), shared by every
 * namespace's store. The password: --remote-cache-password-file (its
 * first line), else KVKEEP_REMOTE_CACHE_PASSWORD, else the URL's (which
 * `ps` shows: a warning). A cluster that does not answer is no error
 * (the tier starts down); a bad URL, prefix or password file is.
 */
static int open_remote(struct ksv_server *s)
{
	const struct ksv_opts *o = &s->o;
	char *file = NULL;
	size_t len = 0;
	const char *pw = NULL;
	int rc;
	if (!o->prefix_cache) {
		KV_WARN("remote.disabled", "msg=\"--remote-cache is ignored with --disable-prefix-cache\"");
		return KV_OK;
	}
	if (o->remote_cache_password_file) {
		if ((rc = kv_io_read_file(o->remote_cache_password_file, 4096, &file, &len)))
			return kv_fail_ctx(rc, "--remote-cache-password-file");
		while (len && (file[len - 1] == '\n' || file[len - 1] == '\r'))
			file[--len] = 0;
		char *nl = memchr(file, '\n', len);
		if (nl)
			*nl = 0;
		if (!file[0]) {
			free(file);
			return kv_fail(KV_ERR_INVALID, "--remote-cache-password-file %s is empty", o->remote_cache_password_file);
		}
		pw = file;
	} else if (o->env_remote_cache_password && *o->env_remote_cache_password) {
		pw = o->env_remote_cache_password;
	} else {
		struct kv_redis_url u;
		if (kv_redis_url_parse(o->remote_cache, &u) == KV_OK && u.pass[0])
			KV_WARN("remote.password", "msg=\"the Redis password is in --remote-cache, which ps shows: use "
						   "--remote-cache-password-file or KVKEEP_REMOTE_CACHE_PASSWORD\"");
		memset(&u, 0, sizeof u);
	}
	struct ks_remote_params rp = {.url = o->remote_cache,
				      .user = o->remote_cache_user,
				      .password = pw,
				      .prefix = o->remote_cache_prefix,
				      .timeout_ms = (int)o->remote_cache_timeout_ms,
				      .to_disk = !strcmp(o->remote_cache_to_disk, "on"),
				      .queue_bytes = (uint64_t)o->remote_cache_queue_mb * MiB,
				      .layout = s->lay};
	rc = ks_remote_create(&rp, &s->remote);
	if (file) {
		memset(file, 0, len);
		free(file);
	}
	return rc ? kv_fail_ctx(rc, "--remote-cache") : KV_OK;
}

/* The memory cap before anything loads: --memory-cap-mb, else the cgroup
 * limit (what kc_opts_resolve will choose); 0: none. */
static uint64_t early_cap(const struct ksv_opts *o, const char **src)
{
	if (o->memory_cap_mb > 0) {
		*src = "--memory-cap-mb";
		return (uint64_t)o->memory_cap_mb * MiB;
	}
	struct kc_machine m;
	kc_machine_read(&m);
	*src = "the cgroup memory limit (--memory-cap-mb sets another)";
	return m.cgroup_limit;
}

/* A cap no request could ever fit under is refused at start, with the
 * numbers: before loading, from the weight files; after, from what the
 * loaded model and one small request take. */
static int refuse_cap(uint64_t cap, const char *src, uint64_t have, uint64_t need, const char *what)
{
	return kv_fail(KV_ERR_INVALID,
		       "the memory cap (%s: %llu MiB) is below %s (%llu MiB): every request would get 503. Raise "
		       "--memory-cap-mb to at least %llu, or leave it out",
		       src, (unsigned long long)(cap / MiB), what, (unsigned long long)(have / MiB),
		       (unsigned long long)((need + MiB - 1) / MiB));
}

/*
 * The context length (docs/operations.md "Context length"): --max-model-len
 * (-c) when given; else the config's max_position_embeddings (32768 when
 * it has none), lowered to what one sequence's KV can take in half the
 * memory the weights leave (the memory cap, else the machine's RAM),
 * in steps of 1024 tokens and never below 4096. Logged with its source.
 */
static void pick_context(struct ksv_server *s)
{
	const struct ksv_opts *o = &s->o;
	int cfg = s->cfg->max_positions > 0 ? s->cfg->max_positions : 32768;
	uint64_t ram = (uint64_t)sysconf(_SC_PHYS_PAGES) * (uint64_t)sysconf(_SC_PAGESIZE);
	uint64_t limit = s->mem_cap ? s->mem_cap : ram, weights = kv_mem_used(KV_MEM_WEIGHTS);
	uint64_t kvb = s->lay->kv_bytes_per_token ? s->lay->kv_bytes_per_token : 1;
	uint64_t bound = limit > weights ? (limit - weights) / 2 / kvb : 0;
	bound = bound / 1024 * 1024;
	if (bound < 4096)
		bound = 4096;
	const char *src;
	if (o->max_model_len > 0) {
		s->ctx_len = (int)o->max_model_len;
		src = "flag";
	} else if (bound < (uint64_t)cfg) {
		s->ctx_len = (int)bound;
		src = "memory";
	} else {
		s->ctx_len = cfg;
		src = s->cfg->max_positions > 0 ? "config" : "default";
	}
	KV_INFO("serve.context",
		"ctx=%d source=%s config_max=%d memory_bound=%llu kv_bytes_per_token=%llu msg=\"context length %d tokens "
		"(%s); --max-model-len or -c sets it\"",
		s->ctx_len, src, s->cfg->max_positions, (unsigned long long)bound, (unsigned long long)kvb, s->ctx_len,
		!strcmp(src, "memory") ? "the config's is more than half the free memory holds" : src);
}

/*
 * Listen first: a busy port fails here, before the model loads, and
 * clients get 503 "loading" (not "connection refused") while it does.
 */
int ksv_server_create(const struct ksv_opts *o, struct ksv_server **out)
{
	struct ksv_server *s;
	int rc;

	*out = NULL;
	if ((rc = ksv_opts_check(o)))
		return rc;
	s = calloc(1, sizeof *s);
	if (!s)
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	s->o = *o;
	s->stop_pipe[0] = s->stop_pipe[1] = -1;
	s->created = kv_wall_s();
	if ((rc = set_names(s, o)))
		goto fail;
	if (o->threads > 0 && (rc = kv_pool_global_threads((int)o->threads)))
		goto fail;
	{
		/* what the model path holds, and whether the memory cap can
		 * take its weights: seconds, before anything is bound or loaded */
		struct kv_model_probe pb;
		const char *cap_src;
		if ((rc = kv_model_probe(o->model_dir, &pb)))
			goto fail;
		uint64_t cap = early_cap(o, &cap_src);
		if (cap && pb.weight_bytes >= cap) {
			rc = refuse_cap(cap, cap_src, pb.weight_bytes, pb.weight_bytes + 64 * MiB, "the model's weights");
			goto fail;
		}
	}
	if (pipe2(s->stop_pipe, O_CLOEXEC | O_NONBLOCK)) {
		rc = kv_fail(KV_ERR_IO, "pipe: %s", strerror(errno));
		goto fail;
	}
	struct ksv_httpd_params hp = {.host = o->host,
				      .port = (int)o->port,
				      .max_body = (size_t)o->max_body_mb * MiB,
				      .max_connections = (int)o->max_connections,
				      .header_timeout_ms = (int)o->header_timeout_ms,
				      .stall_timeout_s = (int)o->stall_timeout_s,
				      .handler = handler,
				      .ctx = s,
				      .on_done = on_done,
				      .on_timeout = on_timeout,
				      .route_of = route_of};
	struct ksv_httpd *http = NULL;
	if ((rc = ksv_httpd_start(&hp, &http)))
		goto fail;
	/* requests may already be arriving: publish the handle atomically */
	__atomic_store_n(&s->http, http, __ATOMIC_RELEASE);
	KV_INFO("serve.listening", "host=%s port=%d model=%s msg=\"loading the model: /health answers 503 until it is "
		"loaded\"", o->host, ksv_httpd_port(http), o->model_dir);
	*out = s;
	return KV_OK;
fail:
	rc = rc ? rc : KV_ERR_INVALID;
	{
		char msg[1024];
		snprintf(msg, sizeof msg, "%s", kv_errmsg());
		ksv_server_destroy(s);
		return kv_fail(rc, "%s", msg);
	}
}

int ksv_server_ready(const struct ksv_server *s)
{
	return atomic_load_explicit(&((struct ksv_server *)s)->ready, memory_order_acquire);
}

int ksv_server_port(const struct ksv_server *s)
{
	return ksv_httpd_port(s->http);
}

/* The tokenizer, the chat template and the weights, each error naming
 * its cause (ksv_server_create has checked the path with model/probe.h,
 * so the tokenizer is not blamed for a missing or damaged model file). */
static int load_model(struct ksv_server *s)
{
	const struct ksv_opts *o = &s->o;
	int rc;
	KV_INFO("serve.threads", "threads=%d source=%s cores=%d isa=%s", kv_pool_size(kv_pool_global()),
		o->threads > 0 ? "--threads" : kv_env(KV_ENV_THREADS) && atoi(kv_env(KV_ENV_THREADS)) > 0 ? "KVKEEP_THREADS"
													    : "cores",
		kv_ncores(), ke_isa_name(ke_isa()));
	if ((rc = kv_tok_load_model(o->model_dir, &s->tok)))
		return kv_fail_ctx(rc, "tokenizer");
	if ((rc = kv_chat_load(o->model_dir, s->tok, &s->chat)))
		return kv_fail_ctx(rc, "chat template");
	s->xml_tools = kv_chat_xml_tools(s->chat);
	s->harmony = kv_chat_harmony(s->chat);
	if ((rc = ksv_norm_parse(o->prompt_normalize, &s->norm_rules)) || (rc = ksv_recent_create(&s->recent)) ||
	    (rc = ksv_inflight_create(&s->inflight)))
		return rc;
	struct ke_model_params mp = {.kv = ke_kv_parse(o->kv_dtype),
				     .page_tokens = (int)o->page_tokens,
				     .quant_act = ke_quant_act_parse(o->quant_act)};
	if ((rc = ke_model_load(o->model_dir, &mp, &s->model)))
		return rc;
	s->cfg = ke_model_config(s->model);
	s->lay = ke_model_layout(s->model);
	s->hybrid = ke_layout_nontrim(s->lay);
	s->vocab = s->cfg->vocab;
	if (kv_tok_vocab_size(s->tok) > s->vocab)
		KV_WARN("serve.vocab", "tokenizer_ids=%d model_vocab=%d msg=\"tokenizer has ids the model cannot embed\"",
			kv_tok_vocab_size(s->tok), s->vocab);
	setup_sampling(s);
	return kv_tok_bytes_build(s->tok, s->vocab, &s->tb);
}

int ksv_server_load(struct ksv_server *s)
{
	const struct ksv_opts *o = &s->o;
	uint64_t t0 = kv_now_ns();
	int rc;
	if ((rc = load_model(s)))
		return rc;

	/* the cache's own resolution of the flags and environment (budget,
	 * policy, memory cap), the same for every command */
	struct kc_opts co;
	kc_opts_default(&co);
	co.enable = o->prefix_cache;
	co.index = o->prefix_cache_index;
	co.prefix_cache_size = o->prefix_cache_size;
	co.cache_memory_mb = o->cache_memory_mb;
	co.cache_memory_percent = o->cache_memory_percent;
	co.hybrid_cache_entries = o->hybrid_cache_entries;
	co.memory_cap_mb = o->memory_cap_mb;
	struct kc_machine mach;
	kc_machine_read(&mach);
	mach.env_max_bytes = o->env_prefix_cache_max_bytes;
	mach.env_stride = o->env_checkpoint_stride;
	mach.env_ckpt_max = o->env_checkpoint_max;
	/* the namespace of both tiers: the model fingerprint and the cache
	 * salt (store/ns.h); the RAM cache's chain hashes start from it, so the
	 * disk tier's file names agree with them */
	{
		/* weight content hashes are remembered beside the disk cache; with
		 * no disk tier the namespace lives only as long as this process,
		 * so the weights need not be read at all */
		char root[4096], memo[4200];
		const char *flag = o->cache_dir && *o->cache_dir ? o->cache_dir : o->env_cache_dir;
		int disk = o->prefix_cache &&
			   !ks_dir_root_from(flag, NULL, kv_env(KV_ENV_XDG_CACHE_HOME), kv_env(KV_ENV_HOME), root, sizeof root);
		if (disk)
			snprintf(memo, sizeof memo, "%s/%s", root, KSV_FP_MEMO_DIR);
		struct ksv_fp_params fp = {.model_dir = o->model_dir,
					   .kv_dtype = o->kv_dtype,
					   .quant_act = ke_model_qdot(s->model) ? KE_QDOT_VERSION : NULL,
					   .page_tokens = (int)o->page_tokens,
					   .memo_dir = disk ? memo : NULL,
					   .skip_weights = !disk};
		s->fingerprint = ksv_model_fingerprint(&fp, NULL);
	}
	s->ns = ks_ns_derive(s->fingerprint, o->cache_salt);
	struct kc_params cp;
	if ((rc = kc_opts_resolve(&co, &mach, s->lay, kv_mem_used(KV_MEM_WEIGHTS), s->ns, &s->policy, &cp, &s->budget)))
		return rc;
	cp.mem_used = cache_mem_used;
	cp.policy = &s->policy;
	/* the server's own answers, per namespace (session/echo.h) */
	cp.echo_bytes = !strcmp(o->echo_generated, "on") ? (uint64_t)o->echo_generated_mb * MiB : 0;
	s->mem_cap = cp.mem_cap;
	pick_context(s);
	s->cache_params = cp;
	if ((rc = kc_cache_create(&cp, &s->cache)))
		return rc;
	s->budget_total = kc_cache_budget(s->cache);
	if (o->remote_cache && (rc = open_remote(s)))
		return rc;
	open_store(s, s->ns, s->cache, o->cache_salt && *o->cache_salt, &s->store);
	struct kss_registry_params rp = {.cache = s->cache,
					 .store = s->store,
					 .ns = s->ns,
					 .cache_params = cp,
					 .budget_total = s->budget_total,
					 .open_store = open_salted_store,
					 .ctx = s};
	if ((rc = kss_registry_create(&rp, &s->reg)))
		return rc;
	/* the engine's scheduler (session/sched.h): max_running requests
	 * generate together, every forward batched into one engine step */
	s->max_running = (int)o->max_running;
	if (!s->max_running) {
		/* as many as 4, while each gets a share of the memory left for
		 * work (half of it; the other half for the cache to grow into)
		 * of its scratch plus 2048 tokens of KV */
		uint64_t per = kss_request_overhead(s->model, (int)o->prefill_chunk) + 2048ull * s->lay->kv_bytes_per_token;
		uint64_t used = kv_mem_total();
		s->max_running = 4;
		if (s->mem_cap) {
			uint64_t room = s->mem_cap > used ? (s->mem_cap - used) / 2 : 0;
			uint64_t fit = per ? room / per : 4;
			s->max_running = fit < 1 ? 1 : fit < 4 ? (int)fit : 4;
		}
	}
	/* speculative decoding (session/spec.h): its verifications of
	 * speculative_draft + 1 rows are engine items */
	s->spec_mode = kss_spec_mode_parse(o->speculative);
	if (s->spec_mode == KSS_SPEC_MTP && !ke_model_has_mtp(s->model))
		return kv_fail(KV_ERR_INVALID, "--speculative mtp: the model has no MTP head (mtp.* or nextn tensors)");
	struct kss_sched_params ep = {.model = s->model,
				      .max_running = s->max_running,
				      .max_batch_tokens = (int)o->max_batch_tokens,
				      .chunk = o->prefill_chunk < 8192 ? (int)o->prefill_chunk : 8192,
				      .spec_rows = s->spec_mode ? (int)o->speculative_draft + 1 : 0};
	if ((rc = kss_sched_create(&ep, &s->engine)))
		return rc;
	struct kss_service_params svp = {.model = s->model,
					 .tok = s->tok,
					 .tb = s->tb,
					 .reg = s->reg,
					 .cache = s->cache,
					 .engine = s->engine,
					 .eos = s->eos,
					 .n_eos = s->n_eos,
					 .mem_cap = s->mem_cap,
					 .prefill_chunk = (int)o->prefill_chunk,
					 .speculative = s->spec_mode,
					 .spec_max_draft = (int)o->speculative_draft};
	if ((rc = kss_service_create(&svp, &s->svc)))
		return rc;
	s->queue = ksv_queue_create(s->max_running, (int)o->max_queue);
	if (!s->queue)
		return kv_fail(KV_ERR_NOMEM, "out of memory");
	KV_INFO("serve.scheduler", "max_running=%d max_batch_tokens=%d chunk=%d speculative=%s mtp=%d verify_rows=%d",
		s->max_running, kss_sched_max_batch_tokens(s->engine), kss_sched_chunk(s->engine),
		kss_spec_mode_name(s->spec_mode), ke_model_has_mtp(s->model), kss_sched_spec_rows(s->engine));
	if ((rc = setup_metrics(s)) || (s->store && (rc = setup_disk_metrics(s))))
		return rc;
	if (s->remote) {
		if ((rc = stat_register(s->m, remote_rows, N_ROWS(remote_rows), s->fr)))
			return rc;
		scrape_remote(s); /* every series exists from the first scrape */
	}
	{
		/* the weights fit (checked before loading); one small request
		 * must fit too, else every request would be a 503 */
		uint64_t used = kv_mem_total();
		uint64_t need = used + kss_service_request_overhead(s->svc) + 256ull * s->lay->kv_bytes_per_token;
		if (s->mem_cap && s->mem_cap < need)
			return refuse_cap(s->mem_cap, o->memory_cap_mb > 0 ? "--memory-cap-mb" : "the cgroup memory limit", need,
					  need, "what the loaded model takes plus one small request");
	}
	char nsx[33];
	kv_h128_hex(s->ns, nsx);
	atomic_store_explicit(&s->ready, 1, memory_order_release);
	KV_INFO("serve.ready",
		"host=%s port=%d model=%s arch=%s hybrid=%d vocab=%d ctx=%d prefix_cache=%d index=%s budget_bytes=%llu "
		"budget=\"%s\" mem_cap=%llu namespace=%s load_ms=%.0f",
		o->host, ksv_httpd_port(s->http), s->model_name, kv_arch_name(s->cfg->arch), s->hybrid, s->vocab,
		s->ctx_len, o->prefix_cache, o->prefix_cache_index, (unsigned long long)s->budget.bytes, s->budget.note,
		(unsigned long long)s->mem_cap, nsx, (double)(kv_now_ns() - t0) / 1e6);
	/* /health answers: now the disk index is built, in the background */
	ks_store_start_scan(s->store);
	return KV_OK;
}

void ksv_server_request_stop(struct ksv_server *s)
{
	if (s && s->stop_pipe[1] >= 0) {
		char c = 1;
		ssize_t w = write(s->stop_pipe[1], &c, 1);
		(void)w;
	}
}

int ksv_server_run(struct ksv_server *s)
{
	for (;;) {
		struct pollfd pf = {.fd = s->stop_pipe[0], .events = POLLIN};
		int r = poll(&pf, 1, 1000);
		if (r > 0)
			break;
		if (r < 0 && errno != EINTR)
			break;
	}
	uint64_t t0 = kv_now_ns();
	KV_INFO("serve.stopping", "running=%d waiting=%d", ksv_queue_running(s->queue), ksv_queue_queued(s->queue));
	atomic_store(&s->stopping, 1);
	ksv_httpd_quiesce(s->http);
	/* queued requests are cancelled, running ones stop at the next step */
	ksv_queue_close(s->queue, 1);
	for (int i = 0; i < 200 && ksv_queue_running(s->queue) > 0; i++)
		kv_sleep_ms(10);
	/* the shutdown flush gets what is left of the SIGTERM budget */
	if (s->store) {
		double budget = ks_store_budget_parse(s->o.env_shutdown_budget);
		double left = budget - (double)(kv_now_ns() - t0) / 1e9;
		ks_store_flush(s->store, left > 0 ? left : 0, NULL);
	}
	/* then the salted tiers, with what is still left */
	{
		double budget = ks_store_budget_parse(s->o.env_shutdown_budget);
		double left = budget - (double)(kv_now_ns() - t0) / 1e9;
		if (left > 0)
			kss_registry_flush_salted(s->reg, left);
	}
	/* remote writes still in flight are cut, never waited for (the
	 * flushes dropped what was queued) */
	ks_remote_abort(s->remote);
	/* every request already in progress gets its answer (a queued one its
	 * 503 + Retry-After) before the daemon stops: stopping it closes
	 * connections whose handler has not answered yet, which the client
	 * sees as an empty reply */
	{
		double budget = ks_store_budget_parse(s->o.env_shutdown_budget);
		while (ksv_httpd_busy(s->http) > 0 && (double)(kv_now_ns() - t0) / 1e9 < budget)
			kv_sleep_ms(10);
	}
	KV_INFO("serve.stopped", "ms=%.0f", (double)(kv_now_ns() - t0) / 1e6);
	return KV_OK;
}

void ksv_server_destroy(struct ksv_server *s)
{
	if (!s)
		return;
	if (s->queue)
		ksv_queue_close(s->queue, 1);
	ksv_httpd_stop(s->http); /* joins connection threads: no handler runs after this */
	ksv_queue_destroy(s->queue);
	kss_service_destroy(s->svc);
	kss_sched_destroy(s->engine); /* after the workers: no forward is in flight */
	ks_remote_abort(s->remote); /* the stores' remote writers stop at once, not after a call */
	kss_registry_destroy(s->reg); /* the salted namespaces */
	ks_store_close(s->store); /* before the cache: its writer holds cache views */
	ks_remote_destroy(s->remote); /* after every store that used it */
	kc_cache_destroy(s->cache);
	ke_model_destroy(s->model);
	kv_chat_free(s->chat);
	kv_tok_free(s->tok);
	ksv_metrics_destroy(s->m);
	ksv_recent_destroy(s->recent);
	ksv_inflight_destroy(s->inflight);
	kv_tok_bytes_free(s->tb);
	free(s->names_buf);
	if (s->stop_pipe[0] >= 0)
		close(s->stop_pipe[0]);
	if (s->stop_pipe[1] >= 0)
		close(s->stop_pipe[1]);
	free(s);
}
