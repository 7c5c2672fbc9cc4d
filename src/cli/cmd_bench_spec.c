/*
 * cmd_bench_spec.c - `kvkeep bench spec`: what speculative decoding buys
 * on coding-agent transcripts. A benchmark, not a test: it asserts nothing
 * (tests/unit/test_spec.c holds the identity).
 *
 *   kvkeep bench spec --model M [--transcripts DIR] [--only a,b] [--repeat N]
 *       [--mode lookup|mtp|auto] [--draft N] [--answer-tokens N] [--json]
 *
 * A transcript (bench/spec/NAME.json: "messages", the conversation up to
 * the answer, and "answer", the assistant's text) is rendered with the
 * model's chat template; the model is then forced to produce the answer's
 * tokens (session/run.h `forced`), once decoding plainly and once with
 * speculative decoding. Forced, a draft token is kept exactly when it is
 * the transcript's next token, so the acceptance is what a model that
 * wrote that answer would get, and the time is the real cost of the
 * verifications (the forwards, the rollbacks, the MTP head's drafting).
 * Each run goes through the server's scheduler (session/sched.h, one
 * running sequence) and a prefix cache, so after the first run the prompt
 * resumes from the cache and only the decode is timed (decode_ms of
 * kss_run). The two modes alternate, --repeat times (off-on, on-off, ...);
 * medians and the spread of the per-repetition ratio are reported.
 */
#include "base/clock.h"
#include "base/err.h"
#include "base/io.h"
#include "base/json.h"
#include "cache/cache.h"
#include "cache/storage_policy.h"
#include "cli/cli.h"
#include "engine/model.h"
#include "engine/seq.h"
#include "session/run.h"
#include "session/sched.h"
#include "session/spec.h"
#include "text/template.h"
#include "text/tokenizer.h"

#include <dirent.h>
#include <time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_TR 32
#define MAX_REP 64

struct tr {
	char name[64];
	int32_t *prompt;          /* rendered prompt (owned) */
	uint32_t n;
	uint32_t *bounds;         /* message boundaries (owned) */
	size_t n_bounds;
	int32_t *answer;          /* the forced tokens (owned) */
	uint32_t n_answer;
	double off[MAX_REP], on[MAX_REP], ratio[MAX_REP]; /* decode tok/s, on / off */
	double cpu_ratio[MAX_REP];   /* process CPU time of a run, off / on (KVKEEP_THREADS=1: load-proof) */
	struct kss_run_spec sp;   /* summed over the speculative runs */
	double off_step_ms;       /* mean plain decode forward, ms (last off run) */
};

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static double median(const double *v, int n)
{
	double t[MAX_REP];
	memcpy(t, v, (size_t)n * sizeof *t);
	qsort(t, (size_t)n, sizeof *t, cmp_d);
	return n % 2 ? t[n / 2] : (t[n / 2 - 1] + t[n / 2]) / 2;
}

static double vmin(const double *v, int n)
{
	double m = v[0];
	for (int i = 1; i < n; i++)
		m = v[i] < m ? v[i] : m;
	return m;
}

static double vmax(const double *v, int n)
{
	double m = v[0];
	for (int i = 1; i < n; i++)
		m = v[i] > m ? v[i] : m;
	return m;
}

static void tr_free(struct tr *t)
{
	free(t->prompt);
	free(t->bounds);
	free(t->answer);
}

