/* Packed Q4_K, Q5_K and Q6_K (qpacked.h): 16 rows per group, each super-block of 256 values of the 16
 * rows in one group block, and the products on it, in the super-block chain order (kquants.h).
 *
 * Group block of Q4_K (2,368 bytes; 148 per row, the 144 of a block with its 6-bit scales unpacked):
 *   d[16], dmin[16]    the rows' fp16 d and dmin
 *   sc[8][16]          the scale of sub-block s (32 values) of row r, at 16 s + r
 *   mn[4][16][2]       the mins of sub-blocks 2j and 2j + 1 of row r, at 32 j + 2 r (pairs: one int16 pair
 *                      per lane for vpdpwssd)
 *   qs[4][8][16][4]    chunk (c, g): row r's nibble bytes 32 c + 4 g .. + 3, whose low nibbles are
 *                      elements 64 c + 4 g + k of the row (sub-block 2 c) and high nibbles 64 c + 32 + 4 g + k
 *                      (sub-block 2 c + 1)
 * Q5_K (2,880 bytes) adds the fifth bits: the 64-bit mask of chunk (c, g) and half h (low, high nibbles) at
 * 2,368 + 8 (16 c + 2 g + h), bit 4 r + k set when the element's fifth bit is.
 * Q6_K (3,360 bytes, as the rows' own 210 each):
 *   d[16]              fp16
 *   sc[8][16][2]       the int8 scales of sub-blocks 2j and 2j + 1 (16 values each) of row r, at 32 j + 2 r
 *   ql[2][16][16][4]   chunk (h, j): row r's bytes 64 h + 4 j .. + 3 of ql: low nibbles are elements
 *                      128 h + 4 j + k, high nibbles 128 h + 64 + 4 j + k
 *   qh[2][8][16][4]    chunk (h, l): row r's bytes 32 h + 4 l .. + 3 of qh: bits 2 i, 2 i + 1 are the high
 *                      bits of element 128 h + 32 i + 4 l + k
 *
 * The weights are multiplied unsigned (the codes q; Q6_K's q - 32 is q times x minus 32 times the
 * activation's sums of 16), and the integer sums of each sub-block scaled before they leave int32, so that
 * a super-block gives each row one exact isum (and, for Q4_K / Q5_K, imin = sum_s m_s (bsum of the
 * sub-block's 32 activations)). The float steps are kquants.h's chain, one per super-block.
 */
#ifndef PYLLAMA_QPACKED_KQUANTS_H
#define PYLLAMA_QPACKED_KQUANTS_H

#include "qpacked.h"

#define PYLLAMA_Q4_K_GROUP_BYTES 2368
#define PYLLAMA_Q5_K_GROUP_BYTES 2880
#define PYLLAMA_Q6_K_GROUP_BYTES 3360
#define PYLLAMA_K4_SC 64
#define PYLLAMA_K4_MN 192
#define PYLLAMA_K4_QS 320
#define PYLLAMA_K5_MASKS 2368
#define PYLLAMA_K6_SC 32
#define PYLLAMA_K6_QL 288
#define PYLLAMA_K6_QH 2336

#if PYLLAMA_QBLOCKS_AVX512
#define PV_SRA32(a, n) _mm512_srai_epi32(a, n)
#elif PYLLAMA_QBLOCKS_AVX2
#define PV_SRA32(a, n) _mm256_srai_epi32(a, n)
#else
#define PV_SRA32(a, n) ((uint32_t)((int32_t)(a) >> (n)))
#endif

static ptrdiff_t pyllama_packed_bytes_q4_k(ptrdiff_t rows, ptrdiff_t cols) {
    /* other row counts keep vec_dot's order on the file's layout, as llama.cpp keeps them (kquants.h) */
    return rows % 8 ? 0 : pyllama_pack_groups(rows) * (cols / PYLLAMA_QK_K) * PYLLAMA_Q4_K_GROUP_BYTES;
}
static ptrdiff_t pyllama_packed_bytes_q5_k(ptrdiff_t rows, ptrdiff_t cols) {
    return pyllama_pack_groups(rows) * (cols / PYLLAMA_QK_K) * PYLLAMA_Q5_K_GROUP_BYTES;
}
static ptrdiff_t pyllama_packed_bytes_q6_k(ptrdiff_t rows, ptrdiff_t cols) {
    return pyllama_pack_groups(rows) * (cols / PYLLAMA_QK_K) * PYLLAMA_Q6_K_GROUP_BYTES;
}

