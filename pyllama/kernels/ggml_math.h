/* ggml's single-precision exp, SiLU and attention softmax, lane for lane: the AVX2 ggml_v_expf of ggml-cpu's vec.h
 * (a degree-5 polynomial after a round-to-nearest range reduction, with fused multiply-adds) written
 * per element with fmaf, so that every build of pyllama gives the bits llama.cpp's AVX2 build gives.
 * llama.cpp applies it to whole groups of 8 and libm's expf to the remainder of a row.
 *
 * Where the CPU has AVX2 and FMA, the same operations also run 8 lanes at a time
 * (pyllama_ggml_v_expf, the group sums, the 32-lane dot product): each lane is the scalar form's
 * operations in its order, one rounding each, so both paths give the same bits (the portable build,
 * PYLLAMA_PORTABLE=1, runs the scalar forms; tests/test_ggml_attention.py checks the bits against numpy
 * emulations of ggml's order, tests/test_ggml_arithmetic.py the 8-lane exp against the scalar one).
 * Measured on the 110M shape's Q4_K_M decode: attention 13% of the time with the scalar forms, 11% with
 * these. */
#ifndef PYLLAMA_GGML_MATH_H
#define PYLLAMA_GGML_MATH_H
#include <math.h>
#include <stdint.h>
#include <string.h>
#include "halfbits.h"
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define PYLLAMA_GGML_AVX2 1
#else
#define PYLLAMA_GGML_AVX2 0
#endif


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

#if PYLLAMA_GGML_AVX2
/* pyllama_ggml_expf on 8 lanes (ggml_v_expf's AVX2 code): the same operations, the two rare branches
   (|n| > 126, |n| > 192) as blends */
static inline __m256 pyllama_ggml_v_expf(__m256 x) {
    const __m256 r = _mm256_set1_ps(0x1.8p23f);
    const __m256 z = _mm256_fmadd_ps(x, _mm256_set1_ps(0x1.715476p+0f), r);
    const __m256 n = _mm256_sub_ps(z, r);
    const __m256 b = _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.7f7d1cp-20f),
                                      _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.62e4p-1f), x));
    const __m256i e = _mm256_slli_epi32(_mm256_castps_si256(z), 23);
    const __m256 k = _mm256_castsi256_ps(_mm256_add_epi32(e, _mm256_castps_si256(_mm256_set1_ps(1.0f))));
    const __m256 u = _mm256_mul_ps(b, b);
    const __m256 j = _mm256_fmadd_ps(
        _mm256_fmadd_ps(_mm256_fmadd_ps(_mm256_set1_ps(0x1.0e4020p-7f), b, _mm256_set1_ps(0x1.573e2ep-5f)), u,
                        _mm256_fmadd_ps(_mm256_set1_ps(0x1.555e66p-3f), b, _mm256_set1_ps(0x1.fffdb6p-2f))),
        u, _mm256_mul_ps(_mm256_set1_ps(0x1.ffffecp-1f), b));
    const __m256 abs_n = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), n);
    const __m256 big = _mm256_cmp_ps(abs_n, _mm256_set1_ps(126.0f), _CMP_GT_OQ);
    const __m256 normal = _mm256_fmadd_ps(j, k, k);
    if (!_mm256_movemask_ps(big))
        return normal;
    const __m256i g = _mm256_and_si256(_mm256_castps_si256(_mm256_cmp_ps(n, _mm256_setzero_ps(), _CMP_LE_OQ)),
                                       _mm256_set1_epi32((int)0x82000000u));
    const __m256 s1 = _mm256_castsi256_ps(_mm256_add_epi32(g, _mm256_set1_epi32(0x7f000000)));
    const __m256 s2 = _mm256_castsi256_ps(_mm256_sub_epi32(e, g));
    const __m256 huge = _mm256_cmp_ps(abs_n, _mm256_set1_ps(192.0f), _CMP_GT_OQ);
    const __m256 special = _mm256_blendv_ps(_mm256_mul_ps(_mm256_fmadd_ps(s2, j, s2), s1), _mm256_mul_ps(s1, s1), huge);
    return _mm256_blendv_ps(normal, special, big);
}

/* pyllama_ggml_hsum8 of the 8 lanes of e: ((e0 + e4) + (e2 + e6)) + ((e1 + e5) + (e3 + e7)) */
static inline float pyllama_ggml_hsum8_avx2(__m256 e) {
    const __m128 s = _mm_add_ps(_mm256_castps256_ps128(e), _mm256_extractf128_ps(e, 1)); /* e_l + e_(l+4) */
    const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));                                  /* s0 + s2, s1 + s3 */
    return _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)));
}
#endif

