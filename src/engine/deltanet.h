/*
 * deltanet.h - the Gated DeltaNet kernels: causal depthwise conv step and
 * the delta rule, one token at a time (exact; docs/engine.md).
 *
 * Conv state layout (the snapshot format of layout.h): [C][K-1] f32, per
 * channel the last K-1 inputs, oldest first. (Hugging Face keeps K
 * entries per channel; its first one is never used again, so kvkeep's
 * state is HF's conv_state[..., 1:].)
 *   y[c] = sum_{j<K-1} w[c][j] state[c][j] + w[c][K-1] x[c]   (j ascending,
 *          separate multiply and add), then the state shifts in x[c].
 *
 * Delta rule for one value head, S [dk][dv] f32, alpha = exp(g):
 *   pass 1, i ascending:  S[i][:] = S[i][:] * alpha;  u = fma(S[i][:], k[i], u)
 *   delta = (v - u) * beta
 *   pass 2, i ascending:  S[i][:] = fma(k[i], delta, S[i][:]);
 *                         o = fma(S[i][:], q[i], o)
 * which is Hugging Face's torch_recurrent_gated_delta_rule (decay, read,
 * write, then read the query from the updated state). Scalar and AVX2 are
 * bit-identical.
 */
#ifndef KV_ENGINE_DELTANET_H
#define KV_ENGINE_DELTANET_H

#include <stddef.h>

/*
 * n consecutive tokens of one value head, in order. Token t reads q, k, v
 * at q + t*sq (same stride for k and v), alpha[t*sab], beta[t*sab], and
 * writes o + t*so. Each element of S and of the outputs sees exactly the
 * operations of n calls of ke_dn_rule; the SIMD paths just sweep S once
 * per token (token t's write and read fused with token t+1's decay and
 * read), so the result is bit-identical to token-by-token.
 */
void ke_dn_rule_seq(int isa, float *S, int n, const float *q, const float *k, const float *v, size_t sq,
		    const float *alpha, const float *beta, size_t sab, float *o, size_t so, int dk, int dv);

/* One token through the conv of C channels with kernel K (w: [C][K]
 * f32). x: in = projected inputs, out = conv output (before SiLU). */
void ke_dn_conv(float *state, const float *w, float *x, int C, int K);
/* On a given path (enum ke_isa, clamped to the CPU); all bit-identical. */
void ke_dn_conv_isa(int isa, float *state, const float *w, float *x, int C, int K);

/* One token, one value head. o: [dv] out. */
void ke_dn_rule(float *S, const float *q, const float *k, const float *v, float alpha, float beta, float *o,
		int dk, int dv);
void ke_dn_rule_isa(int isa, float *S, const float *q, const float *k, const float *v, float alpha, float beta,
		    float *o, int dk, int dv);

#endif
