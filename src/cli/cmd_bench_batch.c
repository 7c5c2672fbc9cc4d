/*
 * cmd_bench_batch.c - `kvkeep bench batch`: what continuous batching buys
 * on a model folder, through the server's own scheduler (session/sched.h)
 * without HTTP. A benchmark, not a test: it asserts nothing.
 *
 *   kvkeep bench batch --model DIR [--json] [--concurrency 1,2,4,8]
 *       [--context N] [--decode-tokens N] [--long-tokens N] [--shorts N] [--repeat N] [--profile]
 *
 * Measured in one run:
 *   decode   for each concurrency c: c threads, each with its own
 *            sequence, prefill --context random tokens, wait for each
 *            other, then decode --decode-tokens greedy steps through one
 *            scheduler (max_running c). Aggregate tokens/s = c x decode
 *            tokens / wall time of the decode phase. The concurrencies
 *            alternate --repeat times (1,2,4,8,1,2,4,8,...) and the median
 *            of each is reported; "speedup" is that over the c = 1 median.
 *            --profile: the engine's phase timers (engine/prof.h) during
 *            the decode phases, per step: GEMM, attention, DeltaNet (conv,
 *            gates and delta rule), the rest of the forward.
 *   ttft     one request prefills --long-tokens cold tokens (prefill
 *            chunk 256) while --shorts short requests (64-token prompt, 1
 *            generated token) arrive one after another; time to first
 *            token of each short one: p50 / p99 / max, next to the long
 *            prefill's own time (without batching every short request
 *            would wait for all of it).
 * Ratios within one run are what to compare; absolute figures depend on
 * how loaded the machine is.
 */
#include "base/clock.h"
#include "base/env.h"
#include "base/err.h"
#include "cli/cli.h"
#include "engine/model.h"
#include "engine/prof.h"
#include "engine/sample.h"
#include "engine/seq.h"
#include "session/sched.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_C 64

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

struct dec_arg {
	struct kss_sched *s;
	struct ke_model *m;
	pthread_barrier_t *bar;
	int context, n_decode, idx;
	uint64_t t_end;
	int rc;
};

static void *dec_main(void *p)
{
	struct dec_arg *a = p;
	int V = ke_model_config(a->m)->vocab, chunk = kss_sched_chunk(a->s);
	struct ke_seq *seq = NULL;
	struct ke_seq_params sp = {.chunk = 1};
	float *lg = malloc((size_t)V * sizeof *lg);
	int32_t *tok = malloc((size_t)a->context * sizeof *tok);
	uint64_t x = 0x9e3779b97f4a7c15ull * (uint64_t)(a->idx + 1);
	a->rc = !lg || !tok ? KV_ERR_NOMEM : ke_seq_create(a->m, &sp, &seq);
	for (int i = 0; tok && i < a->context; i++) {
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		tok[i] = (int32_t)(x % (uint64_t)(V > 1000 ? 1000 : V));
	}
	for (int at = 0; !a->rc && at < a->context; at += chunk) {
		int n = a->context - at < chunk ? a->context - at : chunk;
		a->rc = kss_sched_forward(a->s, seq, tok + at, n, lg);
	}
	pthread_barrier_wait(a->bar);
	kss_sched_join(a->s);
	for (int i = 0; !a->rc && i < a->n_decode; i++) {
		int32_t t = ke_argmax(lg, V);
		a->rc = kss_sched_forward(a->s, seq, &t, 1, lg);
	}
	kss_sched_leave(a->s);
	a->t_end = kv_now_ns();
	ke_seq_destroy(seq);
	free(lg);
	free(tok);
	return NULL;
}

/* Per decode step, ms: GEMM, attention, DeltaNet, the rest of the forward. */
struct phase_ms {
	double gemm, attn, dn, other;
};

/* Aggregate decode tokens/s of c sequences; < 0 on failure. With ph, the
 * engine's phase timers (engine/prof.h) run during the decode phase. */
