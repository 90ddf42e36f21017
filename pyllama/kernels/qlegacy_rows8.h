/* The eight-row products of qlegacy.h's types: Q4_0 and IQ4_NL matrices whose row count is a multiple of 8,
 * in the order of llama.cpp's repacked gemv/gemm_q4_0_8x8_q8_0 (described in qlegacy.h).
 */
#ifndef PYLLAMA_QLEGACY_ROWS8_H
#define PYLLAMA_QLEGACY_ROWS8_H

#include "qlegacy.h"

/* The eight-row tile of a block stays a function of its own: inlined into the product's loop over units,
   it ran 4.5% slower (gcc's register allocation of the loop around it; measured on the 42M shape's
   Q4_0 matrices at 512 positions) */
#if defined(__GNUC__)
#define PYLLAMA_NOINLINE __attribute__((noinline))
#else
#define PYLLAMA_NOINLINE
#endif

/* ggml's order for the weights it repacks into 8-row groups on AVX2 (Q4_0 and IQ4_NL when the row
   count is a multiple of 8: gemv/gemm_q4_0_8x8_q8_0): per block the whole 32-product integer sum
   (exact), then one float chain acc = fma((float)isum, d_w * d_x, acc) over the blocks in order. */
static inline float pyllama_dot_legacy_chain(int kind, const uint8_t* w, const pyllama_qact* a, ptrdiff_t cols) {
    const ptrdiff_t nb = cols / PYLLAMA_QK, bytes = pyllama_legacy_bytes[kind];
    float acc = 0.0f;
    for (ptrdiff_t b = 0; b < nb; b++) {
        const uint8_t* blk = w + bytes * b;
        if ((b & 1) == 0) pyllama_qprefetch(blk + PYLLAMA_QPREFETCH_AHEAD);
        int32_t lo, hi;
#if PYLLAMA_QBLOCKS_AVX2
        const __m256i l = pyllama_lanes_i8(pyllama_legacy_unpack_avx2(kind, blk),
                                           _mm256_loadu_si256((const __m256i*)(a->q + PYLLAMA_QK * b)));
        lo = pyllama_hsum_i32x4(_mm256_castsi256_si128(l));
        hi = pyllama_hsum_i32x4(_mm256_extracti128_si256(l, 1));
#else
        int8_t wq[32];
        pyllama_legacy_unpack(kind, blk, wq);
        pyllama_dot32_halves(wq, a->q + PYLLAMA_QK * b, &lo, &hi);
#endif
        acc = fmaf((float)(lo + hi), pyllama_half_at(blk) * a->d[b], acc);
    }
    return acc;
}

static inline short pyllama_i16_at(const uint8_t* p) {
    short v;
    memcpy(&v, p, 2);
    return v;
}

/* Eight consecutive rows at once in the chain order above (lane j = row j, so each lane is exactly
   pyllama_dot_legacy_chain of its row), for P positions (1: decode, 4: a block's tile): per block, the
   eight rows' weights are unpacked and their eight d_w converted once; for each position the eight
   32-product integer sums are reduced into one vector (hadd, exact), scaled by the eight d_w * d_x and
   fused-multiply-added into that position's eight chains. The next group of rows is prefetched as a
   linear stream. out[p * out_stride + j] is row w + j * row_bytes at position p. */
