/*
 * vec.h - row and element-wise kernels of the engine: dot products,
 * RMSNorm, exp, SiLU, sigmoid, axpy.
 *
 * Same rules as gemm.h: a row's result depends only on that row (never on
 * how many rows are processed together), reductions run in one fixed
 * order, and the scalar reference and the AVX2 path (also used on AVX-512
 * machines; exp has a 16-lane AVX-512 twin) are bit-identical: fused
 * multiply-adds exactly where the scalar code calls fmaf(), the same
 * polynomial for exp.
 *
 *   dot      the canonical 16-lane order of gemm.h (ke_dot_ref).
 *   exp      ke_exp: x clamped to [-86, 88]; n = rint(x log2 e);
 *            r = x - n ln2 (two fmas, Cody-Waite split); degree-5
 *            polynomial (Cephes expf coefficients) by Horner with fmas;
 *            y = fma(p, r*r, r) + 1; then n is added to y's exponent
 *            field (exact: y * 2^n). Relative error about 2e-7; below -86
 *            the result stays exp(-86) ~ 4e-38 (harmless in softmax/SiLU).
 *   silu     x / (1 + exp(-x)); sigmoid 1 / (1 + exp(-x)).
 *   rmsnorm  r = 1 / sqrtf(dot(x, x) / n + eps); out = (x * r) * w
 *            (the weight applied last, as Hugging Face does; callers pass
 *            1 + w for the zero-centred norms of the hybrid models).
 */
#ifndef KV_ENGINE_VEC_H
#define KV_ENGINE_VEC_H

#include <stddef.h>
#include <stdint.h>

/* Scalar canonical exp (the reference of the vector paths). */
float ke_exp(float x);

float ke_vec_dot(const float *a, const float *b, int n);
/* out[i] = (x[i] * r) * w[i]; w NULL means no weight. out may alias x. */
void ke_vec_rmsnorm(float *out, const float *x, const float *w, int n, float eps);
/* y[i] = exp(x[i]) (canonical exp); y may alias x. */
void ke_vec_exp(float *y, const float *x, int n);
/* g[i] = silu(g[i]) * u[i]. */
void ke_vec_silu_mul(float *g, const float *u, int n);
/* x[i] = silu(x[i]). */
void ke_vec_silu(float *x, int n);
/* g = gelu_tanh(g) (* u when u is set): transformers' gelu_pytorch_tanh,
 * 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))), with the canonical
 * tanh below (not libm's tanhf, whose bits are glibc's), 8 or 16 lanes at
 * a time, the same bits on every path. */
void ke_vec_gelu_tanh_mul(float *g, const float *u, int n);
/* x = cap tanh(x / cap) (final logit softcapping) with the canonical
 * tanh (vec.c ke_tanh: a Taylor polynomial below |z| = 0.25, (e - 1) /
 * (e + 1) of the canonical exp above; within 2e-7 relative of tanh), the
 * same bits on every path. */
void ke_vec_softcap(float *x, float cap, size_t n);
/* Same with bf16 x (widened exactly). x may be unaligned. */
void ke_vec_axpy_bf16(float *y, float a, const void *x, int n);
/* x[i] = max(x[i], 0)^2 (relu(x) ** 2: Nemotron-H's MLP); NaN and -0 give +0. */
void ke_vec_relu2(float *x, int n);
void ke_vec_relu2_isa(int isa, float *x, int n);
/* y[i] = y[i] * a. */
void ke_vec_scale(float *y, float a, int n);
/* Widen n bf16 values (possibly unaligned) to f32. */
void ke_vec_bf16_to_f32(float *y, const void *x, size_t n);
/* Round n f32 values to bf16 (nearest even, NaN kept quiet). */
void ke_vec_f32_to_bf16(void *y, const float *x, size_t n);

/* Explicit-path versions, for the tests that compare paths. */
float ke_vec_dot_isa(int isa, const float *a, const float *b, int n);
void ke_vec_exp_isa(int isa, float *y, const float *x, int n);
void ke_vec_softcap_isa(int isa, float *x, float cap, size_t n);
void ke_vec_gelu_tanh_mul_isa(int isa, float *g, const float *u, int n);
void ke_vec_silu_mul_isa(int isa, float *g, const float *u, int n);
void ke_vec_axpy_isa(int isa, float *y, float a, const float *x, int n);
void ke_vec_axpy_bf16_isa(int isa, float *y, float a, const void *x, int n);

#endif
