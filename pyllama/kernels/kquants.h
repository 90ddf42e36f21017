/* The K-quant row products of kquants.pyx (the order they follow is described there).
 *
 * Everything here is static inline C over raw pointers: the AVX2 lanes, the portable lanes, the
 * row dots in llama.cpp's float order and the dequantiser of one row.
 */
#ifndef PYLLAMA_KQUANTS_H
#define PYLLAMA_KQUANTS_H

#include "qblocks.h"

enum { PK_Q2_K, PK_Q3_K, PK_Q4_K, PK_Q5_K, PK_Q6_K };
static const int pyllama_kquant_bytes[5] = {84, 110, 144, 176, 210};

static inline ptrdiff_t pyllama_kquant_row_bytes(int kind, ptrdiff_t cols) {
    return cols / PYLLAMA_QK_K * pyllama_kquant_bytes[kind];
}

/* Q4_K / Q5_K: the 6-bit scale and min of sub-block j < 8 */
static inline void pyllama_k4_scale_min(const uint8_t* s, int j, int* sc, int* mn) {
    if (j < 4) {
        *sc = s[j] & 63;
        *mn = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
        *mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

/* the integer scales and mins of a Q2_K / Q3_K super-block, and its d and dmin */
static inline int pyllama_kquant_scales(int kind, const uint8_t* blk, int* sc, int* mn, float* d, float* dmin) {
    if (kind == PK_Q2_K) {
        for (int j = 0; j < 16; j++) { sc[j] = blk[j] & 15; mn[j] = blk[j] >> 4; }
        *d = pyllama_half_at(blk + 80);
        *dmin = pyllama_half_at(blk + 82);
    } else {
        const uint8_t* s = blk + 96;
        for (int j = 0; j < 16; j++) {
            const int low = j < 8 ? (s[j] & 15) : (s[j - 8] >> 4);
            const int high = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
            sc[j] = (low | (high << 4)) - 32;
            mn[j] = 0;
        }
        *d = pyllama_half_at(blk + 108);
        *dmin = 0.0f;
    }
    return 16;
}

/* A super-block's 256 integer weights in element order, its integer scales (16 per 16 values, or
   8 per 32 values for Q4_K/Q5_K) and mins, and its fp16 d and dmin. */
static inline int pyllama_kquant_unpack(int kind, const uint8_t* blk, int8_t* q, int* sc, int* mn,
                                        float* d, float* dmin) {
    int n_sub = 16;
    if (kind == PK_Q2_K || kind == PK_Q3_K) {
        const uint8_t* qs = blk + (kind == PK_Q2_K ? 16 : 32);
        for (int c = 0; c < 2; c++)
            for (int s = 0; s < 4; s++)
                for (int l = 0; l < 32; l++) q[128 * c + 32 * s + l] = (int8_t)((qs[32 * c + l] >> (2 * s)) & 3);
        if (kind == PK_Q3_K) {
            const uint8_t* hm = blk;
            for (int i = 0; i < 8; i++)
                for (int l = 0; l < 32; l++) q[32 * i + l] -= ((hm[l] >> i) & 1) ? 0 : 4;
        }
        pyllama_kquant_scales(kind, blk, sc, mn, d, dmin);
    } else if (kind == PK_Q4_K || kind == PK_Q5_K) {
        const uint8_t* qs = blk + (kind == PK_Q4_K ? 16 : 48);
        const uint8_t* qh = blk + 16;
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++) {
                int lo = qs[32 * c + l] & 15, hi = qs[32 * c + l] >> 4;
                if (kind == PK_Q5_K) {
                    lo |= ((qh[l] >> (2 * c)) & 1) << 4;
                    hi |= ((qh[l] >> (2 * c + 1)) & 1) << 4;
                }
                q[64 * c + l] = (int8_t)lo;
                q[64 * c + 32 + l] = (int8_t)hi;
            }
        for (int j = 0; j < 8; j++) pyllama_k4_scale_min(blk + 4, j, &sc[j], &mn[j]);
        *d = pyllama_half_at(blk);
        *dmin = pyllama_half_at(blk + 2);
        n_sub = 8;
    } else {
        const uint8_t* ql = blk;
        const uint8_t* qh = blk + 128;
        for (int h = 0; h < 2; h++)
            for (int l = 0; l < 32; l++) {
                const int hb = qh[32 * h + l];
                const int a = ql[64 * h + l], b = ql[64 * h + 32 + l];
                q[128 * h + l] = (int8_t)(((a & 15) | ((hb & 3) << 4)) - 32);
                q[128 * h + 32 + l] = (int8_t)(((b & 15) | (((hb >> 2) & 3) << 4)) - 32);
                q[128 * h + 64 + l] = (int8_t)(((a >> 4) | (((hb >> 4) & 3) << 4)) - 32);
                q[128 * h + 96 + l] = (int8_t)(((b >> 4) | (((hb >> 6) & 3) << 4)) - 32);
            }
        for (int j = 0; j < 16; j++) { sc[j] = (int8_t)blk[192 + j]; mn[j] = 0; }
        *d = pyllama_half_at(blk + 208);
        *dmin = 0.0f;
    }
    return n_sub;
}

/* the integer scales (16 per 16 values, or 8 per 32 for Q4_K/Q5_K) and mins of a super-block, its
   fp16 d and dmin; returns the number of scales */
static inline int pyllama_kquant_scales_of(int kind, const uint8_t* blk, int* sc, int* mn, float* d,
                                           float* dmin) {
    if (kind == PK_Q2_K || kind == PK_Q3_K) return pyllama_kquant_scales(kind, blk, sc, mn, d, dmin);
    if (kind == PK_Q6_K) {
        for (int j = 0; j < 16; j++) { sc[j] = (int8_t)blk[192 + j]; mn[j] = 0; }
        *d = pyllama_half_at(blk + 208);
        *dmin = 0.0f;
        return 16;
    }
    for (int j = 0; j < 8; j++) pyllama_k4_scale_min(blk + 4, j, &sc[j], &mn[j]);
    *d = pyllama_half_at(blk);
    *dmin = pyllama_half_at(blk + 2);
    return 8;
}

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
static inline __m256i pyllama_klanes_q45k_avx2(int kind, const uint8_t* blk, const int8_t* xq, __m256i scales) {
    const uint8_t* qs = blk + (kind == PK_Q4_K ? 16 : 48);
    const __m256i m4 = _mm256_set1_epi8(15), one = _mm256_set1_epi8(1);
    const __m256i qh = _mm256_loadu_si256((const __m256i*)(blk + 16));
    __m256i acc = _mm256_setzero_si256();
    for (int c = 0; c < 4; c++) {
        const __m256i v = _mm256_loadu_si256((const __m256i*)(qs + 32 * c));
        __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
        if (kind == PK_Q5_K) { /* bit 2c of qh[l] is element 64c+l's fifth bit, bit 2c+1 that of 64c+32+l */
            lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * c), one), 4));
            hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * c + 1), one), 4));
        }
        const __m256i p0 = _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i*)(xq + 64 * c)));
        const __m256i p1 = _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i*)(xq + 64 * c + 32)));
        acc = _mm256_add_epi32(acc, _mm256_add_epi32(_mm256_madd_epi16(p0, pyllama_pick16(scales, 2 * c)),
                                                     _mm256_madd_epi16(p1, pyllama_pick16(scales, 2 * c + 1))));
    }
    return acc;
}
static inline __m256i pyllama_klanes_q6k_avx2(const uint8_t* blk, const int8_t* xq, const int16_t* bs) {
    const __m256i m4 = _mm256_set1_epi8(15), m2 = _mm256_set1_epi8(3);
    const __m128i sc8 = _mm_loadu_si128((const __m128i*)(blk + 192));
    __m256i acc = _mm256_setzero_si256();
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
            const __m256i x = _mm256_loadu_si256((const __m256i*)(xq + 128 * h + 32 * k));
            const __m256i p = _mm256_maddubs_epi16(q[k], x);
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, pyllama_pair16(sc8, 4 * h + k, 1)));
        }
    }
    /* minus 32 * (bsums[2l] sc[2l] + bsums[2l+1] sc[2l+1]) in lane l */
    const __m256i corr = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i*)bs), _mm256_cvtepi8_epi16(sc8));
    return _mm256_sub_epi32(acc, _mm256_slli_epi32(corr, 5));
}
/* 2-bit planes: element 128c + 32s + l is bits 2s of qs[32c + l]; Q3_K subtracts 4 where bit 4c+s of
   hmask[l] is clear. sc8: the 16 scales as int8. */