static double decode_rate(struct ke_model *m, int c, int context, int n_decode, double *step_ms, struct phase_ms *ph)
{
	struct kss_sched *s = NULL;
	struct kss_sched_params p = {.model = m, .max_running = c};
	if (kss_sched_create(&p, &s))
		return -1;
	pthread_barrier_t bar;
	pthread_barrier_init(&bar, NULL, (unsigned)c + 1);
	struct dec_arg a[MAX_C];
	pthread_t th[MAX_C];
	for (int i = 0; i < c; i++) {
		a[i] = (struct dec_arg){.s = s, .m = m, .bar = &bar, .context = context, .n_decode = n_decode, .idx = i};
		pthread_create(&th[i], NULL, dec_main, &a[i]);
	}
	pthread_barrier_wait(&bar);
	struct kss_sched_stats st0, st1;
	struct ke_prof pf0, pf1;
	if (ph)
		ke_prof_enable(1);
	ke_prof_get(&pf0);
	kss_sched_stats(s, &st0);
	uint64_t t0 = kv_now_ns(), t1 = t0;
	int bad = 0;
	for (int i = 0; i < c; i++) {
		pthread_join(th[i], NULL);
		bad |= a[i].rc != KV_OK;
		if (a[i].t_end > t1)
			t1 = a[i].t_end;
	}
	kss_sched_stats(s, &st1);
	ke_prof_get(&pf1);
	if (ph) {
		ke_prof_enable(0);
		double ns = st1.steps > st0.steps ? (double)(st1.steps - st0.steps) : 1;
		ph->gemm = (pf1.sec[KE_PROF_GEMM] - pf0.sec[KE_PROF_GEMM]) * 1e3 / ns;
		ph->attn = (pf1.sec[KE_PROF_ATTN] - pf0.sec[KE_PROF_ATTN]) * 1e3 / ns;
		ph->dn = (pf1.sec[KE_PROF_DN] - pf0.sec[KE_PROF_DN]) * 1e3 / ns;
		ph->other = (pf1.sec[KE_PROF_FWD] - pf0.sec[KE_PROF_FWD]) * 1e3 / ns - ph->gemm - ph->attn - ph->dn;
	}
	*step_ms = st1.steps > st0.steps ? (st1.step_s - st0.step_s) * 1e3 / (double)(st1.steps - st0.steps) : 0;
	if (kv_env(KV_ENV_BENCH_BATCH_DEBUG))
		fprintf(stderr, "c=%d steps=%llu mean_batch=%.2f step_ms=%.2f wall_ms_per_step=%.2f\n", c,
			(unsigned long long)(st1.steps - st0.steps),
			st1.steps > st0.steps ? (double)(st1.items - st0.items) / (double)(st1.steps - st0.steps) : 0, *step_ms,
			st1.steps > st0.steps ? (double)(t1 - t0) / 1e6 / (double)(st1.steps - st0.steps) : 0);
	pthread_barrier_destroy(&bar);
	kss_sched_destroy(s);
	return bad ? -1 : (double)c * n_decode / ((double)(t1 - t0) / 1e9);
}

struct long_arg {
	struct kss_sched *s;
	struct ke_model *m;
	int n;
	double seconds;
	volatile int done;
	int rc;
};

/* One prefill of n tokens, chunk by chunk, and its first token. */
static int prefill_one(struct kss_sched *s, struct ke_model *m, int n, uint64_t seed)
{
	int V = ke_model_config(m)->vocab, chunk = kss_sched_chunk(s), rc;
	struct ke_seq *seq = NULL;
	struct ke_seq_params sp = {.chunk = 1};
	float *lg = malloc((size_t)V * sizeof *lg);
	int32_t *tok = malloc((size_t)n * sizeof *tok);
	rc = !lg || !tok ? KV_ERR_NOMEM : ke_seq_create(m, &sp, &seq);
	for (int i = 0; tok && i < n; i++) {
		seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
		tok[i] = (int32_t)(seed % (uint64_t)(V > 1000 ? 1000 : V));
	}
	if (!rc)
		kss_sched_join(s);
	for (int at = 0; !rc && at < n; at += chunk)
		rc = kss_sched_forward(s, seq, tok + at, n - at < chunk ? n - at : chunk, lg);
	if (seq)
		kss_sched_leave(s);
	ke_seq_destroy(seq);
	free(lg);
	free(tok);
	return rc;
}

static void *long_main(void *p)
{
	struct long_arg *a = p;
	uint64_t t0 = kv_now_ns();
	a->rc = prefill_one(a->s, a->m, a->n, 12345);
	a->seconds = (double)(kv_now_ns() - t0) / 1e9;
	a->done = 1;
	return NULL;
}

