/*
 * cmd_bench_engine.c - `kvkeep bench engine`: speed of the engine on a
 * model folder. A benchmark, not a test: it asserts nothing.
 *
 *   kvkeep bench engine --model DIR [--json] [--contexts 1024,8192] [--long]
 *       [--decode-tokens N] [--repeat N] [--gemm-m M]
 *
 * Measured in one run:
 *   memcpy     bandwidth of a 256 MiB memcpy (bytes copied per second;
 *              single thread and all pool threads, the higher is used)
 *   gemm       this engine's GEMM on the model's 3 largest weight shapes,
 *              M = --gemm-m activation rows (default 256, a prefill
 *              chunk), with the model's weight dtype and with f32 copies,
 *              next to OpenBLAS cblas_sgemm (f32) on the same shapes. The
 *              library is dlopen'ed (libopenblas.so.0) only as a yardstick;
 *              "not installed" when absent. OPENBLAS_CORETYPE is set to
 *              the kernel of the engine's path (Haswell for AVX2, SkylakeX
 *              for AVX-512) unless already set. GFLOP/s = 2 M N K / time,
 *              summed over the shapes, best of --repeat runs.
 *   warm-up    first, untimed: a sequence prefills 32 tokens and decodes
 *              one (every weight page mapped, the scratch and page pool
 *              touched), as llama.cpp's side of bench/peer_bench.sh
 *              (kvpeer bench) does before it times; on a 3.4 GB model the
 *              first prefill otherwise pays about 0.5 s of one-time costs.
 *   prefill    for each context C: a fresh sequence prefills C random
 *              tokens; tokens/s = C / time.
 *   decode     then --decode-tokens greedy steps at that context; tokens/s.
 *   bound      decode_bound_tokens_per_s = memcpy bandwidth / weight bytes
 *              one decode step reads (every matrix once + one embedding
 *              row, ke_model_decode_bytes). Per context, for information,
 *              decode_bound_with_kv_tokens_per_s also counts what a step
 *              must read besides weights: the KV of the whole context, and
 *              for hybrids the recurrent state (read and written).
 *   phases     per context, prefill and decode time split into gemm,
 *              attention, deltanet and other (engine/prof.h), each with
 *              GFLOP/s vs the measured FMA peak (ke_peak_gflops, all
 *              threads) and GB/s vs the memcpy bandwidth.
 * --long adds a 32768-token context.
 * --json prints one object; the top-level prefill/decode figures are those
 * of the first context, "contexts" has all of them.
 */
#include "base/clock.h"
#include "base/env.h"
#include "base/err.h"
#include "base/mem.h"
#include "base/pool.h"
#include "cli/cli.h"
#include "engine/gemm.h"
#include "engine/isa.h"
#include "engine/matmul.h"
#include "engine/mlxgemm.h"
#include "engine/prof.h"
#include "engine/sample.h"
#include "engine/seq.h"
#include "engine/vec.h"
#include "model/safetensors.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_CTX 8
#define MAX_SHAPES 3

typedef void (*sgemm_fn)(int, int, int, int, int, int, float, const float *, int, const float *, int, float, float *,
			 int);
typedef void (*set_threads_fn)(int);

struct copy_job {
	char *dst;
	const char *src;
	size_t n;
};

static void copy_part(void *ctx, size_t b, size_t e, int thread)
{
	const struct copy_job *j = ctx;
	(void)thread;
	memcpy(j->dst + b, j->src + b, e - b);
}