static inline __m256i pyllama_klanes_q23k_avx2(int kind, const uint8_t* blk, const int8_t* xq, __m128i sc8) {
    const uint8_t* qs = blk + (kind == PK_Q2_K ? 16 : 32);
    const __m256i m2 = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1);
    const __m256i hm = _mm256_loadu_si256((const __m256i*)blk);
    __m256i acc = _mm256_setzero_si256();
    for (int c = 0; c < 2; c++) {
        const __m256i v = _mm256_loadu_si256((const __m256i*)(qs + 32 * c));
        for (int s = 0; s < 4; s++) {
            const int i = 4 * c + s;
            __m256i q = _mm256_and_si256(_mm256_srli_epi16(v, 2 * s), m2);
            __m256i x = _mm256_loadu_si256((const __m256i*)(xq + 32 * i));
            if (kind == PK_Q3_K) { /* signed q: |q| times x * sign(q), as pyllama_lanes_i8 */
                const __m256i clear = _mm256_xor_si256(_mm256_and_si256(_mm256_srli_epi16(hm, i), one), one);
                q = _mm256_sub_epi8(q, _mm256_slli_epi16(clear, 2));
                x = _mm256_sign_epi8(x, q);
                q = _mm256_sign_epi8(q, q);
            }
            const __m256i p = _mm256_maddubs_epi16(q, x);
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, pyllama_pair16(sc8, i, kind == PK_Q3_K)));
        }
    }
    return acc;
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

