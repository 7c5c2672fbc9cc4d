/*
 * auth.c - see auth.h.
 */
#include "server/auth.h"

#include <arpa/inet.h>
#include <stdint.h>
#include <string.h>
#include <strings.h>

int ksv_auth_equal(const char *key, const char *s)
{
	size_t kl = strlen(key), sl = strlen(s);
	volatile unsigned char diff = (unsigned char)(kl != sl);
	/* always kl steps; past the end of s compare against a NUL (which
	 * differs from every key byte, a key holds no NUL) */
	for (size_t i = 0; i < kl; i++) {
		unsigned char b = i < sl ? (unsigned char)s[i] : 0;
		diff |= (unsigned char)((unsigned char)key[i] ^ b);
	}
	return diff == 0;
}

int ksv_auth_is_loopback(const char *host)
{
	unsigned char a[16];
	if (!host || !*host)
		return 0; /* "" means every interface */
	if (!strcasecmp(host, "localhost"))
		return 1;
	if (inet_pton(AF_INET, host, a) == 1)
		return a[0] == 127;
	if (inet_pton(AF_INET6, host, a) == 1) {
		static const unsigned char one[16] = {[15] = 1};
		static const unsigned char v4map[12] = {[10] = 0xff, [11] = 0xff};
		return !memcmp(a, one, 16) || (!memcmp(a, v4map, 12) && a[12] == 127);
	}
	return 0;
}

const char *ksv_auth_presented(const char *authorization, const char *x_api_key)
{
	if (authorization) {
		const char *p = authorization;
		while (*p == ' ')
			p++;
		if (!strncasecmp(p, "Bearer ", 7)) {
			p += 7;
			while (*p == ' ')
				p++;
			return p;
		}
	}
	return x_api_key;
}

int ksv_auth_is_admin(const struct ksv_auth *a, const char *key)
{
	return a->admin_key && *a->admin_key && key && ksv_auth_equal(a->admin_key, key);
}

int ksv_auth_trusted(const struct ksv_auth *a, const char *key)
{
	int has_api = a->api_key && *a->api_key, has_admin = a->admin_key && *a->admin_key;
	if (has_admin)
		return ksv_auth_is_admin(a, key);
	return !has_api && a->loopback;
}

enum ksv_auth_verdict ksv_auth_check(const struct ksv_auth *a, enum ksv_auth_class c, const char *key)
{
	int has_api = a->api_key && *a->api_key, has_admin = a->admin_key && *a->admin_key;
	int is_admin = has_admin && key && ksv_auth_equal(a->admin_key, key);
	switch (c) {
	case KSV_AUTH_OPEN:
		return KSV_AUTH_OK;
	case KSV_AUTH_API:
		if (!has_api || is_admin || (key && ksv_auth_equal(a->api_key, key)))
			return KSV_AUTH_OK;
		return KSV_AUTH_UNAUTHORIZED;
	case KSV_AUTH_ADMIN:
		if (has_admin)
			return is_admin ? KSV_AUTH_OK : KSV_AUTH_UNAUTHORIZED;
		if (!a->loopback)
			return KSV_AUTH_FORBIDDEN;
		/* loopback without an admin key: the API key (if any) guards it */
		if (!has_api || (key && ksv_auth_equal(a->api_key, key)))
			return KSV_AUTH_OK;
		return KSV_AUTH_UNAUTHORIZED;
	}
	return KSV_AUTH_UNAUTHORIZED;
}
