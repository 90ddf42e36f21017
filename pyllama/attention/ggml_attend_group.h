/* llama.cpp's weighted sum (ggml_attend.h) for a group of up to 4 queries over contiguous value rows:
 * query j of the group attends rows 0 .. n0 + j * grow - 1 with weights w + j * w_stride (grow 1:
 * consecutive positions of one head; grow 0: the query heads of one position sharing a KV head).
 * Output i of a query is still 32 lanes, lane l a fused chain over the rows t = l mod 32 in ascending
 * order, reduced by pyllama_ggml_reduce32: the same chains as pyllama_ggml_weighted_rows, so the same
 * bits. What changes is that one load of a value row serves every query of the group, and the group's
 * chains run side by side: in the block attention of the 15M shape, one query at a time, the lane
 * loops ran about 4 rows each and were half set-up and stores.
 *
 * The outputs go in chunks of PYLLAMA_GROUP_CHUNK columns; a chunk's lanes, [group][32][chunk], sit in
 * a stack buffer and are reduced before the next chunk, so they stay in L1. */
#ifndef PYLLAMA_GGML_ATTEND_GROUP_H
#define PYLLAMA_GGML_ATTEND_GROUP_H
#include <stddef.h>
#include "ggml_attend.h"
#include "ggml_vectors.h"

#define PYLLAMA_GROUP_QUERIES 4

/* columns per chunk: two vectors per query, so a group of 4 keeps 8 chains in flight */
#ifdef PYLLAMA_GV
#define PYLLAMA_GROUP_CHUNK (2 * PYLLAMA_GV_WIDTH)
#else
#define PYLLAMA_GROUP_CHUNK 16
#endif

#ifdef PYLLAMA_GV
/* lane l of g queries (g <= 4) for nv whole vectors of columns from d0, into lanes[(j * 32 + l) * cw ...] */
static inline __attribute__((always_inline)) void pyllama_group_lane_vectors(
    float* lanes, int cw, const float* w, ptrdiff_t w_stride, const float* base, ptrdiff_t stride, long n0,
    int l, int d0, const int g, const int nv, long grow) {
    PYLLAMA_GV a[PYLLAMA_GROUP_QUERIES][2];
    for (int j = 0; j < g; j++)
        for (int k = 0; k < nv; k++) a[j][k] = PYLLAMA_GV_ZERO();
    long t = l;
    for (; t < n0; t += 32) {
        const float* v = base + t * stride + d0;
        PYLLAMA_GV x[2];
        for (int k = 0; k < nv; k++) {
            x[k] = PYLLAMA_GV_LOAD(v + k * PYLLAMA_GV_WIDTH);
            /* keep the row in a register: gcc otherwise folds the load into each query's FMA */
            __asm__("" : "+v"(x[k]));
        }
        for (int j = 0; j < g; j++) {
            const PYLLAMA_GV b = PYLLAMA_GV_SET1(w[j * w_stride + t]);
            for (int k = 0; k < nv; k++) a[j][k] = PYLLAMA_GV_FMA(x[k], b, a[j][k]);
        }
    }
    /* row t, the lane's next, belongs to the queries j with t < n0 + j * grow (at most one row: g <= 32) */
    for (int j = 1; j < g; j++) {
        if (t < n0 + j * grow) {
            const float* v = base + t * stride + d0;
            const PYLLAMA_GV b = PYLLAMA_GV_SET1(w[j * w_stride + t]);
            for (int k = 0; k < nv; k++)
                a[j][k] = PYLLAMA_GV_FMA(PYLLAMA_GV_LOAD(v + k * PYLLAMA_GV_WIDTH), b, a[j][k]);
        }
    }
    for (int j = 0; j < g; j++)
        for (int k = 0; k < nv; k++)
            PYLLAMA_GV_STORE(lanes + ((ptrdiff_t)j * 32 + l) * cw + k * PYLLAMA_GV_WIDTH, a[j][k]);
}
#endif

/* lane l of g queries for columns d0 + c0 .. d0 + cw - 1, one fmaf at a time (a chunk's remainder past
   its whole vectors, and the portable build) */
static inline void pyllama_group_lane_scalar(float* lanes, int cw, int c0, const float* w, ptrdiff_t w_stride,
                                             const float* base, ptrdiff_t stride, long n0, int l, int d0, int g,
                                             long grow) {
    for (int j = 0; j < g; j++) {
        float* o = lanes + ((ptrdiff_t)j * 32 + l) * cw;
        for (int c = c0; c < cw; c++)
            o[c] = 0.0f;
        for (long t = l; t < n0 + j * grow; t += 32) {
            const float* v = base + t * stride + d0;
            const float a = w[j * w_stride + t];
            for (int c = c0; c < cw; c++)
                o[c] = fmaf(v[c], a, o[c]);
        }
    }
}

static inline void pyllama_group_lane(float* lanes, int cw, const float* w, ptrdiff_t w_stride, const float* base,
                                      ptrdiff_t stride, long n0, int l, int d0, int g, long grow) {
    int c0 = 0;
#ifdef PYLLAMA_GV
    const int nv = cw / PYLLAMA_GV_WIDTH;
    /* every (g, nv) its own copy, so the chains are registers */
#define PYLLAMA_GROUP_CASE(G, NV) \
    case (G) * 4 + (NV): pyllama_group_lane_vectors(lanes, cw, w, w_stride, base, stride, n0, l, d0, G, NV, grow); \
        break;
    switch (g * 4 + nv) {
        PYLLAMA_GROUP_CASE(1, 1) PYLLAMA_GROUP_CASE(1, 2)
        PYLLAMA_GROUP_CASE(2, 1) PYLLAMA_GROUP_CASE(2, 2)
        PYLLAMA_GROUP_CASE(3, 1) PYLLAMA_GROUP_CASE(3, 2)
        PYLLAMA_GROUP_CASE(4, 1) PYLLAMA_GROUP_CASE(4, 2)
        default: break;
    }
#undef PYLLAMA_GROUP_CASE
    c0 = nv * PYLLAMA_GV_WIDTH;
#endif
    if (c0 < cw)
        pyllama_group_lane_scalar(lanes, cw, c0, w, w_stride, base, stride, n0, l, d0, g, grow);
}

/* out[j * out_stride + i] for j < g (g <= PYLLAMA_GROUP_QUERIES), i < hd: query j's weighted sum of the
   value rows 0 .. n0 + j * grow - 1 (base + t * stride) with weights w + j * w_stride */
static inline void pyllama_ggml_weighted_group(float* out, ptrdiff_t out_stride, const float* w, ptrdiff_t w_stride,
                                               const float* base, ptrdiff_t stride, long n0, int g, int hd,
                                               long grow) {
    float lanes[PYLLAMA_GROUP_QUERIES * 32 * PYLLAMA_GROUP_CHUNK];
    for (int d0 = 0; d0 < hd; d0 += PYLLAMA_GROUP_CHUNK) {
        const int cw = hd - d0 < PYLLAMA_GROUP_CHUNK ? hd - d0 : PYLLAMA_GROUP_CHUNK;
        for (int l = 0; l < 32; l++)
            pyllama_group_lane(lanes, cw, w, w_stride, base, stride, n0, l, d0, g, grow);
        for (int j = 0; j < g; j++)
            pyllama_ggml_reduce_lanes(out + j * out_stride + d0, lanes + (ptrdiff_t)j * 32 * cw, cw, cw);
    }
}
#endif
