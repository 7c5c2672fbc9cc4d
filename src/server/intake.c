/*
 * intake.c - a generation request's way in (server_int.h struct
 * ksv_intake): the body in its wire format (wire.h parse), the model, the
 * cache_salt, --prompt-normalize, the prompt (prompt.c), the constraint
 * of structured output (session/constrain.h) and the token limits. Every refusal is answered here,
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
#include "text/tcgram.h"

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
	free(in->salt_hdr);
	if (in->grammar)
		kv_grammar_unref(in->grammar);
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

/*
 * A prompt longer than the context, in each API's own terms: OpenAI's
 * code context_length_exceeded with the field that holds the prompt
 * (messages; input on /v1/responses; prompt on /v1/completions), and
 * Anthropic's "prompt is too long: N tokens > M maximum" (the text Claude
 * Code looks for to compact its history).
 */
static void refuse_too_long(struct ksv_server *s, struct ksv_conn *c, int wire, const struct ksv_intake *in)
{
	uint32_t n = in->pr.n_tokens;
	if (wire == KSV_WIRE_ANTHROPIC) {
		refuse(s, c, wire, 400, "messages", "prompt is too long: %u tokens > %d maximum (this server's context; "
						   "kvkeep serve -c N sets it)", n, s->ctx_len);
		return;
	}
	const char *param = wire == KSV_WIRE_RESPONSES ? "input" : in->req.api == KSV_API_CHAT ? "messages" : "prompt";
	ksv_reply_error_code(s, c, KSV_WIRE_OPENAI, 400, param, "context_length_exceeded",
			     "This model's maximum context length is %d tokens. However, your %s resulted in %u tokens. "
			     "Please reduce the length of the %s (or start kvkeep serve with a larger -c / --max-model-len).",
			     s->ctx_len, param, n, param);
}

static int prompt(struct ksv_server *s, struct ksv_conn *c, int wire, struct ksv_intake *in)
{
	char param[32];
	int status = ksv_prompt_make(s, &in->req, in->salt, &in->pr, param, sizeof param);
	if (status == 400 && in->pr.n_tokens >= (uint32_t)s->ctx_len) {
		refuse_too_long(s, c, wire, in);
		return 1;
	}
	if (status) {
		/* the Responses API names its prompt "input" */
		refuse(s, c, wire, status, wire == KSV_WIRE_RESPONSES && !strcmp(param, "messages") ? "input" : param, "%s",
		       kv_errmsg());
		return 1;
	}
	return 0;
}

/*
 * The constraint of structured output (session/constrain.h), compiled or
 * found: tool_choice required or named (the call in the template's own
 * syntax, its arguments valid under the function's schema), tool_choice
 * none (no call), auto with a strict function (text, then calls whose
 * arguments follow the schemas), or the answer's format (response_format,
 * json_schema, grammar). required and named win over a format (the answer
 * is the call); auto with a format is refused: the format would leave no
 * room for a call. A spec that does not compile is a 400 naming what is
 * wrong.
 */
static int constraint(struct ksv_server *s, struct ksv_conn *c, int wire, struct ksv_intake *in)
{
	const struct ksv_req *r = &in->req;
	struct kss_cons_spec sp = {.kind = KSS_CONS_NONE};
	const char *param = r->fmt_param;
	if (r->tools && r->api == KSV_API_CHAT && r->tool_choice != KSV_TC_AUTO) {
		static const int choice[] = {[KSV_TC_NONE] = KV_TCG_NONE, [KSV_TC_REQUIRED] = KV_TCG_REQUIRED,
					     [KSV_TC_NAMED] = KV_TCG_NAMED};
		if (r->tool_choice != KSV_TC_NONE || !r->fmt)
			sp = (struct kss_cons_spec){.kind = KSS_CONS_TOOLS, .choice = choice[r->tool_choice]};
	} else if (r->tools && r->api == KSV_API_CHAT && r->fmt) {
		refuse(s, c, wire, 400, "tool_choice",
		       "a response format with tools needs tool_choice \"none\" or \"required\" (under \"auto\" the "
		       "format would leave no room for a tool call)");
		return 1;
	} else if (r->tools && r->api == KSV_API_CHAT && r->tools_strict) {
		sp = (struct kss_cons_spec){.kind = KSS_CONS_TOOLS, .choice = KV_TCG_AUTO};
	}
	if (sp.kind == KSS_CONS_TOOLS) {
		sp.tools = r->tools;
		sp.name = r->tool_name;
		sp.parallel = r->parallel_tool_calls;
		sp.strict = r->tools_strict;
		sp.xml = s->xml_tools;
		param = r->tool_choice == KSV_TC_NAMED ? "tool_choice" : "tools";
	} else if (r->fmt == KSV_FMT_JSON_SCHEMA) {
		sp = (struct kss_cons_spec){.kind = KSS_CONS_SCHEMA, .schema = r->fmt_schema, .strict = r->fmt_strict};
	} else if (r->fmt == KSV_FMT_JSON_OBJECT) {
		sp.kind = KSS_CONS_JSON_OBJECT;
	} else if (r->fmt == KSV_FMT_GRAMMAR) {
		sp = (struct kss_cons_spec){.kind = KSS_CONS_GBNF, .gbnf = r->grammar, .gbnf_len = r->grammar_len};
	}
	if (sp.kind == KSS_CONS_NONE)
		return 0;
	if (s->harmony && r->api == KSV_API_CHAT) {
		/* GPT-OSS: the answer in harmony's final channel, a forced call
		 * in its commentary channel (session/constrain.h). "none" and
		 * "auto" with strict functions run unconstrained (the calls are
		 * parsed as harmony) */
		if (sp.kind == KSS_CONS_TOOLS && (sp.choice == KV_TCG_NONE || sp.choice == KV_TCG_AUTO))
			return 0;
		sp.harmony = 1;
	}
	in->cons_kind = sp.kind;
	int rc = kss_cons_get(kss_service_cons(s->svc), &sp, &in->grammar, &in->cons_hit);
	if (rc) {
		refuse(s, c, wire, rc == KV_ERR_NOMEM ? 500 : 400, param, "%s: %s", param, kv_errmsg());
		return 1;
	}
	return 0;
}

/* max_tokens within the context. */
static void limits(struct ksv_server *s, struct ksv_intake *in)
{
	int64_t room = s->ctx_len - (int64_t)in->pr.n_tokens;
	int64_t mt = in->req.max_tokens > 0 ? in->req.max_tokens : s->o.default_max_tokens;
	in->max_tokens = (int)(mt < room ? mt : room);
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
	if (prompt(s, c, wire, in) || constraint(s, c, wire, in))
		return 1;
	limits(s, in);
	return 0;
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