/* ggml_vec_silu_f32 followed by ggml_mul: hb = silu(hb) * hb2 */
static inline void pyllama_ggml_swiglu(float *hb, const float *hb2, long n) {
    long i = 0;
#if PYLLAMA_GGML_AVX2
    const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
    for (; i + 7 < n; i += 8) {
        const __m256 x = _mm256_loadu_ps(hb + i);
        const __m256 silu = _mm256_div_ps(x, _mm256_add_ps(one, pyllama_ggml_v_expf(_mm256_sub_ps(zero, x))));
        _mm256_storeu_ps(hb + i, _mm256_mul_ps(silu, _mm256_loadu_ps(hb2 + i)));
    }
#endif
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
    long im = 0;
#if PYLLAMA_GGML_AVX2
    /* the max in 8 lanes: max_ps(x, m) keeps m where x is NaN, as the scalar test does; of two equal
       values it keeps one (+0 and -0 alike: e^(x - max) is 1 for either) */
    if (n >= 8) {
        __m256 m = _mm256_set1_ps(-INFINITY);
        for (; im + 8 <= n; im += 8)
            m = _mm256_max_ps(_mm256_loadu_ps(x + im), m);
        float lanes[8];
        _mm256_storeu_ps(lanes, m);
        for (int l = 0; l < 8; l++)
            max = lanes[l] > max ? lanes[l] : max;
    }
#endif
    for (long i = im; i < n; i++)
        max = x[i] > max ? x[i] : max;
    double sum = 0.0;
    long i0 = 0;
#if PYLLAMA_GGML_AVX2
    const __m256 mv = _mm256_set1_ps(max);
    for (; i0 + 8 <= n; i0 += 8) {
        const __m256 e = pyllama_ggml_v_expf(_mm256_sub_ps(_mm256_loadu_ps(x + i0), mv));
        _mm256_storeu_ps(x + i0, e);
        sum += (double)pyllama_ggml_hsum8_avx2(e);
    }
#endif
    for (long i = i0; i < n; i += 8) {
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

#if PYLLAMA_GGML_AVX2
/* The first steps of ggml_vec_dot_f32 on AVX2 over x[0 .. np) (np a multiple of 32): lanes 0-7, 8-15,
   16-23, 24-31 as four fused chains, then pyllama_ggml_reduce32's first steps on vectors,
   y = (a0 + a2) + (a1 + a3) and t = y's halves added. What is left is (t0 + t1) + (t2 + t3), which
   pyllama_ggml_dot_f32 does for one row and the attention scores (ggml_attend.h) for eight at once. */
static inline __m128 pyllama_ggml_dot32_t(const float *x, const float *y, long np) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (long i = 0; i < np; i += 32) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8), _mm256_loadu_ps(y + i + 8), a1);
        a2 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 16), _mm256_loadu_ps(y + i + 16), a2);
        a3 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 24), _mm256_loadu_ps(y + i + 24), a3);
    }
    const __m256 yv = _mm256_add_ps(_mm256_add_ps(a0, a2), _mm256_add_ps(a1, a3));
    return _mm_add_ps(_mm256_castps256_ps128(yv), _mm256_extractf128_ps(yv, 1));
}
#endif

/* ggml_vec_dot_f32 on AVX2: lane l (of 32) is a fused chain over the elements i = l mod 32 below the last
 * multiple of 32, reduced as above; the remainder (a head size that is not a multiple of 32) is added
 * after, in order, which GCC contracts to fused multiply-adds as written here. */
static inline float pyllama_ggml_dot_f32(const float *x, const float *y, long n) {
    const long np = n & ~31L;
#if PYLLAMA_GGML_AVX2
    const __m128 t = pyllama_ggml_dot32_t(x, y, np);
    const __m128 h = _mm_hadd_ps(t, t); /* t0 + t1, t2 + t3 */
    float s = _mm_cvtss_f32(_mm_add_ss(h, _mm_shuffle_ps(h, h, 1)));
#else
    float acc[32] = {0.0f};
    for (long i = 0; i < np; i += 32)
        for (int l = 0; l < 32; l++)
            acc[l] = fmaf(x[i + l], y[i + l], acc[l]);
    float s = pyllama_ggml_reduce32(acc, 1);
#endif
    for (long i = np; i < n; i++)
        s = fmaf(x[i], y[i], s);
    return s;
}
/* GELU as ggml computes it on the CPU (vec.h, GGML_GELU_FP16): for -10 < x < 10, the table value of
   x rounded to half, the table holding ggml_gelu_f32 of every half rounded to half (ggml-cpu.c's
   ggml_cpu_init); outside, 0 or x. The expression is ggml_gelu_f32's, in its order, compiled as
   ggml's is (GCC, -O3, fp-contract at its default), so the table carries its bits. */
static float pyllama_ggml_gelu_table[65536];
static int pyllama_ggml_gelu_ready = 0;

static inline float pyllama_ggml_gelu_f32(float x) {
    const float GELU_COEF_A = 0.044715f;
    const float SQRT_2_OVER_PI = 0.79788456080286535587989211986876f;
    return 0.5f*x*(1.0f + tanhf(SQRT_2_OVER_PI*x*(1.0f + GELU_COEF_A*x*x)));
}

static void pyllama_ggml_gelu_init(void) {
    if (pyllama_ggml_gelu_ready) return;
    for (uint32_t i = 0; i < 65536; ++i) {
        float f = pyllama_half_to_float((uint16_t)i);
        pyllama_ggml_gelu_table[i] = pyllama_half_to_float(pyllama_float_to_half(pyllama_ggml_gelu_f32(f)));
    }
    pyllama_ggml_gelu_ready = 1;
}

/* hb = gelu(hb) * hb2: ggml_vec_geglu_f32 (the table must be ready: pyllama_ggml_gelu_init) */
static inline void pyllama_ggml_geglu(float *hb, const float *hb2, long n) {
    for (long i = 0; i < n; ++i) {
        float x = hb[i];
        if (x <= -10.0f) {
            hb[i] = 0.0f;
        } else if (x >= 10.0f) {
            hb[i] = x * hb2[i];
        } else {
            hb[i] = pyllama_ggml_gelu_table[pyllama_float_to_half(x)] * hb2[i];
        }
    }
}

#endif

