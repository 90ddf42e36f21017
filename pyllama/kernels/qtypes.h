/* The weight types pyllama multiplies: one row per type (qtype.h says what a row holds), indexed by the
 * type's id. This is the one place a type's facts are written; Python reads them through
 * pyllama.kernels.qproduct (QType, STORED_TYPES, and the GGUF loader's checks come from here), the
 * product loop reads the kernels. Every kernel is this build's SIMD path, chosen at compile time
 * (qblocks.h, f32dot.h, f16.h); every element of a product has the same bits on every path.
 *
 * Adding a type: its id in qtype.h, its kernel file (its block layout, a row dot and the forms of
 * qrows.h, or its own units, vec and mat; a row dequantiser), included below, and its row.
 * tests/test_qtype_table.py fails while a row is incomplete or disagrees with gguf-py.
 *
 * Included by qproduct.pyx only: the kernels are compiled once.
 */
#ifndef PYLLAMA_QTYPES_H
#define PYLLAMA_QTYPES_H

#include "qtype.h"
#include "f32.h"
#include "f16.h"
#include "q8_0.h"
#include "q8_groups.h"
#include "qlegacy_products.h"
#include "kquants.h"
#include "qpacked_kcodes.h"

static void pyllama_act_f32(const pyllama_acts* a, ptrdiff_t p) {
    (void)a;
    (void)p; /* the kernels read the float32 positions */
}

static const pyllama_act pyllama_acts_table[PYLLAMA_N_ACTS] = {
    [PYLLAMA_ACT_F32] = {"F32", pyllama_act_f32},
    [PYLLAMA_ACT_Q8_0] = {"Q8_0", pyllama_act_q8_0},
    [PYLLAMA_ACT_Q8_0_TILE] = {"Q8_0", pyllama_act_q8_0_tile},
    [PYLLAMA_ACT_Q8_1] = {"Q8_1", pyllama_act_q8_1},
    [PYLLAMA_ACT_Q8_K] = {"Q8_K", pyllama_act_q8_k},
    [PYLLAMA_ACT_Q8_GROUPS] = {"Q8_GROUPS", pyllama_act_q8_groups},
};

/* work_div: team_size counts work in float32 multiply-adds; a row that streams fewer bytes per weight
   counts less (F16 half, the 8-bit and smaller types a quarter), so that small products stay on one
   thread. */
