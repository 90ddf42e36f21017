/* Packed Q4_K, Q5_K and Q6_K (qpacked.h): 16 rows per group, each super-block of 256 values of the 16 rows in one
 * group block, and the products on it, in vec_dot's order (kquants.h), the order of the file's layout.
 *
 * Group block (2,368 bytes; 148 per row, the 144 of a block with its 6-bit scales unpacked):
 *   d[16], dmin[16]    the rows' fp16 d and dmin
 *   sc[8][16]          the scale of sub-block s (32 values) of row r, at 16 s + r
 *   mn[4][16][2]       the mins of sub-blocks 2j and 2j + 1 of row r, at 32 j + 2 r (pairs: one int16 pair
 *                      per lane for vpdpwssd)
 *   qs[4][8][16][4]    chunk (c, g): row r's nibble bytes 32 c + 4 g .. + 3, whose low nibbles are
 *                      elements 64 c + 4 g + k of the row (sub-block 2 c) and high nibbles 64 c + 32 + 4 g + k
 *                      (sub-block 2 c + 1)
 *
 * vec_dot's lane g of a super-block is sum_s sc_s (sum of q x over elements 32 s + 4 g .. + 3): chunk
 * (c, g)'s low nibbles give sub-block 2 c's 4-term sum and its high nibbles sub-block 2 c + 1's, each
 * scaled in int32, so a group keeps the 8 lanes of 16 rows in 8 vectors, and the float steps are
 * vec_dot's, lane-wise for the 16 rows: acc[g] = fma(d_x d_w, lane g, acc[g]), the mins' 4 accumulators
 * acc_m[j] = fma(-d_x dmin_w, m_2j bsum_2j + m_2j+1 bsum_2j+1, acc_m[j]), and at the end hsum_float_8 of
 * acc plus (m0 + m2) + (m1 + m3).
 *
 * Group block of Q5_K (2,880 bytes): Q4_K's, then 512 bytes of fifth bits, laid out for the path's
 * cheapest way to add 16 where one is set. AVX-512: per chunk (c, g) and nibble half h, a 64-bit mask
 * of the 16 rows' 4 bytes (bit 4 r + k), at 2,368 + 8 (16 c + 2 g + h), for a masked byte add. AVX2 and
 * portable, which have no byte masks: the file's qh bytes as they are, row r's bytes 4 g .. + 3 at
 * 2,368 + 64 g + 4 r, where bit 2 c + h is the fifth bit of chunk (c, g)'s nibble h, shifted to bit 4.
 *
 * Group block of Q6_K (4,384 bytes; 274 per row against the file's 210: its 6-bit codes one to a byte, so
 * that a prompt's tile, the only product on this copy, spends nothing on unpacking them):
 *   d[16]              fp16
 *   sc[8][16][2]       the int8 scales of sub-blocks 2j and 2j + 1 (16 values each) of row r, at 32 j + 2 r
 *   q[2][8][4][16][4]  chunk (h, l, i): row r's unsigned codes (0..63) of elements 4 l .. 4 l + 3 of run
 *                      4 h + i (32 values; i < 4), at 64 (4 (8 h + l) + i) + 4 r
 * where run 4 h + i's element 4 l + k has its low nibble in ql byte 64 h + 4 l + k (i = 0, 2: low and high
 * nibble) or 64 h + 32 + 4 l + k (i = 1, 3) and its high two bits at bits 2 i of qh byte 128 + 32 h + 4 l + k,
 * as vec_dot reads them. Lane l of a super-block is sum_c sc[2 c + l / 4] (the 4-term sum of unsigned codes
 * times x) minus 32 (bsum_2l sc_2l + bsum_2l+1 sc_2l+1), then acc[l] = fma(d_x d_w, lane l, acc[l]) and
 * hsum_float_8 at the end, as vec_dot.
 */
#ifndef PYLLAMA_QPACKED_KQUANTS_H
#define PYLLAMA_QPACKED_KQUANTS_H

#include "qpacked.h"
#include "kquants.h"

