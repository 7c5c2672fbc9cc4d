/*
 * cmd_render.c - `kvkeep render`: the chat template of a model from the
 * command line, exactly as the server renders a request.
 *
 *   kvkeep render --model DIR --request FILE.json [--no-generation-prompt]
 *                 [--json] [--tokens] [--template FILE] [--no-boundaries]
 *                 [--max-boundaries N] [--time]
 *       FILE.json is an OpenAI chat request body ('-' = stdin): messages,
 *       optional tools and chat_template_kwargs (enable_thinking and any
 *       other keys become template variables). The messages are prepared
 *       as the server prepares them (kv_chat_prepare_messages).
 *       Without --json: the prompt text on stdout, byte for byte, and one
 *       summary line on stderr ("N tokens, boundaries: a,b,c").
 *       With --json: {"text", "n_tokens", "boundaries", "boundary_bytes",
 *       "boundary_msgs", "first_is_system", "first_from_probe"} (+ "tokens"
 *       with --tokens) on stdout; boundary i is where messages[:k] ends,
 *       k = boundary_msgs[i].
 *       --template FILE renders with that Jinja file instead of the
 *       model's chat_template (the model still gives tokenizer and special
 *       tokens).
 *
 *   kvkeep render --template FILE --context CTX.json
 *       raw mode: renders the template with the variables of the JSON
 *       object CTX.json (no preparation, no tokenizer) and prints the text.
 *       The oracle comparison (tests/ref/template_oracle.sh) uses it.
 *
 *   kvkeep render --batch LIST
 *       every line of LIST holds the flags of one render above plus
 *       --out FILE (where its stdout goes; a failed line also writes
 *       FILE.err with the message); the tokenizer is loaded once.
 *       The oracle comparison uses it to stay fast.
 *
 * Exit status: 0 rendered, 1 error (message on stderr), 2 bad flags.
 */
#include "base/buf.h"
#include "base/clock.h"
#include "base/err.h"
#include "base/io.h"
#include "base/json.h"
#include "cli/cli.h"
#include "text/template.h"
#include "text/tokenizer.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_REQUEST (256u << 20)

static int read_input(const char *path, char **buf, size_t *len)
{
	if (strcmp(path, "-"))
		return kv_io_read_file(path, MAX_REQUEST, buf, len);
	struct kv_buf b = KV_BUF_INIT;
	char chunk[65536];
	size_t n;
	while ((n = fread(chunk, 1, sizeof chunk, stdin)) > 0) {
		kv_buf_add(&b, chunk, n);
		if (b.len > MAX_REQUEST) {
			kv_buf_free(&b);
			return kv_fail(KV_ERR_INVALID, "stdin: more than %u bytes", MAX_REQUEST);
		}
	}
	if (b.oom) {
		kv_buf_free(&b);
		return kv_fail(KV_ERR_NOMEM, "out of memory reading stdin");
	}
	*len = b.len;
	*buf = b.p ? kv_buf_take(&b) : strdup("");
	return *buf ? KV_OK : kv_fail(KV_ERR_NOMEM, "out of memory");
}

static int load_json(const char *path, json_t **out)
{
	char *buf;
	size_t len;
	int rc = read_input(path, &buf, &len);
	if (rc)
		return rc;
	rc = kv_json_parse(strcmp(path, "-") ? path : "stdin", buf, len, KV_JSON_MAX_DEPTH, out);
	free(buf);
	return rc;
}

/* Output of one render: stdout, or the --out file of a batch line. */
static FILE *g_out;

static int write_out(const char *p, size_t n)
{
	FILE *f = g_out ? g_out : stdout;
	if (n && fwrite(p, 1, n, f) != n)
		return kv_fail(KV_ERR_IO, "write failed");
	return fflush(f) ? kv_fail(KV_ERR_IO, "write failed") : KV_OK;
}

/* --max-boundaries of the current render. */
static int g_max_b;
static int g_req_specials; /* --special-tokens-in-request */
static int g_keep;         /* --reasoning-history keep (the server's default) */

/* A tokenizer kept across the lines of a batch. */
struct tok_cache {
	char model[4096];
	struct kv_tok *tok;
};