static inline __attribute__((always_inline)) void pyllama_rows8_legacy_chain(
    int kind, const uint8_t* w, ptrdiff_t row_bytes, const pyllama_qact* a, ptrdiff_t cols, float* out,
    ptrdiff_t out_stride, const int P) {
#if PYLLAMA_QBLOCKS_AVX2 && defined(__F16C__)
    const ptrdiff_t nb = cols / PYLLAMA_QK, bytes = pyllama_legacy_bytes[kind];
    const uint8_t* next = w + 8 * row_bytes;
    const __m256i ones16 = _mm256_set1_epi16(1);
    __m256 acc[4];
    for (int p = 0; p < P; p++) acc[p] = _mm256_setzero_ps();
    for (ptrdiff_t b = 0; b < nb; b++) {
        pyllama_qprefetch(next + 144 * b);
        pyllama_qprefetch(next + 144 * b + 64);
        pyllama_qprefetch(next + 144 * b + 128);
        const uint8_t* d0 = w + bytes * b;
#if PYLLAMA_QBLOCKS_AVX512
        /* rows 2k and 2k + 1 in one register */
        __m512i q[4];
        for (int k = 0; k < 4; k++) {
            const uint8_t* blk = d0 + 2 * k * row_bytes;
            q[k] = kind == PYLLAMA_Q4_0 ? pyllama_nibbles2_avx512(blk + 2, blk + row_bytes + 2)
                                   : pyllama_legacy_unpack2_avx512(kind, blk, blk + row_bytes);
        }
#else
        __m256i q[8];
        for (int j = 0; j < 8; j++) {
            const uint8_t* blk = d0 + j * row_bytes;
            if (kind == PYLLAMA_Q4_0) {
                /* (q - 8) x = q x - 8 x: unsigned nibbles need no sign trick; 8 * sum(x) comes off below.
                   The 16 bytes in both halves, the high half shifted by 4: low nibbles, then high. */
                const __m256i packed = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)(blk + 2)));
                q[j] = _mm256_and_si256(_mm256_srlv_epi64(packed, _mm256_set_epi64x(4, 4, 0, 0)), _mm256_set1_epi8(15));
            } else {
                q[j] = pyllama_legacy_unpack_avx2(kind, blk);
            }
        }
#endif
        const __m256 dw = _mm256_cvtph_ps(_mm_set_epi16(
            pyllama_i16_at(d0 + 7 * row_bytes), pyllama_i16_at(d0 + 6 * row_bytes),
            pyllama_i16_at(d0 + 5 * row_bytes), pyllama_i16_at(d0 + 4 * row_bytes),
            pyllama_i16_at(d0 + 3 * row_bytes), pyllama_i16_at(d0 + 2 * row_bytes),
            pyllama_i16_at(d0 + row_bytes), pyllama_i16_at(d0)));
        for (int p = 0; p < P; p++) {
            const __m256i xq = _mm256_loadu_si256((const __m256i*)(a[p].q + PYLLAMA_QK * b));
#if PYLLAMA_QBLOCKS_AVX512
            /* the eight 8-lane sums reduced by shuffles (exact) */
            const __m512i xx = _mm512_broadcast_i64x4(xq);
            __m512i l[4];
            for (int k = 0; k < 4; k++)
                l[k] = kind == PYLLAMA_Q4_0 ? pyllama_lanes_u8_x2(q[k], xx) : pyllama_lanes_i8_x2(q[k], xx);
            /* 128-bit lane j of r0123: row j's four partial sums; of r4567: row 4 + j's */
            const __m512i r0123 = _mm512_add_epi32(_mm512_shuffle_i32x4(l[0], l[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                                   _mm512_shuffle_i32x4(l[0], l[1], _MM_SHUFFLE(3, 1, 3, 1)));
            const __m512i r4567 = _mm512_add_epi32(_mm512_shuffle_i32x4(l[2], l[3], _MM_SHUFFLE(2, 0, 2, 0)),
                                                   _mm512_shuffle_i32x4(l[2], l[3], _MM_SHUFFLE(3, 1, 3, 1)));
            __m512i t = _mm512_add_epi32(_mm512_unpacklo_epi32(r0123, r4567), _mm512_unpackhi_epi32(r0123, r4567));
            t = _mm512_add_epi32(t, _mm512_unpackhi_epi64(t, t));  /* 128-bit lane j starts with rows j, 4 + j */
            __m256i isum = _mm512_castsi512_si256(
                _mm512_permutexvar_epi32(_mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 13, 9, 5, 1, 12, 8, 4, 0), t));
#else
            __m256i l[8];
            for (int j = 0; j < 8; j++)
                l[j] = kind == PYLLAMA_Q4_0 ? _mm256_madd_epi16(_mm256_maddubs_epi16(q[j], xq), ones16)
                                       : pyllama_lanes_i8(q[j], xq);
            const __m256i s0123 = _mm256_hadd_epi32(_mm256_hadd_epi32(l[0], l[1]), _mm256_hadd_epi32(l[2], l[3]));
            const __m256i s4567 = _mm256_hadd_epi32(_mm256_hadd_epi32(l[4], l[5]), _mm256_hadd_epi32(l[6], l[7]));
            __m256i isum = _mm256_add_epi32(_mm256_permute2x128_si256(s0123, s4567, 0x20),
                                            _mm256_permute2x128_si256(s0123, s4567, 0x31));
#endif
            if (kind == PYLLAMA_Q4_0) {
                const __m256i lx = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), xq), ones16);
                const __m128i x4 = _mm_add_epi32(_mm256_castsi256_si128(lx), _mm256_extracti128_si256(lx, 1));
                isum = _mm256_sub_epi32(isum, _mm256_set1_epi32(8 * pyllama_hsum_i32x4(x4)));
            }
            acc[p] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(dw, _mm256_set1_ps(a[p].d[b])), acc[p]);
        }
    }
    for (int p = 0; p < P; p++) _mm256_storeu_ps(out + p * out_stride, acc[p]);