#define PYLLAMA_Q4_K_GROUP_BYTES 2368
#define PYLLAMA_K4_SC 64
#define PYLLAMA_K4_MN 192
#define PYLLAMA_K4_QS 320
#define PYLLAMA_Q5_K_GROUP_BYTES 2880
#define PYLLAMA_K5_MASKS 2368
#define PYLLAMA_K45X_CODES PYLLAMA_K4_QS
#define PYLLAMA_K45X_BYTES 4416
#define PYLLAMA_Q6_K_GROUP_BYTES 4384
#define PYLLAMA_K6_SC 32
#define PYLLAMA_K6_Q 288

static ptrdiff_t pyllama_packed_bytes_q4_k(ptrdiff_t rows, ptrdiff_t cols) {
    return pyllama_pack_groups(rows) * (cols / PYLLAMA_QK_K) * PYLLAMA_Q4_K_GROUP_BYTES;
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
    const uint8_t* qh = src + 16; /* element 64 c + 32 h + j's fifth bit: bit 2 c + h of qh[j] */
#if PYLLAMA_QBLOCKS_AVX512
    for (int c = 0; c < 4; c++)
        for (int g = 0; g < 8; g++)
            for (int h = 0; h < 2; h++) {
                uint8_t* mask = dst + PYLLAMA_K5_MASKS + 8 * (16 * c + 2 * g + h);
                for (int k = 0; k < 4; k++)
                    if ((qh[4 * g + k] >> (2 * c + h)) & 1) mask[(4 * r + k) / 8] |= (uint8_t)(1u << ((4 * r + k) % 8));
            }
#else
    for (int g = 0; g < 8; g++) memcpy(dst + PYLLAMA_K5_MASKS + 64 * g + 4 * r, qh + 4 * g, 4);
#endif
}

static void pyllama_pack_k45(int kind, const pyllama_matrix* m, ptrdiff_t g0, ptrdiff_t g1, uint8_t* out) {
    const ptrdiff_t nb = m->cols / PYLLAMA_QK_K, bytes = pyllama_kquant_bytes[kind];
    const ptrdiff_t group_block = kind == PYLLAMA_Q4_K ? PYLLAMA_Q4_K_GROUP_BYTES : PYLLAMA_Q5_K_GROUP_BYTES;
    for (ptrdiff_t g = g0; g < g1; g++) {
        uint8_t* dst_group = out + g * nb * group_block;
        memset(dst_group, 0, (size_t)(nb * group_block));
        for (int r = 0; r < PYLLAMA_PACK_ROWS && PYLLAMA_PACK_ROWS * g + r < m->rows; r++) {
            const uint8_t* src_row = (const uint8_t*)m->data + (PYLLAMA_PACK_ROWS * g + r) * nb * bytes;
            for (ptrdiff_t b = 0; b < nb; b++)
                pyllama_pack_k45_row(kind, src_row + b * bytes, r, dst_group + b * group_block);
        }
    }
}
static void pyllama_pack_q4_k(const pyllama_matrix* m, ptrdiff_t g0, ptrdiff_t g1, uint8_t* out) {
    pyllama_pack_k45(PYLLAMA_Q4_K, m, g0, g1, out);
}
static ptrdiff_t pyllama_packed_bytes_q5_k(ptrdiff_t rows, ptrdiff_t cols) {
    return pyllama_pack_groups(rows) * (cols / PYLLAMA_QK_K) * PYLLAMA_Q5_K_GROUP_BYTES;
}
static void pyllama_pack_q5_k(const pyllama_matrix* m, ptrdiff_t g0, ptrdiff_t g1, uint8_t* out) {
    pyllama_pack_k45(PYLLAMA_Q5_K, m, g0, g1, out);
}

static ptrdiff_t pyllama_packed_bytes_q6_k(ptrdiff_t rows, ptrdiff_t cols) {
    return pyllama_pack_groups(rows) * (cols / PYLLAMA_QK_K) * PYLLAMA_Q6_K_GROUP_BYTES;
}

static void pyllama_pack_q6_k_row(const uint8_t* src, int r, uint8_t* dst) {
    memcpy(dst + 2 * r, src + 208, 2);
    for (int s = 0; s < 16; s++) dst[PYLLAMA_K6_SC + 32 * (s / 2) + 2 * r + s % 2] = src[192 + s];
    for (int h = 0; h < 2; h++)
        for (int l = 0; l < 8; l++)
            for (int k = 0; k < 4; k++) {
                const int lo0 = src[64 * h + 4 * l + k], lo1 = src[64 * h + 32 + 4 * l + k];
                const int qh = src[128 + 32 * h + 4 * l + k];
                const int code[4] = {(lo0 & 15) | (qh & 3) << 4, (lo1 & 15) | (qh >> 2 & 3) << 4,
                                     lo0 >> 4 | (qh >> 4 & 3) << 4, lo1 >> 4 | (qh >> 6 & 3) << 4};
                for (int i = 0; i < 4; i++) dst[PYLLAMA_K6_Q + 64 * (4 * (8 * h + l) + i) + 4 * r + k] = (uint8_t)code[i];
            }
}

