/*
 * cmd_tokenize.c - `kvkeep tokenize` and `kvkeep detokenize`: the
 * tokenizer of a model folder from the command line (and the batch mode
 * the oracle comparison in tests/e2e/tokenizer_oracle.sh uses).
 *
 *   kvkeep tokenize --model DIR (--text TEXT | --file F | FILE...) [--json]
 *       prints the ids, comma separated (or a JSON array with --json).
 *       Several FILEs (batch mode: one tokenizer load for all) print one
 *       line per file, in order.
 *       --lines encodes every line of the input on its own (without its
 *       "\n") and prints one result per line. --no-special encodes special
 *       token literals as text. --time prints encode timings to stderr
 *       (only the kv_tok_encode calls are timed; --repeat N runs them N
 *       times, --no-cache bypasses the piece cache, --quiet prints no ids).
 *   kvkeep detokenize --model DIR (--ids 1,2,3 | --ids-file F)
 *       prints the text and a newline (--no-newline: the exact bytes).
 *       --skip-special drops special tokens; --stream decodes through the
 *       streaming decoder one id at a time (same output by design).
 *       --lines: every line of the ids is one list; each text is printed
 *       as a JSON string on its own line.
 *
 * DIR is a model folder holding tokenizer.json, or the file itself.
 */
#include "base/buf.h"
#include "base/clock.h"
#include "base/err.h"
#include "base/io.h"
#include "cli/cli.h"
#include "text/tokenizer.h"
#include "model/gguf.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#define MAX_INPUT (1u << 30)

/* CPU seconds of this thread: robust to other processes on a busy machine */
static double cpu_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int load_tok(const char *model, struct kv_tok **t)
{
	char path[4096];
	struct stat st;
	if (stat(model, &st) == 0 && S_ISDIR(st.st_mode))
		snprintf(path, sizeof path, "%s/tokenizer.json", model);
	else
		snprintf(path, sizeof path, "%s", model);
	if (kv_gguf_is_model_path(model) ? kv_tok_load_model(model, t) : kv_tok_load(path, t)) {
		fprintf(stderr, "kvkeep: %s\n", kv_errmsg());
		return -1;
	}
	return 0;
}

static void print_ids(struct kv_buf *o, const int32_t *ids, size_t n, int json)
{
	if (json)
		kv_buf_addc(o, '[');
	for (size_t i = 0; i < n; i++)
		kv_buf_printf(o, i ? "," "%d" : "%d", ids[i]);
	if (json)
		kv_buf_addc(o, ']');
	kv_buf_addc(o, '\n');
}

static int write_all(const char *p, size_t n)
{
	if (n && fwrite(p, 1, n, stdout) != n) {
		fprintf(stderr, "kvkeep: write to stdout failed\n");
		return -1;
	}
	return 0;
}

/* Encode text (whole, or each line) and append the printed ids to out. */
static int encode_print(const struct kv_tok *t, const char *text, size_t len, int lines, int json, int allow_special,
			struct kv_buf *out)
{
	const char *p = text, *end = text + len;
	while (p < end || (p == end && !lines)) {
		const char *e = lines ? memchr(p, '\n', (size_t)(end - p)) : NULL;
		size_t n = e ? (size_t)(e - p) : (size_t)(end - p);
		int32_t *ids;
		size_t nid;
		int rc = kv_tok_encode(t, p, n, allow_special, &ids, &nid);
		if (rc)
			return rc;
		print_ids(out, ids, nid, json);
		free(ids);
		if (!lines)
			break;
		p += n + (e ? 1 : 0);
	}
	return out->oom ? kv_fail(KV_ERR_NOMEM, "out of memory") : KV_OK;
}