/* acc[l] = fma(s, (float)lanes[l], acc[l]) for n lanes (one rounding each) */
typedef struct { float v[8]; } pyllama_acc8;
static inline void pyllama_acc8_fma(pyllama_acc8* acc, float s, const int32_t* lanes, int n) {
    for (int l = 0; l < n; l++) acc->v[l] = fmaf(s, (float)lanes[l], acc->v[l]);
}

/* the portable lanes of a super-block (see above), Q6_K's correction included */
static inline void pyllama_kquant_lanes_c(int kind, const uint8_t* blk, const int8_t* xq, const int16_t* bs,
                                          int32_t* lanes) {
    int8_t q[PYLLAMA_QK_K];
    int sc16[16], mn[16];
    float d, dmin;
    const int n_sub = pyllama_kquant_unpack(kind, blk, q, sc16, mn, &d, &dmin);
    if (n_sub == 8)
        for (int j = 7; j >= 0; j--) sc16[2 * j + 1] = sc16[2 * j] = sc16[j];
    pyllama_klanes_c(q, kind == PK_Q6_K ? 32 : 0, xq, sc16, lanes);
    if (kind == PK_Q6_K)
        for (int l = 0; l < 8; l++) lanes[l] -= pyllama_q6k_offset_lane(bs, sc16, l);
}

/* One row times a Q8_K activation, in the order of ggml_vec_dot_qN_K_q8_K's AVX2 code: per
   super-block, d = d_x * d_w and -d_x * dmin_w; the 8 lanes of Σ sc q_w q_x fused into 8 float32
   accumulators; the mins part of Q2_K fused into the same 8 (before the scales part), that of Q4_K
   into 4 separate accumulators (lane l: the mins of the 32-value runs 2l and 2l+1), that of Q5_K
   into one scalar; at the end ggml's hsum_float_8 ((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7)), plus Q4_K's
   (m0+m2)+(m1+m3) or Q5_K's scalar. The AVX2 build keeps the accumulators in registers, the portable
   one in arrays: the same operations on the same values. */