static void pyllama_pack_q6_k(const pyllama_matrix* m, ptrdiff_t g0, ptrdiff_t g1, uint8_t* out) {
    const ptrdiff_t nb = m->cols / PYLLAMA_QK_K, bytes = PYLLAMA_Q6_K_BYTES, group_block = PYLLAMA_Q6_K_GROUP_BYTES;
    for (ptrdiff_t g = g0; g < g1; g++) {
        uint8_t* dst_group = out + g * nb * group_block;
        memset(dst_group, 0, (size_t)(nb * group_block));
        for (int r = 0; r < PYLLAMA_PACK_ROWS && PYLLAMA_PACK_ROWS * g + r < m->rows; r++) {
            const uint8_t* src_row = (const uint8_t*)m->data + (PYLLAMA_PACK_ROWS * g + r) * nb * bytes;
            for (ptrdiff_t b = 0; b < nb; b++) pyllama_pack_q6_k_row(src_row + b * bytes, r, dst_group + b * group_block);
        }
    }
}

/* the activation's sums of sub-blocks 2j and 2j + 1 (32 values each) of super-block b, as one int16 pair */
static inline int32_t pyllama_k4_bsum_pair(const pyllama_qact* a, ptrdiff_t b, int j) {
    const int16_t* bs = a->bsums + 16 * b + 4 * j;
    const uint32_t lo = (uint16_t)(int16_t)(bs[0] + bs[1]), hi = (uint16_t)(int16_t)(bs[2] + bs[3]);
    return (int32_t)(lo | (hi << 16));
}

/* a logical right shift of each 32-bit lane; each int16 half (|x| <= 128) times -32 */
#if PYLLAMA_QBLOCKS_AVX512
#define PV_SRL32(a, n) _mm512_srli_epi32(a, n)
#define PV_NEG32_PAIRS(a) _mm512_sub_epi16(_mm512_setzero_si512(), _mm512_slli_epi16(a, 5))
#elif PYLLAMA_QBLOCKS_AVX2
#define PV_SRL32(a, n) _mm256_srli_epi32(a, n)
#define PV_NEG32_PAIRS(a) _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(a, 5))
#else
#define PV_SRL32(a, n) ((a) >> (n))
#define PV_NEG32_PAIRS(a) \
    ((uint32_t)(uint16_t)(-32 * (int16_t)(a)) | ((uint32_t)(uint16_t)(-32 * (int16_t)((a) >> 16)) << 16))
#endif

/* each byte's bit `bit` (< 8) moved to bit 4 (the shifts' spill between bytes never reaches bit 4) */
static inline __attribute__((always_inline)) pv_i pv_bit_to_4(pv_i v, int bit) {
    return bit <= 4 ? PV_SLL16(v, 4 - bit) : PV_SRL16(v, bit - 4);
}

/* the codes of chunk (c, k) of a Q4_K or Q5_K group block for the lanes from lane0: *lo sub-block 2 c's (the
   low nibbles), *hi 2 c + 1's (the high), Q5_K's with 16 added where an element's fifth bit is set */
static inline __attribute__((always_inline)) void pyllama_k45_codes(int kind, const uint8_t* blk, int c, int k,
                                                                    int lane0, pv_i* lo, pv_i* hi) {
    const pv_i m4 = PV_SET8(15), sixteen = PV_SET8(16);
    const pv_i v = PV_LOAD(blk + PYLLAMA_K4_QS + 64 * (8 * c + k) + 4 * lane0);
    *lo = PV_AND(v, m4);
    *hi = PV_AND(PV_SRL16(v, 4), m4);
    if (kind == PYLLAMA_Q5_K) {
#if PYLLAMA_QBLOCKS_AVX512
        const uint8_t* mask = blk + PYLLAMA_K5_MASKS + 8 * (16 * c + 2 * k);
        *lo = pv_add_where(*lo, mask, 4 * lane0, sixteen);
        *hi = pv_add_where(*hi, mask + 8, 4 * lane0, sixteen);
#else
        const pv_i qh = PV_LOAD(blk + PYLLAMA_K5_MASKS + 64 * k + 4 * lane0);
        *lo = PV_OR(*lo, PV_AND(pv_bit_to_4(qh, 2 * c), sixteen));
        *hi = PV_OR(*hi, PV_AND(pv_bit_to_4(qh, 2 * c + 1), sixteen));
#endif
    }
}

