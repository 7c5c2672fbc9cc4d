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

/*
 * Prepacked panels (struct ke_mat.panels): a Q8_0, Q4_0, Q5_0 or MXFP4
 * matrix on the AVX-512 VNNI path is repacked once, at model load, into
 * panels of 16 rows (Q8_0: codes + 128 in register order; Q4_0 / Q5_0 /
 * MXFP4: the nibbles, one register giving two code words, Q5_0's 5th bits
 * as a byte mask per register; then the 16 rows' scales as stored: as
 * many bytes as the rows, qpanel.c). Every product of it, decode's one
 * activation row included, then streams the panels: one vpdpbusd per
 * activation word for 16 outputs, no lane reductions, one contiguous
 * stream instead of 4 rows'. Same integers and float operations per
 * output as the definition; the rows stay where they are for the other
 * paths.
 *
 * ke_qpanel_pre_bytes: the bytes of the panels of a rows x K matrix of
 * dtype dt on path isa, 0 when that path and type take none.
 * ke_qpanel_pre_pack: panels [p0, p1) (rows 16 p ..) into out (which
 * holds them all; a short last panel repeats the last row).
 * ke_qpanel_gemm_pre: ke_qdot_gemm's contract for rows [n0, n1), n0 a
 * multiple of 16, from the panels pk; 0 when the path or type do not
 * take them (the caller's row kernels then give the same numbers).
 */
size_t ke_qpanel_pre_bytes(int isa, int dt, int rows, int K);
void ke_qpanel_pre_pack(int dt, const uint8_t *w, size_t wstride, int rows, int K, int p0, int p1, uint8_t *out);
int ke_qpanel_gemm_pre(int isa, int dt, const uint8_t *pk, int K, const uint8_t *a, size_t astride, int m, float *y,
		       size_t ldy, int accum, int n0, int n1);

#endif