static int cmd_tokenize(int argc, char **argv)
{
	const char *model = NULL, *text = NULL, *file = NULL;
	int json = 0, no_special = 0, lines = 0, timing = 0, quiet = 0, no_cache = 0, rc = 1;
	int64_t repeat = 1;
	struct kv_flag flags[] = {
		{"model", KV_FLAG_STR, &model, "DIR", "model folder with tokenizer.json (or the file itself)"},
		{"text", KV_FLAG_STR, &text, "TEXT", "text to encode"},
		{"file", KV_FLAG_STR, &file, "F", "encode the contents of file F ('-' = stdin)"},
		{"json", KV_FLAG_BOOL, &json, NULL, "print a JSON array (default: comma separated)"},
		{"lines", KV_FLAG_BOOL, &lines, NULL, "encode each input line on its own, one result per line"},
		{"no-special", KV_FLAG_BOOL, &no_special, NULL, "encode special-token literals as plain text"},
		{"time", KV_FLAG_BOOL, &timing, NULL, "print encode timings to stderr"},
		{"repeat", KV_FLAG_INT, &repeat, "N", "encode N times (with --time; default 1)"},
		{"no-cache", KV_FLAG_BOOL, &no_cache, NULL, "bypass the piece cache"},
		{"quiet", KV_FLAG_BOOL, &quiet, NULL, "do not print the ids"},
		{0},
	};
	const char *usage = "usage: kvkeep tokenize --model DIR (--text TEXT | --file F | FILE...) [--json] [--lines]";
	struct kv_tok *t = NULL;
	char *buf = NULL;
	size_t len = 0;
	struct kv_buf out = KV_BUF_INIT;
	char *pos[4096];
	int n_pos = 0;
	int pr = kv_flags_parse(usage, flags, argc, argv, pos, 4096, &n_pos);
	if (pr)
		return pr == 1 ? 0 : 2;
	if (!model || (!!text + !!file + (n_pos > 0)) != 1) {
		fprintf(stderr, "kvkeep tokenize: need --model and exactly one of --text / --file / FILE...\n%s\n", usage);
		return 2;
	}
	if (n_pos > 0) {
		if (load_tok(model, &t))
			return 1;
		for (int i = 0; i < n_pos; i++) {
			if (kv_io_read_file(pos[i], MAX_INPUT, &buf, &len)) {
				fprintf(stderr, "kvkeep tokenize: %s\n", kv_errmsg());
				goto done;
			}
			if (encode_print(t, buf, len, lines, json, !no_special, &out)) {
				fprintf(stderr, "kvkeep tokenize: %s: %s\n", pos[i], kv_errmsg());
				goto done;
			}
			free(buf);
			buf = NULL;
			if (write_all(out.p, out.len))
				goto done;
			kv_buf_reset(&out);
		}
		rc = fflush(stdout) ? 1 : 0;
		goto done;
	}
	if (repeat < 1 || repeat > 1000000) {
		fprintf(stderr, "kvkeep tokenize: --repeat must be 1..1000000\n");
		return 2;
	}
	if (text) {
		len = strlen(text);
	} else if (!strcmp(file, "-")) {
		struct kv_buf in = KV_BUF_INIT;
		char chunk[65536];
		size_t r;
		while ((r = fread(chunk, 1, sizeof chunk, stdin)) > 0 && in.len < MAX_INPUT)
			kv_buf_add(&in, chunk, r);
		if (in.oom || in.len >= MAX_INPUT) {
			fprintf(stderr, "kvkeep tokenize: stdin too large or out of memory\n");
			kv_buf_free(&in);
			return 1;
		}
		len = in.len;
		buf = kv_buf_take(&in);
		text = buf;
	} else {
		if (kv_io_read_file(file, MAX_INPUT, &buf, &len)) {
			fprintf(stderr, "kvkeep tokenize: %s\n", kv_errmsg());
			return 1;
		}
		text = buf;
	}
	if (load_tok(model, &t))
		goto done;

	double first = 0, best = 1e30, total = 0, cfirst = 0, cbest = 1e30;
	size_t n_ids_total = 0;
	for (int64_t r = 0; r < repeat; r++) {
		const char *p = text, *end = text + len;
		int last = r == repeat - 1;
		double dt = 0, ct = 0;
		n_ids_total = 0;
		while (p < end || (p == end && !lines)) {
			const char *e = lines ? memchr(p, '\n', (size_t)(end - p)) : NULL;
			size_t n = e ? (size_t)(e - p) : (size_t)(end - p);
			int32_t *ids;
			size_t nid;
			double t0 = kv_now_s(), c0 = cpu_s();
			int erc = kv_tok_encode_opt(t, p, n, !no_special, !no_cache, &ids, &nid);
			dt += kv_now_s() - t0;
			ct += cpu_s() - c0;
			if (erc) {
				fprintf(stderr, "kvkeep tokenize: %s%s\n", kv_errmsg(), lines ? " (in --lines mode: offset within the line)" : "");
				goto done;
			}
			n_ids_total += nid;
			if (last && !quiet) {
				print_ids(&out, ids, nid, json);
				if (out.len > (1u << 20)) {
					if (write_all(out.p, out.len))
						goto done;
					kv_buf_reset(&out);
				}
			}
			free(ids);
			p += n + (e ? 1 : 0);
			if (!lines)
				break;
		}
		if (r == 0) {
			first = dt;
			cfirst = ct;
		}
		if (dt < best)
			best = dt;
		if (ct < cbest)
			cbest = ct;
		total += dt;
	}
	if (out.oom) {
		fprintf(stderr, "kvkeep tokenize: out of memory\n");
		goto done;
	}
	if (write_all(out.p, out.len) || fflush(stdout)) {
		goto done;
	}
	if (timing) {
		uint64_t hits, misses;
		kv_tok_cache_stats(t, &hits, &misses);
		fprintf(stderr,
			"encode: %zu bytes -> %zu ids; first %.3f ms (cpu %.3f ms); best of %lld %.3f ms = %.2f MB/s "
			"(best cpu %.3f ms = %.2f MB/s); mean %.3f ms; cache %s hits=%llu misses=%llu\n",
			len, n_ids_total, first * 1e3, cfirst * 1e3, (long long)repeat, best * 1e3,
			len / 1e6 / (best > 0 ? best : 1e-9), cbest * 1e3, len / 1e6 / (cbest > 0 ? cbest : 1e-9),
			total / (double)repeat * 1e3, no_cache ? "off" : "on", (unsigned long long)hits,
			(unsigned long long)misses);
	}
	rc = 0;
done:
	kv_buf_free(&out);
	kv_tok_free(t);
	free(buf);
	return rc;
}
KV_COMMAND(tokenize, "tokenize", "print the token ids of a text", cmd_tokenize);