static inline float pyllama_dot_kquant(int kind, const uint8_t* w, const pyllama_qact* a, ptrdiff_t cols) {
    const ptrdiff_t bytes = pyllama_kquant_bytes[kind];
    float summs = 0.0f;
#if PYLLAMA_QBLOCKS_AVX2
    __m256 acc = _mm256_setzero_ps();
    __m128 acc_m = _mm_setzero_ps();
#else
    pyllama_acc8 acc = {{0}}, acc_m = {{0}};
#endif
    for (ptrdiff_t b = 0; b < cols / PYLLAMA_QK_K; b++) {
        const uint8_t* blk = w + bytes * b;
        const int8_t* xq = a->q + PYLLAMA_QK_K * b;
        const int16_t* bs = a->bsums + 16 * b;
        const float dx = a->d[b];
        float d, dmin = 0.0f;
        if (kind == PK_Q2_K) { d = pyllama_half_at(blk + 80); dmin = pyllama_half_at(blk + 82); }
        else if (kind == PK_Q3_K) d = pyllama_half_at(blk + 108);
        else if (kind == PK_Q6_K) d = pyllama_half_at(blk + 208);
        else { d = pyllama_half_at(blk); dmin = pyllama_half_at(blk + 2); }
        const float dd = dx * d, ndmin = -dx * dmin;
#if PYLLAMA_QBLOCKS_AVX2
        __m256i lanes;
        if (kind == PK_Q2_K || kind == PK_Q3_K) {
            __m128i sc8;
            if (kind == PK_Q2_K) {
                const __m128i raw = _mm_loadu_si128((const __m128i*)blk);
                const __m128i m4 = _mm_set1_epi8(15);
                sc8 = _mm_and_si128(raw, m4);
                const __m256i mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(raw, 4), m4));
                const __m256i ml = _mm256_madd_epi16(mins, _mm256_loadu_si256((const __m256i*)bs));
                acc = _mm256_fmadd_ps(_mm256_set1_ps(ndmin), _mm256_cvtepi32_ps(ml), acc);
            } else {
                sc8 = pyllama_q3k_scales8(blk + 96);
            }
            lanes = pyllama_klanes_q23k_avx2(kind, blk, xq, sc8);
        } else if (kind == PK_Q6_K) {
            lanes = pyllama_klanes_q6k_avx2(blk, xq, bs);
        } else {
            __m256i scales;
            __m128i mins;
            pyllama_k4_scales_avx2(blk + 4, &scales, &mins);
            const __m128i ml = pyllama_k4_min_lanes(mins, bs);
            if (kind == PK_Q4_K) acc_m = _mm_fmadd_ps(_mm_set1_ps(ndmin), _mm_cvtepi32_ps(ml), acc_m);
            else summs = fmaf(ndmin, (float)pyllama_hsum_i32x4(ml), summs);
            lanes = pyllama_klanes_q45k_avx2(kind, blk, xq, scales);
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(dd), _mm256_cvtepi32_ps(lanes), acc);
#else
        int sc[16], mn[16];
        int32_t lanes[8], mins[8];
        float d_unused, dmin_unused;
        pyllama_kquant_scales_of(kind, blk, sc, mn, &d_unused, &dmin_unused);
        if (kind == PK_Q2_K) {
            for (int l = 0; l < 8; l++) mins[l] = mn[2 * l] * bs[2 * l] + mn[2 * l + 1] * bs[2 * l + 1];
            pyllama_acc8_fma(&acc, ndmin, mins, 8);
        } else if (kind == PK_Q4_K || kind == PK_Q5_K) {
            for (int l = 0; l < 4; l++)
                mins[l] = mn[2 * l] * (bs[4 * l] + bs[4 * l + 1]) + mn[2 * l + 1] * (bs[4 * l + 2] + bs[4 * l + 3]);
            if (kind == PK_Q4_K) pyllama_acc8_fma(&acc_m, ndmin, mins, 4);
            else summs = fmaf(ndmin, (float)((mins[0] + mins[1]) + (mins[2] + mins[3])), summs);
        }
        pyllama_kquant_lanes_c(kind, blk, xq, bs, lanes);
        pyllama_acc8_fma(&acc, dd, lanes, 8);
#endif
    }
#if PYLLAMA_QBLOCKS_AVX2
    float av[8], mv[4];
    _mm256_storeu_ps(av, acc);
    _mm_storeu_ps(mv, acc_m);
#else
    const float* av = acc.v;
    const float* mv = acc_m.v;
#endif
    const float total = pyllama_qreduce8(av);
    if (kind == PK_Q4_K) return total + ((mv[0] + mv[2]) + (mv[1] + mv[3]));
    if (kind == PK_Q5_K) return total + summs;
    return total;
}

static float pyllama_dot_q2_k(const uint8_t* w, const pyllama_qact* a, ptrdiff_t n) {
    return pyllama_dot_kquant(PK_Q2_K, w, a, n);
}
static float pyllama_dot_q3_k(const uint8_t* w, const pyllama_qact* a, ptrdiff_t n) {
    return pyllama_dot_kquant(PK_Q3_K, w, a, n);
}
static float pyllama_dot_q4_k(const uint8_t* w, const pyllama_qact* a, ptrdiff_t n) {
    return pyllama_dot_kquant(PK_Q4_K, w, a, n);
}
static float pyllama_dot_q5_k(const uint8_t* w, const pyllama_qact* a, ptrdiff_t n) {
    return pyllama_dot_kquant(PK_Q5_K, w, a, n);
}
static float pyllama_dot_q6_k(const uint8_t* w, const pyllama_qact* a, ptrdiff_t n) {
    return pyllama_dot_kquant(PK_Q6_K, w, a, n);
}

/* row r as float32: w = (d * sc) * q - dmin * m, with one rounding for the last step (fmaf) */
static void pyllama_dequantize_kquant(int kind, const uint8_t* data, ptrdiff_t r, float* out, ptrdiff_t cols) {
    const uint8_t* row = data + r * pyllama_kquant_row_bytes(kind, cols);
    for (ptrdiff_t b = 0; b < cols / PYLLAMA_QK_K; b++) {
        int8_t q[PYLLAMA_QK_K];
        int sc[16], mn[16];
        float d, dmin;
        const int n_sub = pyllama_kquant_unpack(kind, row + pyllama_kquant_bytes[kind] * b, q, sc, mn, &d, &dmin);
        const int size = PYLLAMA_QK_K / n_sub;
        for (int k = 0; k < PYLLAMA_QK_K; k++) {
            const int j = k / size;
            out[PYLLAMA_QK_K * b + k] = fmaf(d * (float)sc[j], (float)q[k], -(dmin * (float)mn[j]));
        }
    }
}

#endif /* PYLLAMA_KQUANTS_H */
