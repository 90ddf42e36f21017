/* llama2.c's version-2 checkpoints (runq.c): int8 weights with one float32 scale per group_size values
 * of a row (the group size is the file's), the products and dequantiser of qtypes.h's Q8_GROUPS row.
 *
 * The activation is quantised the way runq.c does it (scale = max|x| / 127, round half away from zero)
 * and each group is an exact integer dot scaled by both scales, the groups added in order. A unit is a
 * row, computed for every position of a block.
 */
#ifndef PYLLAMA_Q8_GROUPS_H
#define PYLLAMA_Q8_GROUPS_H

#include <math.h>

#include "qtype.h"

/* x[n] -> int8 q[n] and one scale per group of gs values */
static inline void pyllama_quantize_groups(int8_t* q, float* scales, const float* x, ptrdiff_t n, int gs) {
    for (ptrdiff_t g = 0; g < n / gs; g++) {
        float wmax = 0.0f;
        for (int i = 0; i < gs; i++)
            if (fabsf(x[g * gs + i]) > wmax) wmax = fabsf(x[g * gs + i]);
        /* run.c's wmax / 127.0f: the quotient in double rounded to float is the float quotient */
        const float scale = (float)((double)wmax / 127.0);
        scales[g] = scale;
        /* run.c divides by the scale (0/0 when a group is all zero gives NaN -> int8 0 there too) */
        for (int i = 0; i < gs; i++) q[g * gs + i] = scale != 0.0f ? (int8_t)roundf(x[g * gs + i] / scale) : 0;
    }
}

static void pyllama_act_q8_groups(const pyllama_acts* a, ptrdiff_t p) {
    pyllama_quantize_groups(a->q + p * a->cols, a->d + p * a->d_stride, a->x + p * a->cols, a->cols, a->group_size);
}

static inline float pyllama_dot_q8_groups(const int8_t* wq, const float* ws, const int8_t* xq, const float* xs,
                                          ptrdiff_t n, int gs) {
    float val = 0.0f;
    for (ptrdiff_t g = 0; g < n / gs; g++) {
        const ptrdiff_t j = g * gs;
        int ival = 0;
        for (int k = 0; k < gs; k++) ival = ival + (int)xq[j + k] * (int)wq[j + k];
        val = val + ((float)ival * ws[g]) * xs[g];
    }
    return val;
}

static ptrdiff_t pyllama_units_q8_groups(const pyllama_matrix* m, ptrdiff_t n_pos) {
    (void)n_pos;
    return m->rows;
}

/* rows u0 .. u1 - 1 at every position (one, for the single-vector product) */
static void pyllama_mat_q8_groups(const pyllama_matrix* m, ptrdiff_t u0, ptrdiff_t u1, const pyllama_acts* a,
                                  float* out) {
    const ptrdiff_t rows = m->rows, cols = m->cols, n_groups = cols / m->group_size;
    const int8_t* w = (const int8_t*)m->data;
    for (ptrdiff_t i = u0; i < u1; i++)
        for (ptrdiff_t p = 0; p < a->n_pos; p++)
            out[p * rows + i] = pyllama_dot_q8_groups(w + i * cols, m->scales + i * n_groups, a->q + p * cols,
                                                      a->d + p * a->d_stride, cols, m->group_size);
}
static void pyllama_vec_q8_groups(const pyllama_matrix* m, ptrdiff_t u0, ptrdiff_t u1, const pyllama_acts* a,
                                  float* out) {
    pyllama_mat_q8_groups(m, u0, u1, a, out);
}

static void pyllama_dequantize_q8_groups(const pyllama_matrix* m, ptrdiff_t r, float* out) {
    const int8_t* q = (const int8_t*)m->data + r * m->cols;
    const float* s = m->scales + r * (m->cols / m->group_size);
    for (ptrdiff_t j = 0; j < m->cols; j++) out[j] = q[j] * s[j / m->group_size];
}

#endif /* PYLLAMA_Q8_GROUPS_H */