static const pyllama_qtype pyllama_qtypes[PYLLAMA_N_QTYPES] = {
    [PYLLAMA_F32] = {.name = "F32", .ggml = 0, .block = 1, .block_bytes = 4, .act = PYLLAMA_ACT_F32,
                     .work_div = 1, PYLLAMA_PRODUCTS(f32), .dequantize_row = pyllama_dequantize_f32},
    [PYLLAMA_F16] = {.name = "F16", .ggml = 1, .block = 1, .block_bytes = 2, .act = PYLLAMA_ACT_F32,
                     .work_div = 2, PYLLAMA_PRODUCTS(f16), .dequantize_row = pyllama_dequantize_f16},
    [PYLLAMA_BF16] = {.name = "BF16", .ggml = 30, .block = 1, .block_bytes = 2, .act = PYLLAMA_ACT_F32,
                      .work_div = 4, PYLLAMA_PRODUCTS(bf16), .dequantize_row = pyllama_dequantize_bf16},
    [PYLLAMA_Q8_0] = {.name = "Q8_0", .ggml = 8, .block = 32, .block_bytes = PYLLAMA_Q8_0_BYTES,
                      .act = PYLLAMA_ACT_Q8_0_TILE, .work_div = 4, PYLLAMA_PRODUCTS(q8_0),
                      .dequantize_row = pyllama_dequantize_q8_0},
    [PYLLAMA_Q4_0] = {.name = "Q4_0", .ggml = 2, .block = PYLLAMA_QK, .block_bytes = PYLLAMA_Q4_0_BYTES,
                      .act = PYLLAMA_ACT_Q8_0, .work_div = 4, PYLLAMA_PRODUCTS(q4_0),
                      .dequantize_row = pyllama_dequantize_q4_0, .packed_bytes = pyllama_packed_bytes_q4_0,
                      .pack = pyllama_pack_q4_0},
    [PYLLAMA_Q4_1] = {.name = "Q4_1", .ggml = 3, .block = PYLLAMA_QK, .block_bytes = PYLLAMA_Q4_1_BYTES,
                      .act = PYLLAMA_ACT_Q8_1, .work_div = 4, PYLLAMA_PRODUCTS(q4_1),
                      .dequantize_row = pyllama_dequantize_q4_1},
    [PYLLAMA_Q5_0] = {.name = "Q5_0", .ggml = 6, .block = PYLLAMA_QK, .block_bytes = PYLLAMA_Q5_0_BYTES,
                      .act = PYLLAMA_ACT_Q8_0, .work_div = 4, PYLLAMA_PRODUCTS(q5_0),
                      .dequantize_row = pyllama_dequantize_q5_0, .packed_bytes = pyllama_packed_bytes_q5_0,
                      .pack = pyllama_pack_q5_0},
    [PYLLAMA_Q5_1] = {.name = "Q5_1", .ggml = 7, .block = PYLLAMA_QK, .block_bytes = PYLLAMA_Q5_1_BYTES,
                      .act = PYLLAMA_ACT_Q8_1, .work_div = 4, PYLLAMA_PRODUCTS(q5_1),
                      .dequantize_row = pyllama_dequantize_q5_1},
    [PYLLAMA_IQ4_NL] = {.name = "IQ4_NL", .ggml = 20, .block = PYLLAMA_QK, .block_bytes = PYLLAMA_IQ4_NL_BYTES,
                        .act = PYLLAMA_ACT_Q8_0, .work_div = 4, PYLLAMA_PRODUCTS(iq4_nl),
                        .dequantize_row = pyllama_dequantize_iq4_nl},
    [PYLLAMA_Q2_K] = {.name = "Q2_K", .ggml = 10, .block = PYLLAMA_QK_K, .block_bytes = PYLLAMA_Q2_K_BYTES,
                      .act = PYLLAMA_ACT_Q8_K, .work_div = 4, PYLLAMA_PRODUCTS(q2_k),
                      .dequantize_row = pyllama_dequantize_q2_k},
    [PYLLAMA_Q3_K] = {.name = "Q3_K", .ggml = 11, .block = PYLLAMA_QK_K, .block_bytes = PYLLAMA_Q3_K_BYTES,
                      .act = PYLLAMA_ACT_Q8_K, .work_div = 4, PYLLAMA_PRODUCTS(q3_k),
                      .dequantize_row = pyllama_dequantize_q3_k},
    [PYLLAMA_Q4_K] = {.name = "Q4_K", .ggml = 12, .block = PYLLAMA_QK_K, .block_bytes = PYLLAMA_Q4_K_BYTES,
                      .act = PYLLAMA_ACT_Q8_K, .work_div = 4, PYLLAMA_PRODUCTS(q4_k),
                      .dequantize_row = pyllama_dequantize_q4_k, .packed_bytes = pyllama_packed_bytes_q4_k,
                      .pack = pyllama_pack_q4_k},
    [PYLLAMA_Q5_K] = {.name = "Q5_K", .ggml = 13, .block = PYLLAMA_QK_K, .block_bytes = PYLLAMA_Q5_K_BYTES,
                      .act = PYLLAMA_ACT_Q8_K, .work_div = 4, PYLLAMA_PRODUCTS(q5_k),
                      .dequantize_row = pyllama_dequantize_q5_k, .packed_bytes = pyllama_packed_bytes_q5_k,
                      .pack = pyllama_pack_q5_k},
    [PYLLAMA_Q6_K] = {.name = "Q6_K", .ggml = 14, .block = PYLLAMA_QK_K, .block_bytes = PYLLAMA_Q6_K_BYTES,
                      .act = PYLLAMA_ACT_Q8_K, .work_div = 4, PYLLAMA_PRODUCTS(q6_k),
                      .dequantize_row = pyllama_dequantize_q6_k, .packed_bytes = pyllama_packed_bytes_q6_k,
                      .pack = pyllama_pack_q6_k},
    /* values as int8 bytes, one to a block; the scales are the matrix's own array, one per group_size */
    [PYLLAMA_Q8_GROUPS] = {.name = "Q8_GROUPS", .ggml = -1, .block = 1, .block_bytes = 1,
                           .act = PYLLAMA_ACT_Q8_GROUPS, .work_div = 4, PYLLAMA_PRODUCTS(q8_groups),
                           .dequantize_row = pyllama_dequantize_q8_groups},
};

#endif /* PYLLAMA_QTYPES_H */
