/* Packed Q4_0 and Q5_0 (qpacked.h): 16 rows per group, each block of 32 values of the 16 rows in one
 * group block, and the products on it.
 *
 * Group block of Q4_0 (288 bytes, the 16 rows' 18-byte blocks moved):
 *   d[16]            the rows' fp16 scales
 *   qs[4][16][4]     chunk j: row r's bytes 4j .. 4j + 3 of its 16 nibble bytes at 4r; their low nibbles
 *                    are elements 4j .. 4j + 3 of the row, their high nibbles elements 16 + 4j .. 16 + 4j + 3
 * Group block of Q5_0 (352 bytes): d[16], then the fifth bits as eight 64-bit masks (mask l, bit 4r + k:
 * element 4l + k of row r, which is bit 4l + k of the row's qh), then qs as Q4_0's.
 *
 * The products (the Q8_0 activation with the offsets o4 and o32 of its int8 values, q8_0.h):
 *
 * * Q4_0, matrices whose row count is a multiple of 8: llama.cpp's order for the matrices it repacks
 *   (gemv/gemm_q4_0_8x8_q8_0, qlegacy.h): per block the whole integer sum, then one float chain
 *   acc = fma((float)isum, d_w * d_x, acc). Here isum = sum (q - 8) x = sum q x - 8 * sum x: the nibbles
 *   are multiplied unsigned (vpdpbusd takes unsigned weights, signed activations) and the chain of the
 *   eight 4-byte products starts from o32 = -8 times the block's activation sum. Other Q4_0 matrices keep the
 *   vec_dot order on the mapped file, as llama.cpp does not repack them.
 * * Q5_0: ggml_vec_dot_q5_0_q8_0's order (qlegacy.h), which llama.cpp runs for every Q5_0 matrix: per
 *   block 8 lanes, lane l = sum over elements 4l .. 4l + 3 of (q - 16) x (here each chunk's product
 *   started from o4 = -16 times the 4 activations' sum: one vector is lane l of 16 rows), fused into 8 float
 *   accumulators acc_l = fma(d_w * d_x, lane_l, acc_l), reduced at the end as hsum_float_8 does,
 *   ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)), lane-wise for the 16 rows.
 */
#ifndef PYLLAMA_QPACKED_LEGACY_H
#define PYLLAMA_QPACKED_LEGACY_H

#include "qpacked.h"
#include "qlegacy.h"

#define PYLLAMA_Q4_0_GROUP_BYTES (PYLLAMA_PACK_ROWS * PYLLAMA_Q4_0_BYTES) /* 288 */
#define PYLLAMA_Q5_0_GROUP_BYTES (PYLLAMA_PACK_ROWS * PYLLAMA_Q5_0_BYTES) /* 352 */
#define PYLLAMA_Q5_0_MASKS 32   /* where a Q5_0 group block's masks start */
#define PYLLAMA_Q5_0_QS 96      /* and its nibbles */

/* bytes of the packed copy, 0 for a matrix multiplied as mapped */
static ptrdiff_t pyllama_packed_bytes_q4_0(ptrdiff_t rows, ptrdiff_t cols) {
    return rows % 8 ? 0 : pyllama_pack_groups(rows) * (cols / PYLLAMA_QK) * PYLLAMA_Q4_0_GROUP_BYTES;
}
static ptrdiff_t pyllama_packed_bytes_q5_0(ptrdiff_t rows, ptrdiff_t cols) {
    return pyllama_pack_groups(rows) * (cols / PYLLAMA_QK) * PYLLAMA_Q5_0_GROUP_BYTES;
}

/* groups g0 .. g1 - 1 of the matrix into out (the whole packed copy); rows past the end stay zero */
static void pyllama_pack_legacy(int kind, const pyllama_matrix* m, ptrdiff_t g0, ptrdiff_t g1, uint8_t* out) {
    const ptrdiff_t nb = m->cols / PYLLAMA_QK, bytes = pyllama_legacy_bytes[kind];
    const ptrdiff_t group_block = PYLLAMA_PACK_ROWS * bytes, qs = kind == PYLLAMA_Q5_0 ? PYLLAMA_Q5_0_QS : 32;
    for (ptrdiff_t g = g0; g < g1; g++) {
        uint8_t* dst_group = out + g * nb * group_block;
        memset(dst_group, 0, (size_t)(nb * group_block));
        for (int r = 0; r < PYLLAMA_PACK_ROWS && PYLLAMA_PACK_ROWS * g + r < m->rows; r++) {
            const uint8_t* src_row = (const uint8_t*)m->data + (PYLLAMA_PACK_ROWS * g + r) * nb * bytes;
            for (ptrdiff_t b = 0; b < nb; b++) {
                const uint8_t* src = src_row + b * bytes;
                uint8_t* dst = dst_group + b * group_block;
                memcpy(dst + 2 * r, src, 2);
                for (int j = 0; j < 4; j++) memcpy(dst + qs + 64 * j + 4 * r, src + pyllama_legacy_qs[kind] + 4 * j, 4);
                if (kind == PYLLAMA_Q5_0) {
                    uint32_t qh;
                    memcpy(&qh, src + pyllama_legacy_qh[kind], 4);
                    for (int l = 0; l < 8; l++) {
                        uint64_t mask;
                        memcpy(&mask, dst + PYLLAMA_Q5_0_MASKS + 8 * l, 8);
                        mask |= (uint64_t)((qh >> (4 * l)) & 15) << (4 * r);
                        memcpy(dst + PYLLAMA_Q5_0_MASKS + 8 * l, &mask, 8);
                    }
                }
            }
        }
    }
}
static void pyllama_pack_q4_0(const pyllama_matrix* m, ptrdiff_t g0, ptrdiff_t g1, uint8_t* out) {
    pyllama_pack_legacy(PYLLAMA_Q4_0, m, g0, g1, out);
}
static void pyllama_pack_q5_0(const pyllama_matrix* m, ptrdiff_t g0, ptrdiff_t g1, uint8_t* out) {
    pyllama_pack_legacy(PYLLAMA_Q5_0, m, g0, g1, out);
}

