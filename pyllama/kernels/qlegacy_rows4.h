/* Four rows times four positions of the 32-value types llama.cpp does not repack (Q4_1, Q5_0, Q5_1),
 * each element exactly pyllama_dot_legacy's (qlegacy.h).
 *
 * Why: one row times four positions (qlegacy.h's tile4) reads every position's int8 activation again
 * for every row. A block of 128 positions of a 1,536-column FFN is 200 KB of int8 that comes from L2 at
 * one byte per multiply-add, and that stream, not the arithmetic, held SmolLM2's Q4_1 prompt at about
 * half the Q8_0 rate per multiply-add. Here four rows share each activation load (as q8_0.h's unsigned
 * tile does), and the four positions' scales are taken together: per row and block, d_w * d_x is one
 * vector multiply for the four positions, and the Q4_1/Q5_1 offset term one vector fma whose lane p is
 * position p's fmaf(m_w, s_x, mins).
 *
 * Why the bits are the row dot's: each element's lanes are the same exact integer sums, its chain
 * acc = fma(d_w * d_x, lanes, acc) runs block after block as in pyllama_dot_legacy, the reduction is
 * pyllama_qreduce8's additions (pyllama_qreduce8_x8) and the offset sum is added last, as there.
 * Sixteen accumulators want AVX-512VL's 32 vector registers; with AVX2's 16 the tile is two halves of
 * two rows. Without AVX2 it is tile4 row by row.
 */
#ifndef PYLLAMA_QLEGACY_ROWS4_H
#define PYLLAMA_QLEGACY_ROWS4_H

#include "qlegacy.h"

#if PYLLAMA_QBLOCKS_AVX2
/* pyllama_lanes_u8 / pyllama_lanes_i8 of one row's unpacked block and one position's block: one
   vpdpbusd with VNNI (the same sums: maddubs never saturates at |w| <= 31, |x| <= 127) */
static inline __m256i pyllama_rows4_lanes(int kind, __m256i wq, __m256i xq) {
#if PYLLAMA_QBLOCKS_VNNI
    if (PL_HAS_MIN(kind)) return _mm256_dpbusd_epi32(_mm256_setzero_si256(), wq, xq);
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_sign_epi8(wq, wq), _mm256_sign_epi8(xq, wq));
#else
    return PL_HAS_MIN(kind) ? pyllama_lanes_u8(wq, xq) : pyllama_lanes_i8(wq, xq);
#endif
}

/* Row r's block b: its integer weights, d_w * d_x for the four positions into d[4r..4r+3], and its
   offset term into m_r */
