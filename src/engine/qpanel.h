/*
 * qpanel.h - the panel GEMMs of the integer path (qpanel.c): for a
 * product with many activation rows, a panel of weight rows is repacked
 * once so that one register lane holds one weight row's codes, and every
 * activation row then meets 8 (AVX2) or 16 (AVX-512 VNNI) outputs per
 * instruction. Same integers, same float operations per output as the
 * definition of engine/qdot.h; ke_qdot_gemm chooses them.
 */
#ifndef KV_ENGINE_QPANEL_H
#define KV_ENGINE_QPANEL_H

#include <stddef.h>
#include <stdint.h>

#if defined(__x86_64__)
/* ke_qdot_gemm's contract (engine/qdot.h) through a panel: 1 when it took
 * the product, 0 when the path, the type or m do not call for a panel or
 * the repack buffer could not be had (the caller's 4-row kernels then
 * give the same numbers). */
int ke_qpanel_gemm(int isa, int dt, const uint8_t *w, size_t wstride, int K, const uint8_t *a, size_t astride, int m,
		   float *y, size_t ldy, int accum, int n0, int n1);
#endif

#endif