/* row r (< 16) of a group's super-block from the file's block src, into the zeroed group block dst */
static void pyllama_pack_k45_row(int kind, const uint8_t* src, int r, uint8_t* dst) {
    const uint8_t* qs = src + (kind == PYLLAMA_Q4_K ? 16 : 48);
    memcpy(dst + 2 * r, src, 2);
    memcpy(dst + 32 + 2 * r, src + 2, 2);
    for (int s = 0; s < 8; s++) {
        int sc, mn;
        pyllama_k4_scale_min(src + 4, s, &sc, &mn);
        dst[PYLLAMA_K4_SC + 16 * s + r] = (uint8_t)sc;
        dst[PYLLAMA_K4_MN + 32 * (s / 2) + 2 * r + s % 2] = (uint8_t)mn;
    }
    for (int c = 0; c < 4; c++)
        for (int g = 0; g < 8; g++) memcpy(dst + PYLLAMA_K4_QS + 64 * (8 * c + g) + 4 * r, qs + 32 * c + 4 * g, 4);
    if (kind != PYLLAMA_Q5_K) return;
    const uint8_t* qh = src + 16;
    for (int c = 0; c < 4; c++)
        for (int g = 0; g < 8; g++)
            for (int h = 0; h < 2; h++) {
                uint8_t* mask = dst + PYLLAMA_K5_MASKS + 8 * (16 * c + 2 * g + h);
                for (int k = 0; k < 4; k++)
                    if ((qh[4 * g + k] >> (2 * c + h)) & 1) mask[(4 * r + k) / 8] |= (uint8_t)(1u << ((4 * r + k) % 8));
            }
}

static void pyllama_pack_k6_row(const uint8_t* src, int r, uint8_t* dst) {
    memcpy(dst + 2 * r, src + 208, 2);
    for (int s = 0; s < 16; s++) dst[PYLLAMA_K6_SC + 32 * (s / 2) + 2 * r + s % 2] = src[192 + s];
    for (int h = 0; h < 2; h++) {
        for (int j = 0; j < 16; j++) memcpy(dst + PYLLAMA_K6_QL + 64 * (16 * h + j) + 4 * r, src + 64 * h + 4 * j, 4);
        for (int l = 0; l < 8; l++) memcpy(dst + PYLLAMA_K6_QH + 64 * (8 * h + l) + 4 * r, src + 128 + 32 * h + 4 * l, 4);
    }
}

static void pyllama_pack_kquant(int kind, const pyllama_matrix* m, ptrdiff_t g0, ptrdiff_t g1, uint8_t* out) {
    const ptrdiff_t nb = m->cols / PYLLAMA_QK_K, bytes = pyllama_kquant_bytes[kind];
    const ptrdiff_t group_block = kind == PYLLAMA_Q4_K ? PYLLAMA_Q4_K_GROUP_BYTES
                                  : kind == PYLLAMA_Q5_K ? PYLLAMA_Q5_K_GROUP_BYTES : PYLLAMA_Q6_K_GROUP_BYTES;
    for (ptrdiff_t g = g0; g < g1; g++) {
        uint8_t* dst_group = out + g * nb * group_block;
        memset(dst_group, 0, (size_t)(nb * group_block));
        for (int r = 0; r < PYLLAMA_PACK_ROWS && PYLLAMA_PACK_ROWS * g + r < m->rows; r++) {
            const uint8_t* src_row = (const uint8_t*)m->data + (PYLLAMA_PACK_ROWS * g + r) * nb * bytes;
            for (ptrdiff_t b = 0; b < nb; b++) {
                if (kind == PYLLAMA_Q6_K) pyllama_pack_k6_row(src_row + b * bytes, r, dst_group + b * group_block);
                else pyllama_pack_k45_row(kind, src_row + b * bytes, r, dst_group + b * group_block);
            }
        }
    }
}
static void pyllama_pack_q4_k(const pyllama_matrix* m, ptrdiff_t g0, ptrdiff_t g1, uint8_t* out) {
    pyllama_pack_kquant(PYLLAMA_Q4_K, m, g0, g1, out);
}
static void pyllama_pack_q5_k(const pyllama_matrix* m, ptrdiff_t g0, ptrdiff_t g1, uint8_t* out) {
    pyllama_pack_kquant(PYLLAMA_Q5_K, m, g0, g1, out);
}
static void pyllama_pack_q6_k(const pyllama_matrix* m, ptrdiff_t g0, ptrdiff_t g1, uint8_t* out) {
    pyllama_pack_kquant(PYLLAMA_Q6_K, m, g0, g1, out);
}

/* the activation's sums of sub-blocks 2j and 2j + 1 (32 values each) of super-block b, as one int16 pair */
static inline int32_t pyllama_k4_bsum_pair(const pyllama_qact* a, ptrdiff_t b, int j) {
    const int16_t* bs = a->bsums + 16 * b + 4 * j;
    const uint32_t lo = (uint16_t)(int16_t)(bs[0] + bs[1]), hi = (uint16_t)(int16_t)(bs[2] + bs[3]);
    return (int32_t)(lo | (hi << 16));
}

