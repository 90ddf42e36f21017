/* One row of logits reduced the way metrics.py's numpy reduces it, in loops the compiler vectorises.

   Every value is numpy's: the sums follow numpy's pairwise summation tree, and exp and log are
   numpy's own float64 loops (their addresses are taken from the ufuncs np.exp and np.log by
   _metrics.pyx), so the vector exp numpy has on AVX-512 gives its bits here too. A sum's terms
   are first written to a buffer (a leaf of the tree holds at most 128), then summed: the memory
   barrier between the two keeps every product rounded on its own, never fused into the sum. */
#ifndef PYLLAMA_ROW_METRICS_H
#define PYLLAMA_ROW_METRICS_H

#include <math.h>
#include <stddef.h>

typedef void (*pyllama_unary_loop)(char** args, const ptrdiff_t* n, const ptrdiff_t* steps, void* data);
typedef struct { pyllama_unary_loop loop; void* data; } pyllama_ufunc_loop;

/* y[i] = f(x[i]) for n contiguous doubles through a numpy loop (x == y allowed, as numpy does) */
static inline void pyllama_ufunc_apply(const pyllama_ufunc_loop* f, const double* x, double* y, ptrdiff_t n) {
    char* args[2] = {(char*)x, (char*)y};
    const ptrdiff_t steps[2] = {sizeof(double), sizeof(double)};
    f->loop(args, &n, steps, f->data);
}

#define PYLLAMA_LEAF 128  /* numpy's pairwise blocksize: a sum of at most this many terms is a leaf */

/* numpy's pairwise sum (DOUBLE_pairwise_sum, numpy/_core/src/umath/loops_utils.h.src) of n <= 128
   stored terms: below 8 in order, else 8 interleaved partial sums and the rest in order */
static inline double pyllama_leaf_sum(const double* t, ptrdiff_t n) {
    __asm__ volatile("" ::: "memory");  /* the terms are stored and rounded before they are summed */
    if (n < 8) {
        double res = 0.;
        for (ptrdiff_t i = 0; i < n; i++) res += t[i];
        return res;
    }
    double r[8];
    ptrdiff_t i;
    for (int k = 0; k < 8; k++) r[k] = t[k];
    for (i = 8; i < n - n % 8; i += 8)
        for (int k = 0; k < 8; k++) r[k] += t[i + k];
    double res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
    for (; i < n; i++) res += t[i];
    return res;
}

/* the tree above the leaves: the two halves, split at a multiple of 8, summed apart */
#define PYLLAMA_PAIRWISE(LEAF, RECURSE)          \
    if (n <= PYLLAMA_LEAF) return LEAF;          \
    ptrdiff_t n2 = n / 2;                        \
    n2 -= n2 % 8;                                \
    return RECURSE(0, n2) + RECURSE(n2, n - n2);

/* exp(float64(x_i) - shift) of n <= 128 terms into t (numpy's exp, in place), then their sum */
static inline double pyllama_exp_leaf(const pyllama_ufunc_loop* exp_f, const float* x, double shift, double* t,
                                      ptrdiff_t n) {
    for (ptrdiff_t i = 0; i < n; i++) t[i] = (double)x[i] - shift;
    pyllama_ufunc_apply(exp_f, t, t, n);
    return pyllama_leaf_sum(t, n);
}

/* np.sum(np.exp(x - shift)) of a row, each exp kept in e[i] when e is not NULL */
static double pyllama_exp_sum(const pyllama_ufunc_loop* exp_f, const float* x, double shift, double* e,
                              ptrdiff_t n) {
    double buf[PYLLAMA_LEAF];
#define PYLLAMA_EXP_RECURSE(o, len) pyllama_exp_sum(exp_f, x + (o), shift, e == NULL ? NULL : e + (o), (len))
    PYLLAMA_PAIRWISE(pyllama_exp_leaf(exp_f, x, shift, e != NULL ? e : buf, n), PYLLAMA_EXP_RECURSE)
#undef PYLLAMA_EXP_RECURSE
}

/* a row's log-softmax constants: log P_j = (float64(x_j) - shift) - log_total */
typedef struct { double shift, log_total, total; } pyllama_softmax_row;

/* KL's terms (log P_a - log P_b) * P_a with P_a = e_a / total_a (metrics.kl_divergence), summed */
static inline double pyllama_kl_leaf(const float* xa, const float* xb, const double* ea,
                                     const pyllama_softmax_row* a, const pyllama_softmax_row* b, ptrdiff_t n) {
    double t[PYLLAMA_LEAF];
    for (ptrdiff_t i = 0; i < n; i++) {
        const double lpa = ((double)xa[i] - a->shift) - a->log_total;
        const double lpb = ((double)xb[i] - b->shift) - b->log_total;
        t[i] = (lpa - lpb) * (ea[i] / a->total);
    }
    return pyllama_leaf_sum(t, n);
}

static double pyllama_kl_sum(const float* xa, const float* xb, const double* ea, const pyllama_softmax_row* a,
                             const pyllama_softmax_row* b, ptrdiff_t n) {
#define PYLLAMA_KL_RECURSE(o, len) pyllama_kl_sum(xa + (o), xb + (o), ea + (o), a, b, (len))
    PYLLAMA_PAIRWISE(pyllama_kl_leaf(xa, xb, ea, a, b, n), PYLLAMA_KL_RECURSE)
#undef PYLLAMA_KL_RECURSE
}

/* Sixteen float lanes and their int32 companions, as GCC vector extensions: one AVX-512 vector,
   two AVX2 ones, or four SSE ones, as the build's target has them. */
