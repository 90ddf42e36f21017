/* Float32 weights (GGUF type 0): the products of qtypes.h's F32 row, over f32dot.h's one order.
 *
 * Decode reads every weight once per token, so the single-vector product streams memory: its unit is a
 * group of four rows a quarter of the matrix apart (pyllama_dot4_f32), and the last rows % 4 rows are
 * units of one. Four adjacent rows share their pages, and the hardware prefetcher, which follows
 * streams within a page, then stalls on the back-and-forth; four distant rows are four clean streams
 * (measured from DRAM on a 60 MB matrix of 288-column rows, one AMD EPYC core: 13 GB/s for one row at a
 * time, 10 for four adjacent, 22 for four apart; in cache the same as adjacent). Without the four-row
 * form (a build without AVX2) every unit is one row. A block product's unit is a strip of
 * PYLLAMA_F32_STRIP rows, read once for every position (f32dot.h's tiles). Whichever form computes a
 * row, it is the same dot product, so the bits do not depend on the unit or the thread.
 */
#ifndef PYLLAMA_F32_H
#define PYLLAMA_F32_H

#include <string.h>

#include "f32dot.h"
#include "qtype.h"

/* the groups of four rows of a single-vector product */
static inline ptrdiff_t pyllama_f32_groups(ptrdiff_t rows) { return PYLLAMA_HAVE_DOT4 ? rows / 4 : 0; }

static ptrdiff_t pyllama_units_f32(const pyllama_matrix* m, ptrdiff_t n_pos) {
    if (n_pos == 1) return m->rows - 3 * pyllama_f32_groups(m->rows);
    return (m->rows + PYLLAMA_F32_STRIP - 1) / PYLLAMA_F32_STRIP;
}

/* units u0 .. u1 - 1 at one position: group g < q is rows g, g + q, g + 2q, g + 3q; unit q + i is row 4q + i */
static void pyllama_vec_f32(const pyllama_matrix* m, ptrdiff_t u0, ptrdiff_t u1, const pyllama_acts* a, float* out) {
    const float* w = (const float*)m->data;
    const ptrdiff_t cols = m->cols, q = pyllama_f32_groups(m->rows);
    for (ptrdiff_t u = u0; u < u1; u++) {
        if (u < q) {
            pyllama_dot4_f32(w + u * cols, q * cols, a->x, cols, out + u, q);
        } else {
            const ptrdiff_t r = 3 * q + u;
            out[r] = pyllama_dot_f32(w + r * cols, a->x, cols);
        }
    }
}

/* strips u0 .. u1 - 1 at every position */
static void pyllama_mat_f32(const pyllama_matrix* m, ptrdiff_t u0, ptrdiff_t u1, const pyllama_acts* a, float* out) {
    for (ptrdiff_t u = u0; u < u1; u++) {
        const ptrdiff_t r0 = PYLLAMA_F32_STRIP * u;
        const ptrdiff_t r1 = m->rows - r0 < PYLLAMA_F32_STRIP ? m->rows : r0 + PYLLAMA_F32_STRIP;
        pyllama_matmul_f32_rows(out, (const float*)m->data, a->x, a->n_pos, m->rows, m->cols, r0, r1);
    }
}

static void pyllama_dequantize_f32(const pyllama_matrix* m, ptrdiff_t r, float* out) {
    memcpy(out, (const float*)m->data + r * m->cols, (size_t)m->cols * sizeof(float));
}

#endif /* PYLLAMA_F32_H */