/* Decode one id list into out (as a JSON string line when json). */
static int decode_one(const struct kv_tok *t, const int32_t *ids, size_t n, int skip_special, int stream, int json,
		      struct kv_buf *out)
{
	struct kv_buf txt = KV_BUF_INIT;
	if (stream) {
		struct kv_tok_stream s;
		kv_tok_stream_init(&s, t, skip_special);
		for (size_t i = 0; i < n; i++)
			if (kv_tok_stream_feed(&s, ids[i], &txt)) {
				fprintf(stderr, "kvkeep detokenize: ids[%zu]: %s\n", i, kv_errmsg());
				kv_buf_free(&txt);
				return -1;
			}
		kv_tok_stream_finish(&s, &txt);
	} else {
		char *text;
		size_t tlen;
		if (kv_tok_decode(t, ids, n, skip_special, &text, &tlen)) {
			fprintf(stderr, "kvkeep detokenize: %s\n", kv_errmsg());
			return -1;
		}
		kv_buf_add(&txt, text, tlen);
		free(text);
	}
	if (json) {
		json_t *js = json_stringn(txt.p ? txt.p : "", txt.len);
		char *d = js ? json_dumps(js, JSON_ENCODE_ANY) : NULL;
		json_decref(js);
		if (!d) {
			fprintf(stderr, "kvkeep detokenize: cannot format the text as JSON\n");
			kv_buf_free(&txt);
			return -1;
		}
		kv_buf_adds(out, d);
		kv_buf_addc(out, '\n');
		free(d);
	} else
		kv_buf_add(out, txt.p, txt.len);
	kv_buf_free(&txt);
	return 0;
}

