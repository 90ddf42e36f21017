/* The scores of a block's queries computed across rows instead of along them, in either arithmetic:
 * llama.cpp's, pyllama_ggml_dot_f32(key t, query) * scale (ggml_vec_dot_f32's 32 lanes, their
 * reduction, then the head size's remainder in a fused chain), and pyllama's own (run.c's),
 * pyllama_dot_f32(query, key t) / scale (16 lanes, 16 -> 4 -> 1) for head sizes that are multiples of
 * 16. A tile of 32 key rows is transposed once for all the queries, kt[(g * hd + i) * W + k] = element
 * i of row g * W + k (W = the vector width), so that one vector holds one lane of W rows: lane l of W
 * scores is a chain of FMAs over kt[l], kt[l + 32 (or 16)], ...; the lanes' reduction is elementwise
 * across the rows; and llama.cpp's remainder chain continues on the W rows side by side. Every score
 * gets exactly the operations of its dot product, so the same bits, while a head of 64 spends 64
 * FMAs and 15 or 31 additions per W scores, where one row at a time spent 4 to 8 FMAs and a
 * reduction across registers per score. */
#ifndef PYLLAMA_SCORES_TILE_H
#define PYLLAMA_SCORES_TILE_H
#include <stddef.h>
#include <string.h>
#include "ggml_attend.h"
#include "ggml_vectors.h"

/* key rows per tile: kt is [32, head_dim] floats, the size of the lanes scratch */
#define PYLLAMA_KEY_TILE 32

#ifdef PYLLAMA_GV
#define PYLLAMA_W PYLLAMA_GV_WIDTH

/* kt of the tile's first count rows (keys + t * stride), zeros for the rest of its 32 */
static inline void pyllama_transpose_keys(float* kt, const float* keys, ptrdiff_t stride, int count, int hd) {
    for (int r0 = 0; r0 < PYLLAMA_KEY_TILE; r0 += 8) {
        float* dst = kt + (ptrdiff_t)(r0 / PYLLAMA_W) * hd * PYLLAMA_W + r0 % PYLLAMA_W;
        int i = 0;
        if (r0 + 8 <= count) {
            const float* r[8];
            for (int k = 0; k < 8; k++)
                r[k] = keys + (r0 + k) * stride;
            for (; i + 8 <= hd; i += 8) {
                __m256 x[8];
                pyllama_transpose8(r, i, x);
                for (int e = 0; e < 8; e++)
                    _mm256_storeu_ps(dst + (ptrdiff_t)(i + e) * PYLLAMA_W, x[e]);
            }
        }
        for (; i < hd; i++)
            for (int k = 0; k < 8; k++)
                dst[(ptrdiff_t)i * PYLLAMA_W + k] = r0 + k < count ? keys[(r0 + k) * stride + i] : 0.0f;
    }
}

/* lane l of W rows: a fused chain over elements l, l + 32, ... below np, from zero */
static inline __attribute__((always_inline)) PYLLAMA_GV pyllama_key_lane(const float* ktg, const float* q, int np,
                                                                          int l) {
    PYLLAMA_GV a = PYLLAMA_GV_ZERO();
    for (int i = l; i < np; i += 32)
        a = PYLLAMA_GV_FMA(PYLLAMA_GV_LOAD(ktg + (ptrdiff_t)i * PYLLAMA_W), PYLLAMA_GV_SET1(q[i]), a);
    return a;
}

/* lane u of W rows in pyllama's order: a fused chain over elements u, u + 16, ... below n_main, from zero */
static inline __attribute__((always_inline)) PYLLAMA_GV pyllama_key_lane16(const float* ktg, const float* q,
                                                                            int n_main, int u) {
    PYLLAMA_GV a = PYLLAMA_GV_ZERO();
    for (int i = u; i < n_main; i += 16)
        a = PYLLAMA_GV_FMA(PYLLAMA_GV_SET1(q[i]), PYLLAMA_GV_LOAD(ktg + (ptrdiff_t)i * PYLLAMA_W), a);
    return a;
}

