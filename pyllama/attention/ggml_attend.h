/* The weighted sum of llama.cpp's attention, out = V^T a, as ggml_vec_dot_f32 computes each output on
 * AVX2 (head.pyx): output i is 32 lanes, lane l a fused chain over the rows t = l mod 32 in ascending
 * order, reduced by pyllama_ggml_reduce32. The lanes are built one at a time, up to 64 outputs (8 AVX2
 * registers) at once, so a lane's chain stays in registers over its rows; every build computes the same
 * chains (fmaf or _mm256_fmadd_ps, one rounding each), so the bits do not depend on the path. */
#ifndef PYLLAMA_GGML_ATTEND_H
#define PYLLAMA_GGML_ATTEND_H
#include <stddef.h>
#include "../kernels/ggml_math.h"
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

/* row t of the keys or values: vp[t] when vp is given, else base + t * stride */
static inline const float* pyllama_kv_row(const float* const* vp, const float* base, ptrdiff_t stride, long t) {
    return vp != NULL ? vp[t] : base + t * stride;
}

#if defined(__AVX2__) && defined(__FMA__)
/* lane l's chains of nv * 8 outputs from d0, in nv registers (nv <= 8), stored at o */
static inline __attribute__((always_inline)) void pyllama_ggml_lane_vectors(float* o, const float* w,
                                                                             const float* const* vp,
                                                                             const float* base, ptrdiff_t stride,
                                                                             long n, int l, int d0, const int nv) {
    __m256 a[8];
    for (int k = 0; k < nv; k++) a[k] = _mm256_setzero_ps();
    for (long t = l; t < n; t += 32) {
        const float* v = pyllama_kv_row(vp, base, stride, t) + d0;
        const __m256 b = _mm256_set1_ps(w[t]);
        for (int k = 0; k < nv; k++) a[k] = _mm256_fmadd_ps(_mm256_loadu_ps(v + 8 * k), b, a[k]);
    }
    for (int k = 0; k < nv; k++) _mm256_storeu_ps(o + 8 * k, a[k]);
}
#endif

/* lane l's chains of outputs d0 .. d0 + m - 1 (m <= 64) into lanes[l * hd + d0 ...]: with AVX2 the
   whole groups of 8 outputs in registers (a head of 48, the 15M shape's, had run all its outputs
   through the scalar loop below), the rest one fmaf at a time; the same chains either way */
static inline void pyllama_ggml_lane_chunk(float* lanes, const float* w, const float* const* vp, const float* base,
                                           ptrdiff_t stride, long n, int hd, int l, int d0, int m) {
    float* o = lanes + (ptrdiff_t)l * hd + d0;
    int k0 = 0;
#if defined(__AVX2__) && defined(__FMA__)
    switch (m / 8) {
        case 8: pyllama_ggml_lane_vectors(o, w, vp, base, stride, n, l, d0, 8); break;
        case 7: pyllama_ggml_lane_vectors(o, w, vp, base, stride, n, l, d0, 7); break;
        case 6: pyllama_ggml_lane_vectors(o, w, vp, base, stride, n, l, d0, 6); break;
        case 5: pyllama_ggml_lane_vectors(o, w, vp, base, stride, n, l, d0, 5); break;
        case 4: pyllama_ggml_lane_vectors(o, w, vp, base, stride, n, l, d0, 4); break;
        case 3: pyllama_ggml_lane_vectors(o, w, vp, base, stride, n, l, d0, 3); break;
        case 2: pyllama_ggml_lane_vectors(o, w, vp, base, stride, n, l, d0, 2); break;
        case 1: pyllama_ggml_lane_vectors(o, w, vp, base, stride, n, l, d0, 1); break;
        default: break;
    }
    k0 = m - m % 8;
    if (k0 == m)
        return;
#endif
    for (int k = k0; k < m; k++)
        o[k] = 0.0f;
    for (long t = l; t < n; t += 32) {
        const float* v = pyllama_kv_row(vp, base, stride, t) + d0;
        const float a = w[t];
        for (int k = k0; k < m; k++)
            o[k] = fmaf(v[k], a, o[k]);
    }
}

/* out[i] = pyllama_ggml_reduce32(lanes + i, stride) for i < count. With AVX2, 8 outputs side by side:
   every addition is elementwise, so each output gets exactly the scalar form's additions (a head of 64
   spends more in the 64 scalar reductions, 31 additions and 32 strided loads each, than in its
   weighted sum below 256 rows) */
