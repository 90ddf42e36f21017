/* The K-quant products: the layouts, the row dots in llama.cpp's float order over the integer lanes of
 * kquants_lanes.h, the four-position tiles, the dequantiser of one row, and the products the types' rows
 * (qtypes.h) name. Everything is static C over raw pointers.
 *
 * Block layouts (ggml-common.h; every fp16 is a binary16, scales are unsigned unless said):
 *
 * * ``Q2_K`` (84 bytes): 16 bytes of (4-bit scale | 4-bit min << 4) per 16 values, 64 bytes of 2-bit q,
 *   fp16 d, fp16 dmin; w = d * sc * q - dmin * m.
 * * ``Q3_K`` (110 bytes): 32 bytes of high-bit mask, 64 bytes of 2-bit q, 12 bytes of 16 packed 6-bit
 *   scales (minus 32), fp16 d; w = d * sc * (q - 4 * (1 - high bit)).
 * * ``Q4_K`` (144 bytes): fp16 d, fp16 dmin, 12 bytes of 8 packed 6-bit (scale, min) per 32 values, 128
 *   bytes of nibbles; w = d * sc * q - dmin * m.
 * * ``Q5_K`` (176 bytes): as Q4_K plus 32 bytes of fifth bits.
 * * ``Q6_K`` (210 bytes): 128 bytes of low nibbles, 64 bytes of 2-bit highs, 16 int8 scales per 16 values,
 *   fp16 d; w = d * sc * (q - 32).
 *
 * As llama.cpp does it, the activation is quantised once per product to Q8_K (256 int8 with one float32
 * scale d_x and the sums of each 16 q_x; ggml's ``quantize_row_q8_K_ref``, which x86 runs), and each
 * super-block contributes ``d_x * d * Σ_j sc_j Σ q_w q_x - d_x * dmin * Σ_j m_j Σ q_x``, the sums exact in
 * int32.
 *
 * **The float order is that of the kernel llama.cpp runs on AVX2**, so a row product has llama.cpp's bits
 * (checked against ggml's own ``vec_dot`` and repacked gemv, called on the same bytes, over random rows of
 * every type). ggml's AVX2 ``ggml_vec_dot_qN_K_q8_K`` keeps 8 int32 lanes per super-block: for each run c
 * of 32 values, lane l holds scale16[2c + l/4] * Σ q_w q_x over the run's values 4l..4l+3 (``maddubs``,
 * then ``madd`` with the 16-value scales), summed over the 8 runs. Per super-block, with d = d_x * d_w and
 * dm = -d_x * dmin_w (float32 products):
 *
 * * every type: acc[l] = fma(d, float(lane[l]), acc[l]), 8 float32 accumulators across the row;
 * * Q2_K first fuses its mins into the same 8: acc[l] = fma(dm, float(m[2l] bs[2l] + m[2l+1] bs[2l+1]),
 *   acc[l]);
 * * Q4_K fuses its mins into 4 more accumulators, lane l taking the 32-value runs 2l and 2l+1; Q5_K into
 *   one scalar, fma(dm, float(Σ_j m_j Σ q_x), summs);
 * * Q6_K multiplies the unsigned 6-bit codes and subtracts 32 * (bs[2l] sc[2l] + bs[2l+1] sc[2l+1]) from
 *   lane l (an integer step: its lanes differ from those of q - 32, their float conversions too);
 * * the row's result is ggml's ``hsum_float_8``, ((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7)), plus Q4_K's
 *   (m0+m2)+(m1+m3) or Q5_K's scalar.
 *
 * Every Q4_K matrix takes the ``vec_dot`` order above, whatever its row count, from the file's layout or
 * from its packed copy (qpacked_kquants.h, which also packs Q6_K in this order). Newer llama.cpp builds
 * repack a Q4_K matrix of 8k rows into 8-row groups on AVX2 (``ggml_gemv_q4_K_8x8_q8_K``, another float
 * order); the build that wrote this project's llama.cpp references did not: with the ``vec_dot`` order
 * the tiny Q4_K_M and Q3_K_M models give the references' margins to their 6 decimals at every position
 * of most runs, with the repacked order they part within 3 to 18 tokens (tests/test_quant_models.py).
 * llama.cpp's batched products of 8 or more positions for K types go through its tiled
 * kernel (``tiled/tiled.cpp``), another order; pyllama's block products keep the one-position order, so
 * that a block equals the positions one by one, bit for bit.
 *
 * fma is ``fmaf`` in the portable C path and ``_mm256_fmadd_ps`` with AVX2, one rounding either way; the
 * lanes are exact integers, computed in registers (AVX2) or from the unpacked int8[256] (portable), so
 * the AVX2 and portable (``PYLLAMA_PORTABLE=1``) builds give identical bits. tests/test_kquant_order.py
 * writes the same order out in numpy from gguf-py's integers. With AVX-512 (F and BW; ``vpdpwssd`` when the
 * CPU has VNNI) the lanes take 64 values per step, two runs in one register, folded into the same 8 exact
 * int32 lanes before the float part, which stays 8-wide: an AVX-512 build gives the AVX2 bits
 * (``PYLLAMA_EMULATE_AVX512`` tests that path on a CPU without AVX-512). llama.cpp on AVX-512 repacks
 * Q2_K matrices, which is not followed.
 *
 * The kernels issue no software prefetch: the hardware prefetcher streams the rows, and prefetching 4
 * KiB ahead cost a third of the decode speed of the 42M shapes.
 */