/* bytes copied per second, best of 10, on 1 thread and on all threads */
static double memcpy_bw(double *single)
{
	size_t n = 256u << 20;
	char *a = kv_alloc(KV_MEM_OTHER, n), *b = kv_alloc(KV_MEM_OTHER, n);
	double best1 = 0, bestp = 0;
	if (!a || !b)
		goto out;
	memset(a, 1, n);
	memset(b, 2, n);
	struct copy_job j = {b, a, n};
	for (int r = 0; r < 10; r++) {
		double t = kv_now_s();
		memcpy(b, a, n);
		t = kv_now_s() - t;
		if (n / t > best1)
			best1 = (double)n / t;
		t = kv_now_s();
		kv_pool_for(kv_pool_global(), n, n / (size_t)kv_pool_size(kv_pool_global()) + 1, copy_part, &j);
		t = kv_now_s() - t;
		if (n / t > bestp)
			bestp = (double)n / t;
	}
out:
	kv_free(a);
	kv_free(b);
	*single = best1;
	return best1 > bestp ? best1 : bestp;
}

struct shape {
	const struct ke_mat *w;
	const char *name;
	double ours, ours_f32, blas; /* best seconds */
};

static double time_best(int repeat, void (*fn)(void *), void *ctx)
{
	double best = 1e30;
	fn(ctx); /* warm-up: page faults, caches, thread wake-up */
	for (int r = 0; r < repeat; r++) {
		double t = kv_now_s();
		fn(ctx);
		t = kv_now_s() - t;
		best = t < best ? t : best;
	}
	return best;
}

struct gemm_ctx {
	const struct ke_mat *w;
	const float *x, *wf;
	float *y;
	int m;
	sgemm_fn sg;
};

static void run_ours(void *p)
{
	struct gemm_ctx *g = p;
	ke_gemm(g->w, g->x, (size_t)g->w->cols, g->m, g->y, (size_t)g->w->rows, 0);
}

static void run_blas(void *p)
{
	struct gemm_ctx *g = p;
	/* RowMajor, NoTrans x, Trans w: y[m][n] = sum_k x[m][k] w[n][k] */
	g->sg(101, 111, 112, g->m, g->w->rows, g->w->cols, 1.0f, g->x, g->w->cols, g->wf, g->w->cols, 0.0f, g->y,
	      g->w->rows);
}

struct ctx_result {
	int ctx;
	double prefill_tps, decode_tps, bound_kv;
	struct ke_prof prof[2]; /* prefill, decode */
};

static const char *const g_phase[] = {"gemm", "attention", "deltanet", "other"};

/* Seconds of phase i (3 = other: forward time minus the three kernels). */
static double phase_sec(const struct ke_prof *p, int i)
{
	if (i < 3)
		return p->sec[i];
	double o = p->sec[KE_PROF_FWD] - p->sec[0] - p->sec[1] - p->sec[2];
	return o > 0 ? o : 0;
}

static void print_phases_json(const struct ke_prof *p, double peak, double bw)
{
	printf("{");
	for (int i = 0; i < 4; i++) {
		double s = phase_sec(p, i);
		printf("%s\"%s\": {\"s\": %.4f", i ? ", " : "", g_phase[i], s);
		if (i < 3 && s > 0) {
			double gf = p->flops[i] / s / 1e9, gb = p->bytes[i] / s / 1e9;
			printf(", \"gflops\": %.2f, \"gb_per_s\": %.2f", gf, gb);
			if (peak > 0)
				printf(", \"vs_peak_flops\": %.3f", gf / peak);
			if (bw > 0)
				printf(", \"vs_memcpy_bw\": %.3f", gb * 1e9 / bw);
		}
		printf("}");
	}
	printf("}");
}

static void print_phases_text(const char *what, const struct ke_prof *p, double peak, double bw)
{
	double tot = p->sec[KE_PROF_FWD];
	printf("  %-7s", what);
	for (int i = 0; i < 4; i++) {
		double s = phase_sec(p, i);
		printf(" %s %.3fs (%.0f%%", g_phase[i], s, tot > 0 ? 100.0 * s / tot : 0.0);
		if (i < 3 && s > 0) {
			double gf = p->flops[i] / s / 1e9, gb = p->bytes[i] / s / 1e9;
			printf(", %.1f GFLOP/s = %.0f%% peak, %.1f GB/s = %.0f%% memcpy", gf, peak > 0 ? 100.0 * gf / peak : 0.0,
			       gb, bw > 0 ? 100.0 * gb * 1e9 / bw : 0.0);
		}
		printf(")%s", i < 3 ? ";" : "\n");
	}
}