typedef float pyllama_vf __attribute__((vector_size(64)));
typedef int pyllama_vi __attribute__((vector_size(64)));
#define PYLLAMA_LANES 16

/* The running first-largest of each lane: lane k holds the largest of v[k], v[k + 16], ... and the
   first index where it was met (a strict >, so NaN is never chosen and ties keep the first). */
typedef struct { pyllama_vf best; pyllama_vi where; } pyllama_lane_max;

static inline void pyllama_lane_max_init(pyllama_lane_max* m) {
    for (int k = 0; k < PYLLAMA_LANES; k++) m->best[k] = -INFINITY, m->where[k] = -1;
}

static inline void pyllama_lane_max_step(pyllama_lane_max* m, pyllama_vf v, pyllama_vi j) {
    const pyllama_vi gt = v > m->best;
    m->best = (pyllama_vf)(((pyllama_vi)v & gt) | ((pyllama_vi)m->best & ~gt));
    m->where = (j & gt) | (m->where & ~gt);
}

/* the first index of the overall largest: the smallest index among the lanes that hold it; -1 when
   no value was larger than -Inf */
static inline ptrdiff_t pyllama_lane_max_first(const pyllama_lane_max* m) {
    float top = -INFINITY;
    ptrdiff_t at = -1;
    for (int k = 0; k < PYLLAMA_LANES; k++) {
        const float b = m->best[k];
        const ptrdiff_t w = m->where[k];
        if (w >= 0 && (b > top || (b == top && w < at))) top = b, at = w;
    }
    return at;
}

/* {j, j + 1, ..., j + 15}: built once per row, then stepped by adding 16 */
static inline pyllama_vi pyllama_lane_index(ptrdiff_t j) {
    pyllama_vi v;
    for (int k = 0; k < PYLLAMA_LANES; k++) v[k] = (int)j + k;
    return v;
}

static inline pyllama_vf pyllama_load16(const float* p) {
    pyllama_vf v;
    __builtin_memcpy(&v, p, sizeof v);
    return v;
}

/* metrics.top1 and finite_rows of one row (n < 2^31): the first index of its largest logit;
   *finite = 0 when it holds NaN or Inf (x - x is 0 for a finite x, NaN otherwise) */
static inline ptrdiff_t pyllama_row_top1(const float* x, ptrdiff_t n, int* finite) {
    pyllama_lane_max m;
    pyllama_lane_max_init(&m);
    pyllama_vi idx = pyllama_lane_index(0), ok = idx * 0 == 0;
    ptrdiff_t j = 0;
    for (; j + PYLLAMA_LANES <= n; j += PYLLAMA_LANES, idx += PYLLAMA_LANES) {
        const pyllama_vf v = pyllama_load16(x + j);
        ok &= (v - v) == 0.0f;
        pyllama_lane_max_step(&m, v, idx);
    }
    int all_ok = 1;
    for (int k = 0; k < PYLLAMA_LANES; k++) all_ok &= ok[k] != 0;
    pyllama_vf tail;
    for (int k = 0; k < PYLLAMA_LANES; k++) tail[k] = j + k < n ? x[j + k] : -INFINITY;
    for (ptrdiff_t i = j; i < n; i++) all_ok &= x[i] - x[i] == 0.0f;
    pyllama_lane_max_step(&m, tail, idx);
    const ptrdiff_t at = pyllama_lane_max_first(&m);
    *finite = all_ok && at >= 0;
    return at;
}

/* metrics.max_abs_diff of two finite rows: the first largest float32 |a - b|, taken again in float64 */
static inline double pyllama_max_abs(const float* xa, const float* xb, ptrdiff_t n) {
    pyllama_vi idx = pyllama_lane_index(0);
    const pyllama_vi no_sign = idx * 0 + 0x7fffffff;
    pyllama_lane_max m;
    pyllama_lane_max_init(&m);
    ptrdiff_t j = 0;
    for (; j + PYLLAMA_LANES <= n; j += PYLLAMA_LANES, idx += PYLLAMA_LANES) {
        const pyllama_vf d = pyllama_load16(xa + j) - pyllama_load16(xb + j);
        pyllama_lane_max_step(&m, (pyllama_vf)((pyllama_vi)d & no_sign), idx);
    }
    pyllama_vf tail;
    for (int k = 0; k < PYLLAMA_LANES; k++) tail[k] = j + k < n ? fabsf(xa[j + k] - xb[j + k]) : -INFINITY;
    pyllama_lane_max_step(&m, tail, idx);
    const ptrdiff_t at = pyllama_lane_max_first(&m);
    return at < 0 ? 0.0 : fabs((double)xa[at] - (double)xb[at]);
}

/* retrieval_scores.teacher_rank's count: how many x[j] exceed lt, plus how many x[j < t] equal it */
static inline ptrdiff_t pyllama_count_above(const float* x, ptrdiff_t n, float lt, ptrdiff_t t) {
    pyllama_vi above = pyllama_lane_index(0) * 0;
    ptrdiff_t j = 0, total = 0;
    for (; j + PYLLAMA_LANES <= n; j += PYLLAMA_LANES) above -= pyllama_load16(x + j) > lt;  /* a true lane is -1 */
    for (; j < n; j++) total += x[j] > lt;
    for (int k = 0; k < PYLLAMA_LANES; k++) total += above[k];
    pyllama_vi ties = above * 0;
    for (j = 0; j + PYLLAMA_LANES <= t; j += PYLLAMA_LANES) ties -= pyllama_load16(x + j) == lt;
    for (; j < t; j++) total += x[j] == lt;
    for (int k = 0; k < PYLLAMA_LANES; k++) total += ties[k];
    return total;
}

#endif