#define PYLLAMA_ROWS4_ROW(r)                                                                           \
    const uint8_t* blk##r = w + (r) * row_bytes + bytes * b;                                           \
    const __m256i w##r = pyllama_legacy_unpack_avx2(kind, blk##r);                                     \
    _mm_store_ps(d + 4 * (r), _mm_mul_ps(_mm_set1_ps(pyllama_half_at(blk##r)), dx4));                  \
    if (PL_HAS_MIN(kind)) m##r = _mm_fmadd_ps(_mm_set1_ps(pyllama_half_at(blk##r + 2)), sx4, m##r);
#define PYLLAMA_ROWS4_STEP(r, p)                                                                       \
    a##r##p = _mm256_fmadd_ps(_mm256_set1_ps(d[4 * (r) + (p)]),                                        \
                              _mm256_cvtepi32_ps(pyllama_rows4_lanes(kind, w##r, x##p)), a##r##p);
#define PYLLAMA_ROWS4_X(p) const __m256i x##p = _mm256_loadu_si256((const __m256i*)(a[p].q + PYLLAMA_QK * b));
/* the four positions' d_x and s_x of block b, lane p = position p */
#define PYLLAMA_ROWS4_SCALES                                                                           \
    const __m128 dx4 = _mm_setr_ps(a[0].d[b], a[1].d[b], a[2].d[b], a[3].d[b]);                       \
    const __m128 sx4 = PL_HAS_MIN(kind) ? _mm_setr_ps(a[0].s[b], a[1].s[b], a[2].s[b], a[3].s[b])      \
                                        : _mm_setzero_ps();

/* out[p * out_stride + r] = pyllama_qreduce8(a_rp) + mins_rp for R rows: reduced holds, per position,
   the R rows' reductions one after another (as pyllama_qreduce8_x8 returns them) */
static inline void pyllama_rows4_store(int R, const float* reduced, const float* mins, float* out,
                                       ptrdiff_t out_stride) {
    for (int p = 0; p < 4; p++)
        for (int r = 0; r < R; r++) out[p * out_stride + r] = reduced[R * p + r] + mins[4 * r + p];
}

#if PYLLAMA_QBLOCKS_AVX512
static inline __attribute__((always_inline)) void pyllama_rows4x4_legacy(
        int kind, const uint8_t* w, ptrdiff_t row_bytes, const pyllama_qact* a, ptrdiff_t cols, float* out,
        ptrdiff_t out_stride) {
    const ptrdiff_t nb = cols / PYLLAMA_QK, bytes = pyllama_legacy_bytes[kind];
    /* a<r><p>: row r, position p; each a variable of its own so that all sixteen stay in registers */
    __m256 a00 = _mm256_setzero_ps(), a01 = a00, a02 = a00, a03 = a00, a10 = a00, a11 = a00, a12 = a00,
           a13 = a00, a20 = a00, a21 = a00, a22 = a00, a23 = a00, a30 = a00, a31 = a00, a32 = a00, a33 = a00;
    __m128 m0 = _mm_setzero_ps(), m1 = m0, m2 = m0, m3 = m0;
    float d[16] __attribute__((aligned(64)));
    for (ptrdiff_t b = 0; b < nb; b++) {
        if ((b & 1) == 0)
            for (int r = 0; r < 4; r++) pyllama_qprefetch(w + r * row_bytes + bytes * b + PYLLAMA_QPREFETCH_AHEAD);
        PYLLAMA_ROWS4_SCALES
        PYLLAMA_ROWS4_ROW(0) PYLLAMA_ROWS4_ROW(1) PYLLAMA_ROWS4_ROW(2) PYLLAMA_ROWS4_ROW(3)
        /* d is read back a lane at a time: broadcasts from memory, not shuffles out of registers */
        __asm__("" : "+m"(d));
        PYLLAMA_ROWS4_X(0) PYLLAMA_ROWS4_X(1) PYLLAMA_ROWS4_X(2) PYLLAMA_ROWS4_X(3)
        PYLLAMA_ROWS4_STEP(0, 0) PYLLAMA_ROWS4_STEP(1, 0) PYLLAMA_ROWS4_STEP(2, 0) PYLLAMA_ROWS4_STEP(3, 0)
        PYLLAMA_ROWS4_STEP(0, 1) PYLLAMA_ROWS4_STEP(1, 1) PYLLAMA_ROWS4_STEP(2, 1) PYLLAMA_ROWS4_STEP(3, 1)
        PYLLAMA_ROWS4_STEP(0, 2) PYLLAMA_ROWS4_STEP(1, 2) PYLLAMA_ROWS4_STEP(2, 2) PYLLAMA_ROWS4_STEP(3, 2)
        PYLLAMA_ROWS4_STEP(0, 3) PYLLAMA_ROWS4_STEP(1, 3) PYLLAMA_ROWS4_STEP(2, 3) PYLLAMA_ROWS4_STEP(3, 3)
    }
    float reduced[16], mins[16];
    _mm256_storeu_ps(reduced, pyllama_qreduce8_x8(a00, a10, a20, a30, a01, a11, a21, a31));
    _mm256_storeu_ps(reduced + 8, pyllama_qreduce8_x8(a02, a12, a22, a32, a03, a13, a23, a33));
    _mm_storeu_ps(mins, m0);
    _mm_storeu_ps(mins + 4, m1);
    _mm_storeu_ps(mins + 8, m2);
    _mm_storeu_ps(mins + 12, m3);
    pyllama_rows4_store(4, reduced, mins, out, out_stride);
}
#else
/* two rows (w, w + row_bytes) times four positions: AVX2's sixteen registers hold eight accumulators */
static inline __attribute__((always_inline)) void pyllama_rows2x4_legacy(
        int kind, const uint8_t* w, ptrdiff_t row_bytes, const pyllama_qact* a, ptrdiff_t cols, float* out,
        ptrdiff_t out_stride) {
    const ptrdiff_t nb = cols / PYLLAMA_QK, bytes = pyllama_legacy_bytes[kind];
    __m256 a00 = _mm256_setzero_ps(), a01 = a00, a02 = a00, a03 = a00, a10 = a00, a11 = a00, a12 = a00,
           a13 = a00;
    __m128 m0 = _mm_setzero_ps(), m1 = m0;
    float d[8] __attribute__((aligned(32)));
    for (ptrdiff_t b = 0; b < nb; b++) {
        if ((b & 1) == 0)
            for (int r = 0; r < 2; r++) pyllama_qprefetch(w + r * row_bytes + bytes * b + PYLLAMA_QPREFETCH_AHEAD);
        PYLLAMA_ROWS4_SCALES
        PYLLAMA_ROWS4_ROW(0) PYLLAMA_ROWS4_ROW(1)
        __asm__("" : "+m"(d));
        PYLLAMA_ROWS4_X(0) PYLLAMA_ROWS4_X(1) PYLLAMA_ROWS4_X(2) PYLLAMA_ROWS4_X(3)
        PYLLAMA_ROWS4_STEP(0, 0) PYLLAMA_ROWS4_STEP(1, 0) PYLLAMA_ROWS4_STEP(0, 1) PYLLAMA_ROWS4_STEP(1, 1)
        PYLLAMA_ROWS4_STEP(0, 2) PYLLAMA_ROWS4_STEP(1, 2) PYLLAMA_ROWS4_STEP(0, 3) PYLLAMA_ROWS4_STEP(1, 3)
    }
    float reduced[8], mins[8];
    _mm256_storeu_ps(reduced, pyllama_qreduce8_x8(a00, a10, a01, a11, a02, a12, a03, a13));
    _mm_storeu_ps(mins, m0);
    _mm_storeu_ps(mins + 4, m1);
    pyllama_rows4_store(2, reduced, mins, out, out_stride);
}

static inline __attribute__((always_inline)) void pyllama_rows4x4_legacy(
        int kind, const uint8_t* w, ptrdiff_t row_bytes, const pyllama_qact* a, ptrdiff_t cols, float* out,
        ptrdiff_t out_stride) {
    pyllama_rows2x4_legacy(kind, w, row_bytes, a, cols, out, out_stride);
    pyllama_rows2x4_legacy(kind, w + 2 * row_bytes, row_bytes, a, cols, out + 2, out_stride);
}
#endif
#undef PYLLAMA_ROWS4_ROW
#undef PYLLAMA_ROWS4_STEP
#undef PYLLAMA_ROWS4_X
#undef PYLLAMA_ROWS4_SCALES
#else
static inline void pyllama_rows4x4_legacy(int kind, const uint8_t* w, ptrdiff_t row_bytes, const pyllama_qact* a,
                                          ptrdiff_t cols, float* out, ptrdiff_t out_stride) {
    for (int r = 0; r < 4; r++) pyllama_tile4_legacy(kind, w + r * row_bytes, a, cols, out + r, out_stride);
}
#endif

static void pyllama_rows4x4_q4_1(const uint8_t* w, ptrdiff_t row_bytes, const pyllama_qact* a, ptrdiff_t n,
                                 float* out, ptrdiff_t out_stride) {
    pyllama_rows4x4_legacy(PYLLAMA_Q4_1, w, row_bytes, a, n, out, out_stride);
}
static void pyllama_rows4x4_q5_0(const uint8_t* w, ptrdiff_t row_bytes, const pyllama_qact* a, ptrdiff_t n,
                                 float* out, ptrdiff_t out_stride) {
    pyllama_rows4x4_legacy(PYLLAMA_Q5_0, w, row_bytes, a, n, out, out_stride);
}
static void pyllama_rows4x4_q5_1(const uint8_t* w, ptrdiff_t row_bytes, const pyllama_qact* a, ptrdiff_t n,
                                 float* out, ptrdiff_t out_stride) {
    pyllama_rows4x4_legacy(PYLLAMA_Q5_1, w, row_bytes, a, n, out, out_stride);
}

#endif /* PYLLAMA_QLEGACY_ROWS4_H */
