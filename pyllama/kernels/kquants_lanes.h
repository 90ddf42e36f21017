/* The integer lanes of the K-quant row products (kquants.h): portable C, AVX2, and
 * AVX-512 doing two 32-value runs per step. Every path gives the same int32 lanes; kquants.h fuses
 * them into the float order of llama.cpp.
 */
#ifndef PYLLAMA_KQUANTS_LANES_H
#define PYLLAMA_KQUANTS_LANES_H

#include "qblocks.h"

/* ---- the 8 integer lanes of ggml's AVX2 K-quant dot products ----
   For each run c of 32 values, lane l gets scale16[2c + l / 4] * Σ_{k = 4l..4l+3} q[32c+k] x[32c+k]
   (maddubs, then madd with the scales), summed over the 8 runs; scale16 is the scale of each 16
   values (a Q4_K/Q5_K scale covers two). q is the unsigned code for Q2_K, Q4_K, Q5_K and Q6_K
   (Q6_K subtracts its 32 * scale * bsums afterwards, per lane), q - 4 (1 - high bit) for Q3_K. Every
   lane is an exact int32 whichever path computes it. */
static inline void pyllama_klanes_c(const int8_t* q, int q_offset, const int8_t* xq, const int* sc16,
                                    int32_t* lanes) {
    for (int l = 0; l < 8; l++) lanes[l] = 0;
    for (int c = 0; c < 8; c++)
        for (int l = 0; l < 8; l++) {
            int32_t s = 0;
            for (int k = 4 * l; k < 4 * l + 4; k++) s += (q[32 * c + k] + q_offset) * xq[32 * c + k];
            lanes[l] += sc16[2 * c + l / 4] * s;
        }
}
/* Q6_K's lane l correction: 32 * (bsums[2l] sc[2l] + bsums[2l+1] sc[2l+1]) */
static inline int32_t pyllama_q6k_offset_lane(const int16_t* bs, const int* sc, int l) {
    return 32 * (bs[2 * l] * sc[2 * l] + bs[2 * l + 1] * sc[2 * l + 1]);
}

#if PYLLAMA_QBLOCKS_AVX2
/* int16 number j of each 128-bit half of v, in all 8 int16 of that half */
static inline __m256i pyllama_pick16(__m256i v, int j) {
    return _mm256_shuffle_epi8(v, _mm256_set1_epi16((short)(0x0100 + 0x0202 * j)));
}
/* int16 scales of a 32-value run from 16 int8 scales: sc[2c] for the low 8 int16, sc[2c+1] for the high */
static inline __m256i pyllama_pair16(__m128i sc8, int c, int is_signed) {
    const __m128i m = _mm_set_epi64x((long long)(0x0101010101010101ULL * (uint64_t)(2 * c + 1)),
                                     (long long)(0x0101010101010101ULL * (uint64_t)(2 * c)));
    const __m128i picked = _mm_shuffle_epi8(sc8, m);
    return is_signed ? _mm256_cvtepi8_epi16(picked) : _mm256_cvtepu8_epi16(picked);
}
/* Q4_K / Q5_K: the 8 6-bit scales as int16 in both halves of *scales, the 8 mins as int16 in *mins */
static inline void pyllama_k4_scales_avx2(const uint8_t* s12, __m256i* scales, __m128i* mins) {
    uint32_t u[3];
    memcpy(u, s12, 12);
    const uint32_t sc_lo = u[0] & 0x3f3f3f3fu;
    const uint32_t sc_hi = (u[2] & 0x0f0f0f0fu) | (((u[0] >> 6) & 0x03030303u) << 4);
    const uint32_t mn_lo = u[1] & 0x3f3f3f3fu;
    const uint32_t mn_hi = ((u[2] >> 4) & 0x0f0f0f0fu) | (((u[1] >> 6) & 0x03030303u) << 4);
    const __m256i all = _mm256_cvtepu8_epi16(_mm_set_epi32((int)mn_hi, (int)mn_lo, (int)sc_hi, (int)sc_lo));
    *scales = _mm256_permute2x128_si256(all, all, 0x00);
    *mins = _mm256_extracti128_si256(all, 1);
}
/* Q4_K / Q5_K mins: lane l of the result is m[2l] S[2l] + m[2l+1] S[2l+1], S[k] the sum of 32 q_x */
static inline __m128i pyllama_k4_min_lanes(__m128i mins, const int16_t* bs) {
    const __m256i b = _mm256_loadu_si256((const __m256i*)bs);
    return _mm_madd_epi16(mins, _mm_hadd_epi16(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1)));
}
static inline int32_t pyllama_hsum_i32x8(__m256i v) {
    return pyllama_hsum_i32x4(_mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1)));
}
/* The lanes functions take np <= 4 positions (xq[p], bs[p]; out[p]) at once: the weights are unpacked
   and the scales spread once for them, and each position's integer steps are those of np = 1, so its
   lanes are the same int32 values (the row dot takes one position, kquants.h's tile four). */
