/* The K-quant products and row dequantisers as their table rows (qtypes.h) name them:
 *
 * * Q2_K, Q3_K: vec_dot's order (kquants.h), on the file's layout;
 * * Q4_K: the super-block chain (kquants_chain.h) where the row count is a multiple of 8, from the packed
 *   copy (qpacked_kquants.h) or the file's layout; vec_dot's order elsewhere, as llama.cpp, which repacks
 *   only such matrices;
 * * Q5_K, Q6_K: the chain, from the packed copy or the file's layout.
 */
#ifndef PYLLAMA_KQUANTS_PRODUCTS_H
#define PYLLAMA_KQUANTS_PRODUCTS_H

#include "kquants.h"
#include "kquants_chain.h"
#include "qpacked_kquants.h"
#include "qrows.h"

#define PYLLAMA_KVECDOT_FORMS(name, KIND)                                                                      \
    static float pyllama_dot_##name(const uint8_t* w, const pyllama_qact* a, ptrdiff_t n) {                   \
        return pyllama_dot_kquant(KIND, w, a, n);                                                              \
    }                                                                                                          \
    static void pyllama_tile4_##name(const uint8_t* w, const pyllama_qact* a, ptrdiff_t n, float* out,         \
                                     ptrdiff_t stride) {                                                       \
        pyllama_tile4_kquant(KIND, w, a, n, out, stride);                                                      \
    }
PYLLAMA_KVECDOT_FORMS(q2_k, PYLLAMA_Q2_K)
PYLLAMA_KVECDOT_FORMS(q3_k, PYLLAMA_Q3_K)
PYLLAMA_KVECDOT_FORMS(q4_k, PYLLAMA_Q4_K)
#undef PYLLAMA_KVECDOT_FORMS

#define PYLLAMA_K_FORMS(BYTES, name) .block = PYLLAMA_QK_K, .block_bytes = BYTES, \
    .dot = pyllama_dot_##name, .tile4 = pyllama_tile4_##name
PYLLAMA_ROW_PRODUCTS(q2_k, PYLLAMA_K_FORMS(PYLLAMA_Q2_K_BYTES, q2_k))
PYLLAMA_ROW_PRODUCTS(q3_k, PYLLAMA_K_FORMS(PYLLAMA_Q3_K_BYTES, q3_k))
PYLLAMA_ROW_PRODUCTS(q4_k_vecdot, PYLLAMA_K_FORMS(PYLLAMA_Q4_K_BYTES, q4_k))
PYLLAMA_ROW_PRODUCTS(q4_k_chain, PYLLAMA_K_FORMS(PYLLAMA_Q4_K_BYTES, q4_k_chain))
PYLLAMA_ROW_PRODUCTS(q5_k_mapped, PYLLAMA_K_FORMS(PYLLAMA_Q5_K_BYTES, q5_k_chain))
PYLLAMA_ROW_PRODUCTS(q6_k_mapped, PYLLAMA_K_FORMS(PYLLAMA_Q6_K_BYTES, q6_k_chain))
#undef PYLLAMA_K_FORMS

/* Q4_K on the file's layout: the order by the row count */
static ptrdiff_t pyllama_units_q4_k_mapped(const pyllama_matrix* m, ptrdiff_t n_pos) {
    return m->rows % 8 ? pyllama_units_q4_k_vecdot(m, n_pos) : pyllama_units_q4_k_chain(m, n_pos);
}
static void pyllama_vec_q4_k_mapped(const pyllama_matrix* m, ptrdiff_t u0, ptrdiff_t u1, const pyllama_acts* a,
                                    float* out) {
    if (m->rows % 8) pyllama_vec_q4_k_vecdot(m, u0, u1, a, out);
    else pyllama_vec_q4_k_chain(m, u0, u1, a, out);
}
static void pyllama_mat_q4_k_mapped(const pyllama_matrix* m, ptrdiff_t u0, ptrdiff_t u1, const pyllama_acts* a,
                                    float* out) {
    if (m->rows % 8) pyllama_mat_q4_k_vecdot(m, u0, u1, a, out);
    else pyllama_mat_q4_k_chain(m, u0, u1, a, out);
}

PYLLAMA_PACKED_OR_MAPPED(q4_k)
PYLLAMA_PACKED_OR_MAPPED(q5_k)
PYLLAMA_PACKED_OR_MAPPED(q6_k)

#define PYLLAMA_KQUANT_DEQUANTIZE(name, KIND)                                                  \
    static void pyllama_dequantize_##name(const pyllama_matrix* m, ptrdiff_t r, float* out) {  \
        pyllama_dequantize_kquant(KIND, (const uint8_t*)m->data, r, out, m->cols);             \
    }
PYLLAMA_KQUANT_DEQUANTIZE(q2_k, PYLLAMA_Q2_K)
PYLLAMA_KQUANT_DEQUANTIZE(q3_k, PYLLAMA_Q3_K)
PYLLAMA_KQUANT_DEQUANTIZE(q4_k, PYLLAMA_Q4_K)
PYLLAMA_KQUANT_DEQUANTIZE(q5_k, PYLLAMA_Q5_K)
PYLLAMA_KQUANT_DEQUANTIZE(q6_k, PYLLAMA_Q6_K)
#undef PYLLAMA_KQUANT_DEQUANTIZE

#endif /* PYLLAMA_KQUANTS_PRODUCTS_H */
