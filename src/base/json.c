/*
 * json.c - see json.h.
 */
#include "base/json.h"
#include "base/err.h"
#include "base/buf.h"
#include "base/io.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

int kv_json_text_depth(const char *p, size_t n)
{
	int d = 0, maxd = 0, in_str = 0;
	for (size_t i = 0; i < n; i++) {
		char c = p[i];
		if (in_str) {
			if (c == '\\')
				i++;
			else if (c == '"')
				in_str = 0;
			continue;
		}
		if (c == '"')
			in_str = 1;
		else if (c == '[' || c == '{') {
			if (++d > maxd)
				maxd = d;
		} else if (c == ']' || c == '}')
			d--;
	}
	return maxd;
}

/* --- numbers jansson cannot hold ------------------------------------------ */

static pthread_once_t g_tag_once = PTHREAD_ONCE_INIT;
static char g_tag[32];   /* "\0kvnum-<16 hex>:" as bytes */
static size_t g_tag_n;

static void tag_init(void)
{
	uint64_t r = 0;
	if (getrandom(&r, sizeof r, 0) != (ssize_t)sizeof r)
		r = (uint64_t)time(NULL) * 0x9E3779B97F4A7C15ull ^ (uint64_t)getpid() ^ (uint64_t)(uintptr_t)&r;
	g_tag[0] = 0;
	g_tag_n = 1 + (size_t)snprintf(g_tag + 1, sizeof g_tag - 1, "kvnum-%016llx:", (unsigned long long)r);
}

/* Length of the JSON number at p (grammar of RFC 8259), 0 if none. *is_int
 * when it has no fraction and no exponent. */
static size_t number_len(const char *p, size_t n, int *is_int)
{
	size_t i = 0;
	*is_int = 1;
	if (i < n && p[i] == '-')
		i++;
	if (i >= n || p[i] < '0' || p[i] > '9')
		return 0;
	if (p[i] == '0')
		i++;
	else
		while (i < n && p[i] >= '0' && p[i] <= '9')
			i++;
	if (i < n && p[i] == '.') {
		*is_int = 0;
		if (++i >= n || p[i] < '0' || p[i] > '9')
			return 0;
		while (i < n && p[i] >= '0' && p[i] <= '9')
			i++;
	}
	if (i < n && (p[i] == 'e' || p[i] == 'E')) {
		*is_int = 0;
		i++;
		if (i < n && (p[i] == '+' || p[i] == '-'))
			i++;
		if (i >= n || p[i] < '0' || p[i] > '9')
			return 0;
		while (i < n && p[i] >= '0' && p[i] <= '9')
			i++;
	}
	return i;
}

/* 1 when jansson refuses this number: an integer beyond int64 or a real
 * that overflows a double (underflow reads as 0 there, as in Python). */
static int beyond_jansson(const char *p, size_t n, int is_int)
{
	char buf[512];
	if (n >= sizeof buf)
		return is_int; /* an integer this long (no leading zeros in JSON) is beyond int64; a long
				  real such as 0.000...1 is left to jansson */
	memcpy(buf, p, n);
	buf[n] = 0;
	errno = 0;
	if (is_int) {
		(void)strtoll(buf, NULL, 10);
		return errno == ERANGE;
	}
	double d = strtod(buf, NULL);
	return errno == ERANGE && (d == HUGE_VAL || d == -HUGE_VAL);
}

/* The text with each refused number replaced by a number-literal string;
 * NULL when there is none (or no memory). */
static char *rewrite_numbers(const char *p, size_t n, size_t *out_n)
{
	struct kv_buf b = KV_BUF_INIT;
	int changed = 0;
	pthread_once(&g_tag_once, tag_init);
	for (size_t i = 0; i < n;) {
		char c = p[i];
		if (c == '"') {
			size_t j = i + 1;
			while (j < n && p[j] != '"')
				j += p[j] == '\\' ? 2 : 1;
			j = j < n ? j + 1 : n;
			kv_buf_add(&b, p + i, j - i);
			i = j;
			continue;
		}
		int is_int;
		size_t L = (c == '-' || (c >= '0' && c <= '9')) ? number_len(p + i, n - i, &is_int) : 0;
		if (L && L < 4096 && beyond_jansson(p + i, L, is_int)) {
			kv_buf_adds(&b, "\"\\u0000");
			kv_buf_add(&b, g_tag + 1, g_tag_n - 1);
			kv_buf_add(&b, p + i, L);
			kv_buf_addc(&b, '"');
			i += L;
			changed = 1;
			continue;
		}
		if (L) {
			kv_buf_add(&b, p + i, L);
			i += L;
			continue;
		}
		kv_buf_addc(&b, c);
		i++;
	}
	if (!changed || b.oom) {
		kv_buf_free(&b);
		return NULL;
	}
	*out_n = b.len;
	return b.p;
}

