/*
 * qgemm.c - see qgemm.h. Weight rows are dequantized a panel at a time
 * into a per-thread buffer of KE_QGEMM_MAX_K floats and handed to the f32
 * kernel: the panel is as many rows as fit, so each dequantized row is
 * used by all M activation rows while it is hot in cache.
 */
#include "engine/qgemm.h"
#include "model/quant.h"
#include "model/safetensors.h"

#include <string.h>

/* Per-thread panel (256 KiB): pool threads live as long as the process. */
static __thread float tl_panel[KE_QGEMM_MAX_K] __attribute__((aligned(64)));

int ke_qgemm_handles(const struct ke_mat *w)
{
	return kq_is_quant(w->dtype) || w->dtype == KV_DT_F16;
}

static const uint8_t *row_ptr(const struct ke_mat *w, int r)
{
	return (const uint8_t *)w->data + (size_t)r * (size_t)kv_dtype_row_bytes(w->dtype, (uint64_t)w->ld);
}

void ke_qgemm_row(const struct ke_mat *w, int r, float *out)
{
	kq_dequant_row(w->dtype, row_ptr(w, r), out, (size_t)w->cols);
}

void ke_qgemm_range(int isa, const struct ke_mat *w, const float *x, size_t ldx, int m, float *y, size_t ldy,
		    unsigned flags, int n0, int n1)
{
	const int K = w->cols;
	int P = KE_QGEMM_MAX_K / (K > 0 ? K : 1);
	if (P < 1 || m <= 0 || n1 <= n0)
		return; /* K > KE_QGEMM_MAX_K is refused at model load */
	if (P > 48)
		P = 48;
	for (int n = n0; n < n1; n += P) {
		int p = n1 - n < P ? n1 - n : P;
		for (int r = 0; r < p; r++)
			kq_dequant_row(w->dtype, row_ptr(w, n + r), tl_panel + (size_t)r * (size_t)K, (size_t)K);
		struct ke_mat f = {tl_panel, KV_DT_F32, p, K, (size_t)K};
		ke_gemm_range(isa, &f, x, ldx, m, y + n, ldy, flags, 0, p);
	}
}