static int render_raw(const char *tpath, const char *cpath)
{
	char *src = NULL, *out = NULL;
	size_t len, olen;
	json_t *ctx = NULL;
	struct kv_tmpl *t = NULL;
	int rc;
	if ((rc = kv_io_read_file(tpath, MAX_REQUEST, &src, &len)) || (rc = load_json(cpath, &ctx)))
		goto done;
	if (!json_is_object(ctx)) {
		rc = kv_fail(KV_ERR_INVALID, "%s: the context must be a JSON object", cpath);
		goto done;
	}
	if ((rc = kv_tmpl_compile(src, len, tpath, &t)) || (rc = kv_tmpl_render(t, ctx, &out, &olen)))
		goto done;
	rc = write_out(out, olen);
done:
	free(src);
	free(out);
	json_decref(ctx);
	kv_tmpl_free(t);
	return rc;
}

static int run_batch(const char *path, struct tok_cache *tc);
static int render_main(const char *model, const char *request, const char *tfile, const char *ctxfile, int no_gen,
		       int json_out, int tokens, int no_bound, int timing, struct tok_cache *tc);

static void add_ints(struct kv_buf *b, const int32_t *v, size_t n)
{
	kv_buf_addc(b, '[');
	for (size_t i = 0; i < n; i++)
		kv_buf_printf(b, i ? ",%d" : "%d", v[i]);
	kv_buf_addc(b, ']');
}

static int render_one(int argc, char **argv, struct tok_cache *tc)
{
	const char *model = NULL, *request = NULL, *tfile = NULL, *ctxfile = NULL, *batch = NULL, *outfile = NULL;
	int no_gen = 0, json_out = 0, tokens = 0, no_bound = 0, timing = 0, req_specials = 0;
	int64_t max_b = 0;
	const char *history = "keep";
	struct kv_flag flags[] = {
		{"model", KV_FLAG_STR, &model, "DIR", "model folder (tokenizer.json, tokenizer_config.json)"},
		{"request", KV_FLAG_STR, &request, "FILE", "OpenAI chat request body, JSON ('-' = stdin)"},
		{"no-generation-prompt", KV_FLAG_BOOL, &no_gen, NULL, "render without the assistant prompt"},
		{"json", KV_FLAG_BOOL, &json_out, NULL, "print {text, n_tokens, boundaries, ...} as JSON"},
		{"tokens", KV_FLAG_BOOL, &tokens, NULL, "with --json: include the token ids"},
		{"no-boundaries", KV_FLAG_BOOL, &no_bound, NULL, "skip the message boundary search"},
		{"max-boundaries", KV_FLAG_INT, &max_b, "N", "search only the last N message ends (default 0: all)"},
		{"special-tokens-in-request", KV_FLAG_BOOL, &req_specials, NULL,
		 "special-token literals in the request become control tokens (Hugging Face; default: plain text)"},
		{"reasoning-history", KV_FLAG_STR, &history, "keep|template",
		 "keep (the server's default): every user turn rendered as when it was the newest, so earlier reasoning "
		 "stays; template: the template's own text"},
		{"template", KV_FLAG_STR, &tfile, "FILE", "use this Jinja template instead of the model's"},
		{"context", KV_FLAG_STR, &ctxfile, "FILE", "raw mode: render --template with this JSON object"},
		{"time", KV_FLAG_BOOL, &timing, NULL, "print the render time to stderr"},
		{"batch", KV_FLAG_STR, &batch, "FILE", "run every line of FILE as the flags of one render (needs --out)"},
		{"out", KV_FLAG_STR, &outfile, "FILE", "write the output to FILE instead of stdout"},
		{NULL},
	};
	const char *usage = "usage: kvkeep render --model DIR --request FILE.json [--no-generation-prompt] [--json]\n"
			    "       kvkeep render --template FILE --context CTX.json";
	int pr = kv_flags_parse(usage, flags, argc, argv, NULL, 0, NULL);
	if (pr)
		return pr == 1 ? 0 : 2;
	if (batch) {
		if (tc->tok || tc->model[0] || argc != 3) {
			fprintf(stderr, "kvkeep: --batch takes no other flags (and batch lines cannot nest)\n");
			return 2;
		}
		return run_batch(batch, tc);
	}
	if (outfile) {
		g_out = fopen(outfile, "wb");
		if (!g_out) {
			fprintf(stderr, "kvkeep: cannot create %s\n", outfile);
			return 1;
		}
	}
	if (max_b < 0 || max_b > 1000000) {
		fprintf(stderr, "kvkeep: --max-boundaries wants 0..1000000\n");
		return 2;
	}
	if (strcmp(history, "keep") && strcmp(history, "template")) {
		fprintf(stderr, "kvkeep: --reasoning-history wants keep or template\n");
		return 2;
	}
	g_max_b = (int)max_b;
	g_req_specials = req_specials;
	g_keep = !strcmp(history, "keep");
	int rc1 = render_main(model, request, tfile, ctxfile, no_gen, json_out, tokens, no_bound, timing, tc);
	if (g_out) {
		if (fclose(g_out) && !rc1) {
			fprintf(stderr, "kvkeep: write to %s failed\n", outfile);
			rc1 = 1;
		}
		g_out = NULL;
		if (rc1) {
			/* batch users tell a failure from an empty render by OUT.err */
			char ep[4200];
			snprintf(ep, sizeof ep, "%s.err", outfile);
			FILE *ef = fopen(ep, "w");
			if (ef) {
				fprintf(ef, "%s\n", kv_errmsg());
				fclose(ef);
			}
		}
	}
	return rc1;
}