static int cmd_detokenize(int argc, char **argv)
{
	const char *model = NULL, *ids_s = NULL, *ids_file = NULL;
	int skip_special = 0, no_newline = 0, stream = 0, lines = 0, rc = 1;
	struct kv_flag flags[] = {
		{"model", KV_FLAG_STR, &model, "DIR", "model folder with tokenizer.json (or the file itself)"},
		{"ids", KV_FLAG_STR, &ids_s, "1,2,3", "token ids (comma separated; a JSON array also works)"},
		{"ids-file", KV_FLAG_STR, &ids_file, "F", "read the ids from file F ('-' = stdin)"},
		{"skip-special", KV_FLAG_BOOL, &skip_special, NULL, "drop special tokens"},
		{"stream", KV_FLAG_BOOL, &stream, NULL, "decode through the streaming decoder, one id at a time"},
		{"no-newline", KV_FLAG_BOOL, &no_newline, NULL, "print the exact text, without a final newline"},
		{"lines", KV_FLAG_BOOL, &lines, NULL, "one id list per line; print each text as a JSON string line"},
		{0},
	};
	const char *usage = "usage: kvkeep detokenize --model DIR (--ids 1,2,3 | --ids-file F)";
	struct kv_tok *t = NULL;
	char *buf = NULL;
	int32_t *ids = NULL;
	size_t n = 0;
	struct kv_buf out = KV_BUF_INIT;
	int pr = kv_flags_parse(usage, flags, argc, argv, NULL, 0, NULL);
	if (pr)
		return pr == 1 ? 0 : 2;
	if (!model || (!ids_s) == (!ids_file)) {
		fprintf(stderr, "kvkeep detokenize: need --model and exactly one of --ids / --ids-file\n%s\n", usage);
		return 2;
	}
	if (ids_file) {
		size_t len;
		if (!strcmp(ids_file, "-")) {
			struct kv_buf in = KV_BUF_INIT;
			char chunk[65536];
			size_t r;
			while ((r = fread(chunk, 1, sizeof chunk, stdin)) > 0 && in.len < MAX_INPUT)
				kv_buf_add(&in, chunk, r);
			if (in.oom || in.len >= MAX_INPUT) {
				fprintf(stderr, "kvkeep detokenize: stdin too large or out of memory\n");
				kv_buf_free(&in);
				return 1;
			}
			buf = kv_buf_take(&in);
		} else if (kv_io_read_file(ids_file, MAX_INPUT, &buf, &len)) {
			fprintf(stderr, "kvkeep detokenize: %s\n", kv_errmsg());
			return 1;
		}
		ids_s = buf;
	}
	if (load_tok(model, &t))
		goto done;
	for (const char *p = ids_s; *p || !lines;) {
		const char *e = lines ? strchr(p, '\n') : NULL;
		char *one = NULL;
		if (lines) {
			size_t l = e ? (size_t)(e - p) : strlen(p);
			one = strndup(p, l);
			if (!one) {
				fprintf(stderr, "kvkeep detokenize: out of memory\n");
				goto done;
			}
		}
		free(ids);
		ids = NULL;
		if (kv_parse_int_list(one ? one : p, &ids, &n)) {
			free(one);
			goto done;
		}
		free(one);
		if (decode_one(t, ids, n, skip_special, stream, lines, &out))
			goto done;
		if (!lines)
			break;
		p = e ? e + 1 : p + strlen(p);
	}
	if (out.oom) {
		fprintf(stderr, "kvkeep detokenize: out of memory\n");
		goto done;
	}
	if (write_all(out.p, out.len))
		goto done;
	if (!no_newline && !lines && write_all("\n", 1))
		goto done;
	if (fflush(stdout)) {
		fprintf(stderr, "kvkeep detokenize: write to stdout failed\n");
		goto done;
	}
	rc = 0;
done:
	kv_buf_free(&out);
	kv_tok_free(t);
	free(ids);
	free(buf);
	return rc;
}
KV_COMMAND(detokenize, "detokenize", "print the text of token ids", cmd_detokenize);
