/*
 * matmul.c - see matmul.h: which module multiplies a matrix, and the
 * split of a product over the thread pool.
 */
#include "engine/matmul.h"
#include "engine/isa.h"
#include "engine/mlxgemm.h"
#include "engine/prof.h"
#include "engine/qgemm.h"
#include "model/quant.h"
#include "model/safetensors.h"
#include "base/pool.h"

#include <string.h>

void ke_gemm_range(int isa, const struct ke_mat *w, const float *x, size_t ldx, int m, float *y, size_t ldy,
		   unsigned flags, int n0, int n1)
{
	if (m <= 0 || n1 <= n0)
		return;
	if (ke_qgemm_handles(w)) /* block types and F16: engine/qgemm.c */
		ke_qgemm_range(isa, w, x, ldx, m, y, ldy, flags, n0, n1);
	else if (KE_MAT_IS_DQ(w)) /* MLX affine groups: engine/mlxgemm.c */
		ke_gemm_range_dq(isa, w, x, ldx, m, y, ldy, flags, n0, n1);
	else
		ke_gemm_dense_range(isa, w, x, ldx, m, y, ldy, flags, n0, n1);
}

struct gemm_job {
	int isa;
	const struct ke_mat *w;
	const float *x;
	size_t ldx;
	int m;
	float *y;
	size_t ldy;
	unsigned flags;
};

static void gemm_part(void *ctx, size_t b, size_t e, int thread)
{
	const struct gemm_job *j = ctx;
	(void)thread;
	ke_gemm_range(j->isa, j->w, j->x, j->ldx, j->m, j->y, j->ldy, j->flags, (int)b, (int)e);
}

void ke_gemm(const struct ke_mat *w, const float *x, size_t ldx, int m, float *y, size_t ldy, unsigned flags)
{
	if (ke_qgemm_int(w)) { /* int8 activations: quantized once per call, engine/qgemm.c */
		ke_qgemm(w, x, ldx, m, y, ldy, flags);
		return;
	}
	struct gemm_job j = {ke_isa(), w, x, ldx, m, y, ldy, flags};
	/* Waking a worker costs microseconds (much more when the cores are
	 * busy with other processes): small products run on the caller. */
	double work = (double)m * w->rows * w->cols;
	double t0 = ke_prof_t0();
	double wbytes = (double)w->rows * w->cols * (w->dtype == KV_DT_BF16 ? 2 : 4);
	if (work < KE_PAR_MIN_WORK) {
		gemm_part(&j, 0, (size_t)w->rows, 0);
		ke_prof_add(KE_PROF_GEMM, t0, 2.0 * work, wbytes);
		return;
	}
	/* Chunks: about four per thread, a multiple of every path's NR (6 and
	 * 2) so chunks hold whole tiles. */
	size_t per = (size_t)w->rows / (4u * (size_t)kv_pool_size(kv_pool_global())) + 1;
	size_t grain = (per + 11) / 12 * 12;
	kv_pool_for(kv_pool_global(), (size_t)w->rows, grain, gemm_part, &j);
	ke_prof_add(KE_PROF_GEMM, t0, 2.0 * work, wbytes);
}

void ke_mat_row_f32(const struct ke_mat *w, int r, float *out)
{
	if (w->dtype == KV_DT_F32) {
		memcpy(out, (const char *)w->data + (size_t)r * w->ld * 4, (size_t)w->cols * 4);
	} else if (w->dtype == KV_DT_BF16) {
		const char *p = (const char *)w->data + (size_t)r * w->ld * 2;
		for (int k = 0; k < w->cols; k++) {
			uint16_t h;
			memcpy(&h, p + (size_t)k * 2, 2);
			out[k] = kv_bf16_to_f32(h);
		}
	} else if (kv_dtype_is_quant(w->dtype)) {
		/* ggml blocks: the row is whole blocks at its block row stride */
		const char *p = (const char *)w->data + (size_t)r * (size_t)kv_dtype_row_bytes(w->dtype, (uint64_t)w->ld);
		if (kq_dequant_row(w->dtype, p, out, (size_t)w->cols))
			memset(out, 0, (size_t)w->cols * sizeof *out);
	} else {
		/* F16 and MLX: the scalar dequantizer (every path gives its bits) */
		ke_mat_dequant_rows(KE_ISA_SCALAR, w, r, r + 1, out);
	}
}