static int render_main(const char *model, const char *request, const char *tfile, const char *ctxfile, int no_gen,
		       int json_out, int tokens, int no_bound, int timing, struct tok_cache *tc)
{
	if (ctxfile) {
		if (!tfile || model || request) {
			fprintf(stderr, "kvkeep: --context needs --template and no --model/--request\n");
			return 2;
		}
		if (render_raw(tfile, ctxfile)) {
			fprintf(stderr, "kvkeep: %s\n", kv_errmsg());
			return 1;
		}
		return 0;
	}
	if (!model || !request) {
		fprintf(stderr, "kvkeep: render needs --model and --request (see --help)\n");
		return 2;
	}

	struct kv_tok *tok = NULL;
	struct kv_chat *chat = NULL;
	json_t *req = NULL;
	char *tsrc = NULL;
	size_t tlen = 0;
	struct kv_chat_render r = {0};
	struct kv_buf o = KV_BUF_INIT;
	int rc;

	if (tc->tok && !strcmp(tc->model, model)) {
		tok = tc->tok;
	} else {
		kv_tok_free(tc->tok);
		tc->tok = NULL;
		if ((rc = kv_tok_load_model(model, &tok)))
			goto done;
		tc->tok = tok;
		snprintf(tc->model, sizeof tc->model, "%s", model);
	}
	if ((rc = kv_chat_load(model, tok, &chat)))
		goto done;
	if (tfile) {
		if ((rc = kv_io_read_file(tfile, MAX_REQUEST, &tsrc, &tlen)) ||
		    (rc = kv_chat_set_template(chat, tsrc, tlen, tfile)))
			goto done;
	}
	if ((rc = load_json(request, &req)))
		goto done;
	if (!json_is_object(req)) {
		rc = kv_fail(KV_ERR_INVALID, "%s: the request must be a JSON object", request);
		goto done;
	}
	json_t *kw = json_object_get(req, "chat_template_kwargs");
	if (kw && !json_is_null(kw) && !json_is_object(kw)) {
		rc = kv_fail(KV_ERR_INVALID, "%s: chat_template_kwargs must be an object", request);
		goto done;
	}
	json_t *et = kw ? json_object_get(kw, "enable_thinking") : NULL;
	struct kv_chat_opts opts = {
		.add_generation_prompt = !no_gen,
		.enable_thinking = json_is_boolean(et) ? json_is_true(et) : -1,
		.kwargs = json_is_object(kw) ? kw : NULL,
		.skip_boundaries = no_bound,
		.max_message_boundaries = g_max_b,
		.request_specials = g_req_specials,
		.keep_reasoning = g_keep,
	};
	uint64_t t0 = kv_now_ns();
	if ((rc = kv_chat_render(chat, json_object_get(req, "messages"), json_object_get(req, "tools"), &opts, &r)))
		goto done;
	uint64_t t1 = kv_now_ns();
	if (timing)
		fprintf(stderr, "kvkeep render: %.3f ms (%zu bytes, %zu tokens, %zu boundaries)\n", (double)(t1 - t0) / 1e6,
			r.text_len, r.n_tokens, r.n_boundaries);
	if (json_out) {
		json_t *text = json_stringn(r.text, r.text_len);
		char *enc = text ? json_dumps(text, JSON_ENCODE_ANY | JSON_ENSURE_ASCII) : NULL;
		json_decref(text);
		if (!enc) {
			rc = kv_fail(KV_ERR_NOMEM, "out of memory");
			goto done;
		}
		kv_buf_printf(&o, "{\"text\": %s, \"n_tokens\": %zu, \"boundaries\": ", enc, r.n_tokens);
		free(enc);
		add_ints(&o, r.boundaries, r.n_boundaries);
		kv_buf_adds(&o, ", \"boundary_bytes\": [");
		for (size_t i = 0; i < r.n_boundaries; i++)
			kv_buf_printf(&o, i ? ",%zu" : "%zu", r.boundary_bytes[i]);
		kv_buf_adds(&o, "], \"boundary_msgs\": [");
		for (size_t i = 0; i < r.n_boundaries; i++)
			kv_buf_printf(&o, i ? ",%u" : "%u", (unsigned)r.boundary_msgs[i]);
		kv_buf_printf(&o, "], \"first_is_system\": %s, \"first_from_probe\": %s", r.first_is_system ? "true" : "false",
			      r.first_from_probe ? "true" : "false");
		if (tokens) {
			kv_buf_adds(&o, ", \"tokens\": ");
			add_ints(&o, r.tokens, r.n_tokens);
		}
		kv_buf_adds(&o, "}\n");
		if (o.oom) {
			rc = kv_fail(KV_ERR_NOMEM, "out of memory");
			goto done;
		}
		rc = write_out(o.p, o.len);
	} else {
		rc = write_out(r.text, r.text_len);
		if (!rc) {
			kv_buf_printf(&o, "kvkeep render: %zu tokens, boundaries: ", r.n_tokens);
			for (size_t i = 0; i < r.n_boundaries; i++)
				kv_buf_printf(&o, i ? ",%d" : "%d", r.boundaries[i]);
			kv_buf_printf(&o, "%s\n", r.n_boundaries && r.first_is_system ? " (first ends system + tools)" : "");
			fputs(o.p ? o.p : "", stderr);
		}
	}
done:
	if (rc)
		fprintf(stderr, "kvkeep: %s\n", kv_errmsg());
	kv_buf_free(&o);
	kv_chat_render_free(&r);
	json_decref(req);
	free(tsrc);
	kv_chat_free(chat);
	return rc ? 1 : 0;
}