/* lane[p] (p < P) + the 4-term sums of chunk (c, k), scaled by their sub-blocks' scales (both int16 halves
   of scale[s]): maddubs gives the chunk's byte-pair sums and one vpdpwssd scales and adds them, for
   sub-blocks 2 c and 2 c + 1. The codes come from the group block (blk), or with codes = 1 from a
   super-block's expanded codes (qpacked_kcodes.h: the group block's first 320 bytes, then chunk (c, k)'s
   codes one to a byte, sub-block 2 c's and 2 c + 1's, 64 bytes each, at 320 + 128 (8 c + k)) */
static inline __attribute__((always_inline)) void pyllama_k45_chunk(int kind, const uint8_t* blk, const int codes,
                                                                    int c, int k, int lane0, const pv_i* scale,
                                                                    ptrdiff_t e0, const pyllama_qact* a, const int P,
                                                                    pv_i* lane) {
    pv_i lo, hi;
    if (codes) {
        lo = PV_LOAD(blk + PYLLAMA_K45X_CODES + 128 * (8 * c + k) + 4 * lane0);
        hi = PV_LOAD(blk + PYLLAMA_K45X_CODES + 128 * (8 * c + k) + 64 + 4 * lane0);
    } else {
        pyllama_k45_codes(kind, blk, c, k, lane0, &lo, &hi);
    }
    const ptrdiff_t e = e0 + 64 * c + 4 * k;
    for (int p = 0; p < P; p++) {
        lane[p] = PV_DOT2(lane[p], PV_MADDUBS(lo, PV_X4(a[p], e)), scale[2 * c]);
        if (P > 1) PV_KEEP(lane[p]);
        lane[p] = PV_DOT2(lane[p], PV_MADDUBS(hi, PV_X4(a[p], e + 32)), scale[2 * c + 1]);
        if (P > 1) PV_KEEP(lane[p]);
    }
}

/* A group's rows at P positions (out[p * out_stride + r], r < n_rows), in vec_dot's order, Q4_K or Q5_K
   (kind): Q5_K keeps its mins in one accumulator, as vec_dot's
   summs = fma(-d_x dmin_w, sum_j (m_2j bsum_2j + m_2j+1 bsum_2j+1), summs).
   The integer lane sums are exact in any order, so the loops follow the registers: in a block of
   positions a super-block is taken lane by lane, the P positions' sums of one lane in P registers over its
   4 chunks, then its float step (8 x P lane sums spilled to memory on every update made this tile half as
   fast); for one position (decode), chunk by chunk with the 8 lanes' sums in 8 registers, so that
   consecutive updates do not wait on each other. */