/* pyllama_ggml_reduce32's y_e = (l_e + l_(16+e)) + (l_(8+e) + l_(24+e)) */
#define PYLLAMA_KEY_Y(e)                                                                              \
    PYLLAMA_GV_ADD(PYLLAMA_GV_ADD(pyllama_key_lane(ktg, q, np, e), pyllama_key_lane(ktg, q, np, 16 + e)), \
                   PYLLAMA_GV_ADD(pyllama_key_lane(ktg, q, np, 8 + e), pyllama_key_lane(ktg, q, np, 24 + e)))

/* the scores of W rows (group ktg of the tile) with q, times scale; np = hd & ~31, a constant in each
   copy that pyllama_scores_from_tile makes, so the lanes' chains are unrolled */
static inline __attribute__((always_inline)) PYLLAMA_GV pyllama_scores_w(const float* ktg, const float* q, int hd,
                                                                          float scale, const int np) {
    const PYLLAMA_GV y0 = PYLLAMA_KEY_Y(0), y1 = PYLLAMA_KEY_Y(1), y2 = PYLLAMA_KEY_Y(2), y3 = PYLLAMA_KEY_Y(3);
    const PYLLAMA_GV y4 = PYLLAMA_KEY_Y(4), y5 = PYLLAMA_KEY_Y(5), y6 = PYLLAMA_KEY_Y(6), y7 = PYLLAMA_KEY_Y(7);
    const PYLLAMA_GV t0 = PYLLAMA_GV_ADD(y0, y4), t1 = PYLLAMA_GV_ADD(y1, y5);
    const PYLLAMA_GV t2 = PYLLAMA_GV_ADD(y2, y6), t3 = PYLLAMA_GV_ADD(y3, y7);
    PYLLAMA_GV c = PYLLAMA_GV_ADD(PYLLAMA_GV_ADD(t0, t1), PYLLAMA_GV_ADD(t2, t3));
    for (int i = np; i < hd; i++)
        c = PYLLAMA_GV_FMA(PYLLAMA_GV_LOAD(ktg + (ptrdiff_t)i * PYLLAMA_W), PYLLAMA_GV_SET1(q[i]), c);
    return PYLLAMA_GV_MUL(c, PYLLAMA_GV_SET1(scale));
}
#undef PYLLAMA_KEY_Y

/* pyllama's order (f32dot.h's pyllama_dot_f32 of the query and W rows), divided by scale, for a head size
   that is a multiple of 16: lane u a chain over elements u, u + 16, ..., then (l_u + l_(u+4)) +
   (l_(u+8) + l_(u+12)) and (l_0 + l_2) + (l_1 + l_3). (That dot leaves the products past the last
   multiple of 16 to the compiler, which multiplies some of them as a vector and fuses others into the
   additions: head.pyx scores other head sizes one row at a time, with the dot itself.) */
static inline __attribute__((always_inline)) PYLLAMA_GV pyllama_runc_scores_w(const float* ktg, const float* q, int hd,
                                                                               float scale, const int n_main) {
#define PYLLAMA_KEY_L4(u)                                                                             \
    PYLLAMA_GV_ADD(PYLLAMA_GV_ADD(pyllama_key_lane16(ktg, q, n_main, u), pyllama_key_lane16(ktg, q, n_main, u + 4)), \
                   PYLLAMA_GV_ADD(pyllama_key_lane16(ktg, q, n_main, u + 8), pyllama_key_lane16(ktg, q, n_main, u + 12)))
    const PYLLAMA_GV l0 = PYLLAMA_KEY_L4(0), l1 = PYLLAMA_KEY_L4(1), l2 = PYLLAMA_KEY_L4(2), l3 = PYLLAMA_KEY_L4(3);
#undef PYLLAMA_KEY_L4
    (void)hd;
    return PYLLAMA_GV_DIV(PYLLAMA_GV_ADD(PYLLAMA_GV_ADD(l0, l2), PYLLAMA_GV_ADD(l1, l3)), PYLLAMA_GV_SET1(scale));
}