int kv_json_number_literal(const json_t *v, const char **lit, size_t *n)
{
	if (!json_is_string(v))
		return 0;
	pthread_once(&g_tag_once, tag_init);
	const char *s = json_string_value(v);
	size_t len = json_string_length(v);
	int is_int;
	if (len <= g_tag_n || memcmp(s, g_tag, g_tag_n))
		return 0;
	if (number_len(s + g_tag_n, len - g_tag_n, &is_int) != len - g_tag_n)
		return 0;
	*lit = s + g_tag_n;
	*n = len - g_tag_n;
	return 1;
}

int kv_json_parse(const char *what, const char *p, size_t n, int max_depth, json_t **out)
{
	json_error_t e;
	int d;

	*out = NULL;
	if (max_depth > 0 && (d = kv_json_text_depth(p, n)) > max_depth)
		return kv_fail(KV_ERR_INVALID, "%s: JSON nested %d deep, limit is %d", what, d, max_depth);
	*out = json_loadb(p, n, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &e);
	if (!*out && (strstr(e.text, "too big") || strstr(e.text, "overflow"))) {
		size_t rn = 0;
		char *r = rewrite_numbers(p, n, &rn);
		if (r) {
			*out = json_loadb(r, rn, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &e);
			free(r);
		}
	}
	if (!*out)
		return kv_fail(KV_ERR_INVALID, "%s: line %d column %d: %s", what, e.line, e.column, e.text);
	return KV_OK;
}

int kv_json_load_file(const char *path, size_t max_len, json_t **out)
{
	char *buf;
	size_t len;
	int rc = kv_io_read_file(path, max_len, &buf, &len);
	*out = NULL;
	if (rc)
		return rc;
	rc = kv_json_parse(path, buf, len, KV_JSON_MAX_DEPTH, out);
	free(buf);
	return rc;
}

int kv_json_get_int(const json_t *obj, const char *key, int64_t def, int64_t *out, const char *what)
{
	json_t *v = json_object_get(obj, key);
	*out = def;
	if (!v || json_is_null(v))
		return KV_OK;
	if (json_is_integer(v)) {
		*out = json_integer_value(v);
		return KV_OK;
	}
	if (json_is_real(v)) {
		double d = json_real_value(v);
		if (d == (double)(int64_t)d) {
			*out = (int64_t)d;
			return KV_OK;
		}
	}
	return kv_fail(KV_ERR_INVALID, "%s: '%s' must be an integer", what, key);
}

int kv_json_get_num(const json_t *obj, const char *key, double def, double *out, const char *what)
{
	json_t *v = json_object_get(obj, key);
	*out = def;
	if (!v || json_is_null(v))
		return KV_OK;
	if (!json_is_number(v))
		return kv_fail(KV_ERR_INVALID, "%s: '%s' must be a number", what, key);
	*out = json_number_value(v);
	return KV_OK;
}

int kv_json_get_bool(const json_t *obj, const char *key, int def, int *out, const char *what)
{
	json_t *v = json_object_get(obj, key);
	*out = def;
	if (!v || json_is_null(v))
		return KV_OK;
	if (!json_is_boolean(v))
		return kv_fail(KV_ERR_INVALID, "%s: '%s' must be true or false", what, key);
	*out = json_is_true(v);
	return KV_OK;
}

int kv_json_get_str(const json_t *obj, const char *key, const char *def, const char **out, const char *what)
{
	json_t *v = json_object_get(obj, key);
	*out = def;
	if (!v || json_is_null(v))
		return KV_OK;
	if (!json_is_string(v))
		return kv_fail(KV_ERR_INVALID, "%s: '%s' must be a string", what, key);
	*out = json_string_value(v);
	return KV_OK;
}
