/*
 * test_server_auth.c - the access rules of `kvkeep serve` (server/auth.h).
 */
#include "kt.h"
#include "server/auth.h"

KT_CASE(equal_compares_whole_strings)
{
	KT_CHECK(ksv_auth_equal("secret", "secret"));
	KT_CHECK(!ksv_auth_equal("secret", "secreT"));
	KT_CHECK(!ksv_auth_equal("secret", "secre"));
	KT_CHECK(!ksv_auth_equal("secret", "secrets"));
	KT_CHECK(!ksv_auth_equal("secret", ""));
	KT_CHECK(!ksv_auth_equal("s", "t"));
}

KT_CASE(loopback_hosts)
{
	KT_CHECK(ksv_auth_is_loopback("127.0.0.1"));
	KT_CHECK(ksv_auth_is_loopback("127.1.2.3"));
	KT_CHECK(ksv_auth_is_loopback("::1"));
	KT_CHECK(ksv_auth_is_loopback("::ffff:127.0.0.1"));
	KT_CHECK(ksv_auth_is_loopback("localhost"));
	KT_CHECK(!ksv_auth_is_loopback("0.0.0.0"));
	KT_CHECK(!ksv_auth_is_loopback("::"));
	KT_CHECK(!ksv_auth_is_loopback(""));
	KT_CHECK(!ksv_auth_is_loopback("192.168.1.4"));
	KT_CHECK(!ksv_auth_is_loopback("myhost"));
}

KT_CASE(presented_key)
{
	KT_EQ_STR(ksv_auth_presented("Bearer abc", NULL), "abc");
	KT_EQ_STR(ksv_auth_presented("bearer  abc", NULL), "abc");
	KT_EQ_STR(ksv_auth_presented(NULL, "xyz"), "xyz");
	KT_EQ_STR(ksv_auth_presented("Basic Zm9v", "xyz"), "xyz");
	KT_CHECK(ksv_auth_presented("Basic Zm9v", NULL) == NULL);
	KT_CHECK(ksv_auth_presented(NULL, NULL) == NULL);
}

KT_CASE(route_rules)
{
	struct ksv_auth open_lo = {.loopback = 1}, open_wide = {.loopback = 0};
	struct ksv_auth keys = {.api_key = "k", .admin_key = "a", .loopback = 0};
	struct ksv_auth api_lo = {.api_key = "k", .loopback = 1};
	KT_EQ_INT(ksv_auth_check(&open_lo, KSV_AUTH_API, NULL), KSV_AUTH_OK);
	KT_EQ_INT(ksv_auth_check(&open_lo, KSV_AUTH_ADMIN, NULL), KSV_AUTH_OK);
	KT_EQ_INT(ksv_auth_check(&open_wide, KSV_AUTH_ADMIN, NULL), KSV_AUTH_FORBIDDEN);
	KT_EQ_INT(ksv_auth_check(&open_wide, KSV_AUTH_API, NULL), KSV_AUTH_OK);
	KT_EQ_INT(ksv_auth_check(&keys, KSV_AUTH_API, NULL), KSV_AUTH_UNAUTHORIZED);
	KT_EQ_INT(ksv_auth_check(&keys, KSV_AUTH_API, "k"), KSV_AUTH_OK);
	KT_EQ_INT(ksv_auth_check(&keys, KSV_AUTH_API, "a"), KSV_AUTH_OK);
	KT_EQ_INT(ksv_auth_check(&keys, KSV_AUTH_ADMIN, "k"), KSV_AUTH_UNAUTHORIZED);
	KT_EQ_INT(ksv_auth_check(&keys, KSV_AUTH_ADMIN, "a"), KSV_AUTH_OK);
	KT_EQ_INT(ksv_auth_check(&keys, KSV_AUTH_OPEN, NULL), KSV_AUTH_OK);
	/* loopback, API key only: the admin routes need the API key */
	KT_EQ_INT(ksv_auth_check(&api_lo, KSV_AUTH_ADMIN, NULL), KSV_AUTH_UNAUTHORIZED);
	KT_EQ_INT(ksv_auth_check(&api_lo, KSV_AUTH_ADMIN, "k"), KSV_AUTH_OK);
}

/* Who may read other clients' text (issue 37): the admin key, or anyone
 * on a keyless loopback server; an API key alone never. */
KT_CASE(trusted_callers)
{
	struct ksv_auth open_lo = {.loopback = 1}, open_wide = {.loopback = 0};
	struct ksv_auth keys = {.api_key = "k", .admin_key = "a", .loopback = 1};
	struct ksv_auth api_lo = {.api_key = "k", .loopback = 1};
	struct ksv_auth admin_lo = {.admin_key = "a", .loopback = 1};
	KT_CHECK(ksv_auth_trusted(&open_lo, NULL));
	KT_CHECK(!ksv_auth_trusted(&open_wide, NULL));
	KT_CHECK(!ksv_auth_trusted(&keys, "k"));
	KT_CHECK(!ksv_auth_trusted(&keys, NULL));
	KT_CHECK(ksv_auth_trusted(&keys, "a"));
	KT_CHECK(!ksv_auth_trusted(&api_lo, "k"));   /* may call the admin routes, may not read prompts */
	KT_EQ_INT(ksv_auth_check(&api_lo, KSV_AUTH_ADMIN, "k"), KSV_AUTH_OK);
	KT_CHECK(!ksv_auth_trusted(&admin_lo, NULL)); /* an admin key exists: only it */
	KT_CHECK(ksv_auth_trusted(&admin_lo, "a"));
	KT_CHECK(ksv_auth_is_admin(&keys, "a"));
	KT_CHECK(!ksv_auth_is_admin(&keys, "k"));
	KT_CHECK(!ksv_auth_is_admin(&open_lo, NULL));
}

KT_MAIN(equal_compares_whole_strings, loopback_hosts, presented_key, route_rules, trusted_callers)