/* Read and render one transcript file. */
static int load_tr(const struct kv_chat *chat, const struct kv_tok *tok, const char *path, struct tr *t)
{
	char *text = NULL;
	size_t len = 0;
	json_t *j = NULL;
	int rc;
	memset(t, 0, sizeof *t);
	if ((rc = kv_io_read_file(path, 16u << 20, &text, &len)))
		return rc;
	rc = kv_json_parse(path, text, len, KV_JSON_MAX_DEPTH, &j);
	free(text);
	if (rc)
		return rc;
	const char *name = json_string_value(json_object_get(j, "name")), *ans = json_string_value(json_object_get(j, "answer"));
	json_t *msgs = json_object_get(j, "messages");
	if (!name || !ans || !json_is_array(msgs)) {
		json_decref(j);
		return kv_fail(KV_ERR_INVALID, "%s: a transcript needs \"name\", \"messages\" and \"answer\"", path);
	}
	snprintf(t->name, sizeof t->name, "%s", name);
	struct kv_chat_opts o = {.add_generation_prompt = 1, .enable_thinking = 0};
	struct kv_chat_render r;
	size_t na = 0;
	int32_t *ids = NULL;
	if ((rc = kv_chat_render(chat, msgs, NULL, &o, &r))) {
		json_decref(j);
		return kv_fail_ctx(rc, "%s", path);
	}
	rc = kv_tok_encode(tok, ans, strlen(ans), 1, &ids, &na);
	json_decref(j);
	t->prompt = malloc(r.n_tokens * sizeof *t->prompt);
	t->bounds = malloc((r.n_boundaries + 1) * sizeof *t->bounds);
	if (rc || !t->prompt || !t->bounds || !na) {
		kv_chat_render_free(&r);
		free(ids);
		tr_free(t);
		return rc ? rc : kv_fail(KV_ERR_NOMEM, "%s: out of memory, or an empty answer", path);
	}
	memcpy(t->prompt, r.tokens, r.n_tokens * sizeof *t->prompt);
	t->n = (uint32_t)r.n_tokens;
	for (size_t i = 0; i < r.n_boundaries; i++)
		if (r.boundaries[i] > 0 && (uint32_t)r.boundaries[i] < t->n)
			t->bounds[t->n_bounds++] = (uint32_t)r.boundaries[i];
	kv_chat_render_free(&r);
	t->answer = ids;
	t->n_answer = (uint32_t)na;
	return KV_OK;
}

/* One forced run; decode tokens/s (< 0 on failure). */
static double ms_now(void);

static double run_once(struct kc_cache *c, struct ke_model *m, struct kss_sched *s, const struct tr *t, int mode,
		       int draft, struct kss_run_spec *sp, double *step_ms, double *cpu_ms)
{
	struct kss_run_params p = {.prompt = t->prompt, .n = t->n, .bounds = t->bounds, .n_bounds = t->n_bounds,
				   .max_new = t->n_answer, .forced = t->answer, .sched = s, .speculative = mode,
				   .spec_max_draft = draft};
	struct kss_run_result r;
	double c0 = ms_now();
	int rc = kss_run(c, m, &p, &r);
	if (cpu_ms)
		*cpu_ms = ms_now() - c0;
	if (rc) {
		fprintf(stderr, "kvkeep bench spec: %s: %s\n", t->name, kv_errmsg());
		return -1;
	}
	if (sp) {
		sp->steps += r.spec.steps;
		sp->plain += r.spec.plain;
		sp->mtp_ms += r.spec.mtp_ms;
		for (int k = 0; k < 2; k++) {
			sp->drafted[k] += r.spec.drafted[k];
			sp->accepted[k] += r.spec.accepted[k];
		}
	}
	if (step_ms)
		*step_ms = r.generated > 1 ? r.decode_ms / (r.generated - 1) : 0;
	return r.decode_ms > 0 ? r.generated / (r.decode_ms / 1e3) : 0;
}

static int list_dir(const char *dir, const char *only, char (*paths)[4096], int cap)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	int n = 0;
	if (!d)
		return kv_fail(KV_ERR_NOT_FOUND, "cannot open %s", dir), -1;
	while ((e = readdir(d)) && n < cap) {
		size_t l = strlen(e->d_name);
		if (l < 6 || strcmp(e->d_name + l - 5, ".json"))
			continue;
		if (only) {
			char stem[256];
			snprintf(stem, sizeof stem, ",%.*s,", (int)(l - 5), e->d_name);
			char o[1024];
			snprintf(o, sizeof o, ",%s,", only);
			if (!strstr(o, stem))
				continue;
		}
		if (kv_path_fmt(paths[n], sizeof paths[n], "%s/%s", dir, e->d_name) == KV_OK)
			n++;
	}
	closedir(d);
	/* a stable order: by name */
	qsort(paths, (size_t)n, sizeof *paths, (int (*)(const void *, const void *))strcmp);
	return n;
}

