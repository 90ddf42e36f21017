/* The products of a type multiplied row by row: a row kernel (one row times one position) and the forms
 * that take several rows or positions at once, each element that row kernel's computation (or, for an
 * eight-row form, the order of the layout llama.cpp repacks such matrices into).
 *
 * A type's kernel file names its forms once, and PYLLAMA_ROW_PRODUCTS(name, ...) makes its row's units,
 * vec and mat (qtype.h) from them:
 *
 *   PYLLAMA_ROW_PRODUCTS(q4_k, .block = PYLLAMA_QK_K, .block_bytes = PYLLAMA_Q4_K_BYTES,
 *                        .dot = pyllama_dot_q4_k, .tile4 = pyllama_tile4_q4_k)
 *
 * The forms, of which only dot is required:
 *   dot      one row, one position: the type's arithmetic
 *   tile4    one row, four positions (each element dot's): the row is unpacked once for four
 *   rows4x4  four rows, four positions (each element dot's): four rows share each activation load; taken
 *            in a block of four or more positions when the row count is a multiple of 4
 *   rows8    eight rows, one position, and rows8x4, eight rows, four positions: the order of llama.cpp's
 *            8-row repacked layout, which it uses for matrices whose row count is a multiple of 8, so
 *            every product of such a matrix (one position or a block) takes it
 * A unit is one row, four rows or eight rows, so that whichever thread computes a unit, every element is
 * computed by the same form with the same arithmetic. The functions below are inlined into each type's
 * with constant forms, so the forms are direct calls and a missing one costs no test.
 */
#ifndef PYLLAMA_QROWS_H
#define PYLLAMA_QROWS_H

#include "qtype.h"

typedef float (*pyllama_dot_fn)(const uint8_t* w, const pyllama_qact* a, ptrdiff_t cols);
/* one row times four positions (a4[0..3]) into out[p * out_stride] */
typedef void (*pyllama_tile4_fn)(const uint8_t* w, const pyllama_qact* a4, ptrdiff_t cols, float* out,
                                 ptrdiff_t out_stride);
/* eight consecutive rows (w, w + row_bytes, ...) times one position into out[0..7] */
typedef void (*pyllama_rows8_fn)(const uint8_t* w, ptrdiff_t row_bytes, const pyllama_qact* a, ptrdiff_t cols,
                                 float* out);
/* four or eight consecutive rows times four positions into out[p * out_stride + j] */
typedef void (*pyllama_rows_x4_fn)(const uint8_t* w, ptrdiff_t row_bytes, const pyllama_qact* a4, ptrdiff_t cols,
                                   float* out, ptrdiff_t out_stride);

typedef struct {
    ptrdiff_t block, block_bytes; /* values and bytes per block */
    pyllama_dot_fn dot;
    pyllama_tile4_fn tile4;       /* NULL: a block one position at a time */
    pyllama_rows_x4_fn rows4x4;   /* NULL: none */
    pyllama_rows8_fn rows8;       /* NULL: none (then rows8x4 is NULL too) */
    pyllama_rows_x4_fn rows8x4;   /* NULL: eight rows one position at a time */
} pyllama_row_forms;

/* rows per unit of a product of n_pos positions */
static inline __attribute__((always_inline)) ptrdiff_t pyllama_unit_rows(const pyllama_row_forms f, ptrdiff_t rows,
                                                                         ptrdiff_t n_pos) {
    if (f.rows8 && rows % 8 == 0) return 8;
    if (f.rows4x4 && n_pos >= 4 && rows % 4 == 0) return 4;
    return 1;
}

static inline __attribute__((always_inline)) void pyllama_four_acts(pyllama_qact* a4, const pyllama_acts* a,
                                                                    ptrdiff_t p0) {
    for (int p = 0; p < 4; p++) a4[p] = pyllama_act_at(a, p0 + p);
}

/* units u0 .. u1 - 1 at one position */
static inline __attribute__((always_inline)) void pyllama_rows_vec(const pyllama_row_forms f, const pyllama_matrix* m,
                                                                   ptrdiff_t u0, ptrdiff_t u1, const pyllama_acts* a,
                                                                   float* out) {
    const ptrdiff_t cols = m->cols, row_bytes = cols / f.block * f.block_bytes;
    const uint8_t* w = (const uint8_t*)m->data;
    const pyllama_qact a0 = pyllama_act_at(a, 0);
    if (pyllama_unit_rows(f, m->rows, 1) == 8) {
        for (ptrdiff_t u = u0; u < u1; u++) f.rows8(w + 8 * u * row_bytes, row_bytes, &a0, cols, out + 8 * u);
        return;
    }
    for (ptrdiff_t u = u0; u < u1; u++) out[u] = f.dot(w + u * row_bytes, &a0, cols);
}

