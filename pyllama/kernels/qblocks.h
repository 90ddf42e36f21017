/* ggml block formats multiplied on their own blocks: the shared C of qlegacy.h and kquants.h.
 *
 * Layouts are ggml's (ggml-common.h; gguf-py's quants.py reads the same bytes). A weight row is
 * multiplied with an activation vector that was quantised once per product to the type llama.cpp
 * pairs with the weight type (its vec_dot_type): Q8_0 (32 int8 and one scale), Q8_1 (the same plus
 * s = d * sum(q)), or Q8_K (256 int8, one float32 scale and the sums of each 16 values).
 *
 * Every integer part is exact, whatever path computes it. Every float operation is written out with
 * an explicit order: fused multiply-adds are fmaf() in C and _mm256_fmadd_ps with AVX2, both one
 * rounding, so the AVX2 and the portable (PYLLAMA_PORTABLE=1) builds give the same bits. Nothing is
 * left to the compiler's contraction of a*b+c.
 */
#ifndef PYLLAMA_QBLOCKS_H
#define PYLLAMA_QBLOCKS_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#if defined(__AVX2__) || defined(__F16C__)
#include <immintrin.h>
#endif
#include "halfbits.h"
#include "qtype.h" /* pyllama_qact: the quantised activation of one position */

#if defined(__AVX2__) && defined(__FMA__)
#define PYLLAMA_QBLOCKS_AVX2 1
#else
#define PYLLAMA_QBLOCKS_AVX2 0
#endif

/* AVX-512 (F and BW, on top of AVX2 and FMA): the integer work of two 32-value blocks, or of 64
 * values of a super-block, in one zmm register; with VNNI, vpdpbusd/vpdpwssd fuse the multiply-adds.
 * The float work keeps the AVX2 order of 8 lanes, so an AVX-512 build gives the bits of an AVX2 one.
 * PYLLAMA_EMULATE_AVX512 (build_config.py) compiles this path on a CPU without AVX-512, against
 * SIMDe's portable AVX-512 (a test build: slow, but the same integers and the same float operations),
 * so that the path is tested on whichever machine is at hand. */
#if PYLLAMA_QBLOCKS_AVX2 && defined(PYLLAMA_EMULATE_AVX512)
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>
/* SIMDe 0.7.4 aliases _mm512_madd_epi16 with the four arguments of its masked form */
#undef _mm512_madd_epi16
#define _mm512_madd_epi16(a, b) simde_mm512_madd_epi16(a, b)
/* and has no unsigned widenings to 512 bits: the same values, a 128-bit half at a time */
static inline simde__m512i pyllama_emulated_cvtepu8_epi16(simde__m256i v) {
    return simde_mm512_inserti64x4(simde_mm512_castsi256_si512(_mm256_cvtepu8_epi16(_mm256_castsi256_si128(v))),
                                   _mm256_cvtepu8_epi16(_mm256_extracti128_si256(v, 1)), 1);
}
static inline simde__m512i pyllama_emulated_cvtepu16_epi32(simde__m256i v) {
    return simde_mm512_inserti64x4(simde_mm512_castsi256_si512(_mm256_cvtepu16_epi32(_mm256_castsi256_si128(v))),
                                   _mm256_cvtepu16_epi32(_mm256_extracti128_si256(v, 1)), 1);
}
#define _mm512_cvtepu8_epi16 pyllama_emulated_cvtepu8_epi16
#define _mm512_cvtepu16_epi32 pyllama_emulated_cvtepu16_epi32
#define PYLLAMA_QBLOCKS_AVX512 1
#define PYLLAMA_QBLOCKS_VNNI (PYLLAMA_EMULATE_AVX512 == 2)
#elif PYLLAMA_QBLOCKS_AVX2 && defined(__AVX512F__) && defined(__AVX512BW__)
#define PYLLAMA_QBLOCKS_AVX512 1
#if defined(__AVX512VNNI__)
#define PYLLAMA_QBLOCKS_VNNI 1
#else
#define PYLLAMA_QBLOCKS_VNNI 0
#endif
#else
#define PYLLAMA_QBLOCKS_AVX512 0
#define PYLLAMA_QBLOCKS_VNNI 0
#endif