static inline __attribute__((always_inline)) void pyllama_klanes_q45k_avx2(
        int kind, const uint8_t* blk, const int8_t* const* xq, __m256i scales, int np, __m256i* out) {
    const uint8_t* qs = blk + (kind == PYLLAMA_Q4_K ? 16 : 48);
    const __m256i m4 = _mm256_set1_epi8(15), one = _mm256_set1_epi8(1);
    const __m256i qh = _mm256_loadu_si256((const __m256i*)(blk + 16));
    __m256i acc[4];
    for (int p = 0; p < np; p++) acc[p] = _mm256_setzero_si256();
    for (int c = 0; c < 4; c++) {
        const __m256i v = _mm256_loadu_si256((const __m256i*)(qs + 32 * c));
        __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
        if (kind == PYLLAMA_Q5_K) { /* bit 2c of qh[l] is element 64c+l's fifth bit, bit 2c+1 that of 64c+32+l */
            lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * c), one), 4));
            hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * c + 1), one), 4));
        }
        const __m256i s0 = pyllama_pick16(scales, 2 * c), s1 = pyllama_pick16(scales, 2 * c + 1);
        for (int p = 0; p < np; p++) {
            const __m256i p0 = _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i*)(xq[p] + 64 * c)));
            const __m256i p1 = _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i*)(xq[p] + 64 * c + 32)));
            acc[p] = _mm256_add_epi32(acc[p], _mm256_add_epi32(_mm256_madd_epi16(p0, s0), _mm256_madd_epi16(p1, s1)));
        }
    }
    for (int p = 0; p < np; p++) out[p] = acc[p];
}
static inline __attribute__((always_inline)) void pyllama_klanes_q6k_avx2(
        const uint8_t* blk, const int8_t* const* xq, const int16_t* const* bs, int np, __m256i* out) {
    const __m256i m4 = _mm256_set1_epi8(15), m2 = _mm256_set1_epi8(3);
    const __m128i sc8 = _mm_loadu_si128((const __m128i*)(blk + 192));
    __m256i acc[4];
    for (int p = 0; p < np; p++) acc[p] = _mm256_setzero_si256();
    for (int h = 0; h < 2; h++) {
        const __m256i a = _mm256_loadu_si256((const __m256i*)(blk + 64 * h));
        const __m256i b = _mm256_loadu_si256((const __m256i*)(blk + 64 * h + 32));
        const __m256i hb = _mm256_loadu_si256((const __m256i*)(blk + 128 + 32 * h));
        __m256i q[4];
        q[0] = _mm256_or_si256(_mm256_and_si256(a, m4), _mm256_slli_epi16(_mm256_and_si256(hb, m2), 4));
        q[1] = _mm256_or_si256(_mm256_and_si256(b, m4),
                               _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2), m2), 4));
        q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(a, 4), m4),
                               _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 4), m2), 4));
        q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b, 4), m4),
                               _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 6), m2), 4));
        for (int k = 0; k < 4; k++) {
            const __m256i sc = pyllama_pair16(sc8, 4 * h + k, 1);
            for (int p = 0; p < np; p++) {
                const __m256i x = _mm256_loadu_si256((const __m256i*)(xq[p] + 128 * h + 32 * k));
                acc[p] = _mm256_add_epi32(acc[p], _mm256_madd_epi16(_mm256_maddubs_epi16(q[k], x), sc));
            }
        }
    }
    /* minus 32 * (bsums[2l] sc[2l] + bsums[2l+1] sc[2l+1]) in lane l */
    const __m256i sc16 = _mm256_cvtepi8_epi16(sc8);
    for (int p = 0; p < np; p++) {
        const __m256i corr = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i*)bs[p]), sc16);
        out[p] = _mm256_sub_epi32(acc[p], _mm256_slli_epi32(corr, 5));
    }
}
/* 2-bit planes: element 128c + 32s + l is bits 2s of qs[32c + l]; Q3_K subtracts 4 where bit 4c+s of
   hmask[l] is clear. sc8: the 16 scales as int8. */