static void report(const struct tr *t, int reps, int mode, int json, int last)
{
	double mo = median(t->off, reps), mn = median(t->on, reps), r = median(t->ratio, reps);
	uint64_t d = (uint64_t)t->sp.drafted[0] + t->sp.drafted[1], a = (uint64_t)t->sp.accepted[0] + t->sp.accepted[1];
	double acc = d ? (double)a / (double)d : 0, mean_draft = t->sp.steps ? (double)d / t->sp.steps : 0;
	double mtp_per = t->sp.drafted[1] ? t->sp.mtp_ms / t->sp.drafted[1] : 0;
	if (json) {
		printf("  {\"name\": \"%s\", \"prompt_tokens\": %u, \"answer_tokens\": %u, \"mode\": \"%s\", \"repeat\": %d, "
		       "\"off_tok_s\": %.2f, \"on_tok_s\": %.2f, \"speedup\": %.3f, \"speedup_min\": %.3f, "
		       "\"speedup_max\": %.3f, \"acceptance\": %.3f, \"acceptance_lookup\": %.3f, \"acceptance_mtp\": %.3f, "
		       "\"drafted\": %llu, \"accepted\": %llu, \"mean_draft\": %.2f, \"verifications\": %u, "
		       "\"plain_steps\": %u, \"plain_step_ms\": %.3f, \"mtp_ms_per_draft_token\": %.3f, "
		       "\"cpu_speedup\": %.3f, \"cpu_speedup_min\": %.3f, \"cpu_speedup_max\": %.3f}%s\n",
		       t->name, t->n, t->n_answer, kss_spec_mode_name(mode), reps, mo, mn, r, vmin(t->ratio, reps),
		       vmax(t->ratio, reps), acc, t->sp.drafted[0] ? (double)t->sp.accepted[0] / t->sp.drafted[0] : 0,
		       t->sp.drafted[1] ? (double)t->sp.accepted[1] / t->sp.drafted[1] : 0, (unsigned long long)d,
		       (unsigned long long)a, mean_draft, t->sp.steps, t->sp.plain, t->off_step_ms, mtp_per,
		       median(t->cpu_ratio, reps), vmin(t->cpu_ratio, reps), vmax(t->cpu_ratio, reps), last ? "" : ",");
		return;
	}
	printf("%-14s %6u %6u %9.1f %9.1f %6.2fx [%4.2f-%4.2f] %5.2fx [%4.2f-%4.2f] %5.1f%% %5.1f%% %5.1f%% %6.2f %6.3f\n",
	       t->name, t->n, t->n_answer, mo, mn, r, vmin(t->ratio, reps), vmax(t->ratio, reps),
	       median(t->cpu_ratio, reps), vmin(t->cpu_ratio, reps), vmax(t->cpu_ratio, reps), 100 * acc,
	       t->sp.drafted[0] ? 100.0 * t->sp.accepted[0] / t->sp.drafted[0] : 0,
	       t->sp.drafted[1] ? 100.0 * t->sp.accepted[1] / t->sp.drafted[1] : 0, mean_draft, mtp_per);
}

/*
 * --rollback: what taking rows back costs on this model, against the
 * alternative of snapshots. A sequence at 512 tokens; per trial (medians
 * of 15): a decode step; a forward of R = draft + 1 rows plain and
 * speculative (the out-of-place recurrent layers' cost is their difference);
 * ke_seq_accept keeping 1 .. R - 1 rows (the replay); and what the
 * snapshot way would pay instead: a copy of the recurrent state before the
 * verification, a copy back, and a forward of the kept rows.
 */
/* CPU time of the process, ms: with KVKEEP_THREADS=1 the figure another
 * job's load does not inflate (docs/engine.md section 6). */