/* The weights' formats: one name ("BF16"), or the mix of a quantized file
 * by matrix count ("Q4_K x42 + Q6_K x14"), most frequent first. */
static const char *weights_label(const struct ke_model *m, char *buf, size_t cap)
{
	enum { MAXF = 8 };
	char names[MAXF][32];
	int count[MAXF], nf = 0, other = 0;
	for (int i = 0; i < ke_model_n_mats(m); i++) {
		char f[32];
		ke_mat_format(ke_model_mat(m, i, NULL), f, sizeof f);
		int j = 0;
		while (j < nf && strcmp(names[j], f))
			j++;
		if (j == nf) {
			if (nf == MAXF) {
				other++;
				continue;
			}
			snprintf(names[nf], sizeof names[nf], "%s", f);
			count[nf++] = 0;
		}
		count[j]++;
	}
	if (nf <= 1) {
		snprintf(buf, cap, "%s", nf ? names[0] : "?");
		return buf;
	}
	size_t len = 0;
	buf[0] = 0;
	for (int done = 0; done < nf; done++) {
		int b = -1;
		for (int j = 0; j < nf; j++)
			if (count[j] > 0 && (b < 0 || count[j] > count[b]))
				b = j;
		if (len < cap)
			len += (size_t)snprintf(buf + len, cap - len, "%s%s x%d", done ? " + " : "", names[b], count[b]);
		count[b] = -count[b];
	}
	if (other && len < cap)
		snprintf(buf + len, cap - len, " + %d more", other);
	return buf;
}

struct be_opts {
	const char *model, *ctxs, *quant_act, *kv_dtype;
	int64_t decode_tokens, repeat, gemm_m;
	int json, kv_f32, long_ctx;
	int kv;                    /* enum ke_kv, from --kv-dtype / --kv-f32 */
	int32_t *cl;               /* the contexts (malloc'd), ncl of them */
	size_t ncl;
};

/* One run: the options, the model, and what was measured. */
struct bench {
	struct be_opts o;
	struct ke_model *m;
	const struct kv_model_config *c;
	int V, threads;
	double bw1, bw;            /* memcpy bytes/s: one thread, the higher of one and all */
	double wbytes, state_bytes, bound, peak;
	struct shape sh[MAX_SHAPES];
	int nsh;
	const char *coretype;      /* OpenBLAS kernel asked for, NULL: its own choice */
	int coretype_env;          /* 1: from the environment, not chosen here */
	void *blas;                /* dlopen handle, or NULL */
	sgemm_fn sg;
	double g_ours, g_ours32, g_blas;
	struct ctx_result res[MAX_CTX];
};

/* Flags into o (o->cl allocated): 0 to run, 1 for --help (exit 0), 2 for
 * a usage error (reported). */
