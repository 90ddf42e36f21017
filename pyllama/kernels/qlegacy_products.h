/* The products and the row dequantisers of the 32-value block types and BF16, as their table rows
 * (qtypes.h) name them: qlegacy.h's row dots and one-row tiles, qlegacy_rows4.h's four-row tiles,
 * qlegacy_rows8.h's eight-row order of the matrices llama.cpp repacks (Q4_0, IQ4_NL), and, for Q4_0 and
 * Q5_0, qpacked_legacy.h's products on the packed copy when the matrix has one.
 */
#ifndef PYLLAMA_QLEGACY_PRODUCTS_H
#define PYLLAMA_QLEGACY_PRODUCTS_H

#include "qlegacy.h"
#include "qlegacy_rows4.h"
#include "qlegacy_rows8.h"
#include "qpacked_legacy.h"
#include "qrows.h"

PYLLAMA_ROW_PRODUCTS(q4_0_mapped, .block = PYLLAMA_QK, .block_bytes = PYLLAMA_Q4_0_BYTES, .dot = pyllama_dot_q4_0,
                     .rows8 = pyllama_dot8_q4_0_chain, .rows8x4 = pyllama_dot8x4_q4_0_chain)
PYLLAMA_PACKED_OR_MAPPED(q4_0)
PYLLAMA_ROW_PRODUCTS(q4_1, .block = PYLLAMA_QK, .block_bytes = PYLLAMA_Q4_1_BYTES, .dot = pyllama_dot_q4_1,
                     .tile4 = pyllama_tile4_q4_1, .rows4x4 = pyllama_rows4x4_q4_1)
PYLLAMA_ROW_PRODUCTS(q5_0_mapped, .block = PYLLAMA_QK, .block_bytes = PYLLAMA_Q5_0_BYTES, .dot = pyllama_dot_q5_0,
                     .tile4 = pyllama_tile4_q5_0, .rows4x4 = pyllama_rows4x4_q5_0)
PYLLAMA_PACKED_OR_MAPPED(q5_0)
PYLLAMA_ROW_PRODUCTS(q5_1, .block = PYLLAMA_QK, .block_bytes = PYLLAMA_Q5_1_BYTES, .dot = pyllama_dot_q5_1,
                     .tile4 = pyllama_tile4_q5_1, .rows4x4 = pyllama_rows4x4_q5_1)
PYLLAMA_ROW_PRODUCTS(iq4_nl, .block = PYLLAMA_QK, .block_bytes = PYLLAMA_IQ4_NL_BYTES, .dot = pyllama_dot_iq4_nl,
                     .rows8 = pyllama_dot8_iq4_nl_chain, .rows8x4 = pyllama_dot8x4_iq4_nl_chain)
PYLLAMA_ROW_PRODUCTS(bf16, .block = 1, .block_bytes = 2, .dot = pyllama_dot_bf16)

#define PYLLAMA_LEGACY_DEQUANTIZE(name, KIND)                                                    \
    static void pyllama_dequantize_##name(const pyllama_matrix* m, ptrdiff_t r, float* out) {    \
        pyllama_dequantize_legacy(KIND, (const uint8_t*)m->data, r, out, m->cols);               \
    }
PYLLAMA_LEGACY_DEQUANTIZE(q4_0, PYLLAMA_Q4_0)
PYLLAMA_LEGACY_DEQUANTIZE(q4_1, PYLLAMA_Q4_1)
PYLLAMA_LEGACY_DEQUANTIZE(q5_0, PYLLAMA_Q5_0)
PYLLAMA_LEGACY_DEQUANTIZE(q5_1, PYLLAMA_Q5_1)
PYLLAMA_LEGACY_DEQUANTIZE(iq4_nl, PYLLAMA_IQ4_NL)
#undef PYLLAMA_LEGACY_DEQUANTIZE

static void pyllama_dequantize_bf16(const pyllama_matrix* m, ptrdiff_t r, float* out) {
    const uint16_t* h = (const uint16_t*)m->data + r * m->cols;
    for (ptrdiff_t j = 0; j < m->cols; j++) out[j] = pyllama_bf2f(h[j]);
}

#endif /* PYLLAMA_QLEGACY_PRODUCTS_H */
