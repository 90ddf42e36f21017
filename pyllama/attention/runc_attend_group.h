/* pyllama's own weighted sum (head.pyx's add_weighted, run.c's order) for a group of up to 4 queries
 * over contiguous value rows: query j of the group gets out_i = sum over its rows t < n0 + j * grow
 * (grow 1: consecutive positions of one head; grow 0: the query heads of one position sharing a KV
 * head), in ascending t, of w_j[t] * v_t[i], one chain per output from 0, each step out + a * v,
 * which gcc contracts to one fused multiply-add (so FMAs here too, and the portable build, which has
 * none, keeps head.pyx's loop). add_weighted runs one row at a time through memory: the output is
 * loaded, updated and stored for every row (a 512-token block of the 42M shape spent 14% of its time
 * on that store-to-load chain). Here a group's outputs stay in registers over all the rows, a chunk of
 * columns at a time, and one load of a value row serves the four queries: the same chains, so the
 * same bits. */
#ifndef PYLLAMA_RUNC_ATTEND_GROUP_H
#define PYLLAMA_RUNC_ATTEND_GROUP_H
#include <math.h>
#include <stddef.h>
#include "ggml_vectors.h"

#ifdef PYLLAMA_GV
/* the outputs d0 .. d0 + nv * W - 1 of g queries (constants g <= 4, nv <= 2) */
static inline __attribute__((always_inline)) void pyllama_runc_group_vectors(
    float* out, ptrdiff_t out_stride, const float* w, ptrdiff_t w_stride, const float* base, ptrdiff_t stride,
    long n0, int d0, const int g, const int nv, long grow) {
    PYLLAMA_GV a[4][2];
    for (int j = 0; j < g; j++)
        for (int k = 0; k < nv; k++) a[j][k] = PYLLAMA_GV_ZERO();
    long t = 0;
    for (; t < n0; t++) {
        const float* v = base + t * stride + d0;
        PYLLAMA_GV x[2];
        for (int k = 0; k < nv; k++) {
            x[k] = PYLLAMA_GV_LOAD(v + k * PYLLAMA_GV_WIDTH);
            __asm__("" : "+v"(x[k])); /* one load for the g queries, not one per FMA */
        }
        for (int j = 0; j < g; j++) {
            const PYLLAMA_GV b = PYLLAMA_GV_SET1(w[j * w_stride + t]);
            for (int k = 0; k < nv; k++) a[j][k] = PYLLAMA_GV_FMA(b, x[k], a[j][k]);
        }
    }
    /* rows n0 .. n0 + g - 2 belong to the later queries only: row t to the queries j > t - n0 */
    for (; grow && t < n0 + g - 1; t++) {
        const float* v = base + t * stride + d0;
        for (int j = (int)(t - n0) + 1; j < g; j++) {
            const PYLLAMA_GV b = PYLLAMA_GV_SET1(w[j * w_stride + t]);
            for (int k = 0; k < nv; k++)
                a[j][k] = PYLLAMA_GV_FMA(b, PYLLAMA_GV_LOAD(v + k * PYLLAMA_GV_WIDTH), a[j][k]);
        }
    }
    for (int j = 0; j < g; j++)
        for (int k = 0; k < nv; k++) PYLLAMA_GV_STORE(out + j * out_stride + d0 + k * PYLLAMA_GV_WIDTH, a[j][k]);
}
#endif

/* out[j * out_stride + i] for j < g (g <= 4), i < hd: query j's weighted sum of the value rows
   0 .. n0 + j * grow - 1 (base + t * stride) with weights w + j * w_stride */
static inline void pyllama_runc_weighted_group(float* out, ptrdiff_t out_stride, const float* w, ptrdiff_t w_stride,
                                               const float* base, ptrdiff_t stride, long n0, int g, int hd,
                                               long grow) {
    int d0 = 0;
#ifdef PYLLAMA_GV
    /* two vectors of columns per query: a group of 4 keeps 8 chains in registers */
    for (; d0 + PYLLAMA_GV_WIDTH <= hd; d0 += 2 * PYLLAMA_GV_WIDTH) {
        const int nv = d0 + 2 * PYLLAMA_GV_WIDTH <= hd ? 2 : 1;
#define PYLLAMA_RUNC_CASE(G, NV) \
    case (G) * 4 + (NV): pyllama_runc_group_vectors(out, out_stride, w, w_stride, base, stride, n0, d0, G, NV, \
                                                    grow); \
        break;
        switch (g * 4 + nv) {
            PYLLAMA_RUNC_CASE(1, 1) PYLLAMA_RUNC_CASE(1, 2)
            PYLLAMA_RUNC_CASE(2, 1) PYLLAMA_RUNC_CASE(2, 2)
            PYLLAMA_RUNC_CASE(3, 1) PYLLAMA_RUNC_CASE(3, 2)
            PYLLAMA_RUNC_CASE(4, 1) PYLLAMA_RUNC_CASE(4, 2)
            default: break;
        }
#undef PYLLAMA_RUNC_CASE
        if (nv == 1) {
            d0 += PYLLAMA_GV_WIDTH;
            break;
        }
    }
#endif
    /* the columns past the last whole vector, one chain at a time */
    for (int j = 0; j < g; j++) {
        float* o = out + j * out_stride;
        const float* wj = w + j * w_stride;
        for (int i = d0; i < hd; i++) {
            float acc = 0.0f;
            for (long t = 0; t < n0 + j * grow; t++)
                acc = fmaf(wj[t], base[t * stride + i], acc);
            o[i] = acc;
        }
    }
}
#endif