static int parse_opts(int argc, char **argv, struct be_opts *o)
{
	*o = (struct be_opts){.ctxs = "1024,8192", .quant_act = "q8", .decode_tokens = 32, .repeat = 3, .gemm_m = 256};
	struct kv_flag flags[] = {
		{"model", KV_FLAG_STR, &o->model, "DIR", "model folder"},
		{"json", KV_FLAG_BOOL, &o->json, NULL, "print one JSON object"},
		{"contexts", KV_FLAG_STR, &o->ctxs, "LIST", "context lengths for prefill/decode (default 1024,8192)"},
		{"decode-tokens", KV_FLAG_INT, &o->decode_tokens, "N", "decode steps timed per context (default 32)"},
		{"repeat", KV_FLAG_INT, &o->repeat, "N", "GEMM repetitions, best kept (default 3)"},
		{"gemm-m", KV_FLAG_INT, &o->gemm_m, "M", "activation rows of the GEMM measurement (default 256)"},
		{"kv-dtype", KV_FLAG_STR, &o->kv_dtype, "bf16|f32|q8_0", "KV element type (default bf16)"},
		{"kv-f32", KV_FLAG_BOOL, &o->kv_f32, NULL, "f32 KV (the same as --kv-dtype f32)"},
		{"quant-act", KV_FLAG_STR, &o->quant_act, "q8|f32", "products with Q8_0/Q4_0/Q4_1/Q5_0/Q5_1/Q2_K/Q3_K/Q4_K/Q5_K/Q6_K/MXFP4 weights: q8 (default) quantizes each activation row to int8 for integer dots, f32 keeps activations f32 against the exactly dequantized weights"},
		{"long", KV_FLAG_BOOL, &o->long_ctx, NULL, "also measure a 32K context (slow)"},
		{0},
	};
	const char *usage = "usage: kvkeep bench engine --model DIR [--json] [--contexts 1024,8192]";
	int rc = kv_flags_parse(usage, flags, argc, argv, NULL, 0, NULL);
	if (rc == 1)
		return 1;
	if (rc)
		return 2;
	if (!o->model || kv_parse_int_list(o->ctxs, &o->cl, &o->ncl) || o->ncl == 0 || o->ncl > MAX_CTX ||
	    o->decode_tokens < 1 || o->decode_tokens > 100000 || o->repeat < 1 || o->repeat > 1000 || o->gemm_m < 1 ||
	    o->gemm_m > 8192) {
		fprintf(stderr, "kvkeep bench engine: --model is required; contexts 1..%d values; see --help\n", MAX_CTX);
		return 2;
	}
	if (o->long_ctx && o->ncl < MAX_CTX) {
		int32_t *ncl2 = realloc(o->cl, (o->ncl + 1) * sizeof *o->cl);
		if (!ncl2)
			return 2;
		o->cl = ncl2;
		o->cl[o->ncl++] = 32768;
	}
	for (size_t i = 0; i < o->ncl; i++)
		if (o->cl[i] < 1 || o->cl[i] > 1 << 20) {
			fprintf(stderr, "kvkeep bench engine: context %d out of range\n", o->cl[i]);
			return 2;
		}
	return 0;
}

/* The GEMM on the model's largest distinct shapes, ours (its weight
 * format, then f32 copies) and OpenBLAS's. -1 when out of memory. */
