/*
 * intake.c - a generation request's way in (server_int.h struct
 * ksv_intake): the body in its wire format (wire.h parse), the model, the
 * cache_salt, --prompt-normalize, the prompt (prompt.c), a forced
 * tool-call opening and the token limits. Every refusal is answered here,
 * in the request's own error shape, naming the field. The two routes that
 * need no more than this, /v1/messages/count_tokens and /v1/cache/probe,
 * are answered here too.
 */
#include "server/server_int.h"
#include "base/err.h"
#include "base/json.h"
#include "base/log.h"
#include "server/anthropic.h"
#include "server/normalize.h"
#include "text/toolcall.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void ksv_intake_free(struct ksv_intake *in)
{
	ksv_req_free(&in->req);
	ksv_prompt_free(&in->pr);
	json_decref(in->norm_report);
	json_decref(in->raw);
	free(in->forced);
	free(in->salt_hdr);
	memset(in, 0, sizeof *in);
}

static void refuse(struct ksv_server *s, struct ksv_conn *c, int wire, int status, const char *param, const char *fmt,
		   ...) __attribute__((format(printf, 6, 7)));
static void refuse(struct ksv_server *s, struct ksv_conn *c, int wire, int status, const char *param, const char *fmt,
		   ...)
{
	char msg[600];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	ksv_reply_error_wire(s, c, wire == KSV_WIRE_ANTHROPIC ? KSV_WIRE_ANTHROPIC : KSV_WIRE_OPENAI, status, param, "%s",
			     msg);
}

/*
 * The request's salt, one rule on every route that reads a prompt (chat,
 * completions, messages, count_tokens, responses, probe): the body's
 * "cache_salt" or the X-Cache-Salt header (for clients that cannot add a
 * body field), both the same when both are sent. *out: NULL when neither
 * is (or the field is JSON null), else the salt (borrowed from the body or
 * the header). A salt names a namespace by its full bytes, so the two
 * byte strings a C string would confuse are refused rather than silently
 * sharing a namespace: one with NUL inside ("x\u0000a" would be "x"), and
 * the empty one (it would be the server's own namespace: omit the field
 * for that). Without --allow-request-salt a salt is refused rather than
 * silently sharing the server's namespace. Replies 400 and returns 1.
 */
static int request_salt(struct ksv_server *s, struct ksv_conn *c, int wire, struct ksv_intake *in, const json_t *body)
{
	const char **out = &in->salt;
	const json_t *salt = json_object_get(body, "cache_salt");
	const char *hdr = ksv_conn_req_header(c, "X-Cache-Salt");
	const char *why = NULL;
	*out = NULL;
	if (salt && json_is_null(salt))
		salt = NULL;
	if (!salt && !hdr)
		return 0;
	if (salt && !json_is_string(salt))
		why = "cache_salt must be a string";
	else if (!s->o.allow_request_salt)
		why = salt ? "cache_salt is not accepted: start the server with --allow-request-salt"
			   : "X-Cache-Salt is not accepted: start the server with --allow-request-salt";
	else if (salt && !json_string_length(salt))
		why = "cache_salt must not be empty (omit it to use the server's namespace)";
	else if (hdr && !*hdr)
		why = "X-Cache-Salt must not be empty (omit it to use the server's namespace)";
	else if (salt && memchr(json_string_value(salt), 0, json_string_length(salt)))
		why = "cache_salt must not contain NUL characters";
	else if (salt && hdr && strcmp(hdr, json_string_value(salt)))
		why = "cache_salt and the X-Cache-Salt header differ: send one, or the same value in both";
	if (why) {
		refuse(s, c, wire, 400, "cache_salt", "%s", why);
		return 1;
	}
	if (salt) {
		*out = json_string_value(salt);
		return 0;
	}
	/* the header dies with the connection; a worker may outlive it */
	in->salt_hdr = strdup(hdr);
	if (!in->salt_hdr) {
		refuse(s, c, wire, 500, NULL, "out of memory");
		return 1;
	}
	*out = in->salt_hdr;
	return 0;
}