/* whether the build targeted the CPU it ran on (-march=native: build_config.py) */
static inline int pyllama_qblocks_native(void) {
#if defined(PYLLAMA_MARCH_NATIVE)
    return 1;
#else
    return 0;
#endif
}

/* which path this build compiled: "avx512-vnni", "avx512", "avx2" or "portable" */
static inline const char* pyllama_qblocks_path(void) {
    if (PYLLAMA_QBLOCKS_AVX512) return PYLLAMA_QBLOCKS_VNNI ? "avx512-vnni" : "avx512";
    return PYLLAMA_QBLOCKS_AVX2 ? "avx2" : "portable";
}

#define PYLLAMA_QK 32    /* values per Q4_0/Q4_1/Q5_0/Q5_1/IQ4_NL/Q8_0/Q8_1 block */
#define PYLLAMA_QK_K 256 /* values per K-quant / Q8_K super-block */

#if defined(__GNUC__)
#define pyllama_qprefetch(p) __builtin_prefetch((const void*)(p), 0, 3)
#else
#define pyllama_qprefetch(p) ((void)0)
#endif
#define PYLLAMA_QPREFETCH_AHEAD 4096 /* one page ahead of the mapped weight stream (see q8_0.h) */

/* ---- binary16 / bfloat16 (halfbits.h) ---- */
#define pyllama_qh2f pyllama_half_to_float
#define pyllama_qf2h pyllama_float_to_half
static inline float pyllama_half_at(const uint8_t* p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return pyllama_qh2f(h);
}

/* max |x| over n values, n a multiple of 16 (a Q8_0 / Q8_1 block of 32, a Q8_K block of 256; a NaN is
   passed over, as the scalar comparison does) */
static inline __attribute__((always_inline)) float pyllama_absmax(const float* x, const int n) {
#if PYLLAMA_QBLOCKS_AVX512
    __m512 m = _mm512_setzero_ps();
    for (int k = 0; k < n; k += 16) m = _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(x + k)), m);
    return _mm512_reduce_max_ps(m);
#elif PYLLAMA_QBLOCKS_AVX2
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 m = _mm256_setzero_ps();
    for (int k = 0; k < n; k += 8) m = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + k)), m);
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_max_ss(h, _mm_shuffle_ps(h, h, 1)));
#else
    float amax = 0.0f;
    for (int k = 0; k < n; k++)
        if (fabsf(x[k]) > amax) amax = fabsf(x[k]);
    return amax;
#endif
}

/* q = nearest-even(x * inv) over a 32-value block whose |x * inv| <= 127 (up to the rounding of inv), and
   the sum of q (the vector paths round with the default MXCSR mode, nearest-even, as rintf does) */
static inline int32_t pyllama_round32(int8_t* q, const float* x, float inv) {
#if PYLLAMA_QBLOCKS_AVX512
    const __m512 s = _mm512_set1_ps(inv);
    const __m512i v0 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x), s));
    const __m512i v1 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + 16), s));
    _mm_storeu_si128((__m128i*)q, _mm512_cvtsepi32_epi8(v0));
    _mm_storeu_si128((__m128i*)(q + 16), _mm512_cvtsepi32_epi8(v1));
    return _mm512_reduce_add_epi32(_mm512_add_epi32(v0, v1));
