/* Q4_K's and Q5_K's products on their packed copies (qpacked_kquants.h). Decode (one position) runs the tile on
 * the group blocks. A block of positions expands each group's codes to one byte each, on the stack, once, and
 * runs all its positions on them: unpacking the nibbles (and Q5_K's fifth bits) in the tile, for every 4
 * positions, had cost Q5_K a tenth of its tile on AVX-512, and the expanded codes would be bytes read once
 * each by a decode. The lanes are the same integers either way, so the same bits.
 */
#ifndef PYLLAMA_QPACKED_KCODES_H
#define PYLLAMA_QPACKED_KCODES_H

#include "qpacked_kquants.h"

/* A Q4_K or Q5_K group's nb super-blocks (g) with their codes one to a byte (out, nb * 4,416 bytes): per
   super-block the group block's first 320 bytes (d, dmin, scales, mins), then chunk (c, k)'s codes of
   sub-block 2 c and of 2 c + 1, 64 bytes each (row r's 4 at 4 r), at 320 + 128 (8 c + k) */
static void pyllama_k45_expand(int kind, const uint8_t* g, ptrdiff_t nb, uint8_t* out) {
    const ptrdiff_t group_block = kind == PYLLAMA_Q4_K ? PYLLAMA_Q4_K_GROUP_BYTES : PYLLAMA_Q5_K_GROUP_BYTES;
    for (ptrdiff_t b = 0; b < nb; b++) {
        const uint8_t* blk = g + b * group_block;
        uint8_t* dst = out + b * PYLLAMA_K45X_BYTES;
        memcpy(dst, blk, PYLLAMA_K4_QS);
        for (int part = 0; part * PV_LANES < PYLLAMA_PACK_ROWS; part++)
            for (int c = 0; c < 4; c++)
                for (int k = 0; k < 8; k++) {
                    pv_i lo, hi;
                    pyllama_k45_codes(kind, blk, c, k, PV_LANES * part, &lo, &hi);
                    PV_STORE_I(dst + PYLLAMA_K45X_CODES + 128 * (8 * c + k) + 4 * PV_LANES * part, lo);
                    PV_STORE_I(dst + PYLLAMA_K45X_CODES + 128 * (8 * c + k) + 64 + 4 * PV_LANES * part, hi);
                }
    }
}

PYLLAMA_PACKED_PRODUCTS(q4_k_blocks, pyllama_ptile_q4_k, 4, PYLLAMA_QK_K, PYLLAMA_Q4_K_GROUP_BYTES)
PYLLAMA_PACKED_PRODUCTS(q5_k_blocks, pyllama_ptile_q5_k, 4, PYLLAMA_QK_K, PYLLAMA_Q5_K_GROUP_BYTES)

/* a group's expanded codes sit on the stack, up to 16 super-blocks (4,096 columns, 70,656 bytes); a wider
   matrix's block product runs the tile on the group blocks */
#define PYLLAMA_K45X_MAX_BLOCKS 16

/* a block of positions on a Q4_K or Q5_K packed copy (nb <= PYLLAMA_K45X_MAX_BLOCKS), group by group on the
   group's expanded codes: the tile's lanes on the same codes, so the same bits as on the group block */
static inline __attribute__((always_inline)) void pyllama_pmat_k45_codes(int kind, const pyllama_matrix* m,
                                                                         ptrdiff_t u0, ptrdiff_t u1,
                                                                         const pyllama_acts* a, float* out) {
    const ptrdiff_t nb = m->cols / PYLLAMA_QK_K, rows = m->rows;
    const ptrdiff_t group_block = kind == PYLLAMA_Q4_K ? PYLLAMA_Q4_K_GROUP_BYTES : PYLLAMA_Q5_K_GROUP_BYTES;
    uint8_t codes[PYLLAMA_K45X_MAX_BLOCKS * PYLLAMA_K45X_BYTES] __attribute__((aligned(64)));
    const pyllama_acts own = *a;
    pyllama_qact at[4];
    for (ptrdiff_t u = u0; u < u1; u++) {
        pyllama_k45_expand(kind, (const uint8_t*)m->packed + u * nb * group_block, nb, codes);
        const ptrdiff_t r0 = PYLLAMA_PACK_ROWS * u;
        const int n_rows = (int)(rows - r0 < PYLLAMA_PACK_ROWS ? rows - r0 : PYLLAMA_PACK_ROWS);
        ptrdiff_t p = 0;
        for (; p + 4 <= own.n_pos; p += 4) {
            for (int k = 0; k < 4; k++) at[k] = pyllama_act_at(&own, p + k);
            pyllama_ptile_k45(kind, 1, codes, nb, at, 4, out + p * rows + r0, rows, n_rows);
        }
        for (; p < own.n_pos; p++) {
            at[0] = pyllama_act_at(&own, p);
            pyllama_ptile_k45(kind, 1, codes, nb, at, 1, out + p * rows + r0, rows, n_rows);
        }
    }
}

/* Q4_K's and Q5_K's products on their packed copies: decode on the group blocks (expanded codes would be
   bytes read for one use), a block of positions on each group's expanded codes where they fit the stack */
#define PYLLAMA_K45_PRODUCTS(name, KIND)                                                                         \
    static void pyllama_pvec_##name(const pyllama_matrix* m, ptrdiff_t u0, ptrdiff_t u1, const pyllama_acts* a,  \
                                    float* out) {                                                                \
        pyllama_pvec_##name##_blocks(m, u0, u1, a, out);                                                         \
    }                                                                                                            \
    static void pyllama_pmat_##name(const pyllama_matrix* m, ptrdiff_t u0, ptrdiff_t u1, const pyllama_acts* a,  \
                                    float* out) {                                                                \
        if (m->cols / PYLLAMA_QK_K > PYLLAMA_K45X_MAX_BLOCKS) pyllama_pmat_##name##_blocks(m, u0, u1, a, out);   \
        else pyllama_pmat_k45_codes(KIND, m, u0, u1, a, out);                                                    \
    }                                                                                                            \
    PYLLAMA_PACKED_OR_MAPPED(name)
PYLLAMA_K45_PRODUCTS(q4_k, PYLLAMA_Q4_K)
PYLLAMA_K45_PRODUCTS(q5_k, PYLLAMA_Q5_K)
#undef PYLLAMA_K45_PRODUCTS

#endif /* PYLLAMA_QPACKED_KCODES_H */