/* --prompt-normalize on the messages and tools of a chat request. */
static void normalize(struct ksv_server *s, const char *route, struct ksv_intake *in)
{
	if (in->req.api != KSV_API_CHAT || !in->req.messages || !s->norm_rules)
		return;
	json_t *wrap = json_pack("{s:O}", "messages", in->req.messages);
	int n = wrap ? ksv_norm_apply(wrap, &in->req.tools, s->norm_rules, &in->norm_report) : 0;
	json_decref(wrap);
	for (size_t i = 0; n && i < json_array_size(in->norm_report); i++) {
		json_t *r = json_array_get(in->norm_report, i);
		KV_INFO("prompt.normalize", "route=%s rule=%s message=%lld removed_bytes=%zu moved_tools=%lld", route,
			json_string_value(json_object_get(r, "rule")),
			(long long)json_integer_value(json_object_get(r, "message")),
			json_string_length(json_object_get(r, "removed")), (long long)json_integer_value(json_object_get(r, "moved")));
	}
}

/* The body in its API, as a validated chat request (wire.h parse). */
static int parse_body(struct ksv_server *s, const struct ksv_request *rq, int wire, int api, int for_count,
		      struct ksv_intake *in)
{
	if (kv_json_parse("request body", rq->body, rq->body_len, JSON_MAX_DEPTH, &in->raw)) {
		refuse(s, rq->conn, wire, 400, "", "%s", kv_errmsg());
		return 1;
	}
	int rc = ksv_wire_of(wire)->parse(in->raw, api, for_count, &in->req);
	if (rc) {
		refuse(s, rq->conn, wire, 400, in->req.err_param, "%s", kv_errmsg());
		return 1;
	}
	return 0;
}

/* The request's model must be a served name (404 listing them). */
static int check_model(struct ksv_server *s, struct ksv_conn *c, int wire, const struct ksv_intake *in)
{
	if (!in->req.model || ksv_server_serves(s, in->req.model))
		return 0;
	char names[512];
	ksv_server_names_text(s, names, sizeof names);
	refuse(s, c, wire, 404, "model", "the model '%s' does not exist (this server serves %s)", in->req.model, names);
	return 1;
}

static int prompt(struct ksv_server *s, struct ksv_conn *c, int wire, struct ksv_intake *in)
{
	char param[32];
	int status = ksv_prompt_make(s, &in->req, in->salt, &in->pr, param, sizeof param);
	if (status) {
		refuse(s, c, wire, status, param, "%s", kv_errmsg());
		return 1;
	}
	return 0;
}

/*
 * tool_choice "required" or a named function: the answer is made to start
 * with the opening of a tool call in the template's own syntax, so the
 * model can only continue it (text/toolcall.h kv_tc_opener; a documented
 * feature, not a test hook). The forced tokens are prefilled after the
 * generation prompt and count as completion tokens.
 */
static int force_tool_call(struct ksv_server *s, struct ksv_conn *c, int wire, struct ksv_intake *in)
{
	struct ksv_req *r = &in->req;
	if (r->api != KSV_API_CHAT || !r->tools || (r->tool_choice != KSV_TC_REQUIRED && r->tool_choice != KSV_TC_NAMED))
		return 0;
	int fmt = s->harmony ? KV_TC_HARMONY : s->xml_tools ? KV_TC_XML : KV_TC_JSON;
	if (kv_tc_opener(fmt, r->tool_choice == KSV_TC_NAMED ? r->tool_name : NULL,
			 &in->forced)) {
		refuse(s, c, wire, 400, "tool_choice", "%s", kv_errmsg());
		return 1;
	}
	if (ksv_prompt_append(s, &in->pr, in->forced, &in->n_forced)) {
		refuse(s, c, wire, 500, NULL, "cannot encode the forced tool call: %s", kv_errmsg());
		return 1;
	}
	if ((int64_t)in->pr.n_tokens >= s->ctx_len) {
		refuse(s, c, wire, 400, "messages", "the prompt is %u tokens; this model's context is %d tokens",
		       in->pr.n_tokens, s->ctx_len);
		return 1;
	}
	return 0;
}

/* max_tokens within the context, the forced tokens counted against it. */
static int limits(struct ksv_server *s, struct ksv_conn *c, int wire, struct ksv_intake *in)
{
	int64_t room = s->ctx_len - (int64_t)in->pr.n_tokens;
	int64_t mt = in->req.max_tokens > 0 ? in->req.max_tokens : s->o.default_max_tokens;
	if (in->n_forced && mt <= (int64_t)in->n_forced) {
		refuse(s, c, wire, 400, in->req.max_tokens > 0 ? "max_tokens" : "tool_choice",
		       "max_tokens %lld leaves no room: the forced tool-call opening alone takes %u tokens", (long long)mt,
		       in->n_forced);
		return 1;
	}
	mt -= in->n_forced;
	in->max_tokens = (int)(mt < room ? mt : room);
	return 0;
}