#ifndef PYLLAMA_KQUANTS_H
#define PYLLAMA_KQUANTS_H

#include "qblocks.h"
#include "kquants_lanes.h"
#include "qrows.h"

/* bytes per super-block of 256 values (ggml-common.h's block_qN_K; the layouts are above) */
#define PYLLAMA_Q2_K_BYTES 84
#define PYLLAMA_Q3_K_BYTES 110
#define PYLLAMA_Q4_K_BYTES 144
#define PYLLAMA_Q5_K_BYTES 176
#define PYLLAMA_Q6_K_BYTES 210
static const int pyllama_kquant_bytes[PYLLAMA_N_QTYPES] = {
    [PYLLAMA_Q2_K] = PYLLAMA_Q2_K_BYTES, [PYLLAMA_Q3_K] = PYLLAMA_Q3_K_BYTES, [PYLLAMA_Q4_K] = PYLLAMA_Q4_K_BYTES,
    [PYLLAMA_Q5_K] = PYLLAMA_Q5_K_BYTES, [PYLLAMA_Q6_K] = PYLLAMA_Q6_K_BYTES};

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
    if (kind == PYLLAMA_Q2_K) {
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
    if (kind == PYLLAMA_Q2_K || kind == PYLLAMA_Q3_K) {
        const uint8_t* qs = blk + (kind == PYLLAMA_Q2_K ? 16 : 32);
        for (int c = 0; c < 2; c++)
            for (int s = 0; s < 4; s++)
                for (int l = 0; l < 32; l++) q[128 * c + 32 * s + l] = (int8_t)((qs[32 * c + l] >> (2 * s)) & 3);
        if (kind == PYLLAMA_Q3_K) {
            const uint8_t* hm = blk;
            for (int i = 0; i < 8; i++)
                for (int l = 0; l < 32; l++) q[32 * i + l] -= ((hm[l] >> i) & 1) ? 0 : 4;
        }
        pyllama_kquant_scales(kind, blk, sc, mn, d, dmin);
    } else if (kind == PYLLAMA_Q4_K || kind == PYLLAMA_Q5_K) {
        const uint8_t* qs = blk + (kind == PYLLAMA_Q4_K ? 16 : 48);
        const uint8_t* qh = blk + 16;
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++) {
                int lo = qs[32 * c + l] & 15, hi = qs[32 * c + l] >> 4;
                if (kind == PYLLAMA_Q5_K) {
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
    if (kind == PYLLAMA_Q2_K || kind == PYLLAMA_Q3_K) return pyllama_kquant_scales(kind, blk, sc, mn, d, dmin);
    if (kind == PYLLAMA_Q6_K) {
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
    pyllama_klanes_c(q, kind == PYLLAMA_Q6_K ? 32 : 0, xq, sc16, lanes);
    if (kind == PYLLAMA_Q6_K)
        for (int l = 0; l < 8; l++) lanes[l] -= pyllama_q6k_offset_lane(bs, sc16, l);
}

/* One row times a Q8_K activation, in the order of ggml_vec_dot_qN_K_q8_K's AVX2 code: per
   super-block, d = d_x * d_w and -d_x * dmin_w; the 8 lanes of Σ sc q_w q_x fused into 8 float32
   accumulators; the mins part of Q2_K fused into the same 8 (before the scales part), that of Q4_K
   into 4 separate accumulators (lane l: the mins of the 32-value runs 2l and 2l+1), that of Q5_K
   into one scalar; at the end ggml's hsum_float_8 ((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7)), plus Q4_K's
   (m0+m2)+(m1+m3) or Q5_K's scalar. The AVX2 build keeps the accumulators in registers, the portable
   one in arrays: the same operations on the same values. */
#if PYLLAMA_QBLOCKS_AVX2
typedef struct { __m256 acc; __m128 acc_m; float summs; } pyllama_kacc;
#define PYLLAMA_KACC_ZERO {_mm256_setzero_ps(), _mm_setzero_ps(), 0.0f}
#else
typedef struct { pyllama_acc8 acc, acc_m; float summs; } pyllama_kacc;
#define PYLLAMA_KACC_ZERO {{{0}}, {{0}}, 0.0f}
#endif

/* Super-block b of one row (blk) with np <= 4 activations a[0..np-1] into k[0..np-1]: the loop body of
   the dot below (np = 1) and of the tile (np = 4). The weights are unpacked and the scales spread once
   for the np positions (kquants_lanes.h); each position's integer lanes are the same values whatever
   np, and its float steps come in the same order, so each element is the row dot's. */
static inline __attribute__((always_inline)) void pyllama_kquant_steps(int kind, const uint8_t* blk,
                                                                       const pyllama_qact* a, ptrdiff_t b,
                                                                       pyllama_kacc* k, int np) {
    float d, dmin = 0.0f;
    if (kind == PYLLAMA_Q2_K) { d = pyllama_half_at(blk + 80); dmin = pyllama_half_at(blk + 82); }
    else if (kind == PYLLAMA_Q3_K) d = pyllama_half_at(blk + 108);
    else if (kind == PYLLAMA_Q6_K) d = pyllama_half_at(blk + 208);
    else { d = pyllama_half_at(blk); dmin = pyllama_half_at(blk + 2); }
#if PYLLAMA_QBLOCKS_AVX2
    const int8_t* xq[4];
    const int16_t* bs[4];
    for (int p = 0; p < np; p++) {
        xq[p] = a[p].q + PYLLAMA_QK_K * b;
        bs[p] = a[p].bsums + 16 * b;
    }
    __m256i lanes[4];
    if (kind == PYLLAMA_Q2_K || kind == PYLLAMA_Q3_K) {
        __m128i sc8;
        if (kind == PYLLAMA_Q2_K) {
            const __m128i raw = _mm_loadu_si128((const __m128i*)blk);
            const __m128i m4 = _mm_set1_epi8(15);
            sc8 = _mm_and_si128(raw, m4);
            const __m256i mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(raw, 4), m4));
            for (int p = 0; p < np; p++) {
                const float ndmin = -a[p].d[b] * dmin;
                const __m256i ml = _mm256_madd_epi16(mins, _mm256_loadu_si256((const __m256i*)bs[p]));
                k[p].acc = _mm256_fmadd_ps(_mm256_set1_ps(ndmin), _mm256_cvtepi32_ps(ml), k[p].acc);
            }
        } else {
            sc8 = pyllama_q3k_scales8(blk + 96);
        }
        pyllama_klanes_q23k(kind, blk, xq, sc8, np, lanes);
    } else if (kind == PYLLAMA_Q6_K) {
        pyllama_klanes_q6k(blk, xq, bs, np, lanes);
    } else {
        __m256i scales;
        __m128i mins;
        pyllama_k4_scales_avx2(blk + 4, &scales, &mins);
        for (int p = 0; p < np; p++) {
            const float ndmin = -a[p].d[b] * dmin;
            const __m128i ml = pyllama_k4_min_lanes(mins, bs[p]);
            if (kind == PYLLAMA_Q4_K) k[p].acc_m = _mm_fmadd_ps(_mm_set1_ps(ndmin), _mm_cvtepi32_ps(ml), k[p].acc_m);
            else k[p].summs = fmaf(ndmin, (float)pyllama_hsum_i32x4(ml), k[p].summs);
        }
        pyllama_klanes_q45k(kind, blk, xq, scales, np, lanes);
    }
    for (int p = 0; p < np; p++)
        k[p].acc = _mm256_fmadd_ps(_mm256_set1_ps(a[p].d[b] * d), _mm256_cvtepi32_ps(lanes[p]), k[p].acc);
#else
    int sc[16], mn[16];
    int32_t lanes[8], mins[8];
    float d_unused, dmin_unused;
    pyllama_kquant_scales_of(kind, blk, sc, mn, &d_unused, &dmin_unused);
    for (int p = 0; p < np; p++) {
        const int8_t* xq = a[p].q + PYLLAMA_QK_K * b;
        const int16_t* bs = a[p].bsums + 16 * b;
        const float ndmin = -a[p].d[b] * dmin;
        if (kind == PYLLAMA_Q2_K) {
            for (int l = 0; l < 8; l++) mins[l] = mn[2 * l] * bs[2 * l] + mn[2 * l + 1] * bs[2 * l + 1];
            pyllama_acc8_fma(&k[p].acc, ndmin, mins, 8);
        } else if (kind == PYLLAMA_Q4_K || kind == PYLLAMA_Q5_K) {
            for (int l = 0; l < 4; l++)
                mins[l] = mn[2 * l] * (bs[4 * l] + bs[4 * l + 1]) + mn[2 * l + 1] * (bs[4 * l + 2] + bs[4 * l + 3]);
            if (kind == PYLLAMA_Q4_K) pyllama_acc8_fma(&k[p].acc_m, ndmin, mins, 4);
            else k[p].summs = fmaf(ndmin, (float)((mins[0] + mins[1]) + (mins[2] + mins[3])), k[p].summs);
        }
        pyllama_kquant_lanes_c(kind, blk, xq, bs, lanes);
        pyllama_acc8_fma(&k[p].acc, a[p].d[b] * d, lanes, 8);
    }
#endif
}

/* the dot's end: hsum_float_8 of the lanes, plus Q4_K's mins lanes or Q5_K's scalar */
static inline float pyllama_kquant_finish(int kind, const pyllama_kacc* k) {
#if PYLLAMA_QBLOCKS_AVX2
    float av[8], mv[4];
    _mm256_storeu_ps(av, k->acc);
    _mm_storeu_ps(mv, k->acc_m);
#else
    const float* av = k->acc.v;
    const float* mv = k->acc_m.v;
#endif
    const float total = pyllama_qreduce8(av);
    if (kind == PYLLAMA_Q4_K) return total + ((mv[0] + mv[2]) + (mv[1] + mv[3]));
    if (kind == PYLLAMA_Q5_K) return total + k->summs;
    return total;
}

static inline float pyllama_dot_kquant(int kind, const uint8_t* w, const pyllama_qact* a, ptrdiff_t cols) {
    const ptrdiff_t bytes = pyllama_kquant_bytes[kind];
    pyllama_kacc k = PYLLAMA_KACC_ZERO;
    for (ptrdiff_t b = 0; b < cols / PYLLAMA_QK_K; b++) pyllama_kquant_steps(kind, w + bytes * b, a, b, &k, 1);
    return pyllama_kquant_finish(kind, &k);
}

/* One row times four positions (a[0..3]): out[p * out_stride] = pyllama_dot_kquant(kind, w, &a[p], cols),
   the super-blocks taken for the four at once (one position at a time, the unpacking was most of the
   work) */
static inline __attribute__((always_inline)) void pyllama_tile4_kquant(int kind, const uint8_t* w,
                                                                       const pyllama_qact* a, ptrdiff_t cols,
                                                                       float* out, ptrdiff_t out_stride) {
    const ptrdiff_t bytes = pyllama_kquant_bytes[kind];
    pyllama_kacc k[4] = {PYLLAMA_KACC_ZERO, PYLLAMA_KACC_ZERO, PYLLAMA_KACC_ZERO, PYLLAMA_KACC_ZERO};
    for (ptrdiff_t b = 0; b < cols / PYLLAMA_QK_K; b++) pyllama_kquant_steps(kind, w + bytes * b, a, b, k, 4);
    for (int p = 0; p < 4; p++) out[p * out_stride] = pyllama_kquant_finish(kind, &k[p]);
}

static float pyllama_dot_q2_k(const uint8_t* w, const pyllama_qact* a, ptrdiff_t n) {
    return pyllama_dot_kquant(PYLLAMA_Q2_K, w, a, n);
}
static float pyllama_dot_q3_k(const uint8_t* w, const pyllama_qact* a, ptrdiff_t n) {
    return pyllama_dot_kquant(PYLLAMA_Q3_K, w, a, n);
}
static float pyllama_dot_q4_k(const uint8_t* w, const pyllama_qact* a, ptrdiff_t n) {
    return pyllama_dot_kquant(PYLLAMA_Q4_K, w, a, n);
}
static float pyllama_dot_q5_k(const uint8_t* w, const pyllama_qact* a, ptrdiff_t n) {
    return pyllama_dot_kquant(PYLLAMA_Q5_K, w, a, n);
}
static float pyllama_dot_q6_k(const uint8_t* w, const pyllama_qact* a, ptrdiff_t n) {
    return pyllama_dot_kquant(PYLLAMA_Q6_K, w, a, n);
}

#define PYLLAMA_KQUANT_TILE(name, KIND)                                                                \
    static void name(const uint8_t* w, const pyllama_qact* a, ptrdiff_t n, float* out, ptrdiff_t stride) { \
        pyllama_tile4_kquant(KIND, w, a, n, out, stride);                                               \
    }
PYLLAMA_KQUANT_TILE(pyllama_tile4_q2_k, PYLLAMA_Q2_K)
PYLLAMA_KQUANT_TILE(pyllama_tile4_q3_k, PYLLAMA_Q3_K)
PYLLAMA_KQUANT_TILE(pyllama_tile4_q4_k, PYLLAMA_Q4_K)
PYLLAMA_KQUANT_TILE(pyllama_tile4_q5_k, PYLLAMA_Q5_K)
PYLLAMA_KQUANT_TILE(pyllama_tile4_q6_k, PYLLAMA_Q6_K)
#undef PYLLAMA_KQUANT_TILE

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

/* the table rows' products (qrows.h) and row dequantisers; Q4_K's, Q5_K's and Q6_K's are those of a matrix without
   its packed copy (qpacked_kcodes.h and qpacked_kquants.h name the rows') */
#define PYLLAMA_KQUANT_TYPE(name, products, KIND, BYTES)                                                   \
    PYLLAMA_ROW_PRODUCTS(products, .block = PYLLAMA_QK_K, .block_bytes = BYTES, .dot = pyllama_dot_##name,  \
                         .tile4 = pyllama_tile4_##name)                                                     \
    static void pyllama_dequantize_##name(const pyllama_matrix* m, ptrdiff_t r, float* out) {              \
        pyllama_dequantize_kquant(KIND, (const uint8_t*)m->data, r, out, m->cols);                         \
    }
PYLLAMA_KQUANT_TYPE(q2_k, q2_k, PYLLAMA_Q2_K, PYLLAMA_Q2_K_BYTES)
PYLLAMA_KQUANT_TYPE(q3_k, q3_k, PYLLAMA_Q3_K, PYLLAMA_Q3_K_BYTES)
PYLLAMA_KQUANT_TYPE(q4_k, q4_k_mapped, PYLLAMA_Q4_K, PYLLAMA_Q4_K_BYTES)
PYLLAMA_KQUANT_TYPE(q5_k, q5_k_mapped, PYLLAMA_Q5_K, PYLLAMA_Q5_K_BYTES)
PYLLAMA_KQUANT_TYPE(q6_k, q6_k_mapped, PYLLAMA_Q6_K, PYLLAMA_Q6_K_BYTES)
#undef PYLLAMA_KQUANT_TYPE

#endif /* PYLLAMA_KQUANTS_H */