static inline __attribute__((always_inline)) void pyllama_klanes_q23k_avx2(
        int kind, const uint8_t* blk, const int8_t* const* xq, __m128i sc8, int np, __m256i* out) {
    const uint8_t* qs = blk + (kind == PYLLAMA_Q2_K ? 16 : 32);
    const __m256i m2 = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1);
    const __m256i hm = _mm256_loadu_si256((const __m256i*)blk);
    __m256i acc[4];
    for (int p = 0; p < np; p++) acc[p] = _mm256_setzero_si256();
    for (int c = 0; c < 2; c++) {
        const __m256i v = _mm256_loadu_si256((const __m256i*)(qs + 32 * c));
        for (int s = 0; s < 4; s++) {
            const int i = 4 * c + s;
            __m256i q = _mm256_and_si256(_mm256_srli_epi16(v, 2 * s), m2);
            if (kind == PYLLAMA_Q3_K) { /* signed q: |q| times x * sign(q), as pyllama_lanes_i8 */
                const __m256i clear = _mm256_xor_si256(_mm256_and_si256(_mm256_srli_epi16(hm, i), one), one);
                q = _mm256_sub_epi8(q, _mm256_slli_epi16(clear, 2));
            }
            const __m256i aq = kind == PYLLAMA_Q3_K ? _mm256_sign_epi8(q, q) : q;
            const __m256i sc = pyllama_pair16(sc8, i, kind == PYLLAMA_Q3_K);
            for (int p = 0; p < np; p++) {
                __m256i x = _mm256_loadu_si256((const __m256i*)(xq[p] + 32 * i));
                if (kind == PYLLAMA_Q3_K) x = _mm256_sign_epi8(x, q);
                acc[p] = _mm256_add_epi32(acc[p], _mm256_madd_epi16(_mm256_maddubs_epi16(aq, x), sc));
            }
        }
    }
    for (int p = 0; p < np; p++) out[p] = acc[p];
}
/* Q3_K's 16 6-bit scales minus 32, as int8 */
static inline __m128i pyllama_q3k_scales8(const uint8_t* s12) {
    uint32_t u[3];
    memcpy(u, s12, 12);
    const uint32_t lo4 = 0x0f0f0f0fu, hi2 = 0x03030303u;
    const __m128i s = _mm_set_epi32((int)(((u[1] >> 4) & lo4) | (((u[2] >> 6) & hi2) << 4)),
                                    (int)(((u[0] >> 4) & lo4) | (((u[2] >> 4) & hi2) << 4)),
                                    (int)((u[1] & lo4) | (((u[2] >> 2) & hi2) << 4)),
                                    (int)((u[0] & lo4) | ((u[2] & hi2) << 4)));
    return _mm_sub_epi8(s, _mm_set1_epi8(32));
}

#endif

#if PYLLAMA_QBLOCKS_AVX512
/* The AVX2 lanes above, 64 values (two 32-value runs) per step: run c's lanes in the low 256 bits, run
   c + 1's in the high, folded at the end. Integer sums in another order are the same integers. */