static double pct(const double *v, int n, double q)
{
	if (n <= 0)
		return NAN;
	int i = (int)ceil(q * n) - 1;
	return v[i < 0 ? 0 : i >= n ? n - 1 : i];
}

static int cmd_bench_batch(int argc, char **argv)
{
	const char *model = NULL, *conc = "1,2,4,8";
	int64_t context = 256, n_decode = 64, long_tokens = 8192, shorts = 20, repeat = 3;
	int json = 0, profile = 0;
	struct kv_flag flags[] = {
		{"model", KV_FLAG_STR, &model, "DIR", "model folder"},
		{"json", KV_FLAG_BOOL, &json, NULL, "print one JSON object"},
		{"concurrency", KV_FLAG_STR, &conc, "LIST", "sequences decoding together (default 1,2,4,8)"},
		{"context", KV_FLAG_INT, &context, "N", "prompt tokens of each decoding sequence (default 256)"},
		{"decode-tokens", KV_FLAG_INT, &n_decode, "N", "decode steps timed per sequence (default 64)"},
		{"long-tokens", KV_FLAG_INT, &long_tokens, "N", "tokens of the long cold prefill (default 8192)"},
		{"shorts", KV_FLAG_INT, &shorts, "N", "short requests during it (default 20; 0 skips the measurement)"},
		{"profile", KV_FLAG_BOOL, &profile, NULL, "time the engine phases of a decode step (GEMM, attention, DeltaNet, rest)"},
		{"repeat", KV_FLAG_INT, &repeat, "N", "alternating repetitions of the decode measurement, median kept (default 3)"},
		{0},
	};
	const char *usage = "usage: kvkeep bench batch --model DIR [--json] [--concurrency 1,2,4,8]";
	int rc = kv_flags_parse(usage, flags, argc, argv, NULL, 0, NULL);
	if (rc == 1)
		return 0;
	if (rc)
		return 2;
	int32_t *cl = NULL;
	size_t ncl = 0;
	if (!model || kv_parse_int_list(conc, &cl, &ncl) || !ncl || ncl > 16 || context < 1 || context > 100000 ||
	    n_decode < 1 || n_decode > 100000 || long_tokens < 1 || long_tokens > 1000000 || shorts < 0 || shorts > 10000 || repeat < 1 ||
	    repeat > 100) {
		fprintf(stderr, "kvkeep bench batch: --model is required; see --help for the ranges\n");
		free(cl);
		return 2;
	}
	for (size_t i = 0; i < ncl; i++)
		if (cl[i] < 1 || cl[i] > MAX_C) {
			fprintf(stderr, "kvkeep bench batch: concurrency %d is not in [1, %d]\n", cl[i], MAX_C);
			free(cl);
			return 2;
		}
	struct ke_model *m = NULL;
	if (ke_model_load(model, NULL, &m)) {
		fprintf(stderr, "kvkeep: %s\n", kv_errmsg());
		free(cl);
		return 1;
	}
	double rate[16], step[16], base = 0;
	int status = 0;
	if (!json)
		printf("%-12s %14s %9s %12s\n", "concurrency", "decode tok/s", "speedup", "step ms");
	double reps[16][100], sreps[16][100];
	struct phase_ms ph[16] = {0};
	for (int r = 0; r < (int)repeat; r++)
		for (size_t i = 0; i < ncl; i++) {
			struct phase_ms one;
			reps[i][r] = decode_rate(m, cl[i], (int)context, (int)n_decode, &sreps[i][r], profile ? &one : NULL);
			if (profile) { /* the mean over the repetitions */
				ph[i].gemm += one.gemm / (double)repeat;
				ph[i].attn += one.attn / (double)repeat;
				ph[i].dn += one.dn / (double)repeat;
				ph[i].other += one.other / (double)repeat;
			}
			if (reps[i][r] < 0) {
				fprintf(stderr, "kvkeep bench batch: concurrency %d failed: %s\n", cl[i], kv_errmsg());
				status = 1;
				goto out;
			}
		}
	for (size_t i = 0; i < ncl; i++) {
		qsort(reps[i], (size_t)repeat, sizeof reps[i][0], cmp_d);
		qsort(sreps[i], (size_t)repeat, sizeof sreps[i][0], cmp_d);
		rate[i] = reps[i][repeat / 2];
		step[i] = sreps[i][repeat / 2];
		if (cl[i] == 1)
			base = rate[i];
	}
	for (size_t i = 0; i < ncl && !json; i++) {
		if (base > 0) /* no c = 1 in the list: nothing to compare with */
			printf("%-12d %14.1f %8.2fx %12.2f\n", cl[i], rate[i], rate[i] / base, step[i]);
		else
			printf("%-12d %14.1f %9s %12.2f\n", cl[i], rate[i], "-", step[i]);
	}
	if (profile && !json) {
		printf("\nper decode step, ms (mean of the repetitions, timers on):\n%-12s %9s %9s %9s %9s\n",
		       "concurrency", "gemm", "attn", "deltanet", "other");
		for (size_t i = 0; i < ncl; i++)
			printf("%-12d %9.2f %9.2f %9.2f %9.2f\n", cl[i], ph[i].gemm, ph[i].attn, ph[i].dn, ph[i].other);
	}

	/* TTFT of short requests while a long cold prefill runs */
	double *tt = shorts ? calloc((size_t)shorts, sizeof *tt) : NULL;
	int n_tt = 0;
	struct long_arg la = {.m = m, .n = (int)long_tokens};
	if (shorts) {
		struct kss_sched_params p = {.model = m, .max_running = 4};
		if (!tt || kss_sched_create(&p, &la.s)) {
			fprintf(stderr, "kvkeep bench batch: %s\n", kv_errmsg());
			free(tt);
			status = 1;
			goto out;
		}
		pthread_t th;
		pthread_create(&th, NULL, long_main, &la);
		kv_sleep_ms(5);
		for (int k = 0; k < shorts && !la.done; k++) {
			uint64_t t0 = kv_now_ns();
			if (prefill_one(la.s, m, 64, 777 + (uint64_t)k) == KV_OK)
				tt[n_tt++] = (double)(kv_now_ns() - t0) / 1e9;
		}
		pthread_join(th, NULL);
		kss_sched_destroy(la.s);
		qsort(tt, (size_t)n_tt, sizeof *tt, cmp_d);
		if (!json)
			printf("\nlong cold prefill of %lld tokens: %.2f s; %d short requests (64 tokens) during it: "
			       "ttft p50 %.1f ms, p99 %.1f ms, max %.1f ms\n",
			       (long long)long_tokens, la.seconds, n_tt, pct(tt, n_tt, 0.5) * 1e3, pct(tt, n_tt, 0.99) * 1e3,
			       n_tt ? tt[n_tt - 1] * 1e3 : NAN);
	}
	if (json) {
		printf("{\"decode\":[");
		for (size_t i = 0; i < ncl; i++)
		{
			printf("%s{\"concurrency\":%d,\"tokens_per_s\":%.2f,\"speedup\":%.3f,\"step_ms\":%.3f", i ? "," : "",
			       cl[i], rate[i], base > 0 ? rate[i] / base : 0.0, step[i]);
			if (profile)
				printf(",\"phases_ms\":{\"gemm\":%.3f,\"attn\":%.3f,\"deltanet\":%.3f,\"other\":%.3f}", ph[i].gemm,
				       ph[i].attn, ph[i].dn, ph[i].other);
			printf("}");
		}
		printf("]");
		if (shorts)
			printf(",\"ttft\":{\"long_tokens\":%lld,\"long_prefill_s\":%.3f,\"shorts\":%d,\"p50_ms\":%.2f,"
			       "\"p99_ms\":%.2f,\"max_ms\":%.2f}",
			       (long long)long_tokens, la.seconds, n_tt, n_tt ? pct(tt, n_tt, 0.5) * 1e3 : 0.0,
			       n_tt ? pct(tt, n_tt, 0.99) * 1e3 : 0.0, n_tt ? tt[n_tt - 1] * 1e3 : 0.0);
		printf("}\n");
	}
	free(tt);
out:
	ke_model_destroy(m);
	free(cl);
	return status;
}

KV_COMMAND(bench_batch, "bench batch", "continuous batching: decode tok/s at 1..N sequences, TTFT during a long prefill",
	   cmd_bench_batch);
