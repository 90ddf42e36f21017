"""Products over ggml's K-quants (super-blocks of 256 values), on their own blocks, times Q8_K activations.

Block layouts (ggml-common.h; every fp16 is a binary16, scales are unsigned unless said):

* ``Q2_K`` (84 bytes): 16 bytes of (4-bit scale | 4-bit min << 4) per 16 values, 64 bytes of 2-bit q,
  fp16 d, fp16 dmin; w = d * sc * q - dmin * m.
* ``Q3_K`` (110 bytes): 32 bytes of high-bit mask, 64 bytes of 2-bit q, 12 bytes of 16 packed 6-bit
  scales (minus 32), fp16 d; w = d * sc * (q - 4 * (1 - high bit)).
* ``Q4_K`` (144 bytes): fp16 d, fp16 dmin, 12 bytes of 8 packed 6-bit (scale, min) per 32 values, 128
  bytes of nibbles; w = d * sc * q - dmin * m.
* ``Q5_K`` (176 bytes): as Q4_K plus 32 bytes of fifth bits.
* ``Q6_K`` (210 bytes): 128 bytes of low nibbles, 64 bytes of 2-bit highs, 16 int8 scales per 16 values,
  fp16 d; w = d * sc * (q - 32).

As llama.cpp does it (``ggml_vec_dot_q4_K_q8_K`` and friends), the activation is quantised once per
product to Q8_K (256 int8 with one float32 scale d_x and the sums of each 16 q_x), and each super-block
contributes ``d_x * d * Σ_j sc_j Σ q_w q_x - d_x * dmin * Σ_j m_j Σ q_x``. The sums are exact int32 (a
super-block's sums stay below 2^28); the float part is two fused multiply-adds per super-block into one
float32 accumulator, in block order: ``fmaf`` in C, the same single rounding as any FMA hardware. With
AVX2 a super-block is unpacked in registers, its 32-value int8 dots are 8 int32 lanes
(``maddubs``/``madd``) multiplied by their sub-block scales and summed once; the portable C path unpacks
to int8[256] and sums in plain C. The integers are exact either way, so the AVX2 and portable
(``PYLLAMA_PORTABLE=1``) builds give identical bits (checked: every type at three row lengths, an AVX2
build against a portable one, bit for bit). There is no AVX-512 path (an AVX-512 machine runs the AVX2
code, with the same bits).
"""

from libc.stdint cimport uint8_t

from pyllama.kernels.matvec cimport Matrix, QuantScratch, QTYPE_Q2_K, QTYPE_Q3_K, QTYPE_Q4_K, QTYPE_Q5_K
from pyllama.kernels.qproduct cimport pyllama_qact, row_dot_fn, quant_product, ACT_Q8_K