static inline __attribute__((always_inline)) void pyllama_ptile_k45(int kind, const int codes, const uint8_t* g,
                                                                    ptrdiff_t nb, const pyllama_qact* a, const int P,
                                                                    float* out, ptrdiff_t out_stride, int n_rows) {
    const ptrdiff_t group_block = codes                  ? PYLLAMA_K45X_BYTES
                                  : kind == PYLLAMA_Q4_K ? PYLLAMA_Q4_K_GROUP_BYTES
                                                         : PYLLAMA_Q5_K_GROUP_BYTES;
    for (int part = 0; part * PV_LANES < n_rows; part++) {
        const int lane0 = PV_LANES * part;
        pv_f acc[8][8], accm[8][4];
        for (int p = 0; p < P; p++) {
            for (int l = 0; l < 8; l++) acc[p][l] = PV_ZEROF();
            for (int j = 0; j < 4; j++) accm[p][j] = PV_ZEROF();
        }
        for (ptrdiff_t b = 0; b < nb; b++) {
            const uint8_t* blk = g + b * group_block;
            pv_i scale[8]; /* sub-block s's scale of each lane's row, in both int16 halves */
            for (int s = 0; s < 8; s++) scale[s] = PV_DUP16(PV_U8(blk + PYLLAMA_K4_SC + 16 * s + lane0));
            const pv_f dw = PV_HALVES(blk + 2 * lane0), dm = PV_HALVES(blk + 32 + 2 * lane0);
            pv_f d[8];
            for (int p = 0; p < P; p++) d[p] = PV_MULF(PV_SETF(a[p].d[b]), dw);
            if (P == 1) {
                pv_i lanes[8];
                for (int k = 0; k < 8; k++) lanes[k] = PV_ZERO();
                for (int c = 0; c < 4; c++)
                    for (int k = 0; k < 8; k++)
                        pyllama_k45_chunk(kind, blk, codes, c, k, lane0, scale, PYLLAMA_QK_K * b, a, 1, &lanes[k]);
                for (int k = 0; k < 8; k++) acc[0][k] = PV_FMA(d[0], PV_CVT(lanes[k]), acc[0][k]);
            } else {
                for (int k = 0; k < 8; k++) {
                    pv_i lane[8];
                    for (int p = 0; p < P; p++) lane[p] = PV_ZERO();
                    for (int c = 0; c < 4; c++)
                        pyllama_k45_chunk(kind, blk, codes, c, k, lane0, scale, PYLLAMA_QK_K * b, a, P, lane);
                    for (int p = 0; p < P; p++) acc[p][k] = PV_FMA(d[p], PV_CVT(lane[p]), acc[p][k]);
                }
            }
            for (int p = 0; p < P; p++) {
                const pv_f ndmin = PV_MULF(PV_SETF(-a[p].d[b]), dm);
                pv_i imin = PV_ZERO();
                for (int j = 0; j < 4; j++) {
                    const pv_i ml = PV_DOT2(PV_ZERO(), PV_U8PAIRS(blk + PYLLAMA_K4_MN + 32 * j + 2 * lane0),
                                            PV_SET32(pyllama_k4_bsum_pair(&a[p], b, j)));
                    if (kind == PYLLAMA_Q4_K) accm[p][j] = PV_FMA(ndmin, PV_CVT(ml), accm[p][j]);
                    else imin = PV_ADD32(imin, ml);
                }
                if (kind == PYLLAMA_Q5_K) accm[p][0] = PV_FMA(ndmin, PV_CVT(imin), accm[p][0]);
            }
        }
        for (int p = 0; p < P; p++) {
            const pv_f* s = acc[p];
            const pv_f* m = accm[p];
            const pv_f total = PV_ADDF(PV_ADDF(PV_ADDF(s[0], s[4]), PV_ADDF(s[2], s[6])),
                                       PV_ADDF(PV_ADDF(s[1], s[5]), PV_ADDF(s[3], s[7])));
            const pv_f mins = kind == PYLLAMA_Q4_K ? PV_ADDF(PV_ADDF(m[0], m[2]), PV_ADDF(m[1], m[3])) : m[0];
            pv_store(out + p * out_stride + lane0, PV_ADDF(total, mins), n_rows - lane0);
        }
    }
}

/* the same for Q6_K (the layout above), lane by lane as Q4_K: each of a lane's 4-term sums (|sum| <= 4 * 63
   * 128) scaled and added by maddubs and one vpdpwssd, on codes loaded as they are */
