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

    #if PYLLAMA_QBLOCKS_AVX2
    static inline int32_t pyllama_hsum_i32x8(__m256i v) {
        return pyllama_hsum_i32x4(_mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1)));
    }
    /* Σ_j sc_j Σ q_w q_x of a Q4_K / Q5_K super-block, unpacked in registers (exact int32) */
    static inline int32_t pyllama_sumi_q45k_avx2(int kind, const uint8_t* blk, const int8_t* xq, const int* sc) {
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
        return pyllama_hsum_i32x8(acc);
    }
    /* Σ_j sc_j Σ q_w q_x of a Q6_K super-block: lanes 0-3 of a 32-value dot are one 16-value sub-block,
       lanes 4-7 the next */
    static inline int32_t pyllama_sumi_q6k_avx2(const uint8_t* blk, const int8_t* xq, const int* sc) {
        const __m256i m4 = _mm256_set1_epi8(15), m2 = _mm256_set1_epi8(3), off = _mm256_set1_epi8(32);
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
                const int j = 8 * h + 2 * k;
                const __m256i lanes = pyllama_lanes_i8(_mm256_sub_epi8(q[k], off),
                    _mm256_loadu_si256((const __m256i*)(xq + 128 * h + 32 * k)));
                const __m256i scale = _mm256_setr_epi32(sc[j], sc[j], sc[j], sc[j], sc[j + 1], sc[j + 1], sc[j + 1],
                                                        sc[j + 1]);
                acc = _mm256_add_epi32(acc, _mm256_mullo_epi32(lanes, scale));
            }
        }
        return pyllama_hsum_i32x8(acc);
    }
    /* the same for Q2_K / Q3_K: 2-bit planes (element 128c + 32s + l is bits 2s of qs[32c + l]); Q3_K
       subtracts 4 where bit 4c+s of hmask[l] is clear */
    static inline int32_t pyllama_sumi_q23k_avx2(int kind, const uint8_t* blk, const int8_t* xq, const int* sc) {
        const uint8_t* qs = blk + (kind == PK_Q2_K ? 16 : 32);
        const __m256i m2 = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1);
        const __m256i hm = _mm256_loadu_si256((const __m256i*)blk);
        __m256i acc = _mm256_setzero_si256();
        for (int c = 0; c < 2; c++) {
            const __m256i v = _mm256_loadu_si256((const __m256i*)(qs + 32 * c));
            for (int s = 0; s < 4; s++) {
                const int i = 4 * c + s, j = 2 * i;
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
                const __m256i scale = _mm256_setr_epi32(sc[j], sc[j], sc[j], sc[j], sc[j + 1], sc[j + 1], sc[j + 1],
                                                        sc[j + 1]);
                acc = _mm256_add_epi32(acc, _mm256_mullo_epi32(lanes, scale));
            }
        }
        return pyllama_hsum_i32x8(acc);
    }
    #endif

    /* Σ_j sc_j Σ q_w q_x of one super-block from its unpacked weights (any K-quant, any build) */
    static inline int32_t pyllama_sumi_unpacked(const int8_t* q, const int8_t* xq, const int* sc, int n_sub) {
        int32_t sumi = 0;
        for (int i = 0; i < 8; i++) {
            int32_t lo, hi;
            pyllama_dot32_halves(q + 32 * i, xq + 32 * i, &lo, &hi);
            sumi += n_sub == 8 ? sc[i] * (lo + hi) : sc[2 * i] * lo + sc[2 * i + 1] * hi;
        }
        return sumi;
    }

    static inline float pyllama_dot_kquant(int kind, const uint8_t* w, const pyllama_qact* a, ptrdiff_t cols) {
        const ptrdiff_t bytes = pyllama_kquant_bytes[kind];
        float acc = 0.0f;
        for (ptrdiff_t b = 0; b < cols / PYLLAMA_QK_K; b++) {
            const uint8_t* blk = w + bytes * b;
            pyllama_qprefetch(blk + PYLLAMA_QPREFETCH_AHEAD);
            int8_t q[PYLLAMA_QK_K];
            int sc[16], mn[16];
            float d, dmin;
            const int8_t* xq = a->q + PYLLAMA_QK_K * b;
            const int16_t* bs = a->bsums + 16 * b;
            int32_t sumi, summ = 0;
            int n_sub;
    #if PYLLAMA_QBLOCKS_AVX2
            if (kind == PK_Q4_K || kind == PK_Q5_K) {
                for (int j = 0; j < 8; j++) pyllama_k4_scale_min(blk + 4, j, &sc[j], &mn[j]);
                d = pyllama_half_at(blk);
                dmin = pyllama_half_at(blk + 2);
                n_sub = 8;
                sumi = pyllama_sumi_q45k_avx2(kind, blk, xq, sc);
            } else if (kind == PK_Q6_K) {
                for (int j = 0; j < 16; j++) sc[j] = (int8_t)blk[192 + j];
                d = pyllama_half_at(blk + 208);
                dmin = 0.0f;
                n_sub = 16;
                sumi = pyllama_sumi_q6k_avx2(blk, xq, sc);
            } else if (kind == PK_Q2_K || kind == PK_Q3_K) {
                n_sub = pyllama_kquant_scales(kind, blk, sc, mn, &d, &dmin);
                sumi = pyllama_sumi_q23k_avx2(kind, blk, xq, sc);
            } else
    #endif
            {
                n_sub = pyllama_kquant_unpack(kind, blk, q, sc, mn, &d, &dmin);
                sumi = pyllama_sumi_unpacked(q, xq, sc, n_sub);
            }
            if (kind == PK_Q2_K || kind == PK_Q4_K || kind == PK_Q5_K)
                for (int i = 0; i < 8; i++)
                    summ += n_sub == 8 ? mn[i] * (bs[2 * i] + bs[2 * i + 1])
                                       : mn[2 * i] * bs[2 * i] + mn[2 * i + 1] * bs[2 * i + 1];
            const float dx = a->d[b];
            acc = fmaf(dx * d, (float)sumi, acc);
            if (kind == PK_Q2_K || kind == PK_Q4_K || kind == PK_Q5_K) acc = fmaf(-(dx * dmin), (float)summ, acc);
        }
        return acc;
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
        dot = <row_dot_fn>dot_q4_k
    elif m.qtype == QTYPE_Q5_K:
        dot = <row_dot_fn>dot_q5_k
    quant_product(out, m, x, n_pos, scratch, n_threads, dot, ACT_Q8_K, kquant_row_bytes(kquant_kind(m.qtype), m.cols))


cdef void dequantize_row_kquant(float* out, const Matrix* m, Py_ssize_t row) noexcept nogil:
    """out[cols] = row ``row`` of m as float32 (the token embedding lookup)."""
    dequantize_kquant(kquant_kind(m.qtype), <const uint8_t*>m.data, row, out, m.cols)