cdef extern from *:
    """
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
    static inline __m256i pyllama_scale_pair(const int* sc16, int c) {
        const int a = sc16[2 * c], b = sc16[2 * c + 1];
        return _mm256_setr_epi32(a, a, a, a, b, b, b, b);
    }
    static inline __m256i pyllama_klanes_q45k_avx2(int kind, const uint8_t* blk, const int8_t* xq, const int* sc) {
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
            const __m256i l0 = pyllama_lanes_u8(lo, _mm256_loadu_si256((const __m256i*)(xq + 64 * c)));
            const __m256i l1 = pyllama_lanes_u8(hi, _mm256_loadu_si256((const __m256i*)(xq + 64 * c + 32)));
            acc = _mm256_add_epi32(acc, _mm256_mullo_epi32(l0, _mm256_set1_epi32(sc[2 * c])));
            acc = _mm256_add_epi32(acc, _mm256_mullo_epi32(l1, _mm256_set1_epi32(sc[2 * c + 1])));
        }
        return acc;
    }
    static inline __m256i pyllama_klanes_q6k_avx2(const uint8_t* blk, const int8_t* xq, const int* sc) {
        const __m256i m4 = _mm256_set1_epi8(15), m2 = _mm256_set1_epi8(3);
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
                const __m256i lanes = pyllama_lanes_u8(q[k], _mm256_loadu_si256((const __m256i*)(xq + 128 * h + 32 * k)));
                acc = _mm256_add_epi32(acc, _mm256_mullo_epi32(lanes, pyllama_scale_pair(sc, 4 * h + k)));
            }
        }
        return acc;
    }
    /* 2-bit planes: element 128c + 32s + l is bits 2s of qs[32c + l]; Q3_K subtracts 4 where bit 4c+s of
       hmask[l] is clear */
    static inline __m256i pyllama_klanes_q23k_avx2(int kind, const uint8_t* blk, const int8_t* xq, const int* sc) {
        const uint8_t* qs = blk + (kind == PK_Q2_K ? 16 : 32);
        const __m256i m2 = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1);
        const __m256i hm = _mm256_loadu_si256((const __m256i*)blk);
        __m256i acc = _mm256_setzero_si256();
        for (int c = 0; c < 2; c++) {
            const __m256i v = _mm256_loadu_si256((const __m256i*)(qs + 32 * c));
            for (int s = 0; s < 4; s++) {
                const int i = 4 * c + s;
                __m256i q = _mm256_and_si256(_mm256_srli_epi16(v, 2 * s), m2);
                const __m256i x = _mm256_loadu_si256((const __m256i*)(xq + 32 * i));
                __m256i lanes;
                if (kind == PK_Q3_K) {
                    const __m256i clear = _mm256_xor_si256(_mm256_and_si256(_mm256_srli_epi16(hm, i), one), one);
                    q = _mm256_sub_epi8(q, _mm256_slli_epi16(clear, 2));
                    lanes = pyllama_lanes_i8(q, x);
                } else {
                    lanes = pyllama_lanes_u8(q, x);
                }
                acc = _mm256_add_epi32(acc, _mm256_mullo_epi32(lanes, pyllama_scale_pair(sc, i)));
            }
        }
        return acc;
    }
    #endif

    /* A super-block's 8 integer lanes (see above), Q6_K's correction included, into lanes[8]. */
    static inline void pyllama_kquant_lanes(int kind, const uint8_t* blk, const int8_t* xq, const int16_t* bs,
                                            const int* sc, int n_sub, int32_t* lanes) {
    #if PYLLAMA_QBLOCKS_AVX2
        __m256i v;
        if (kind == PK_Q4_K || kind == PK_Q5_K) v = pyllama_klanes_q45k_avx2(kind, blk, xq, sc);
        else if (kind == PK_Q6_K) v = pyllama_klanes_q6k_avx2(blk, xq, sc);
        else v = pyllama_klanes_q23k_avx2(kind, blk, xq, sc);
        _mm256_storeu_si256((__m256i*)lanes, v);
    #else
        int8_t q[PYLLAMA_QK_K];
        int sc16[16], mn[16];
        float d, dmin;
        pyllama_kquant_unpack(kind, blk, q, sc16, mn, &d, &dmin);
        if (n_sub == 8)
            for (int j = 7; j >= 0; j--) sc16[2 * j + 1] = sc16[2 * j] = sc[j];
        pyllama_klanes_c(q, kind == PK_Q6_K ? 32 : 0, xq, sc16, lanes);
    #endif
        if (kind == PK_Q6_K)
            for (int l = 0; l < 8; l++) lanes[l] -= pyllama_q6k_offset_lane(bs, sc, l);
    }

    /* acc[l] = fma(s, (float)lanes[l], acc[l]) for the 8 lanes (one rounding each; the AVX2 build
       keeps the accumulators in a register, the same operation) */
    typedef struct { float v[8]; } pyllama_acc8;
    static inline void pyllama_acc8_fma(pyllama_acc8* acc, float s, const int32_t* lanes, int n) {
        for (int l = 0; l < n; l++) acc->v[l] = fmaf(s, (float)lanes[l], acc->v[l]);
    }

    /* One row times a Q8_K activation, in the order of ggml_vec_dot_qN_K_q8_K's AVX2 code: per
       super-block, d = d_x * d_w and -d_x * dmin_w; the 8 lanes of Σ sc q_w q_x fused into 8 float32
       accumulators; the mins part of Q2_K fused into the same 8 (before the scales part), that of Q4_K
       into 4 separate accumulators (lane l: the mins of the 32-value runs 2l and 2l+1), that of Q5_K
       into one scalar; at the end ggml's hsum_float_8 ((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7)), plus Q4_K's
       (m0+m2)+(m1+m3) or Q5_K's scalar. */
    static inline float pyllama_dot_kquant(int kind, const uint8_t* w, const pyllama_qact* a, ptrdiff_t cols) {
        const ptrdiff_t bytes = pyllama_kquant_bytes[kind];
        pyllama_acc8 acc = {{0}}, acc_m = {{0}};
        float summs = 0.0f;
        for (ptrdiff_t b = 0; b < cols / PYLLAMA_QK_K; b++) {
            const uint8_t* blk = w + bytes * b;
            pyllama_qprefetch(blk + PYLLAMA_QPREFETCH_AHEAD);
            int sc[16], mn[16];
            int32_t lanes[8], mins[8];
            float d, dmin;
            const int8_t* xq = a->q + PYLLAMA_QK_K * b;
            const int16_t* bs = a->bsums + 16 * b;
            const int n_sub = pyllama_kquant_scales_of(kind, blk, sc, mn, &d, &dmin);
            const float dx = a->d[b];
            const float dd = dx * d, ndmin = -dx * dmin;
            if (kind == PK_Q2_K) {
                for (int l = 0; l < 8; l++) mins[l] = mn[2 * l] * bs[2 * l] + mn[2 * l + 1] * bs[2 * l + 1];
                pyllama_acc8_fma(&acc, ndmin, mins, 8);
            } else if (kind == PK_Q4_K) {
                for (int l = 0; l < 4; l++)
                    mins[l] = mn[2 * l] * (bs[4 * l] + bs[4 * l + 1]) + mn[2 * l + 1] * (bs[4 * l + 2] + bs[4 * l + 3]);
                pyllama_acc8_fma(&acc_m, ndmin, mins, 4);
            } else if (kind == PK_Q5_K) {
                int32_t summ = 0;
                for (int j = 0; j < 8; j++) summ += mn[j] * (bs[2 * j] + bs[2 * j + 1]);
                summs = fmaf(ndmin, (float)summ, summs);
            }
            pyllama_kquant_lanes(kind, blk, xq, bs, sc, n_sub, lanes);
            pyllama_acc8_fma(&acc, dd, lanes, 8);
        }
        const float total = pyllama_qreduce8(acc.v);
        if (kind == PK_Q4_K) return total + ((acc_m.v[0] + acc_m.v[2]) + (acc_m.v[1] + acc_m.v[3]));
        if (kind == PK_Q5_K) return total + summs;
        return total;
    }

    /* Q4_K in the order of ggml's repacked AVX2 gemv (ggml_gemv_q4_K_8x8_q8_K), which llama.cpp runs for a
       Q4_K matrix whose row count is a multiple of 8: per super-block the whole Σ_j sc_j Σ q_w q_x and
       Σ_j m_j Σ q_x of the row, each fused into its own float32 accumulator with d_w * d_x and
       dmin_w * d_x; the result is their difference. */
    static float pyllama_dot_q4_k_x8(const uint8_t* w, const pyllama_qact* a, ptrdiff_t cols) {
        float acc = 0.0f, acc_m = 0.0f;
        for (ptrdiff_t b = 0; b < cols / PYLLAMA_QK_K; b++) {
            const uint8_t* blk = w + 144 * b;
            pyllama_qprefetch(blk + PYLLAMA_QPREFETCH_AHEAD);
            int sc[16], mn[16];
            int32_t lanes[8];
            float d, dmin;
            const int16_t* bs = a->bsums + 16 * b;
            pyllama_kquant_scales_of(PK_Q4_K, blk, sc, mn, &d, &dmin);
            int32_t summ = 0;
            for (int j = 0; j < 8; j++) summ += mn[j] * (bs[2 * j] + bs[2 * j + 1]);
            pyllama_kquant_lanes(PK_Q4_K, blk, a->q + PYLLAMA_QK_K * b, bs, sc, 8, lanes);
            const int32_t sumi = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
            const float dx = a->d[b];
            acc = fmaf((float)sumi, d * dx, acc);
            acc_m = fmaf((float)summ, dmin * dx, acc_m);
        }
        return acc - acc_m;
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
    """
    int PK_Q2_K, PK_Q3_K, PK_Q4_K, PK_Q5_K, PK_Q6_K
    float dot_q2_k "pyllama_dot_q2_k"(const uint8_t* w, const pyllama_qact* a, Py_ssize_t n) noexcept nogil
    float dot_q3_k "pyllama_dot_q3_k"(const uint8_t* w, const pyllama_qact* a, Py_ssize_t n) noexcept nogil
    float dot_q4_k "pyllama_dot_q4_k"(const uint8_t* w, const pyllama_qact* a, Py_ssize_t n) noexcept nogil
    float dot_q4_k_x8 "pyllama_dot_q4_k_x8"(const uint8_t* w, const pyllama_qact* a, Py_ssize_t n) noexcept nogil
    float dot_q5_k "pyllama_dot_q5_k"(const uint8_t* w, const pyllama_qact* a, Py_ssize_t n) noexcept nogil
    float dot_q6_k "pyllama_dot_q6_k"(const uint8_t* w, const pyllama_qact* a, Py_ssize_t n) noexcept nogil
    Py_ssize_t kquant_row_bytes "pyllama_kquant_row_bytes"(int kind, Py_ssize_t cols) noexcept nogil
    void dequantize_kquant "pyllama_dequantize_kquant"(int kind, const uint8_t* data, Py_ssize_t row, float* out,
                                                       Py_ssize_t cols) noexcept nogil