#else
    for (int p = 0; p < P; p++)
        for (int j = 0; j < 8; j++)
            out[p * out_stride + j] = pyllama_dot_legacy_chain(kind, w + j * row_bytes, &a[p], cols);
#endif
}

static void pyllama_dot8_legacy_chain(int kind, const uint8_t* w, ptrdiff_t row_bytes, const pyllama_qact* a,
                                      ptrdiff_t cols, float* out) {
    pyllama_rows8_legacy_chain(kind, w, row_bytes, a, cols, out, 0, 1);
}

static void pyllama_dot8x4_legacy_chain(int kind, const uint8_t* w, ptrdiff_t row_bytes, const pyllama_qact* a,
                                        ptrdiff_t cols, float* out, ptrdiff_t out_stride) {
    pyllama_rows8_legacy_chain(kind, w, row_bytes, a, cols, out, out_stride, 4);
}

PYLLAMA_NOINLINE static void pyllama_dot8x4_q4_0_chain(const uint8_t* w, ptrdiff_t row_bytes, const pyllama_qact* a, ptrdiff_t n,
                                      float* out, ptrdiff_t out_stride) {
    pyllama_dot8x4_legacy_chain(PYLLAMA_Q4_0, w, row_bytes, a, n, out, out_stride);
}
PYLLAMA_NOINLINE static void pyllama_dot8x4_iq4_nl_chain(const uint8_t* w, ptrdiff_t row_bytes, const pyllama_qact* a, ptrdiff_t n,
                                        float* out, ptrdiff_t out_stride) {
    pyllama_dot8x4_legacy_chain(PYLLAMA_IQ4_NL, w, row_bytes, a, n, out, out_stride);
}

static void pyllama_dot8_q4_0_chain(const uint8_t* w, ptrdiff_t row_bytes, const pyllama_qact* a, ptrdiff_t n,
                                    float* out) {
    pyllama_dot8_legacy_chain(PYLLAMA_Q4_0, w, row_bytes, a, n, out);
}
static void pyllama_dot8_iq4_nl_chain(const uint8_t* w, ptrdiff_t row_bytes, const pyllama_qact* a,
                                      ptrdiff_t n, float* out) {
    pyllama_dot8_legacy_chain(PYLLAMA_IQ4_NL, w, row_bytes, a, n, out);
}

#endif