static inline __attribute__((always_inline)) void pyllama_ptile_q6_k(const uint8_t* g, ptrdiff_t nb,
                                                                     const pyllama_qact* a, const int P, float* out,
                                                                     ptrdiff_t out_stride, int n_rows) {
    for (int part = 0; part * PV_LANES < n_rows; part++) {
        const int lane0 = PV_LANES * part;
        pv_f acc[8][8];
        for (int p = 0; p < P; p++)
            for (int l = 0; l < 8; l++) acc[p][l] = PV_ZEROF();
        for (ptrdiff_t b = 0; b < nb; b++) {
            const uint8_t* blk = g + b * PYLLAMA_Q6_K_GROUP_BYTES;
            const pv_f dw = PV_HALVES(blk + 2 * lane0);
            pv_f d[8];
            for (int p = 0; p < P; p++) d[p] = PV_MULF(PV_SETF(a[p].d[b]), dw);
            /* lanes 4 half .. 4 half + 3 take sub-block 2 c + half of each run c: the scales of one half at a
               time, 8 registers where all 16 and the corrections spilled on AVX-512 */
            for (int half = 0; half < 2; half++) {
                pv_i scale[8]; /* sub-block 2 j + half's int8 scale of each lane's row, in both int16 halves */
                for (int j = 0; j < 8; j++) {
                    const pv_i pair = PV_I8PAIRS(blk + PYLLAMA_K6_SC + 32 * j + 2 * lane0);
                    scale[j] = PV_DUP16(half ? PV_SRL32(pair, 16) : pair);
                }
                for (int l = 4 * half; l < 4 * half + 4; l++) {
                    pv_i lane[8];
                    for (int p = 0; p < P; p++) lane[p] = PV_ZERO();
                    for (int h = 0; h < 2; h++) {
                        const uint8_t* q = blk + PYLLAMA_K6_Q + 64 * 4 * (8 * h + l) + 4 * lane0;
                        const ptrdiff_t e = PYLLAMA_QK_K * b + 128 * h + 4 * l;
                        pv_i w[4];
                        for (int i = 0; i < 4; i++) w[i] = PV_LOAD(q + 64 * i);
                        for (int p = 0; p < P; p++)
                            for (int i = 0; i < 4; i++) {
                                lane[p] = PV_DOT2(lane[p], PV_MADDUBS(w[i], PV_X4(a[p], e + 32 * i)), scale[4 * h + i]);
                                PV_KEEP(lane[p]);
                            }
                    }
                    /* the scales of sub-blocks 2 l and 2 l + 1 times -32 (|.| <= 4096) as int16 pairs, for the
                       codes' -32: minus 32 (bsum_2l sc_2l + bsum_2l+1 sc_2l+1) in lane l */
                    const pv_i neg32 = PV_NEG32_PAIRS(PV_I8PAIRS(blk + PYLLAMA_K6_SC + 32 * l + 2 * lane0));
                    for (int p = 0; p < P; p++) {
                        const pv_i sum = PV_DOT2(lane[p], neg32, PV_SET32(pyllama_i32_at(a[p].bsums + 16 * b + 2 * l)));
                        acc[p][l] = PV_FMA(d[p], PV_CVT(sum), acc[p][l]);
                    }
                }
            }
        }
        for (int p = 0; p < P; p++) {
            const pv_f* s = acc[p];
            const pv_f total = PV_ADDF(PV_ADDF(PV_ADDF(s[0], s[4]), PV_ADDF(s[2], s[6])),
                                       PV_ADDF(PV_ADDF(s[1], s[5]), PV_ADDF(s[3], s[7])));
            pv_store(out + p * out_stride + lane0, total, n_rows - lane0);
        }
    }
}

static inline __attribute__((always_inline)) void pyllama_ptile_q4_k(const uint8_t* g, ptrdiff_t nb,
                                                                     const pyllama_qact* a, const int P, float* out,
                                                                     ptrdiff_t out_stride, int n_rows) {
    pyllama_ptile_k45(PYLLAMA_Q4_K, 0, g, nb, a, P, out, out_stride, n_rows);
}
static inline __attribute__((always_inline)) void pyllama_ptile_q5_k(const uint8_t* g, ptrdiff_t nb,
                                                                     const pyllama_qact* a, const int P, float* out,
                                                                     ptrdiff_t out_stride, int n_rows) {
    pyllama_ptile_k45(PYLLAMA_Q5_K, 0, g, nb, a, P, out, out_stride, n_rows);
}
PYLLAMA_PACKED_PRODUCTS(q6_k, pyllama_ptile_q6_k, 4, PYLLAMA_QK_K, PYLLAMA_Q6_K_GROUP_BYTES)
/* Q6_K's packed tile serves blocks only: its decode reads the file's layout (qpacked.h), 210 bytes a row and
   super-block against the copy's 274, where the tile of one position was also slower on a copy of the file's
   size (stories110M Q6_K on the Xeon: 105 against 115 tok/s). Q4_K's and Q5_K's products: qpacked_kcodes.h. */
PYLLAMA_PACKED_BLOCKS_OR_MAPPED(q6_k)

#endif /* PYLLAMA_QPACKED_KQUANTS_H */