static inline void pyllama_ggml_reduce_lanes(float* out, const float* lanes, ptrdiff_t stride, int count) {
    int i = 0;
#if defined(__AVX512F__)
    /* the same, 16 outputs side by side */
    for (; i + 16 <= count; i += 16) {
        const float* a = lanes + i;
        __m512 y[8];
        for (int e = 0; e < 8; e++)
            y[e] = _mm512_add_ps(_mm512_add_ps(_mm512_loadu_ps(a + e * stride),
                                               _mm512_loadu_ps(a + (16 + e) * stride)),
                                 _mm512_add_ps(_mm512_loadu_ps(a + (8 + e) * stride),
                                               _mm512_loadu_ps(a + (24 + e) * stride)));
        const __m512 t0 = _mm512_add_ps(y[0], y[4]), t1 = _mm512_add_ps(y[1], y[5]);
        const __m512 t2 = _mm512_add_ps(y[2], y[6]), t3 = _mm512_add_ps(y[3], y[7]);
        _mm512_storeu_ps(out + i, _mm512_add_ps(_mm512_add_ps(t0, t1), _mm512_add_ps(t2, t3)));
    }
#endif
#if defined(__AVX2__) && defined(__FMA__)
    for (; i + 8 <= count; i += 8) {
        const float* a = lanes + i;
        __m256 y[8];
        for (int e = 0; e < 8; e++)
            y[e] = _mm256_add_ps(_mm256_add_ps(_mm256_loadu_ps(a + e * stride),
                                               _mm256_loadu_ps(a + (16 + e) * stride)),
                                 _mm256_add_ps(_mm256_loadu_ps(a + (8 + e) * stride),
                                               _mm256_loadu_ps(a + (24 + e) * stride)));
        const __m256 t0 = _mm256_add_ps(y[0], y[4]), t1 = _mm256_add_ps(y[1], y[5]);
        const __m256 t2 = _mm256_add_ps(y[2], y[6]), t3 = _mm256_add_ps(y[3], y[7]);
        _mm256_storeu_ps(out + i, _mm256_add_ps(_mm256_add_ps(t0, t1), _mm256_add_ps(t2, t3)));
    }
#endif
    for (; i < count; i++)
        out[i] = pyllama_ggml_reduce32(lanes + i, stride);
}

static inline void pyllama_ggml_weighted_rows(float* out, const float* w, const float* const* vp, const float* base,
                                              ptrdiff_t stride, long n, int hd, float* lanes) {
    for (int d0 = 0; d0 < hd; d0 += 64) {
        const int m = hd - d0 < 64 ? hd - d0 : 64;
        for (int l = 0; l < 32; l++)
            pyllama_ggml_lane_chunk(lanes, w, vp, base, stride, n, hd, l, d0, m);
    }
    pyllama_ggml_reduce_lanes(out, lanes, hd, hd);
}

#if defined(__AVX2__) && defined(__FMA__)
/* x[e] = (r[0][i + e], ..., r[7][i + e]) for e < 8: elements i .. i + 7 of eight rows, transposed */
static inline void pyllama_transpose8(const float* const* r, long i, __m256* x) {
    __m256 t[8], u[8];
    for (int k = 0; k < 8; k += 2) {
        const __m256 a = _mm256_loadu_ps(r[k] + i), b = _mm256_loadu_ps(r[k + 1] + i);
        t[k] = _mm256_unpacklo_ps(a, b);     /* a0 b0 a1 b1 | a4 b4 a5 b5 */
        t[k + 1] = _mm256_unpackhi_ps(a, b); /* a2 b2 a3 b3 | a6 b6 a7 b7 */
    }
    for (int h = 0; h < 8; h += 4) {         /* rows h .. h + 3 */
        u[h] = _mm256_shuffle_ps(t[h], t[h + 2], 0x44);     /* elements 0 | 4 */
        u[h + 1] = _mm256_shuffle_ps(t[h], t[h + 2], 0xEE); /* 1 | 5 */
        u[h + 2] = _mm256_shuffle_ps(t[h + 1], t[h + 3], 0x44); /* 2 | 6 */
        u[h + 3] = _mm256_shuffle_ps(t[h + 1], t[h + 3], 0xEE); /* 3 | 7 */
    }
    for (int e = 0; e < 4; e++) {
        x[e] = _mm256_permute2f128_ps(u[e], u[4 + e], 0x20);
        x[e + 4] = _mm256_permute2f128_ps(u[e], u[4 + e], 0x31);
    }
}
#endif