/* --batch: each line is the flags of one render, split at whitespace
 * (paths with spaces are not supported); '#' lines are comments. Every
 * line must name its --out. The status is the worst line's. */
static int run_batch(const char *path, struct tok_cache *tc)
{
	char *buf;
	size_t len;
	int worst = 0;
	if (kv_io_read_file(path, MAX_REQUEST, &buf, &len)) {
		fprintf(stderr, "kvkeep: %s\n", kv_errmsg());
		return 1;
	}
	char *save = NULL;
	for (char *line = strtok_r(buf, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		char *av[64], *s2 = NULL;
		int ac = 0, has_out = 0;
		av[ac++] = "render";
		for (char *w = strtok_r(line, " \t", &s2); w && ac < 63; w = strtok_r(NULL, " \t", &s2)) {
			has_out |= !strcmp(w, "--out");
			av[ac++] = w;
		}
		av[ac] = NULL;
		if (ac == 1 || av[1][0] == '#')
			continue;
		if (!has_out) {
			fprintf(stderr, "kvkeep: %s: every batch line needs --out\n", path);
			worst = 2;
			continue;
		}
		int r = render_one(ac, av, tc);
		if (r > worst)
			worst = r;
	}
	free(buf);
	return worst;
}

static int cmd_render(int argc, char **argv)
{
	struct tok_cache tc = {{0}, NULL};
	int rc = render_one(argc, argv, &tc);
	kv_tok_free(tc.tok);
	return rc;
}
KV_COMMAND(render, "render", "render a chat request with the model's chat template", cmd_render);
