/* The K-quant products in the super-block chain order, on the file's layout (the products of a matrix
 * without its packed copy, qpacked_kquants.h, which gives the same bits).
 *
 * The order, per row and super-block b (d = d_x d_w, dm = d_x dmin_w, each one float32 product):
 *
 *   isum = sum over the sub-blocks s of sc_s * sum_{e in s} q_e x_e            (exact, int32)
 *   Q4_K, Q5_K:  imin = sum_s m_s * (the sum of the sub-block's 32 x)          (exact)
 *                acc = fma((float)isum, d, acc);  accm = fma((float)imin, dm, accm)
 *   Q6_K:        isum's q_e is the signed q - 32;  acc = fma((float)isum, d, acc)
 *
 * and the row's product is acc - accm (Q4_K, Q5_K) or acc (Q6_K). For Q4_K this is the order of the
 * kernels llama.cpp (0c1e570 and later) runs on every matrix whose row count is a multiple of 8, which it
 * repacks on AVX2 and AVX-512 (ggml-cpu/arch/x86/repack.cpp, ggml_gemv_q4_K_8x8_q8_K and
 * ggml_gemm_q4_K_8x8_q8_K: one float chain for the scaled sums and one for the mins per super-block, their
 * difference at the end; decode and prompt alike). llama.cpp multiplies Q5_K and Q6_K with vec_dot in
 * decode and with its tiled kernel (another order again) in prompts; pyllama takes one order for both, the
 * same chain as Q4_K: two float operations per super-block and row, where vec_dot's eight lanes per
 * super-block and their reduction made the block products cost twice the integer work.
 *
 * The integer sums come from the lanes of kquants_lanes.h (summed across lanes: the same integers), so
 * this file adds only the float steps.
 */
#ifndef PYLLAMA_KQUANTS_CHAIN_H
#define PYLLAMA_KQUANTS_CHAIN_H

#include "kquants.h"

typedef struct {
    float acc, accm;
} pyllama_kchain;

/* Super-block b of one row (blk) at np <= 4 positions a[0 .. np-1] into k[0 .. np-1] */
static inline __attribute__((always_inline)) void pyllama_kchain_steps(int kind, const uint8_t* blk,
                                                                       const pyllama_qact* a, ptrdiff_t b,
                                                                       pyllama_kchain* k, int np) {
    float d, dmin = 0.0f;
    if (kind == PYLLAMA_Q6_K) d = pyllama_half_at(blk + 208);
    else { d = pyllama_half_at(blk); dmin = pyllama_half_at(blk + 2); }
    int32_t isum[4], imin[4] = {0, 0, 0, 0};
#if PYLLAMA_QBLOCKS_AVX2
    const int8_t* xq[4];
    const int16_t* bs[4];
    for (int p = 0; p < np; p++) {
        xq[p] = a[p].q + PYLLAMA_QK_K * b;
        bs[p] = a[p].bsums + 16 * b;
    }
    __m256i lanes[4];
    if (kind == PYLLAMA_Q6_K) {
        pyllama_klanes_q6k(blk, xq, bs, np, lanes);
    } else {
        __m256i scales;
        __m128i mins;
        pyllama_k4_scales_avx2(blk + 4, &scales, &mins);
        for (int p = 0; p < np; p++) imin[p] = pyllama_hsum_i32x4(pyllama_k4_min_lanes(mins, bs[p]));
        pyllama_klanes_q45k(kind, blk, xq, scales, np, lanes);
    }
    for (int p = 0; p < np; p++) isum[p] = pyllama_hsum_i32x8(lanes[p]);
#else
    int sc[16], mn[16];
    float d_unused, dmin_unused;
    pyllama_kquant_scales_of(kind, blk, sc, mn, &d_unused, &dmin_unused);
    for (int p = 0; p < np; p++) {
        const int16_t* bs = a[p].bsums + 16 * b;
        int32_t lanes[8];
        pyllama_kquant_lanes_c(kind, blk, a[p].q + PYLLAMA_QK_K * b, bs, lanes);
        isum[p] = 0;
        for (int l = 0; l < 8; l++) isum[p] += lanes[l];
        if (kind != PYLLAMA_Q6_K)
            for (int s = 0; s < 8; s++) imin[p] += mn[s] * (bs[2 * s] + bs[2 * s + 1]);
    }
#endif
    for (int p = 0; p < np; p++) {
        k[p].acc = fmaf((float)isum[p], d * a[p].d[b], k[p].acc);
        if (kind != PYLLAMA_Q6_K) k[p].accm = fmaf((float)imin[p], dmin * a[p].d[b], k[p].accm);
    }
}

static inline float pyllama_kchain_finish(int kind, const pyllama_kchain* k) {
    return kind == PYLLAMA_Q6_K ? k->acc : k->acc - k->accm;
}

static inline float pyllama_dot_kchain(int kind, const uint8_t* w, const pyllama_qact* a, ptrdiff_t cols) {
    const ptrdiff_t bytes = pyllama_kquant_bytes[kind];
    pyllama_kchain k = {0.0f, 0.0f};
    for (ptrdiff_t b = 0; b < cols / PYLLAMA_QK_K; b++) pyllama_kchain_steps(kind, w + bytes * b, a, b, &k, 1);
    return pyllama_kchain_finish(kind, &k);
}

/* one row times four positions, each element pyllama_dot_kchain's */
static inline __attribute__((always_inline)) void pyllama_tile4_kchain(int kind, const uint8_t* w,
                                                                       const pyllama_qact* a, ptrdiff_t cols,
                                                                       float* out, ptrdiff_t out_stride) {
    const ptrdiff_t bytes = pyllama_kquant_bytes[kind];
    pyllama_kchain k[4] = {{0.0f, 0.0f}, {0.0f, 0.0f}, {0.0f, 0.0f}, {0.0f, 0.0f}};
    for (ptrdiff_t b = 0; b < cols / PYLLAMA_QK_K; b++) pyllama_kchain_steps(kind, w + bytes * b, a, b, k, 4);
    for (int p = 0; p < 4; p++) out[p * out_stride] = pyllama_kchain_finish(kind, &k[p]);
}

#define PYLLAMA_KCHAIN_FORMS(name, KIND)                                                                        \
    static float pyllama_dot_##name##_chain(const uint8_t* w, const pyllama_qact* a, ptrdiff_t n) {             \
        return pyllama_dot_kchain(KIND, w, a, n);                                                               \
    }                                                                                                           \
    static void pyllama_tile4_##name##_chain(const uint8_t* w, const pyllama_qact* a, ptrdiff_t n, float* out,  \
                                             ptrdiff_t stride) {                                                \
        pyllama_tile4_kchain(KIND, w, a, n, out, stride);                                                       \
    }
PYLLAMA_KCHAIN_FORMS(q4_k, PYLLAMA_Q4_K)
PYLLAMA_KCHAIN_FORMS(q5_k, PYLLAMA_Q5_K)
PYLLAMA_KCHAIN_FORMS(q6_k, PYLLAMA_Q6_K)
#undef PYLLAMA_KCHAIN_FORMS

#endif /* PYLLAMA_KQUANTS_CHAIN_H */