static int bench_gemm(struct bench *b)
{
	const int64_t gemm_m = b->o.gemm_m;
	struct shape *sh = b->sh;
	for (int i = 0; i < ke_model_n_mats(b->m) && b->nsh < MAX_SHAPES; i++) {
		const char *nm;
		const struct ke_mat *w = ke_model_mat(b->m, i, &nm);
		int dup = 0;
		for (int j = 0; j < b->nsh; j++)
			dup |= sh[j].w->rows == w->rows && sh[j].w->cols == w->cols && sh[j].w->dtype == w->dtype;
		if (!dup) {
			memset(&sh[b->nsh], 0, sizeof sh[b->nsh]);
			sh[b->nsh].w = w;
			sh[b->nsh].name = nm;
			b->nsh++;
		}
	}
	/* OpenBLAS picks its kernel from the CPU model and falls back to SSE3
	 * ("Prescott") on CPUs it does not know, such as some virtual Xeons:
	 * a yardstick 3x too short. Unless the user chose one, ask for the
	 * kernel of the path this engine runs (read when the library loads). */
	/* A machine may set OPENBLAS_CORETYPE for everything (one of ours
	 * sets Haswell on an AVX-512 CPU): it is kept, and the report says it
	 * came from the environment, since a Haswell yardstick on an AVX-512
	 * run is half the machine. */
	b->coretype = kv_env(KV_ENV_OPENBLAS_CORETYPE);
	b->coretype_env = b->coretype != NULL;
	if (!b->coretype && ke_isa() >= KE_ISA_AVX2) {
		b->coretype = ke_isa() >= KE_ISA_AVX512 ? "SkylakeX" : "Haswell";
		setenv("OPENBLAS_CORETYPE", b->coretype, 0); /* for the library, which reads it when it loads */
	}
	b->blas = dlopen("libopenblas.so.0", RTLD_NOW | RTLD_LOCAL);
	b->sg = b->blas ? (sgemm_fn)dlsym(b->blas, "cblas_sgemm") : NULL;
	set_threads_fn st = b->blas ? (set_threads_fn)dlsym(b->blas, "openblas_set_num_threads") : NULL;
	if (st)
		st(b->threads);
	double fl_total = 0, t_ours = 0, t_ours32 = 0, t_blas = 0;
	for (int i = 0; i < b->nsh; i++) {
		const struct ke_mat *w = sh[i].w;
		size_t nk = (size_t)w->rows * w->cols;
		float *x = kv_alloc(KV_MEM_OTHER, (size_t)gemm_m * w->cols * 4);
		float *y = kv_alloc(KV_MEM_OTHER, (size_t)gemm_m * w->rows * 4);
		float *wf = kv_alloc(KV_MEM_OTHER, nk * 4);
		if (!x || !y || !wf) {
			fprintf(stderr, "kvkeep: out of memory for the GEMM benchmark\n");
			kv_free(x);
			kv_free(y);
			kv_free(wf);
			return -1;
		}
		uint64_t seed = 1;
		for (size_t k = 0; k < (size_t)gemm_m * w->cols; k++) {
			seed = seed * 6364136223846793005ull + 1442695040888963407ull;
			x[k] = (float)((int64_t)(seed >> 40) - (1 << 23)) / (float)(1 << 23);
		}
		for (int r = 0; r < w->rows; r++) /* any weight format, as the GEMM sees it */
			ke_mat_row_f32(w, r, wf + (size_t)r * w->cols);
		struct ke_mat w32 = {wf, KV_DT_F32, w->rows, w->cols, (size_t)w->cols};
		struct gemm_ctx g = {w, x, wf, y, (int)gemm_m, b->sg};
		sh[i].ours = time_best((int)b->o.repeat, run_ours, &g);
		g.w = &w32;
		sh[i].ours_f32 = time_best((int)b->o.repeat, run_ours, &g);
		if (b->sg)
			sh[i].blas = time_best((int)b->o.repeat, run_blas, &g);
		double fl = 2.0 * (double)gemm_m * w->rows * w->cols;
		fl_total += fl;
		t_ours += sh[i].ours;
		t_ours32 += sh[i].ours_f32;
		t_blas += sh[i].blas;
		kv_free(x);
		kv_free(y);
		kv_free(wf);
	}
	b->g_ours = fl_total / t_ours / 1e9;
	b->g_ours32 = fl_total / t_ours32 / 1e9;
	b->g_blas = b->sg ? fl_total / t_blas / 1e9 : 0;
	return 0;
}

/* The untimed warm-up, then prefill and decode per context, with the
 * phase timers on. -1 on an error (reported). */