static double ms_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static int rollback_bench(struct ke_model *m, int R, const char *path)
{
	enum { TR = 15, P = 512 };
	const int V = ke_model_config(m)->vocab;
	struct ke_seq *s = NULL;
	struct ke_seq_params sp = {.chunk = 512};
	int32_t tok[P + 32];
	size_t sb = ke_model_layout(m)->snapshot_bytes;
	float *rows = malloc((size_t)(R + 1) * V * sizeof *rows), *lg = malloc((size_t)V * sizeof *lg);
	void *snap = sb ? malloc(sb) : NULL;
	double t1[TR], tp[TR], ts[TR], tcopy[TR], tacc[16][TR], tfwd[16][TR];
	uint64_t x = 7;
	for (int i = 0; i < P + 32; i++)
		tok[i] = (int32_t)((x = x * 6364136223846793005ull + 1) >> 33) % (V < 1000 ? V : 1000);
	if (!rows || !lg || (sb && !snap) || ke_seq_create(m, &sp, &s) || ke_seq_prefill(s, tok, P, NULL, lg))
		return kv_fail(KV_ERR_NOMEM, "bench spec --rollback: setup: %s", kv_errmsg());
	for (int t = 0; t < TR; t++) {
		double a = ms_now();
		ke_seq_decode(s, tok[t], lg);
		t1[t] = ms_now() - a;
		struct ke_prefill_opts po = {.logits_all = rows};
		a = ms_now();
		ke_seq_prefill(s, tok, R, &po, NULL);
		tp[t] = ms_now() - a;
		struct ke_prefill_opts os = {.logits_all = rows, .spec = 1};
		for (int keep = 1; keep < R; keep++) {
			a = ms_now();
			ke_seq_prefill(s, tok, R, &os, NULL);
			ts[t] = ms_now() - a;
			a = ms_now();
			ke_seq_accept(s, keep);
			tacc[keep][t] = ms_now() - a;
			/* the snapshot way: save, restore, forward the kept rows again */
			a = ms_now();
			if (sb) {
				ke_seq_snapshot(s, snap, sb);
				memcpy(rows, snap, sb < (size_t)V * 4 ? sb : (size_t)V * 4); /* touch, like a restore */
				ke_seq_snapshot(s, snap, sb);
			}
			tcopy[t] = ms_now() - a;
			a = ms_now();
			ke_seq_prefill(s, tok, keep, NULL, lg);
			tfwd[keep][t] = ms_now() - a;
		}
	}
	printf("rollback on %s, %d rows per verification, medians of %d (CPU ms of the process):\n", path, R, TR);
	printf("  decode step %.3f; forward of %d rows %.3f plain, %.3f speculative (out-of-place recurrent state)\n",
	       median(t1, TR), R, median(tp, TR), median(ts, TR));
	printf("  recurrent state %.1f MiB: two copies (save + restore) %.3f\n", (double)sb / 1048576.0, median(tcopy, TR));
	printf("  keep  accept(replay)  snapshot way (copies + forward of the kept rows)\n");
	for (int keep = 1; keep < R; keep++)
		printf("  %4d  %13.3f  %.3f\n", keep, median(tacc[keep], TR), median(tcopy, TR) + median(tfwd[keep], TR));
	free(rows);
	free(lg);
	free(snap);
	ke_seq_destroy(s);
	return KV_OK;
}