/* units u0 .. u1 - 1 at a->n_pos positions: the unit's rows are read once for every position, in tiles of
   four positions where there is a form for it, the remaining positions one at a time */
static inline __attribute__((always_inline)) void pyllama_rows_mat(const pyllama_row_forms f, const pyllama_matrix* m,
                                                                   ptrdiff_t u0, ptrdiff_t u1,
                                                                   const pyllama_acts* acts, float* out) {
    /* a copy the kernels cannot reach: its strides are computed once, not again after every kernel call */
    const pyllama_acts own = *acts, *a = &own;
    const ptrdiff_t rows = m->rows, cols = m->cols, n_pos = a->n_pos, row_bytes = cols / f.block * f.block_bytes;
    const ptrdiff_t unit = pyllama_unit_rows(f, rows, n_pos);
    pyllama_qact a4[4], one;
    for (ptrdiff_t u = u0; u < u1; u++) {
        const uint8_t* w = (const uint8_t*)m->data + unit * u * row_bytes;
        float* o = out + unit * u;
        ptrdiff_t p = 0;
        if (unit == 8) {
            if (f.rows8x4)
                for (; p + 4 <= n_pos; p += 4) {
                    pyllama_four_acts(a4, a, p);
                    f.rows8x4(w, row_bytes, a4, cols, o + p * rows, rows);
                }
            for (; p < n_pos; p++) {
                one = pyllama_act_at(a, p);
                f.rows8(w, row_bytes, &one, cols, o + p * rows);
            }
        } else if (unit == 4) {
            for (; p + 4 <= n_pos; p += 4) {
                pyllama_four_acts(a4, a, p);
                f.rows4x4(w, row_bytes, a4, cols, o + p * rows, rows);
            }
            for (; p < n_pos; p++) {
                one = pyllama_act_at(a, p);
                for (int j = 0; j < 4; j++) o[p * rows + j] = f.dot(w + j * row_bytes, &one, cols);
            }
        } else {
            if (f.tile4)
                for (; p + 4 <= n_pos; p += 4) {
                    pyllama_four_acts(a4, a, p);
                    f.tile4(w, a4, cols, o + p * rows, rows);
                }
            for (; p < n_pos; p++) {
                one = pyllama_act_at(a, p);
                o[p * rows] = f.dot(w, &one, cols);
            }
        }
    }
}

/* pyllama_units_<name>, pyllama_vec_<name> and pyllama_mat_<name> of a type whose forms are the
   designated initialisers of pyllama_row_forms that follow the name */
#define PYLLAMA_ROW_PRODUCTS(name, ...)                                                                      \
    static ptrdiff_t pyllama_units_##name(const pyllama_matrix* m, ptrdiff_t n_pos) {                       \
        const pyllama_row_forms f = {__VA_ARGS__};                                                          \
        return m->rows / pyllama_unit_rows(f, m->rows, n_pos);                                              \
    }                                                                                                       \
    static void pyllama_vec_##name(const pyllama_matrix* m, ptrdiff_t u0, ptrdiff_t u1, const pyllama_acts* a, \
                                   float* out) {                                                            \
        const pyllama_row_forms f = {__VA_ARGS__};                                                          \
        pyllama_rows_vec(f, m, u0, u1, a, out);                                                             \
    }                                                                                                       \
    static void pyllama_mat_##name(const pyllama_matrix* m, ptrdiff_t u0, ptrdiff_t u1, const pyllama_acts* a, \
                                   float* out) {                                                            \
        const pyllama_row_forms f = {__VA_ARGS__};                                                          \
        pyllama_rows_mat(f, m, u0, u1, a, out);                                                             \
    }

/* a table row's kernels, by the name its kernel file gave them (PYLLAMA_ROW_PRODUCTS, or written out) */
#define PYLLAMA_PRODUCTS(name) .units = pyllama_units_##name, .vec = pyllama_vec_##name, .mat = pyllama_mat_##name

#endif /* PYLLAMA_QROWS_H */