/* int16 scales of runs c and c + 1 from 16 int8 scales: sc[2c], sc[2c+1], sc[2c+2], sc[2c+3], 8 each */
static inline __m512i pyllama_pair16_x2(__m128i sc8, int c, int is_signed) {
    const long long r = (long long)(0x0101010101010101ULL * (uint64_t)(2 * c));
    const long long one = (long long)0x0101010101010101ULL;
    const __m256i picked = _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(sc8),
                                               _mm256_set_epi64x(r + 3 * one, r + 2 * one, r + one, r));
    return is_signed ? _mm512_cvtepi8_epi16(picked) : _mm512_cvtepu8_epi16(picked);
}
/* the same int16 value s_lo in the low 256 bits and s_hi in the high */
static inline __m512i pyllama_split16(__m256i s_lo, __m256i s_hi) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(s_lo), s_hi, 1);
}
/* bytes of v in both halves, each 16-bit lane shifted right by lo (low half) or hi (high half) */
static inline __m512i pyllama_srl2(__m256i v, int lo, int hi) {
    return _mm512_srlv_epi16(_mm512_broadcast_i64x4(v), pyllama_split16(_mm256_set1_epi16((short)lo),
                                                                         _mm256_set1_epi16((short)hi)));
}

static inline __attribute__((always_inline)) void pyllama_klanes_q45k_avx512(
        int kind, const uint8_t* blk, const int8_t* const* xq, __m256i scales, int np, __m256i* out) {
    const uint8_t* qs = blk + (kind == PYLLAMA_Q4_K ? 16 : 48);
    const __m512i m4 = _mm512_set1_epi8(15), sixteen = _mm512_set1_epi8(16);
    const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i*)(blk + 16)));
    __m512i acc[4];
    for (int p = 0; p < np; p++) acc[p] = _mm512_setzero_si512();
    for (int c = 0; c < 4; c++) {
        /* elements 64c..64c+31 (low nibbles) and 64c+32..64c+63 (high): 32-value runs 2c and 2c + 1 */
        const __m256i v = _mm256_loadu_si256((const __m256i*)(qs + 32 * c));
        __m512i q = _mm512_and_si512(pyllama_split16(v, _mm256_srli_epi16(v, 4)), m4);
        if (kind == PYLLAMA_Q5_K) { /* fifth bits: bit 2c of qh[l] for the low run, 2c + 1 for the high */
            const __m512i bit = pyllama_split16(_mm256_set1_epi8((char)(1 << (2 * c))),
                                                _mm256_set1_epi8((char)(1 << (2 * c + 1))));
            q = _mm512_mask_add_epi8(q, _mm512_test_epi8_mask(qh, bit), q, sixteen);
        }
        const __m512i sc = pyllama_split16(pyllama_pick16(scales, 2 * c), pyllama_pick16(scales, 2 * c + 1));
        for (int p = 0; p < np; p++)
            acc[p] = pyllama_madd_acc(acc[p], _mm512_maddubs_epi16(q, _mm512_loadu_si512((const void*)(xq[p] + 64 * c))),
                                      sc);
    }
    for (int p = 0; p < np; p++) out[p] = pyllama_fold_halves(acc[p]);
}