/* A group's rows at P positions (out[p * out_stride + r], r < n_rows), Q4_K (kind) or Q5_K: per
   super-block and position, isum and imin of each row, then acc = fma(isum, d_w * d_x, acc) and
   accm = fma(imin, dmin_w * d_x, accm); the row's product is acc - accm. */
static inline __attribute__((always_inline)) void pyllama_ptile_k45(int kind, const uint8_t* g, ptrdiff_t nb,
                                                                    const pyllama_qact* a, const int P, float* out,
                                                                    ptrdiff_t out_stride, int n_rows) {
    const ptrdiff_t group_block = kind == PYLLAMA_Q4_K ? PYLLAMA_Q4_K_GROUP_BYTES : PYLLAMA_Q5_K_GROUP_BYTES;
    const pv_i m4 = PV_SET8(15), sixteen = PV_SET8(16);
    for (int part = 0; part * PV_LANES < n_rows; part++) {
        const int lane0 = PV_LANES * part;
        pv_f acc[8], accm[8];
        for (int p = 0; p < P; p++) acc[p] = accm[p] = PV_ZEROF();
        for (ptrdiff_t b = 0; b < nb; b++) {
            const uint8_t* blk = g + b * group_block;
            pv_i isum[8];
            for (int p = 0; p < P; p++) isum[p] = PV_ZERO();
            for (int c = 0; c < 4; c++) {
                pv_i lo[8], hi[8];
                for (int k = 0; k < 8; k++) {
                    const pv_i v = PV_LOAD(blk + PYLLAMA_K4_QS + 64 * (8 * c + k) + 4 * lane0);
                    lo[k] = PV_AND(v, m4);
                    hi[k] = PV_AND(PV_SRL16(v, 4), m4);
                    if (kind == PYLLAMA_Q5_K) {
                        const uint8_t* mask = blk + PYLLAMA_K5_MASKS + 8 * (16 * c + 2 * k);
                        lo[k] = pv_add_where(lo[k], mask, 4 * lane0, sixteen);
                        hi[k] = pv_add_where(hi[k], mask + 8, 4 * lane0, sixteen);
                    }
                }
                const pv_i sl = PV_U8(blk + PYLLAMA_K4_SC + 32 * c + lane0);
                const pv_i sh = PV_U8(blk + PYLLAMA_K4_SC + 32 * c + 16 + lane0);
                for (int p = 0; p < P; p++) {
                    const ptrdiff_t e = PYLLAMA_QK_K * b + 64 * c;
                    pv_i tl = PV_ZERO(), th = PV_ZERO();
                    for (int k = 0; k < 8; k++) {
                        tl = PV_DOT4(tl, lo[k], PV_X4(a[p], e + 4 * k));
                        th = PV_DOT4(th, hi[k], PV_X4(a[p], e + 32 + 4 * k));
                    }
                    isum[p] = PV_ADD32(isum[p], PV_ADD32(PV_MUL32(tl, sl), PV_MUL32(th, sh)));
                }
            }
            const pv_f dw = PV_HALVES(blk + 2 * lane0), dm = PV_HALVES(blk + 32 + 2 * lane0);
            for (int p = 0; p < P; p++) {
                pv_i imin = PV_ZERO();
                for (int j = 0; j < 4; j++)
                    imin = PV_DOT2(imin, PV_U8PAIRS(blk + PYLLAMA_K4_MN + 32 * j + 2 * lane0),
                                   PV_SET32(pyllama_k4_bsum_pair(&a[p], b, j)));
                const pv_f dx = PV_SETF(a[p].d[b]);
                acc[p] = PV_FMA(PV_CVT(isum[p]), PV_MULF(dw, dx), acc[p]);
                accm[p] = PV_FMA(PV_CVT(imin), PV_MULF(dm, dx), accm[p]);
            }
        }
        for (int p = 0; p < P; p++) pv_store(out + p * out_stride + lane0, PV_SUBF(acc[p], accm[p]), n_rows - lane0);
    }
}

