/*
 * rows.c - the per-row steps of a forward on the pool, and the residual
 * add with Granite's multiplier (engine_int.h: ke_par_rows,
 * ke_gemm_residual), for forward.c and mamba.c alike.
 *
 * Per-row steps (norms, RoPE, KV writes, pointwise gates) over the n rows
 * of a chunk are split across the pool when there is enough of them: each
 * row is computed by the same function on its own data, so the split
 * changes nothing but which thread runs it. At 2 threads these steps were
 * ~6-9% of a 1K prefill, on one thread while the other waited.
 */
#include "engine/engine_int.h"
#include "engine/matmul.h"
#include "base/pool.h"

struct row_job {
	ke_row_fn fn;
	const void *ctx;
};

static void rows_part(void *ctx, size_t b, size_t e, int thread)
{
	const struct row_job *j = ctx;
	(void)thread;
	for (size_t t = b; t < e; t++)
		j->fn(j->ctx, (int)t);
}

void ke_par_rows(int n, double work, ke_row_fn fn, const void *ctx)
{
	struct kv_pool *pool = kv_pool_global();
	int T = kv_pool_size(pool);
	if (T < 2 || n < 2 || (double)n * work < KE_PAR_MIN_WORK / 4) {
		for (int t = 0; t < n; t++)
			fn(ctx, t);
		return;
	}
	struct row_job j = {fn, ctx};
	size_t grain = (size_t)n / (4u * (size_t)T);
	kv_pool_for(pool, (size_t)n, grain ? grain : 1, rows_part, &j);
}

/* x[t] += r * y[t] for a row (Granite's residual_multiplier): the product
 * rounded, then the add, as transformers' residual + h * multiplier. */
struct resid_job {
	float *x;
	const float *y;
	float r;
	int D;
};

static void resid_row(const void *ctx, int t)
{
	const struct resid_job *j = ctx;
	float *x = j->x + (size_t)t * j->D;
	const float *y = j->y + (size_t)t * j->D;
	for (int i = 0; i < j->D; i++) {
		float v = y[i] * j->r;
		x[i] = x[i] + v;
	}
}

void ke_gemm_residual(const struct ke_fwd *f, const struct ke_mat *w, const float *in, size_t k)
{
	const struct kv_model_config *c = &f->m->cfg;
	struct ke_scratch *sc = f->sc;
	int D = c->hidden;
	if (c->residual_mult == 1.0 || c->residual_mult == 0.0) {
		ke_gemm(w, in, k, f->n, sc->x, (size_t)D, KE_GEMM_ACCUM);
		return;
	}
	ke_gemm(w, in, k, f->n, sc->h, (size_t)D, 0);
	struct resid_job j = {sc->x, sc->h, (float)c->residual_mult, D};
	ke_par_rows(f->n, 2.0 * D, resid_row, &j);
}