static int bench_contexts(struct bench *b)
{
	const struct be_opts *o = &b->o;
	int V = b->V, status = -1, rc;
	float *logits = kv_alloc(KV_MEM_SCRATCH, (size_t)V * 4);
	int maxc = 0;
	for (size_t i = 0; i < o->ncl; i++)
		maxc = o->cl[i] > maxc ? o->cl[i] : maxc;
	int32_t *tok = malloc((size_t)maxc * sizeof *tok);
	if (!logits || !tok) {
		fprintf(stderr, "kvkeep: out of memory\n");
		goto out;
	}
	uint64_t seed = 7;
	for (int i = 0; i < maxc; i++) {
		seed = seed * 6364136223846793005ull + 1442695040888963407ull;
		tok[i] = (int32_t)((seed >> 33) % (uint64_t)V);
	}
	{
		struct ke_seq *s = NULL;
		int nw = maxc < 32 ? maxc : 32;
		if (ke_seq_create(b->m, NULL, &s) || ke_seq_prefill(s, tok, nw, NULL, logits) ||
		    ke_seq_decode(s, ke_argmax(logits, V), logits)) {
			fprintf(stderr, "kvkeep: %s\n", kv_errmsg());
			ke_seq_destroy(s);
			goto out;
		}
		ke_seq_destroy(s);
	}
	for (size_t i = 0; i < o->ncl; i++) {
		struct ctx_result *res = &b->res[i];
		struct ke_seq *s = NULL;
		if (ke_seq_create(b->m, NULL, &s)) {
			fprintf(stderr, "kvkeep: %s\n", kv_errmsg());
			goto out;
		}
		ke_prof_reset();
		ke_prof_enable(1);
		double t = kv_now_s();
		rc = ke_seq_prefill(s, tok, o->cl[i], NULL, logits);
		double tp = kv_now_s() - t;
		ke_prof_get(&res->prof[0]);
		ke_prof_reset();
		int32_t next = ke_argmax(logits, V);
		t = kv_now_s();
		for (int k = 0; k < o->decode_tokens && !rc; k++) {
			rc = ke_seq_decode(s, next, logits);
			next = ke_argmax(logits, V);
		}
		double td = kv_now_s() - t;
		ke_prof_get(&res->prof[1]);
		ke_prof_enable(0);
		ke_seq_destroy(s);
		if (rc) {
			fprintf(stderr, "kvkeep: %s\n", kv_errmsg());
			goto out;
		}
		res->ctx = o->cl[i];
		res->prefill_tps = o->cl[i] / tp;
		res->decode_tps = (double)o->decode_tokens / td;
		double step_bytes = b->wbytes + 2.0 * b->state_bytes +
				    (double)(o->cl[i] + o->decode_tokens / 2) * (double)ke_model_layout(b->m)->kv_bytes_per_token;
		res->bound_kv = b->bw / step_bytes;
		if (!o->json)
			fprintf(stderr, "context %d: prefill %.1f tok/s, decode %.2f tok/s\n", o->cl[i], res->prefill_tps,
				res->decode_tps);
	}
	status = 0;
out:
	free(tok);
	kv_free(logits);
	return status;
}