cdef inline int kquant_kind(int qtype) noexcept nogil:
    if qtype == QTYPE_Q2_K:
        return PK_Q2_K
    if qtype == QTYPE_Q3_K:
        return PK_Q3_K
    if qtype == QTYPE_Q4_K:
        return PK_Q4_K
    if qtype == QTYPE_Q5_K:
        return PK_Q5_K
    return PK_Q6_K


cdef void matmul_kquant(float* out, const Matrix* m, const float* x, Py_ssize_t n_pos, QuantScratch* scratch,
                        int n_threads) noexcept nogil:
    """out[n_pos, rows] = x[n_pos, cols] · Wᵀ for any K-quant (dispatch on m.qtype)."""
    cdef row_dot_fn dot = <row_dot_fn>dot_q6_k
    if m.qtype == QTYPE_Q2_K:
        dot = <row_dot_fn>dot_q2_k
    elif m.qtype == QTYPE_Q3_K:
        dot = <row_dot_fn>dot_q3_k
    elif m.qtype == QTYPE_Q4_K:
        # llama.cpp repacks a Q4_K matrix of 8k rows into 8-row groups on AVX2 and runs another order
        dot = <row_dot_fn>(dot_q4_k_x8 if m.rows % 8 == 0 else dot_q4_k)
    elif m.qtype == QTYPE_Q5_K:
        dot = <row_dot_fn>dot_q5_k
    quant_product(out, m, x, n_pos, scratch, n_threads, dot, ACT_Q8_K, kquant_row_bytes(kquant_kind(m.qtype), m.cols))


cdef void dequantize_row_kquant(float* out, const Matrix* m, Py_ssize_t row) noexcept nogil:
    """out[cols] = row ``row`` of m as float32 (the token embedding lookup)."""
    dequantize_kquant(kquant_kind(m.qtype), <const uint8_t*>m.data, row, out, m.cols)