static int cmd_bench_spec(int argc, char **argv)
{
	const char *model = NULL, *dir = "bench/spec", *only = NULL, *mode_s = "auto", *quant_act = "q8";
	int64_t repeat = 3, draft = 8, answer_max = 0;
	int json = 0, status = 1, n_tr = 0, rollback = 0;
	struct kv_flag flags[] = {
		{"model", KV_FLAG_STR, &model, "DIR", "model folder or GGUF file (with a tokenizer and chat template)"},
		{"transcripts", KV_FLAG_STR, &dir, "DIR", "folder of transcript .json files (default bench/spec)"},
		{"only", KV_FLAG_STR, &only, "a,b", "only these transcripts (file names without .json)"},
		{"repeat", KV_FLAG_INT, &repeat, "N", "off / on pairs per transcript, alternating (default 3)"},
		{"mode", KV_FLAG_STR, &mode_s, "lookup|mtp|auto", "the speculative mode compared with off (default auto)"},
		{"draft", KV_FLAG_INT, &draft, "N", "longest draft a step verifies, 1-15 (default 8)"},
		{"answer-tokens", KV_FLAG_INT, &answer_max, "N",
		 "force only the first N tokens of each answer (0, the default: all; big models)"},
		{"quant-act", KV_FLAG_STR, &quant_act, "q8|f32", "as for serve (default q8)"},
		{"json", KV_FLAG_BOOL, &json, NULL, "one JSON object"},
		{"rollback", KV_FLAG_BOOL, &rollback, NULL,
		 "measure taking rows back (ke_seq_accept) against snapshots and recomputation instead"},
		{0},
	};
	const char *usage = "usage: kvkeep bench spec --model M [--transcripts DIR] [--only a,b] [--repeat N] "
			    "[--mode lookup|mtp|auto] [--draft N] [--answer-tokens N] [--json]";
	int rc = kv_flags_parse(usage, flags, argc, argv, NULL, 0, NULL);
	if (rc == 1)
		return 0;
	if (rc)
		return 2;
	int mode = kss_spec_mode_parse(mode_s), qa = ke_quant_act_parse(quant_act);
	if (!model || mode <= 0 || repeat < 1 || repeat > MAX_REP || draft < 1 || draft > KE_SPEC_MAX_ROWS - 1 || qa < 0 ||
	    answer_max < 0) {
		fprintf(stderr, "kvkeep bench spec: --model is required; --mode lookup|mtp|auto, --repeat 1-%d, --draft "
			"1-%d, --answer-tokens >= 0\n%s\n", MAX_REP, KE_SPEC_MAX_ROWS - 1, usage);
		return 2;
	}
	static char paths[MAX_TR][4096];
	static struct tr trs[MAX_TR];
	struct ke_model *m = NULL;
	struct kv_tok *tok = NULL;
	struct kv_chat *chat = NULL;
	struct kc_cache *c = NULL;
	struct kss_sched *s = NULL;
	struct ke_model_params mp = {.quant_act = qa};
	int n_paths = rollback ? 0 : list_dir(dir, only, paths, MAX_TR);
	if (!rollback && n_paths <= 0) {
		fprintf(stderr, "kvkeep bench spec: no transcripts in %s: %s\n", dir, n_paths < 0 ? kv_errmsg() : "none");
		return 1;
	}
	if (rollback) {
		if (ke_model_load(model, &mp, &m) || rollback_bench(m, (int)draft + 1, model))
			fprintf(stderr, "kvkeep bench spec: %s\n", kv_errmsg());
		else
			status = 0;
		goto out;
	}
	if (ke_model_load(model, &mp, &m) || kv_tok_load_model(model, &tok) || kv_chat_load(model, tok, &chat)) {
		fprintf(stderr, "kvkeep bench spec: %s\n", kv_errmsg());
		goto out;
	}
	if (mode == KSS_SPEC_MTP && !ke_model_has_mtp(m)) {
		fprintf(stderr, "kvkeep bench spec: --mode mtp: the model has no MTP head\n");
		goto out;
	}
	for (int i = 0; i < n_paths; i++) {
		if (load_tr(chat, tok, paths[i], &trs[n_tr])) {
			fprintf(stderr, "kvkeep bench spec: %s\n", kv_errmsg());
			goto out;
		}
		if (answer_max && trs[n_tr].n_answer > (uint64_t)answer_max)
			trs[n_tr].n_answer = (uint32_t)answer_max;
		n_tr++;
	}
	struct kc_policy pol;
	kc_policy_default(&pol, ke_layout_nontrim(ke_model_layout(m)));
	struct kc_params cp = {.layout = ke_model_layout(m), .policy = &pol, .ns = {0x5bec, 1}};
	struct kss_sched_params sp = {.model = m, .max_running = 1, .spec_rows = (int)draft + 1};
	if (kc_cache_create(&cp, &c) || kss_sched_create(&sp, &s)) {
		fprintf(stderr, "kvkeep bench spec: %s\n", kv_errmsg());
		goto out;
	}
	/* a first run of each prompt fills the cache: later runs time decode only */
	for (int i = 0; i < n_tr; i++)
		if (run_once(c, m, s, &trs[i], 0, (int)draft, NULL, NULL, NULL) < 0)
			goto out;
	for (int rep = 0; rep < repeat; rep++)
		for (int i = 0; i < n_tr; i++) {
			struct tr *t = &trs[i];
			double a, b, ca, cb;
			if (rep % 2 == 0) {
				a = run_once(c, m, s, t, 0, (int)draft, NULL, &t->off_step_ms, &ca);
				b = run_once(c, m, s, t, mode, (int)draft, &t->sp, NULL, &cb);
			} else {
				b = run_once(c, m, s, t, mode, (int)draft, &t->sp, NULL, &cb);
				a = run_once(c, m, s, t, 0, (int)draft, NULL, &t->off_step_ms, &ca);
			}
			if (a <= 0 || b <= 0)
				goto out;
			t->off[rep] = a;
			t->on[rep] = b;
			t->ratio[rep] = b / a;
			t->cpu_ratio[rep] = ca / cb;
		}
	if (json)
		printf("{\"model\": \"%s\", \"draft\": %d, \"transcripts\": [\n", model, (int)draft);
	else
		printf("transcript     prompt answer  off tok/s  on tok/s speedup [min-max]  cpu    [min-max]  accept lookup "
		       "   mtp  draft mtp ms/tok\n");
	for (int i = 0; i < n_tr; i++)
		report(&trs[i], (int)repeat, mode, json, i + 1 == n_tr);
	if (json)
		printf("]}\n");
	status = 0;
out:
	for (int i = 0; i < n_tr; i++)
		tr_free(&trs[i]);
	kss_sched_destroy(s);
	kc_cache_destroy(c);
	kv_chat_free(chat);
	kv_tok_free(tok);
	ke_model_destroy(m);
	return status;
}
KV_COMMAND(bench_spec, "bench spec", "speculative decoding on coding-agent transcripts: decode tok/s on vs off, acceptance",
	   cmd_bench_spec);