static inline __attribute__((always_inline)) void pyllama_klanes_q6k_avx512(
        const uint8_t* blk, const int8_t* const* xq, const int16_t* const* bs, int np, __m256i* out) {
    const __m512i m4 = _mm512_set1_epi8(15), m2 = _mm512_set1_epi8(3);
    const __m128i sc8 = _mm_loadu_si128((const __m128i*)(blk + 192));
    __m512i acc[4];
    for (int p = 0; p < np; p++) acc[p] = _mm512_setzero_si512();
    for (int h = 0; h < 2; h++) {
        /* a then b (64 bytes): q0 = a & 15 and q1 = b & 15 (runs 4h, 4h + 1), q2 = a >> 4 and q3 = b >> 4
           (runs 4h + 2, 4h + 3); the high bits are bit pairs 0, 2, 4, 6 of hb */
        const __m512i ab = _mm512_loadu_si512((const void*)(blk + 64 * h));
        const __m256i hb = _mm256_loadu_si256((const __m256i*)(blk + 128 + 32 * h));
        const __m512i q01 = _mm512_or_si512(_mm512_and_si512(ab, m4),
                                            _mm512_slli_epi16(_mm512_and_si512(pyllama_srl2(hb, 0, 2), m2), 4));
        const __m512i q23 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ab, 4), m4),
                                            _mm512_slli_epi16(_mm512_and_si512(pyllama_srl2(hb, 4, 6), m2), 4));
        const __m512i s01 = pyllama_pair16_x2(sc8, 4 * h, 1), s23 = pyllama_pair16_x2(sc8, 4 * h + 2, 1);
        for (int p = 0; p < np; p++) {
            const __m512i p01 = _mm512_maddubs_epi16(q01, _mm512_loadu_si512((const void*)(xq[p] + 128 * h)));
            const __m512i p23 = _mm512_maddubs_epi16(q23, _mm512_loadu_si512((const void*)(xq[p] + 128 * h + 64)));
            acc[p] = pyllama_madd_acc(pyllama_madd_acc(acc[p], p01, s01), p23, s23);
        }
    }
    const __m256i sc16 = _mm256_cvtepi8_epi16(sc8);
    for (int p = 0; p < np; p++) {
        const __m256i corr = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i*)bs[p]), sc16);
        out[p] = _mm256_sub_epi32(pyllama_fold_halves(acc[p]), _mm256_slli_epi32(corr, 5));
    }
}

static inline __attribute__((always_inline)) void pyllama_klanes_q23k_avx512(
        int kind, const uint8_t* blk, const int8_t* const* xq, __m128i sc8, int np, __m256i* out) {
    const uint8_t* qs = blk + (kind == PYLLAMA_Q2_K ? 16 : 32);
    const __m512i m2 = _mm512_set1_epi8(3), four = _mm512_set1_epi8(4);
    const __m512i hm = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i*)blk));
    __m512i acc[4];
    for (int p = 0; p < np; p++) acc[p] = _mm512_setzero_si512();
    for (int c = 0; c < 2; c++) {
        const __m256i v = _mm256_loadu_si256((const __m256i*)(qs + 32 * c));
        for (int s = 0; s < 4; s += 2) {
            const int i = 4 * c + s; /* runs i (bits 2s of v) and i + 1 (bits 2s + 2) */
            __m512i q = _mm512_and_si512(pyllama_srl2(v, 2 * s, 2 * s + 2), m2);
            __mmask64 negative = 0;
            if (kind == PYLLAMA_Q3_K) { /* minus 4 where hmask bit i (low run) or i + 1 (high run) is clear */
                const __m512i bit = pyllama_split16(_mm256_set1_epi8((char)(1 << i)), _mm256_set1_epi8((char)(1 << (i + 1))));
                q = _mm512_mask_sub_epi8(q, (__mmask64)~_mm512_test_epi8_mask(hm, bit), q, four);
                negative = _mm512_movepi8_mask(q); /* x is negated where q < 0, then |q| is used */
                q = _mm512_abs_epi8(q);
            }
            const __m512i sc = pyllama_pair16_x2(sc8, i, kind == PYLLAMA_Q3_K);
            for (int p = 0; p < np; p++) {
                __m512i x = _mm512_loadu_si512((const void*)(xq[p] + 32 * i));
                if (kind == PYLLAMA_Q3_K) x = _mm512_mask_sub_epi8(x, negative, _mm512_setzero_si512(), x);
                acc[p] = pyllama_madd_acc(acc[p], _mm512_maddubs_epi16(q, x), sc);
            }
        }
    }
    for (int p = 0; p < np; p++) out[p] = pyllama_fold_halves(acc[p]);
}
#define pyllama_klanes_q45k pyllama_klanes_q45k_avx512
#define pyllama_klanes_q6k pyllama_klanes_q6k_avx512
#define pyllama_klanes_q23k pyllama_klanes_q23k_avx512
#elif PYLLAMA_QBLOCKS_AVX2
#define pyllama_klanes_q45k pyllama_klanes_q45k_avx2
#define pyllama_klanes_q6k pyllama_klanes_q6k_avx2
#define pyllama_klanes_q23k pyllama_klanes_q23k_avx2
#endif

#endif