#elif PYLLAMA_QBLOCKS_AVX2
    const __m256 s = _mm256_set1_ps(inv);
    __m256i v[4];
    for (int k = 0; k < 4; k++) v[k] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8 * k), s));
    /* packs interleave the 128-bit halves: the permutation puts the 32 bytes back in order */
    const __m256i w = _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
    _mm256_storeu_si256((__m256i*)q, _mm256_permutevar8x32_epi32(w, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
    const __m256i t = _mm256_add_epi32(_mm256_add_epi32(v[0], v[1]), _mm256_add_epi32(v[2], v[3]));
    __m128i h = _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
    h = _mm_add_epi32(h, _mm_unpackhi_epi64(h, h));
    return _mm_cvtsi128_si32(_mm_add_epi32(h, _mm_shuffle_epi32(h, _MM_SHUFFLE(2, 3, 0, 1))));
#else
    int32_t sum = 0;
    for (int k = 0; k < PYLLAMA_QK; k++) {
        const int v = (int)rintf(x[k] * inv);
        q[k] = (int8_t)v;
        sum += v;
    }
    return sum;
#endif
}

/* Q8_1 (ggml's x86 quantize_row_q8_1): d = amax / 127 stored as fp16, q = rint(x * 127 / amax),
   s = fp16(d * sum(q)) with the float32 d. */
static inline void pyllama_quantize_q8_1(int8_t* q, float* d, float* s, const float* x, ptrdiff_t n) {
    for (ptrdiff_t b = 0; b < n / PYLLAMA_QK; b++) {
        const float* xb = x + PYLLAMA_QK * b;
        const float amax = pyllama_absmax(xb, PYLLAMA_QK);
        const float db = amax / 127.0f;
        const float inv = amax != 0.0f ? 127.0f / amax : 0.0f;
        const int32_t sum = pyllama_round32(q + PYLLAMA_QK * b, xb, inv);
        d[b] = pyllama_qh2f(pyllama_qf2h(db));
        s[b] = pyllama_qh2f(pyllama_qf2h(db * (float)sum));
    }
}

/* q = min(127, nearest-even(iscale * x)) over a Q8_K block and the sums of each 16 q (the vector paths
   round with the default MXCSR mode, nearest-even, as rintf does) */
static inline void pyllama_round_q8_k(int8_t* q, int16_t* bsums, const float* x, float iscale) {
#if PYLLAMA_QBLOCKS_AVX512
    const __m512 s = _mm512_set1_ps(iscale);
    const __m512i top = _mm512_set1_epi32(127);
    for (int j = 0; j < 16; j++) {
        const __m512i v = _mm512_min_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(s, _mm512_loadu_ps(x + 16 * j))), top);
        _mm_storeu_si128((__m128i*)(q + 16 * j), _mm512_cvtsepi32_epi8(v));
        bsums[j] = (int16_t)_mm512_reduce_add_epi32(v);
    }
#elif PYLLAMA_QBLOCKS_AVX2
    const __m256 s = _mm256_set1_ps(iscale);
    const __m256i top = _mm256_set1_epi32(127);
    for (int j = 0; j < 16; j++) {
        const __m256i v0 = _mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(s, _mm256_loadu_ps(x + 16 * j))), top);
        const __m256i v1 = _mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(s, _mm256_loadu_ps(x + 16 * j + 8))), top);
        const __m256i w = _mm256_permute4x64_epi64(_mm256_packs_epi32(v0, v1), 0xD8); /* 16 int16, in order */
        _mm_storeu_si128((__m128i*)(q + 16 * j), _mm_packs_epi16(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1)));
        const __m256i t = _mm256_add_epi32(v0, v1);
        __m128i h = _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
        h = _mm_add_epi32(h, _mm_unpackhi_epi64(h, h));
        bsums[j] = (int16_t)_mm_cvtsi128_si32(_mm_add_epi32(h, _mm_shuffle_epi32(h, _MM_SHUFFLE(2, 3, 0, 1))));
    }
#else
    for (int k = 0; k < PYLLAMA_QK_K; k++) {
        const int v = (int)rintf(iscale * x[k]);
        q[k] = (int8_t)(v < 127 ? v : 127);
    }
    for (int j = 0; j < 16; j++) {
        int sum = 0;
        for (int k = 0; k < 16; k++) sum += q[16 * j + k];
        bsums[j] = (int16_t)sum;
    }
#endif
}

/* Q8_K (ggml's quantize_row_q8_K_ref, which x86 uses): the value of largest magnitude (the first
   one) sets iscale = -127 / max, q = min(127, nearest-even(iscale * x)), d = 1 / iscale, and the
   sums of each 16 q. An all-zero block gets d = 0, q = 0. */