/* scores[t] = pyllama_ggml_dot_f32(key row t, q, hd) * scale for t < n (row t: kp[t] when the table is
   given, else base + t * stride). With AVX2, eight rows at a time: each row's 32 lanes and 8 -> 4 step
   by pyllama_ggml_dot32_t, the helper pyllama_ggml_dot_f32 uses, then the last steps,
   (t0 + t1) + (t2 + t3), for the eight rows side by side after a transpose, then a head size's
   remainder past the last multiple of 32 (the 15M shape's 48) as each row's fused chain in order, the
   eight chains side by side, their operands transposed 8 x 8 at a time (gathered one element per row
   before: 8 loads and 7 inserts per step): the same operations on the same operands, so the same
   bits, for a quarter of the horizontal work. */
static inline void pyllama_ggml_scores(float* scores, const float* q, const float* const* kp, const float* base,
                                       ptrdiff_t stride, long n, int hd, float scale) {
    long t = 0;
#if defined(__AVX2__) && defined(__FMA__)
    const long np = hd & ~31L;
    const __m256 sv = _mm256_set1_ps(scale);
    for (; t + 8 <= n; t += 8) {
        const float* r[8];
        __m128 tk[8];
        for (int k = 0; k < 8; k++) {
            r[k] = pyllama_kv_row(kp, base, stride, t + k);
            tk[k] = pyllama_ggml_dot32_t(r[k], q, np);
        }
        /* u_k = [t of row k | t of row k + 4]; a 4 x 4 transpose in each 128-bit half gives
           c_e = element e of every row's t, rows 0-3 low, 4-7 high */
        const __m256 u0 = _mm256_set_m128(tk[4], tk[0]), u1 = _mm256_set_m128(tk[5], tk[1]);
        const __m256 u2 = _mm256_set_m128(tk[6], tk[2]), u3 = _mm256_set_m128(tk[7], tk[3]);
        const __m256 w0 = _mm256_unpacklo_ps(u0, u1), w1 = _mm256_unpackhi_ps(u0, u1);
        const __m256 w2 = _mm256_unpacklo_ps(u2, u3), w3 = _mm256_unpackhi_ps(u2, u3);
        const __m256 c0 = _mm256_shuffle_ps(w0, w2, 0x44), c1 = _mm256_shuffle_ps(w0, w2, 0xEE);
        const __m256 c2 = _mm256_shuffle_ps(w1, w3, 0x44), c3 = _mm256_shuffle_ps(w1, w3, 0xEE);
        __m256 total = _mm256_add_ps(_mm256_add_ps(c0, c1), _mm256_add_ps(c2, c3));
        long i = np;
        for (; i + 8 <= hd; i += 8) {
            /* an 8 x 8 transpose: x[e] lane k = element i + e of row k, then the chains' next 8 steps */
            __m256 x[8];
            pyllama_transpose8(r, i, x);
            for (int e = 0; e < 8; e++) total = _mm256_fmadd_ps(x[e], _mm256_set1_ps(q[i + e]), total);
        }
        for (; i < hd; i++) {
            const __m256 xi = _mm256_set_ps(r[7][i], r[6][i], r[5][i], r[4][i], r[3][i], r[2][i], r[1][i], r[0][i]);
            total = _mm256_fmadd_ps(xi, _mm256_set1_ps(q[i]), total);
        }
        _mm256_storeu_ps(scores + t, _mm256_mul_ps(total, sv));
    }
#endif
    for (; t < n; t++)
        scores[t] = pyllama_ggml_dot_f32(pyllama_kv_row(kp, base, stride, t), q, hd) * scale;
}

/* pyllama_ggml_scores of m queries (q + j * q_stride) over rows 0 .. n + j * grow - 1, into
   scores + j * score_stride (grow 1: a block's consecutive queries; grow 0: the query heads of one
   position over the same rows): 64 rows at a time for every query, so the 16 KiB of a 64-wide head's
   rows scored for the first query are still in L1 for the others. A score is its row's and query's
   alone, computed the same way in a batch of eight rows or alone: the same bits. */
static inline void pyllama_ggml_scores_group(float* scores, ptrdiff_t score_stride, const float* q,
                                             ptrdiff_t q_stride, long m, const float* base, ptrdiff_t stride, long n,
                                             long grow, int hd, float scale) {
    const long total = n + (m - 1) * grow;
    for (long t0 = 0; t0 < total; t0 += 64) {
        for (long j = 0; j < m; j++) {
            const long rows = n + j * grow, end = t0 + 64 < rows ? t0 + 64 : rows;
            if (end > t0)
                pyllama_ggml_scores(scores + j * score_stride + t0, q + j * q_stride, NULL, base + t0 * stride, stride,
                                    end - t0, hd, scale);
        }
    }
}
#endif
