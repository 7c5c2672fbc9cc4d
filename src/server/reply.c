/*
 * reply.c - JSON and error answers, shared by the route handlers
 * (server.c) and the generation requests (gen.c). Calls nothing above
 * httpd and openai, so neither of those two files calls the other back.
 */
#include "server/server_int.h"
#include "server/httpd.h"
#include "server/anthropic.h"
#include "server/openai.h"
#include "base/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void ksv_reply_json(struct ksv_conn *c, int status, json_t *j)
{
	char *s = json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(17));
	json_decref(j);
	if (!s) {
		ksv_conn_reply(c, 500, "application/json", "{\"error\":{\"message\":\"out of memory\"}}", 37);
		return;
	}
	ksv_conn_reply(c, status, "application/json", s, strlen(s));
	free(s);
}

static void reply_error_v(struct ksv_server *s, struct ksv_conn *c, int wire, int status, const char *param,
			  const char *code, const char *fmt, va_list ap)
{
	char msg[600], ra[32];
	vsnprintf(msg, sizeof msg, fmt, ap);
	size_t len = 0;
	char *body = wire == KSV_WIRE_ANTHROPIC ? ksv_anth_error(status, msg, &len)
						: ksv_oai_error_code(status, code, msg, param, &len);
	/* every refusal leaves a line at the default level: a user whose agent
	 * fails must be able to see why in the server log */
	char emsg[700], eparam[160];
	kv_log_escape(msg, emsg, sizeof emsg);
	kv_log_escape(param && *param ? param : "-", eparam, sizeof eparam);
	KV_INFO("http.error", "route=%s status=%d param=\"%s\" msg=\"%s\"", ksv_conn_route(c), status, eparam, emsg);
	if (status == 503 || status == 429) {
		snprintf(ra, sizeof ra, "%lld", (long long)s->o.retry_after_s);
		ksv_conn_header(c, "Retry-After", ra);
	}
	ksv_conn_reply(c, status, "application/json", body ? body : "{}", body ? len : 2);
	free(body);
}

void ksv_reply_error(struct ksv_server *s, struct ksv_conn *c, int status, const char *param, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	reply_error_v(s, c, KSV_WIRE_OPENAI, status, param, NULL, fmt, ap);
	va_end(ap);
}

void ksv_reply_error_wire(struct ksv_server *s, struct ksv_conn *c, int wire, int status, const char *param,
			  const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	reply_error_v(s, c, wire, status, param, NULL, fmt, ap);
	va_end(ap);
}

void ksv_reply_error_code(struct ksv_server *s, struct ksv_conn *c, int wire, int status, const char *param,
			  const char *code, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	reply_error_v(s, c, wire, status, param, code, fmt, ap);
	va_end(ap);
}