/* out[t] for the tile's first count rows (count <= 32) */
static inline void pyllama_scores_from_tile(float* out, const float* q, const float* kt, long count, int hd,
                                            float scale, int ggml) {
    const int np = ggml ? hd & ~31 : hd - hd % 16;
    for (long g = 0; g * PYLLAMA_W < count; g++) {
        const float* ktg = kt + g * hd * PYLLAMA_W;
        PYLLAMA_GV s;
        /* the lanes' chains unrolled for the common head sizes: 48 (np 32 or 48), 64, 128 */
        switch (ggml ? np : -np) {
            case 32: s = pyllama_scores_w(ktg, q, hd, scale, 32); break;
            case 64: s = pyllama_scores_w(ktg, q, hd, scale, 64); break;
            case 128: s = pyllama_scores_w(ktg, q, hd, scale, 128); break;
            case -48: s = pyllama_runc_scores_w(ktg, q, hd, scale, 48); break;
            case -64: s = pyllama_runc_scores_w(ktg, q, hd, scale, 64); break;
            case -128: s = pyllama_runc_scores_w(ktg, q, hd, scale, 128); break;
            default:
                s = ggml ? pyllama_scores_w(ktg, q, hd, scale, np) : pyllama_runc_scores_w(ktg, q, hd, scale, np);
                break;
        }
        const long left = count - g * PYLLAMA_W;
        if (left >= PYLLAMA_W) {
            PYLLAMA_GV_STORE(out + g * PYLLAMA_W, s);
        } else {
            float part[PYLLAMA_W];
            PYLLAMA_GV_STORE(part, s);
            memcpy(out + g * PYLLAMA_W, part, (size_t)left * sizeof(float));
        }
    }
}
#undef PYLLAMA_W
#endif

/* scores[j * score_stride + t] for queries j < m and rows t < n + j * grow (grow 1: a block's consecutive
   queries; grow 0: the query heads of one position over the same rows): pyllama_ggml_dot_f32(keys + t * stride,
   q + j * q_stride, hd) * scale when ggml, else pyllama_dot_f32(q + j * q_stride, keys + t * stride, hd) /
   scale (hd a multiple of 16); kt: [32, hd] scratch. The portable build has no vector type: it scores
   llama.cpp's order one row at a time here, and pyllama's in head.pyx. */
static inline void pyllama_scores_block(float* scores, ptrdiff_t score_stride, const float* q, ptrdiff_t q_stride,
                                        const float* keys, ptrdiff_t stride, long n, long m, int hd, float scale,
                                        float* kt, int ggml, long grow) {
    const long total = n + (m - 1) * grow;
    for (long t0 = 0; t0 < total; t0 += PYLLAMA_KEY_TILE) {
        const long t1 = total - t0 < PYLLAMA_KEY_TILE ? total : t0 + PYLLAMA_KEY_TILE;
        /* the first query whose rows reach the tile */
        const long j0 = grow && t0 - n + 1 > 0 ? t0 - n + 1 : 0;
#ifdef PYLLAMA_GV
        pyllama_transpose_keys(kt, keys + t0 * stride, stride, (int)(t1 - t0), hd);
#else
        (void)kt;
        (void)ggml;
#endif
        for (long j = j0; j < m; j++) {
            const long end = t1 < n + j * grow ? t1 : n + j * grow;
#ifdef PYLLAMA_GV
            pyllama_scores_from_tile(scores + j * score_stride + t0, q + j * q_stride, kt, end - t0, hd, scale, ggml);
#else
            pyllama_ggml_scores(scores + j * score_stride + t0, q + j * q_stride, NULL, keys + t0 * stride, stride,
                                end - t0, hd, scale);
#endif
        }
    }
}
#endif
