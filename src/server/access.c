/*
 * access.c - who a request is (server/auth.h) as the server's routes ask
 * it: the keys the server was given, the key a request presents, and the
 * two questions above a route's own access class (see server_int.h).
 */
#include "server/server_int.h"
#include "server/auth.h"
#include "server/httpd.h"

struct ksv_auth ksv_server_auth(const struct ksv_server *s)
{
	return (struct ksv_auth){.api_key = s->o.api_key ? s->o.api_key : s->o.env_api_key,
				 .admin_key = s->o.admin_key ? s->o.admin_key : s->o.env_admin_key,
				 .loopback = ksv_auth_is_loopback(s->o.host)};
}

const char *ksv_server_key(struct ksv_conn *c)
{
	return ksv_auth_presented(ksv_conn_req_header(c, "Authorization"), ksv_conn_req_header(c, "x-api-key"));
}

int ksv_server_trusted(const struct ksv_server *s, struct ksv_conn *c)
{
	struct ksv_auth au = ksv_server_auth(s);
	return ksv_auth_trusted(&au, ksv_server_key(c));
}

int ksv_server_admin(const struct ksv_server *s, struct ksv_conn *c)
{
	struct ksv_auth au = ksv_server_auth(s);
	return ksv_auth_is_admin(&au, ksv_server_key(c));
}