/* A group's rows at P positions a[0 .. P-1]: out[p * out_stride + r] for r < n_rows, in Q4_0's chain
   order. The 16 rows are 16 / PV_LANES parts of PV_LANES lanes; each block's nibbles are unpacked once
   for the P positions. */
static inline __attribute__((always_inline)) void pyllama_ptile_q4_0(const uint8_t* g, ptrdiff_t nb,
                                                                     const pyllama_qact* a, const int P, float* out,
                                                                     ptrdiff_t out_stride, int n_rows) {
    const pv_i m4 = PV_SET8(15);
    for (int part = 0; part * PV_LANES < n_rows; part++) {
        pv_f acc[8];
        for (int p = 0; p < P; p++) acc[p] = PV_ZEROF();
        for (ptrdiff_t b = 0; b < nb; b++) {
            const uint8_t* blk = g + b * PYLLAMA_Q4_0_GROUP_BYTES;
            pv_i lo[4], hi[4];
            for (int j = 0; j < 4; j++) {
                const pv_i v = PV_LOAD(blk + 32 + 64 * j + 4 * PV_LANES * part);
                lo[j] = PV_AND(v, m4);
                hi[j] = PV_AND(PV_SRL16(v, 4), m4);
            }
            const pv_f dw = PV_HALVES(blk + 2 * PV_LANES * part);
            for (int p = 0; p < P; p++) {
                const ptrdiff_t e = PYLLAMA_QK * b;
                /* two chains of exact int32 sums, so that one position does not wait on each dot's latency */
                pv_i tl = PV_SET32(a[p].o32[b]), th = PV_ZERO();
                for (int j = 0; j < 4; j++) {
                    tl = PV_DOT4(tl, lo[j], PV_X4(a[p], e + 4 * j));
                    th = PV_DOT4(th, hi[j], PV_X4(a[p], e + 16 + 4 * j));
                    if (P > 1) {
                        PV_KEEP(tl);
                        PV_KEEP(th);
                    }
                }
                acc[p] = PV_FMA(PV_CVT(PV_ADD32(tl, th)), PV_MULF(dw, PV_SETF(a[p].d[b])), acc[p]);
            }
        }
        for (int p = 0; p < P; p++) pv_store(out + p * out_stride + PV_LANES * part, acc[p], n_rows - PV_LANES * part);
    }
}

/* The same for Q5_0, in vec_dot's order: eight float accumulators per position */
static inline __attribute__((always_inline)) void pyllama_ptile_q5_0(const uint8_t* g, ptrdiff_t nb,
                                                                     const pyllama_qact* a, const int P, float* out,
                                                                     ptrdiff_t out_stride, int n_rows) {
    const pv_i m4 = PV_SET8(15), sixteen = PV_SET8(16);
    for (int part = 0; part * PV_LANES < n_rows; part++) {
        pv_f acc[2][8];
        for (int p = 0; p < P; p++)
            for (int l = 0; l < 8; l++) acc[p][l] = PV_ZEROF();
        for (ptrdiff_t b = 0; b < nb; b++) {
            const uint8_t* blk = g + b * PYLLAMA_Q5_0_GROUP_BYTES;
            const uint8_t* masks = blk + PYLLAMA_Q5_0_MASKS;
            pv_i w[8];
            for (int j = 0; j < 4; j++) {
                const pv_i v = PV_LOAD(blk + PYLLAMA_Q5_0_QS + 64 * j + 4 * PV_LANES * part);
                w[j] = pv_add_where(PV_AND(v, m4), masks + 8 * j, 4 * PV_LANES * part, sixteen);
                w[4 + j] = pv_add_where(PV_AND(PV_SRL16(v, 4), m4), masks + 8 * (4 + j), 4 * PV_LANES * part, sixteen);
            }
            const pv_f dw = PV_HALVES(blk + 2 * PV_LANES * part);
            for (int p = 0; p < P; p++) {
                const pv_f d = PV_MULF(dw, PV_SETF(a[p].d[b]));
                for (int l = 0; l < 8; l++) {
                    const pv_i t = PV_DOT4(PV_SET32(a[p].o4[8 * b + l]), w[l], PV_X4(a[p], PYLLAMA_QK * b + 4 * l));
                    acc[p][l] = PV_FMA(d, PV_CVT(t), acc[p][l]);
                }
            }
        }
        for (int p = 0; p < P; p++) {
            const pv_f* s = acc[p];
            const pv_f total = PV_ADDF(PV_ADDF(PV_ADDF(s[0], s[4]), PV_ADDF(s[2], s[6])),
                                       PV_ADDF(PV_ADDF(s[1], s[5]), PV_ADDF(s[3], s[7])));
            pv_store(out + p * out_stride + PV_LANES * part, total, n_rows - PV_LANES * part);
        }
    }
}

PYLLAMA_PACKED_PRODUCTS(q4_0, pyllama_ptile_q4_0, 8, PYLLAMA_QK, PYLLAMA_Q4_0_GROUP_BYTES)
PYLLAMA_PACKED_PRODUCTS(q5_0, pyllama_ptile_q5_0, 2, PYLLAMA_QK, PYLLAMA_Q5_0_GROUP_BYTES)

#endif /* PYLLAMA_QPACKED_LEGACY_H */