static inline void pyllama_quantize_q8_k(int8_t* q, float* d, int16_t* bsums, const float* x, ptrdiff_t n) {
    for (ptrdiff_t b = 0; b < n / PYLLAMA_QK_K; b++) {
        const float* xb = x + PYLLAMA_QK_K * b;
        int8_t* qb = q + PYLLAMA_QK_K * b;
        const float amax = pyllama_absmax(xb, PYLLAMA_QK_K);
        if (amax == 0.0f) {
            memset(qb, 0, PYLLAMA_QK_K);
            for (int j = 0; j < 16; j++) bsums[16 * b + j] = 0;
            d[b] = 0.0f;
            continue;
        }
        float vmax = amax;
        for (int k = 0; k < PYLLAMA_QK_K; k++)
            if (fabsf(xb[k]) == amax) {
                vmax = xb[k]; /* the first value of largest magnitude: its sign decides */
                break;
            }
        const float iscale = -127.0f / vmax;
        pyllama_round_q8_k(qb, bsums + 16 * b, xb, iscale);
        d[b] = 1.0f / iscale;
    }
}

/* position p of the Q8_1 and Q8_K activations (qtypes.h's pyllama_acts) */
static void pyllama_act_q8_1(const pyllama_acts* a, ptrdiff_t p) {
    pyllama_quantize_q8_1(a->q + p * a->cols, a->d + p * a->d_stride, a->s + p * (a->cols / PYLLAMA_QK),
                          a->x + p * a->cols, a->cols);
}
static void pyllama_act_q8_k(const pyllama_acts* a, ptrdiff_t p) {
    pyllama_quantize_q8_k(a->q + p * a->cols, a->d + p * a->d_stride, a->bsums + p * (a->cols / 16),
                          a->x + p * a->cols, a->cols);
}

