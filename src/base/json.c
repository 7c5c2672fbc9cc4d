/*
 * json.c - see json.h.
 */
#include "base/json.h"
#include "base/err.h"
#include "base/io.h"

#include <stdlib.h>
#include <string.h>

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

int kv_json_parse(const char *what, const char *p, size_t n, int max_depth, json_t **out)
{
	json_error_t e;
	int d;

	*out = NULL;
	if (max_depth > 0 && (d = kv_json_text_depth(p, n)) > max_depth)
		return kv_fail(KV_ERR_INVALID, "%s: JSON nested %d deep, limit is %d", what, d, max_depth);
	*out = json_loadb(p, n, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &e);
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