/* the same for Q6_K: isum = sum_s sc_s (sum q x - 32 bsum_s), acc = fma(isum, d_w * d_x, acc) */
static inline __attribute__((always_inline)) void pyllama_ptile_q6_k(const uint8_t* g, ptrdiff_t nb,
                                                                     const pyllama_qact* a, const int P, float* out,
                                                                     ptrdiff_t out_stride, int n_rows) {
    const pv_i m4 = PV_SET8(15), m2 = PV_SET8(0x30);
    for (int part = 0; part * PV_LANES < n_rows; part++) {
        const int lane0 = PV_LANES * part;
        pv_f acc[8];
        for (int p = 0; p < P; p++) acc[p] = PV_ZEROF();
        for (ptrdiff_t b = 0; b < nb; b++) {
            const uint8_t* blk = g + b * PYLLAMA_Q6_K_GROUP_BYTES;
            pv_i isum[8];
            for (int p = 0; p < P; p++) isum[p] = PV_ZERO();
            for (int h = 0; h < 2; h++)
                for (int q4 = 0; q4 < 2; q4++) {
                    /* w[i][l]: elements 128 h + 32 i + 4 (4 q4 + l) + k, sub-block 8 h + 2 i + q4 */
                    pv_i w[4][4];
                    for (int l = 0; l < 4; l++) {
                        const int l4 = 4 * q4 + l;
                        const pv_i qh = PV_LOAD(blk + PYLLAMA_K6_QH + 64 * (8 * h + l4) + 4 * lane0);
                        const pv_i a0 = PV_LOAD(blk + PYLLAMA_K6_QL + 64 * (16 * h + l4) + 4 * lane0);
                        const pv_i a1 = PV_LOAD(blk + PYLLAMA_K6_QL + 64 * (16 * h + 8 + l4) + 4 * lane0);
                        w[0][l] = PV_OR(PV_AND(a0, m4), PV_AND(PV_SLL16(qh, 4), m2));
                        w[1][l] = PV_OR(PV_AND(a1, m4), PV_AND(PV_SLL16(qh, 2), m2));
                        w[2][l] = PV_OR(PV_AND(PV_SRL16(a0, 4), m4), PV_AND(qh, m2));
                        w[3][l] = PV_OR(PV_AND(PV_SRL16(a1, 4), m4), PV_AND(PV_SRL16(qh, 2), m2));
                    }
                    pv_i sc[4];
                    for (int i = 0; i < 4; i++) {
                        /* sub-block 8 h + 2 i + q4: the low (q4 = 0) or high int16 of pair 4 h + i */
                        const pv_i pair = PV_I8PAIRS(blk + PYLLAMA_K6_SC + 32 * (4 * h + i) + 2 * lane0);
                        sc[i] = q4 ? PV_SRA32(pair, 16) : PV_SRA32(PV_SLL32(pair, 16), 16);
                    }
                    for (int p = 0; p < P; p++)
                        for (int i = 0; i < 4; i++) {
                            const ptrdiff_t e = PYLLAMA_QK_K * b + 128 * h + 32 * i + 16 * q4;
                            pv_i t = PV_ZERO();
                            for (int l = 0; l < 4; l++) t = PV_DOT4(t, w[i][l], PV_X4(a[p], e + 4 * l));
                            isum[p] = PV_ADD32(isum[p], PV_MUL32(t, sc[i]));
                        }
                }
            const pv_f dw = PV_HALVES(blk + 2 * lane0);
            for (int p = 0; p < P; p++) {
                pv_i corr = PV_ZERO();
                for (int j = 0; j < 8; j++)
                    corr = PV_DOT2(corr, PV_I8PAIRS(blk + PYLLAMA_K6_SC + 32 * j + 2 * lane0),
                                   PV_SET32(pyllama_i32_at(a[p].bsums + 16 * b + 2 * j)));
                const pv_i total = PV_SUB32(isum[p], PV_SLL32(corr, 5));
                acc[p] = PV_FMA(PV_CVT(total), PV_MULF(dw, PV_SETF(a[p].d[b])), acc[p]);
            }
        }
        for (int p = 0; p < P; p++) pv_store(out + p * out_stride + lane0, acc[p], n_rows - lane0);
    }
}

#define PYLLAMA_KTILE(name, KIND)                                                                               \
    static inline __attribute__((always_inline)) void pyllama_ptile_##name(const uint8_t* g, ptrdiff_t nb,       \
        const pyllama_qact* a, const int P, float* out, ptrdiff_t out_stride, int n_rows) {                     \
        pyllama_ptile_k45(KIND, g, nb, a, P, out, out_stride, n_rows);                                          \
    }
PYLLAMA_KTILE(q4_k, PYLLAMA_Q4_K)
PYLLAMA_KTILE(q5_k, PYLLAMA_Q5_K)
#undef PYLLAMA_KTILE

PYLLAMA_PACKED_PRODUCTS(q4_k, pyllama_ptile_q4_k, 8, PYLLAMA_QK_K, PYLLAMA_Q4_K_GROUP_BYTES)
PYLLAMA_PACKED_PRODUCTS(q5_k, pyllama_ptile_q5_k, 8, PYLLAMA_QK_K, PYLLAMA_Q5_K_GROUP_BYTES)
PYLLAMA_PACKED_PRODUCTS(q6_k, pyllama_ptile_q6_k, 8, PYLLAMA_QK_K, PYLLAMA_Q6_K_GROUP_BYTES)

#endif /* PYLLAMA_QPACKED_KQUANTS_H */