/* ---- exact int8 dot products ---- */
/* sum_k w[k] x[k] over 32 values, as 8 int32 lanes: lane l holds k = 4l..4l+3. |w| <= 128, |x| <= 127. */
#if PYLLAMA_QBLOCKS_AVX2
static inline __m256i pyllama_lanes_i8(__m256i w, __m256i x) {
    const __m256i aw = _mm256_sign_epi8(w, w); /* |w| as unsigned bytes: -128 gives 128, exact */
    const __m256i sx = _mm256_sign_epi8(x, w); /* x * sign(w) */
    /* byte pairs to int16: |sum| <= 2 * 128 * 127 < 32767, so maddubs never saturates */
    return _mm256_madd_epi16(_mm256_maddubs_epi16(aw, sx), _mm256_set1_epi16(1));
}
/* unsigned weights w <= 31 need no sign trick */
static inline __m256i pyllama_lanes_u8(__m256i w, __m256i x) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1));
}
static inline int32_t pyllama_hsum_i32x4(__m128i v) {
    v = _mm_add_epi32(v, _mm_unpackhi_epi64(v, v));
    v = _mm_add_epi32(v, _mm_shuffle_epi32(v, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(v);
}
#endif

#if PYLLAMA_QBLOCKS_AVX512
/* pyllama_lanes_u8 on 64 values: 16 int32 lanes, lane l of each 256-bit half as in the AVX2 form.
   vpdpbusd sums the four products without maddubs' int16 step, which never saturates here. */
static inline __m512i pyllama_lanes_u8_x2(__m512i w, __m512i x) {
#if PYLLAMA_QBLOCKS_VNNI
    return _mm512_dpbusd_epi32(_mm512_setzero_si512(), w, x);
#else
    return _mm512_madd_epi16(_mm512_maddubs_epi16(w, x), _mm512_set1_epi16(1));
#endif
}
/* pyllama_lanes_i8 on 64 values. zmm has no vpsignb: x is negated where w is negative (a byte mask),
   which is x * sign(w) wherever w != 0, and |w| = 0 elsewhere: the same products. */
static inline __m512i pyllama_lanes_i8_x2(__m512i w, __m512i x) {
    const __m512i sx = _mm512_mask_sub_epi8(x, _mm512_movepi8_mask(w), _mm512_setzero_si512(), x);
    return pyllama_lanes_u8_x2(_mm512_abs_epi8(w), sx);
}
/* the 8 lanes of the two halves added (exact): a super-block's lanes from its 64-value steps */
static inline __m256i pyllama_fold_halves(__m512i v) {
    return _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
}
/* acc + madd(p, scales): the int16 products of maddubs times their int16 scales, pairs summed */
static inline __m512i pyllama_madd_acc(__m512i acc, __m512i p, __m512i scales) {
#if PYLLAMA_QBLOCKS_VNNI
    return _mm512_dpwssd_epi32(acc, p, scales);
#else
    return _mm512_add_epi32(acc, _mm512_madd_epi16(p, scales));
#endif
}
#endif

/* the two sums of 16 of a 32-value int8 dot: *lo = sum over k < 16, *hi = sum over 16 <= k < 32 */
static inline void pyllama_dot32_halves(const int8_t* w, const int8_t* x, int32_t* lo, int32_t* hi) {
#if PYLLAMA_QBLOCKS_AVX2
    const __m256i l = pyllama_lanes_i8(_mm256_loadu_si256((const __m256i*)w),
                                       _mm256_loadu_si256((const __m256i*)x));
    *lo = pyllama_hsum_i32x4(_mm256_castsi256_si128(l));
    *hi = pyllama_hsum_i32x4(_mm256_extracti128_si256(l, 1));
#else
    int32_t a = 0, b = 0;
    for (int k = 0; k < 16; k++) a += (int32_t)w[k] * x[k];
    for (int k = 16; k < 32; k++) b += (int32_t)w[k] * x[k];
    *lo = a;
    *hi = b;
#endif
}

static inline float pyllama_qreduce8(const float* a) {
    return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
}

#if PYLLAMA_QBLOCKS_AVX2
/* pyllama_qreduce8 of eight accumulators at once: transposed 8 x 8 so that x[k] holds lane k of each,
   then ((x0 + x4) + (x2 + x6)) + ((x1 + x5) + (x3 + x7)) elementwise, pyllama_qreduce8's additions for
   every accumulator (its scalar form spent about as long as a 288-column tile's blocks) */
static inline __m256 pyllama_qreduce8_x8(__m256 a0, __m256 a1, __m256 a2, __m256 a3, __m256 a4, __m256 a5,
                                         __m256 a6, __m256 a7) {
    const __m256 t0 = _mm256_unpacklo_ps(a0, a1), t1 = _mm256_unpackhi_ps(a0, a1);
    const __m256 t2 = _mm256_unpacklo_ps(a2, a3), t3 = _mm256_unpackhi_ps(a2, a3);
    const __m256 t4 = _mm256_unpacklo_ps(a4, a5), t5 = _mm256_unpackhi_ps(a4, a5);
    const __m256 t6 = _mm256_unpacklo_ps(a6, a7), t7 = _mm256_unpackhi_ps(a6, a7);
    const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
    const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
    const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
    const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
    /* x[k]: lane k of a0 .. a7 */
    const __m256 x0 = _mm256_permute2f128_ps(u0, u4, 0x20), x4 = _mm256_permute2f128_ps(u0, u4, 0x31);
    const __m256 x1 = _mm256_permute2f128_ps(u1, u5, 0x20), x5 = _mm256_permute2f128_ps(u1, u5, 0x31);
    const __m256 x2 = _mm256_permute2f128_ps(u2, u6, 0x20), x6 = _mm256_permute2f128_ps(u2, u6, 0x31);
    const __m256 x3 = _mm256_permute2f128_ps(u3, u7, 0x20), x7 = _mm256_permute2f128_ps(u3, u7, 0x31);
    return _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(x0, x4), _mm256_add_ps(x2, x6)),
                         _mm256_add_ps(_mm256_add_ps(x1, x5), _mm256_add_ps(x3, x7)));
}
#endif

#endif /* PYLLAMA_QBLOCKS_H */