/* --json: one object (docs/engine.md lists the keys). */
static void print_json(const struct bench *b)
{
	const struct be_opts *o = &b->o;
	const struct shape *sh = b->sh;
	const struct ctx_result *res = b->res;
	const int64_t gemm_m = o->gemm_m;
	double peak = b->peak, bw = b->bw, bound = b->bound;
	char wfmt[160];
	printf("{\"model\": \"%s\", \"arch\": \"%s\", \"isa\": \"%s\", \"threads\": %d, \"weight_dtype\": \"%s\", "
	       "\"kv_dtype\": \"%s\", \"quant_act\": \"%s\",\n", o->model, kv_arch_name(b->c->arch), ke_isa_name(ke_isa()),
	       b->threads, weights_label(b->m, wfmt, sizeof wfmt), ke_kv_name(o->kv),
	       ke_model_qdot(b->m) ? "q8" : "f32");
	printf(" \"openblas_coretype\": \"%s\", \"openblas_coretype_from_env\": %s,", b->coretype ? b->coretype : "auto",
	       b->coretype_env ? "true" : "false");
	printf(" \"gemm_m\": %d, \"gemm_gflops\": %.2f, \"gemm_f32_gflops\": %.2f, ", (int)gemm_m, b->g_ours, b->g_ours32);
	if (b->sg)
		printf("\"openblas_gflops\": %.2f, \"gemm_ratio_vs_openblas\": %.3f, "
		       "\"gemm_f32_ratio_vs_openblas\": %.3f,\n", b->g_blas, b->g_ours / b->g_blas, b->g_ours32 / b->g_blas);
	else
		printf("\"openblas_gflops\": null, \"openblas\": \"not installed\", \"gemm_ratio_vs_openblas\": null,\n");
	printf(" \"gemm_shapes\": [");
	for (int i = 0; i < b->nsh; i++) {
		double fl = 2.0 * (double)gemm_m * sh[i].w->rows * sh[i].w->cols;
		printf("%s{\"name\": \"%s\", \"n\": %d, \"k\": %d, \"gflops\": %.2f, \"f32_gflops\": %.2f, "
		       "\"openblas_gflops\": %.2f}", i ? ", " : "", sh[i].name, sh[i].w->rows, sh[i].w->cols,
		       fl / sh[i].ours / 1e9, fl / sh[i].ours_f32 / 1e9, b->sg ? fl / sh[i].blas / 1e9 : 0.0);
	}
	printf("],\n \"peak_gflops\": %.2f, \"memcpy_gb_per_s\": %.2f, \"memcpy_1thread_gb_per_s\": %.2f, \"decode_weight_bytes\": %.0f, "
	       "\"recurrent_state_bytes\": %.0f,\n", peak, bw / 1e9, b->bw1 / 1e9, b->wbytes, b->state_bytes);
	printf(" \"prefill_tokens_per_s\": %.2f, \"decode_tokens_per_s\": %.2f, \"decode_bound_tokens_per_s\": %.2f, "
	       "\"decode_vs_bound\": %.3f,\n", res[0].prefill_tps, res[0].decode_tps, bound, res[0].decode_tps / bound);
	/* flat keys per context for scripts: prefill_tps_1024, decode_tps_8192, ... */
	printf(" ");
	for (size_t i = 0; i < o->ncl; i++)
		printf("\"prefill_tps_%d\": %.2f, \"decode_tps_%d\": %.2f, ", res[i].ctx, res[i].prefill_tps, res[i].ctx,
		       res[i].decode_tps);
	printf("\n \"contexts\": [");
	for (size_t i = 0; i < o->ncl; i++) {
		printf("%s{\"context\": %d, \"prefill_tokens_per_s\": %.2f, \"decode_tokens_per_s\": %.2f, "
		       "\"decode_vs_bound\": %.3f, \"decode_bound_with_kv_tokens_per_s\": %.2f,\n  \"prefill_phases\": ",
		       i ? ",\n " : "", res[i].ctx, res[i].prefill_tps, res[i].decode_tps, res[i].decode_tps / bound,
		       res[i].bound_kv);
		print_phases_json(&res[i].prof[0], peak, bw);
		printf(",\n  \"decode_phases\": ");
		print_phases_json(&res[i].prof[1], peak, bw);
		printf("}");
	}
	printf("]}\n");
}

