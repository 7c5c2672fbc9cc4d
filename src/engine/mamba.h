/*
 * mamba.h - the Mamba-2 mixer of Granite 4.0-H and Nemotron-H: the SSD
 * scan kernel and the layer's forward (docs/engine.md, "Mamba-2").
 *
 * State of one head: S [P][N] f32 (P = head dim, N = d_state), the
 * snapshot format of layout.h ({H, P, N} per layer, after the conv state
 * [C][d_conv - 1]). Per token t, with dt = softplus(dt_raw + dt_bias)
 * and dA = exp(dt A) computed once per (token, head), for every row p in
 * ascending order:
 *
 *   xdt      = x[p] * dt                               (one rounding)
 *   S[p][k]  = fmaf(B[k], xdt, S[p][k] * dA)           k = 0 .. N-1
 *   y[p]     = fmaf(D, x[p], dot(S[p][:], C))
 *
 * where dot is the canonical 16-lane reduction of engine/gemm.h
 * (ke_dot_ref: lane j takes k = 16b + j with one fma per term, b
 * ascending, then the fixed tree). B and C are those of the head's group
 * h / (H / G).
 *
 * One kernel serves prefill and decode: ke_ssm_scan runs n consecutive
 * tokens of one head, sweeping the rows in blocks that stay in L1 for
 * all n tokens (the "chunked" scan of a prefill), and a decode step is
 * n = 1. Each element of S and y sees the same operations in the same
 * order whatever n, the chunk boundaries, the thread or the CPU path, so
 * a prompt prefilled in chunks of any size gives the bits of token-by-
 * token decode (tests/unit/test_mamba.c). This is not the SSD matrix
 * form transformers uses for prefill (its chunk_size segment sums): that
 * form is mathematically equal and is what tests/ref/mamba_ref.py checks
 * the engine against, chunked and recurrent.
 */
#ifndef KV_ENGINE_MAMBA_H
#define KV_ENGINE_MAMBA_H

#include <stddef.h>

/*
 * n tokens of one head. Token t reads x[t sx + p] (p < P), B[t sbc + k],
 * C[t sbc + k] (k < N), dt[t sd], dA[t sd], and writes y[t sy + p].
 * isa: enum ke_isa (clamped to the CPU); all paths give the same bits.
 */
void ke_ssm_scan(int isa, float *S, int P, int N, int n, const float *x, size_t sx, const float *B,
		 const float *C, size_t sbc, const float *dt, const float *dA, size_t sd, float D, float *y,
		 size_t sy);

struct ke_fwd;
struct ke_layer;
/* The mixer of layer ly over the rows of f: reads f->sc->h (the normed
 * input), adds out_proj's output (x residual_multiplier when the model
 * has one) into f->sc->x, runs each sequence's conv and SSM state. */
void ke_mamba_layer(const struct ke_fwd *f, const struct ke_layer *ly);

#endif
