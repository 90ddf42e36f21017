/* ggml's single-precision exp, SiLU and attention softmax, lane for lane: the AVX2 ggml_v_expf of ggml-cpu's vec.h
 * (a degree-5 polynomial after a round-to-nearest range reduction, with fused multiply-adds) written
 * per element with fmaf, so that every build of pyllama gives the bits llama.cpp's AVX2 build gives.
 * llama.cpp applies it to whole groups of 8 and libm's expf to the remainder of a row. */
#ifndef PYLLAMA_GGML_MATH_H
#define PYLLAMA_GGML_MATH_H
#include <math.h>
#include <stdint.h>
#include <string.h>
#include "halfbits.h"


static inline float pyllama_ggml_expf(float x) {
    const float r = 0x1.8p23f;
    const float z = fmaf(x, 0x1.715476p+0f, r);
    const float n = z - r;
    const float b = fmaf(-n, 0x1.7f7d1cp-20f, fmaf(-n, 0x1.62e4p-1f, x));
    const uint32_t e = pyllama_f2u(z) << 23;
    const float k = pyllama_u2f(e + pyllama_f2u(1.0f));
    const float u = b * b;
    const float j = fmaf(fmaf(fmaf(0x1.0e4020p-7f, b, 0x1.573e2ep-5f), u,
                              fmaf(0x1.555e66p-3f, b, 0x1.fffdb6p-2f)),
                         u, 0x1.ffffecp-1f * b);
    if (!(fabsf(n) > 126.0f))
        return fmaf(j, k, k);
    const uint32_t g = (n <= 0.0f) ? 0x82000000u : 0u;
    const float s1 = pyllama_u2f(g + 0x7f000000u);
    const float s2 = pyllama_u2f(e - g);
    if (fabsf(n) > 192.0f)
        return s1 * s1;
    return fmaf(s2, j, s2) * s1;
}

/* ggml_vec_silu_f32 followed by ggml_mul: hb = silu(hb) * hb2 */
static inline void pyllama_ggml_swiglu(float *hb, const float *hb2, long n) {
    long i = 0;
    for (; i + 7 < n; i += 8)
        for (long l = i; l < i + 8; l++)
            hb[l] = (hb[l] / (1.0f + pyllama_ggml_expf(0.0f - hb[l]))) * hb2[l];
    for (; i < n; i++)
        hb[i] = (hb[i] / (1.0f + expf(-hb[i]))) * hb2[i];
}

/* 8 floats summed as AVX2's horizontal add does it (ggml_vec_soft_max_f32):
 * ((e0 + e4) + (e2 + e6)) + ((e1 + e5) + (e3 + e7)) */
static inline float pyllama_ggml_hsum8(const float *e) {
    return ((e[0] + e[4]) + (e[2] + e[6])) + ((e[1] + e[5]) + (e[3] + e[7]));
}

/* ggml's soft_max of one attention row in place, as its AVX2 build runs it over llama.cpp's KV cache:
 * the max, then e^(x - max) with ggml_v_expf in groups of 8, each group summed by pyllama_ggml_hsum8 and
 * added in double, then every value times (float)(1 / sum). llama.cpp pads the cache it attends to a
 * multiple of 256 cells and masks the padding to -inf, so every real score falls in a full group of 8
 * (libm's expf, which ggml keeps for a row's remainder, never runs) and the padding adds exact zeros:
 * here the last group is completed with zeros. */
static inline void pyllama_ggml_softmax(float *x, long n) {
    float max = -INFINITY;
    for (long i = 0; i < n; i++)
        max = x[i] > max ? x[i] : max;
    double sum = 0.0;
    for (long i = 0; i < n; i += 8) {
        float e[8];
        for (int l = 0; l < 8; l++)
            e[l] = i + l < n ? pyllama_ggml_expf(x[i + l] - max) : 0.0f;
        for (int l = 0; l < 8 && i + l < n; l++)
            x[i + l] = e[l];
        sum += (double)pyllama_ggml_hsum8(e);
    }
    const float inv = (float)(1.0 / sum);
    for (long i = 0; i < n; i++)
        x[i] = x[i] * inv;
}

/* GGML_F32x8_REDUCE of ggml_vec_dot_f32's 32 lanes (4 accumulators of 8 floats), lane l at a[l * stride]:
 * accumulators 0+2 and 1+3, then their sum, then the two halves of 8, then two horizontal adds */
static inline float pyllama_ggml_reduce32(const float *a, long stride) {
    float y[8];
    for (int e = 0; e < 8; e++)
        y[e] = (a[e * stride] + a[(16 + e) * stride]) + (a[(8 + e) * stride] + a[(24 + e) * stride]);
    const float t0 = y[0] + y[4], t1 = y[1] + y[5], t2 = y[2] + y[6], t3 = y[3] + y[7];
    return (t0 + t1) + (t2 + t3);
}

/* ggml_vec_dot_f32 on AVX2: lane l (of 32) is a fused chain over the elements i = l mod 32 below the last
 * multiple of 32, reduced as above; the remainder (a head size that is not a multiple of 32) is added
 * after, in order, which GCC contracts to fused multiply-adds as written here. */
static inline float pyllama_ggml_dot_f32(const float *x, const float *y, long n) {
    float acc[32] = {0.0f};
    const long np = n & ~31L;
    for (long i = 0; i < np; i += 32)
        for (int l = 0; l < 32; l++)
            acc[l] = fmaf(x[i + l], y[i + l], acc[l]);
    float s = pyllama_ggml_reduce32(acc, 1);
    for (long i = np; i < n; i++)
        s = fmaf(x[i], y[i], s);
    return s;
}
#endif