/* The text report. */
static void print_text(const struct bench *b)
{
	const struct be_opts *o = &b->o;
	const struct shape *sh = b->sh;
	const struct ctx_result *res = b->res;
	const int64_t gemm_m = o->gemm_m;
	double peak = b->peak, bw = b->bw, bound = b->bound;
	char wfmt[160];
	printf("model %s (%s, %s weights, %s KV), isa %s, %d threads\n", o->model, kv_arch_name(b->c->arch),
	       weights_label(b->m, wfmt, sizeof wfmt), ke_kv_name(o->kv), ke_isa_name(ke_isa()), b->threads);
	printf("memcpy: %.2f GB/s (1 thread %.2f GB/s)\n", bw / 1e9, b->bw1 / 1e9);
	for (int i = 0; i < b->nsh; i++) {
		double fl = 2.0 * (double)gemm_m * sh[i].w->rows * sh[i].w->cols;
		printf("gemm %-44s M=%d N=%d K=%d: %.1f GFLOP/s (f32 weights %.1f), openblas ", sh[i].name, (int)gemm_m,
		       sh[i].w->rows, sh[i].w->cols, fl / sh[i].ours / 1e9, fl / sh[i].ours_f32 / 1e9);
		if (b->sg)
			printf("%.1f GFLOP/s\n", fl / sh[i].blas / 1e9);
		else
			printf("not installed\n");
	}
	printf("gemm total: %.1f GFLOP/s (f32 weights %.1f); openblas sgemm (%s kernel%s) ", b->g_ours, b->g_ours32,
	       b->coretype ? b->coretype : "auto", b->coretype_env ? ", from OPENBLAS_CORETYPE" : "");
	if (b->sg)
		printf("%.1f GFLOP/s; ratio %.2f (f32 weights %.2f)\n", b->g_blas, b->g_ours / b->g_blas,
		       b->g_ours32 / b->g_blas);
	else
		printf("not installed\n");
	printf("FMA peak: %.1f GFLOP/s (%d threads)\n", peak, b->threads);
	for (size_t i = 0; i < o->ncl; i++) {
		printf("context %6d: prefill %9.1f tok/s, decode %8.2f tok/s (%.0f%% of the weights bound; "
		       "bound with KV + state reads %.2f tok/s)\n", res[i].ctx, res[i].prefill_tps, res[i].decode_tps,
		       100.0 * res[i].decode_tps / bound, res[i].bound_kv);
		print_phases_text("prefill", &res[i].prof[0], peak, bw);
		print_phases_text("decode", &res[i].prof[1], peak, bw);
	}
	printf("decode bound: %.2f tok/s (%.1f MB of weights per token at %.2f GB/s; recurrent state %.1f MB "
	       "not counted)\n", bound, b->wbytes / 1e6, bw / 1e9, b->state_bytes / 1e6);
}

static int cmd_bench_engine(int argc, char **argv)
{
	struct bench b = {0};
	int rc = parse_opts(argc, argv, &b.o);
	if (rc) {
		free(b.o.cl);
		return rc == 1 ? 0 : 2;
	}
	b.o.kv = b.o.kv_f32 ? KE_KV_F32 : ke_kv_parse(b.o.kv_dtype);
	struct ke_model_params mp = {.kv = b.o.kv, .quant_act = ke_quant_act_parse(b.o.quant_act)};
	if (mp.quant_act < 0) {
		fprintf(stderr, "kvkeep bench engine: --quant-act must be q8 or f32\n");
		free(b.o.cl);
		return 2;
	}
	if (mp.kv < 0 || (b.o.kv_f32 && b.o.kv_dtype && strcmp(b.o.kv_dtype, "f32"))) {
		fprintf(stderr, "kvkeep bench engine: --kv-dtype must be bf16, f32 or q8_0 (and agree with --kv-f32)\n");
		free(b.o.cl);
		return 2;
	}
	if (ke_model_load(b.o.model, &mp, &b.m)) {
		fprintf(stderr, "kvkeep: %s\n", kv_errmsg());
		free(b.o.cl);
		return 1;
	}
	b.c = ke_model_config(b.m);
	b.V = b.c->vocab;
	b.threads = kv_pool_size(kv_pool_global());
	int status = 1;

	/* memory bandwidth and the decode bound */
	b.bw = memcpy_bw(&b.bw1);
	b.wbytes = (double)ke_model_decode_bytes(b.m);
	b.state_bytes = (double)ke_model_layout(b.m)->snapshot_bytes;
	b.bound = b.bw > 0 ? b.bw / b.wbytes : 0;
	b.peak = ke_peak_gflops(ke_isa(), 0.2);

	if (bench_gemm(&b) == 0 && bench_contexts(&b) == 0) {
		if (b.o.json)
			print_json(&b);
		else
			print_text(&b);
		status = 0;
	}
	if (b.blas)
		dlclose(b.blas);
	free(b.o.cl);
	ke_model_destroy(b.m);
	return status;
}
KV_COMMAND(bench_engine, "bench engine", "engine speed: GEMM vs OpenBLAS, prefill and decode tokens/s", cmd_bench_engine);