int ksv_intake_gen(struct ksv_server *s, const struct ksv_request *rq, int wire, int api, const char *route,
		   struct ksv_intake *in)
{
	struct ksv_conn *c = rq->conn;
	memset(in, 0, sizeof *in);
	in->trusted = ksv_server_trusted(s, c);
	if (parse_body(s, rq, wire, api, 0, in) || check_model(s, c, wire, in) ||
	    request_salt(s, c, wire, in, in->raw))
		return 1;
	normalize(s, route, in);
	return prompt(s, c, wire, in) || force_tool_call(s, c, wire, in) || limits(s, c, wire, in);
}

/* POST /v1/messages/count_tokens: the prompt's length as /v1/messages
 * would render it. */
void ksv_intake_count_tokens(struct ksv_server *s, const struct ksv_request *rq)
{
	struct ksv_intake in;
	int w = KSV_WIRE_ANTHROPIC;
	memset(&in, 0, sizeof in);
	if (!parse_body(s, rq, w, KSV_API_CHAT, 1, &in) && !check_model(s, rq->conn, w, &in) &&
	    !request_salt(s, rq->conn, w, &in, in.raw)) {
		normalize(s, "/v1/messages/count_tokens", &in);
		if (!prompt(s, rq->conn, w, &in)) {
			size_t len = 0;
			char *body = ksv_anth_count_body(in.pr.n_tokens, &len);
			if (body)
				ksv_conn_reply(rq->conn, 200, "application/json", body, len);
			else
				refuse(s, rq->conn, w, 500, NULL, "out of memory");
			free(body);
		}
	}
	ksv_intake_free(&in);
}

/* POST /v1/cache/probe: what each tier of the namespace holds of a chat
 * body's prompt, without running it. */
void ksv_intake_probe(struct ksv_server *s, const struct ksv_request *rq)
{
	struct ksv_conn *c = rq->conn;
	struct ksv_intake in;
	memset(&in, 0, sizeof in);
	if (ksv_req_parse_probe(rq->body, rq->body_len, JSON_MAX_DEPTH, &in.req)) {
		refuse(s, c, KSV_WIRE_OPENAI, 400, in.req.err_param, "%s", kv_errmsg());
		goto out;
	}
	if (request_salt(s, c, KSV_WIRE_OPENAI, &in, in.req.body) || prompt(s, c, KSV_WIRE_OPENAI, &in))
		goto out;
	struct kss_probe_result pr;
	kss_probe(s->svc, in.salt, in.pr.tokens, in.pr.n_tokens, in.pr.bounds, in.pr.n_bounds, &pr);
	uint32_t pos = pr.ram_pos, dpos = pr.disk_pos;
	int have_disk = pr.open ? pr.have_disk : s->store != NULL;
	json_t *j = json_object(), *ram = json_object(), *disk = json_object();
	json_object_set_new(j, "prompt_tokens", json_integer(in.pr.n_tokens));
	if (in.salt)
		json_object_set_new(j, "salt_tier_open", json_boolean(pr.open));
	json_object_set_new(ram, "cached_tokens", json_integer(pos));
	json_object_set_new(ram, "shared_tokens", json_integer(pr.ram_shared));
	json_object_set_new(j, "ram", ram);
	json_object_set_new(disk, "available", json_boolean(have_disk));
	json_object_set_new(disk, "cached_tokens", json_integer(dpos));
	json_object_set_new(j, "disk", disk);
	if (dpos > pos)
		pos = dpos;
	json_object_set_new(j, "cached_tokens", json_integer(pos));
	json_object_set_new(j, "cold_tokens", json_integer(in.pr.n_tokens - pos));
	json_t *bs = json_array();
	for (size_t i = 0; i < in.pr.n_bounds; i++)
		json_array_append_new(bs, json_integer(in.pr.bounds[i]));
	json_object_set_new(j, "boundaries", bs);
	if (pr.have_explain)
		json_object_set_new(j, "miss", ksv_explain_json(&pr.ex, ksv_server_trusted(s, c)));
	ksv_reply_json(c, 200, j);
out:
	ksv_intake_free(&in);
}
