/* The weighted sum of llama.cpp's attention, out = V^T a, as ggml_vec_dot_f32 computes each output on
 * AVX2 (head.pyx): output i is 32 lanes, lane l a fused chain over the rows t = l mod 32 in ascending
 * order, reduced by pyllama_ggml_reduce32. The lanes are built one at a time, 64 outputs (8 AVX2
 * registers) at once, so a lane's chain stays in registers over its rows; every build computes the same
 * chains (fmaf or _mm256_fmadd_ps, one rounding each), so the bits do not depend on the path. */
#ifndef PYLLAMA_GGML_ATTEND_H
#define PYLLAMA_GGML_ATTEND_H
#include <stddef.h>
#include "../kernels/ggml_math.h"
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

/* row t of the values: vp[t] when vp is given, else base + t * stride */
static inline const float* pyllama_value_row(const float* const* vp, const float* base, ptrdiff_t stride, long t) {
    return vp != NULL ? vp[t] : base + t * stride;
}

/* lane l's chains of outputs d0 .. d0 + m - 1 into lanes[l * hd + d0 ...] */
static inline void pyllama_ggml_lane_chunk(float* lanes, const float* w, const float* const* vp, const float* base,
                                           ptrdiff_t stride, long n, int hd, int l, int d0, int m) {
#if defined(__AVX2__) && defined(__FMA__)
    if (m == 64) {
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
        for (long t = l; t < n; t += 32) {
            const float* v = pyllama_value_row(vp, base, stride, t) + d0;
            const __m256 b = _mm256_set1_ps(w[t]);
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(v), b, a0);
            a1 = _mm256_fmadd_ps(_mm256_loadu_ps(v + 8), b, a1);
            a2 = _mm256_fmadd_ps(_mm256_loadu_ps(v + 16), b, a2);
            a3 = _mm256_fmadd_ps(_mm256_loadu_ps(v + 24), b, a3);
            a4 = _mm256_fmadd_ps(_mm256_loadu_ps(v + 32), b, a4);
            a5 = _mm256_fmadd_ps(_mm256_loadu_ps(v + 40), b, a5);
            a6 = _mm256_fmadd_ps(_mm256_loadu_ps(v + 48), b, a6);
            a7 = _mm256_fmadd_ps(_mm256_loadu_ps(v + 56), b, a7);
        }
        float* o = lanes + (ptrdiff_t)l * hd + d0;
        _mm256_storeu_ps(o, a0);
        _mm256_storeu_ps(o + 8, a1);
        _mm256_storeu_ps(o + 16, a2);
        _mm256_storeu_ps(o + 24, a3);
        _mm256_storeu_ps(o + 32, a4);
        _mm256_storeu_ps(o + 40, a5);
        _mm256_storeu_ps(o + 48, a6);
        _mm256_storeu_ps(o + 56, a7);
        return;
    }
#endif
    float* o = lanes + (ptrdiff_t)l * hd + d0;
    for (int k = 0; k < m; k++)
        o[k] = 0.0f;
    for (long t = l; t < n; t += 32) {
        const float* v = pyllama_value_row(vp, base, stride, t) + d0;
        const float a = w[t];
        for (int k = 0; k < m; k++)
            o[k] = fmaf(v[k], a, o[k]);
    }
}

static inline void pyllama_ggml_weighted_rows(float* out, const float* w, const float* const* vp, const float* base,
                                              ptrdiff_t stride, long n, int hd, float* lanes) {
    for (int d0 = 0; d0 < hd; d0 += 64) {
        const int m = hd - d0 < 64 ? hd - d0 : 64;
        for (int l = 0; l < 32; l++)
            pyllama_ggml_lane_chunk(lanes, w, vp, base, stride, n, hd, l, d0, m);
    }
    for (int i = 0; i < hd; i++)
        out[i] = pyllama_ggml_reduce32(lanes + i, hd);
}
#endif
