/* The float32 dot product of pyllama (f32.h, matvec.pyx): one row, four rows at once, and the block tile.

   The order, which every form below keeps exactly, so that a row's value never depends on the
   form that computed it (the tests check this bit for bit):
     - 16 lanes: lane u accumulates a[j] * b[j] for j = u (mod 16) over the whole groups of 16, in
       increasing j, each step one fused multiply-add where the CPU has them;
     - the lanes reduced 16 -> 4 as l[u] = (l[u] + l[u+4]) + (l[u+8] + l[u+12]), then
       total = (l[0] + l[2]) + (l[1] + l[3]);
     - the last n mod 16 products added to total in order.
   16 lanes are two AVX2 vectors or one AVX-512 vector. A wider order (64 lanes, before) hides the
   FMA latency inside one row, but a block tile must then hold 8 vectors per element and make a
   pass over its rows per group of 8 lanes; with 16 lanes the latency is hidden across rows (four
   rows in flight in matvec, a 4 x 3 tile in matmul) and the tile makes two passes. */
#ifndef PYLLAMA_F32DOT_H
#define PYLLAMA_F32DOT_H

#include <stddef.h>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define PYLLAMA_F32_AVX2 1
#else
#define PYLLAMA_F32_AVX2 0
#endif
#if defined(__AVX512F__) && defined(__FMA__)
#define PYLLAMA_F32_AVX512 1
#else
#define PYLLAMA_F32_AVX512 0
#endif
/* the forms of the F32 products (f32.h), which matvec.pyx, including this file for pyllama_dot_f32 alone,
   does not call */
#if defined(__GNUC__)
#define PYLLAMA_F32_MAYBE_UNUSED __attribute__((unused))
#else
#define PYLLAMA_F32_MAYBE_UNUSED
#endif
/* four rows at once (f32.h): 8 (AVX2) or 4 (AVX-512) FMA chains in flight, and four weight
   streams when the rows are far apart (f32.h takes them a quarter of the matrix apart) */
#define PYLLAMA_HAVE_DOT4 (PYLLAMA_F32_AVX2 || PYLLAMA_F32_AVX512)

/* 16 -> 4 -> 1 over the lanes l (overwritten), then the tail of a . b in order */
static inline float pyllama_finish_f32(float* l, const float* a, const float* b, Py_ssize_t n) {
    for (int u = 0; u < 4; u++) l[u] = (l[u] + l[u + 4]) + (l[u + 8] + l[u + 12]);
    float total = (l[0] + l[2]) + (l[1] + l[3]);
    for (Py_ssize_t j = n - n % 16; j < n; j++) total = total + a[j] * b[j];
    return total;
}

#if PYLLAMA_F32_AVX2
/* pyllama_finish_f32 on s = the four partial lanes l[u] (u < 4) after 16 -> 4 */
static inline float pyllama_finish4_f32(__m128 s, const float* a, const float* b, Py_ssize_t n) {
    const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s)); /* t0 = l0 + l2, t1 = l1 + l3 */
    float total = _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)));
    for (Py_ssize_t j = n - n % 16; j < n; j++) total = total + a[j] * b[j];
    return total;
}

/* 16 -> 4 on the lanes as two vectors (lo = lanes 0-7, hi = lanes 8-15): l[u] + l[u+4] is the sum
   of lo's halves, l[u+8] + l[u+12] the sum of hi's */
static inline __m128 pyllama_halves_16to4(__m256 lo, __m256 hi) {
    return _mm_add_ps(_mm_add_ps(_mm256_castps256_ps128(lo), _mm256_extractf128_ps(lo, 1)),
                      _mm_add_ps(_mm256_castps256_ps128(hi), _mm256_extractf128_ps(hi, 1)));
}

static inline float pyllama_finish_f32_avx2(__m256 lo, __m256 hi, const float* a, const float* b, Py_ssize_t n) {
    return pyllama_finish4_f32(pyllama_halves_16to4(lo, hi), a, b, n);
}
#endif
#if PYLLAMA_F32_AVX512
/* 16 -> 4 on the lanes as one vector: its quarters q0 .. q3 (lanes 0-3, ..., 12-15) as
   (q0 + q1) + (q2 + q3), the same additions as pyllama_halves_16to4 */
static inline __m128 pyllama_quarters_16to4(__m512 l) {
    return _mm_add_ps(_mm_add_ps(_mm512_extractf32x4_ps(l, 0), _mm512_extractf32x4_ps(l, 1)),
                      _mm_add_ps(_mm512_extractf32x4_ps(l, 2), _mm512_extractf32x4_ps(l, 3)));
}
#endif

static float pyllama_dot_f32(const float* a, const float* b, Py_ssize_t n) {
    const Py_ssize_t n_main = n - n % 16;
#if PYLLAMA_F32_AVX2
    __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
    for (Py_ssize_t j = 0; j < n_main; j += 16) {
        lo = _mm256_fmadd_ps(_mm256_loadu_ps(a + j), _mm256_loadu_ps(b + j), lo);
        hi = _mm256_fmadd_ps(_mm256_loadu_ps(a + j + 8), _mm256_loadu_ps(b + j + 8), hi);
    }
    return pyllama_finish_f32_avx2(lo, hi, a, b, n);
#else
    float l[16];
    for (int u = 0; u < 16; u++) l[u] = 0.0f;
    for (Py_ssize_t j = 0; j < n_main; j += 16)
        for (int u = 0; u < 16; u++) l[u] = l[u] + a[j + u] * b[j + u];
    return pyllama_finish_f32(l, a, b, n);
#endif
}

/* out[r * out_stride] = pyllama_dot_f32(w + r * stride, x, n) for r < 4 */
PYLLAMA_F32_MAYBE_UNUSED static void pyllama_dot4_f32(const float* w, Py_ssize_t stride, const float* x, Py_ssize_t n, float* out,
                             Py_ssize_t out_stride) {
    const Py_ssize_t n_main = n - n % 16;
#if PYLLAMA_F32_AVX512
    __m512 acc[4];
    for (int r = 0; r < 4; r++) acc[r] = _mm512_setzero_ps();
    for (Py_ssize_t j = 0; j < n_main; j += 16) {
        const __m512 xv = _mm512_loadu_ps(x + j);
        for (int r = 0; r < 4; r++) acc[r] = _mm512_fmadd_ps(_mm512_loadu_ps(w + r * stride + j), xv, acc[r]);
    }
    for (int r = 0; r < 4; r++)
        out[r * out_stride] = pyllama_finish4_f32(pyllama_quarters_16to4(acc[r]), w + r * stride, x, n);
#elif PYLLAMA_F32_AVX2
    __m256 lo[4], hi[4];
    for (int r = 0; r < 4; r++) lo[r] = hi[r] = _mm256_setzero_ps();
    for (Py_ssize_t j = 0; j < n_main; j += 16) {
        const __m256 x0 = _mm256_loadu_ps(x + j), x1 = _mm256_loadu_ps(x + j + 8);
        for (int r = 0; r < 4; r++) {
            lo[r] = _mm256_fmadd_ps(_mm256_loadu_ps(w + r * stride + j), x0, lo[r]);
            hi[r] = _mm256_fmadd_ps(_mm256_loadu_ps(w + r * stride + j + 8), x1, hi[r]);
        }
    }
    for (int r = 0; r < 4; r++) out[r * out_stride] = pyllama_finish_f32_avx2(lo[r], hi[r], w + r * stride, x, n);
#else
    (void)n_main;
    for (int r = 0; r < 4; r++) out[r * out_stride] = pyllama_dot_f32(w + r * stride, x, n);
#endif
}

/* rows per strip of the block product: one thread computes a strip, one tile holds its rows */
#define PYLLAMA_F32_STRIP 4

#if PYLLAMA_F32_AVX512
/* The block product on AVX-512: one zmm register holds an element's 16 lanes, so a tile of R <= 4
   rows times P <= 4 positions keeps 16 accumulators, the 4 x vectors and the weight vector in
   registers, in one pass over the columns (AVX2's 4 x 3 tile makes a pass per half of the lanes).
   4 x 4 was faster than 4 x 5 and 4 x 6 (24 accumulators in 31 of the 32 registers): 42M F32 pp512
   2,413-2,428 against 2,356-2,364 and 2,335-2,359 tok/s at 2 threads. Each lane is still one chain
   of FMAs in increasing j, chunk after chunk: exactly pyllama_dot_f32's lanes; the finish adds the quarters (q0 + q1) + (q2 + q3), which is AVX2's
   (lo's halves) + (hi's halves), then the same transposed 4 -> 1. Chunks and groups as below. */
#define PYLLAMA_F32_KC 768
#define PYLLAMA_F32_TILE_POS 4
#define PYLLAMA_F32_GROUP 64 /* positions whose lanes a strip keeps between chunks (16 tiles) */

static inline __attribute__((always_inline)) void pyllama_tile_f32(const float* w, const float* x, Py_ssize_t cols,
                                                                   Py_ssize_t j0, Py_ssize_t j1, __m512* lanes,
                                                                   const int R, const int P) {
    __m512 acc[4][PYLLAMA_F32_TILE_POS];
    for (int r = 0; r < R; r++)
        for (int p = 0; p < P; p++) acc[r][p] = j0 == 0 ? _mm512_setzero_ps() : lanes[r * P + p];
    for (Py_ssize_t j = j0; j < j1; j += 16) {
        __m512 xv[PYLLAMA_F32_TILE_POS];
        for (int p = 0; p < P; p++) {
            xv[p] = _mm512_loadu_ps(x + p * cols + j);
            __asm__("" : "+v"(xv[p]));
        }
        for (int r = 0; r < R; r++) {
            __m512 wv = _mm512_loadu_ps(w + r * cols + j);
            __asm__("" : "+v"(wv));
            for (int p = 0; p < P; p++) acc[r][p] = _mm512_fmadd_ps(wv, xv[p], acc[r][p]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int p = 0; p < P; p++) lanes[r * P + p] = acc[r][p];
}

/* element e's 16 -> 4 step */
static inline __m128 pyllama_lanes_16to4(const __m512* lanes, int e) { return pyllama_quarters_16to4(lanes[e]); }

/* [a.q0 + a.q1, a.q2 + a.q3, b.q0 + b.q1, b.q2 + b.q3] of two vectors' quarters */
static inline __m512 pyllama_pair_quarters(__m512 a, __m512 b) {
    return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x88), _mm512_shuffle_f32x4(a, b, 0xDD));
}

/* A whole tile (4 rows x 4 positions, no tail) finished at once: pyllama_tile_finish_f32's additions
   for its 16 elements side by side in shuffles, (q0 + q1) + (q2 + q3) then (l0 + l2) + (l1 + l3),
   instead of each element's quarters extracted one by one and a 4 x 4 transpose per position (about
   54 instructions for the tile against 170). lanes[r * 4 + p] holds element (r, p). */
static inline void pyllama_tile_finish_4x4_avx512(const __m512* lanes, float* out, Py_ssize_t rows) {
    __m512 t[4];
    for (int p = 0; p < 4; p++) {
        /* quarter r of t[p] = element (r, p)'s l[0 .. 3] = (q0 + q1) + (q2 + q3) */
        const __m512 s01 = pyllama_pair_quarters(lanes[p], lanes[4 + p]);
        const __m512 s23 = pyllama_pair_quarters(lanes[8 + p], lanes[12 + p]);
        t[p] = pyllama_pair_quarters(s01, s23);
    }
    /* per quarter r: [l0 + l2, l1 + l3] of positions 0, 1 (g01) and 2, 3 (g23) */
    const __m512 g01 = _mm512_add_ps(_mm512_shuffle_ps(t[0], t[1], 0x44), _mm512_shuffle_ps(t[0], t[1], 0xEE));
    const __m512 g23 = _mm512_add_ps(_mm512_shuffle_ps(t[2], t[3], 0x44), _mm512_shuffle_ps(t[2], t[3], 0xEE));
    /* lane p of quarter r = element (r, p)'s (l0 + l2) + (l1 + l3) */
    const __m512 z = _mm512_add_ps(_mm512_shuffle_ps(g01, g23, 0x88), _mm512_shuffle_ps(g01, g23, 0xDD));
    const __m512i by_position = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    const __m512 o = _mm512_permutexvar_ps(by_position, z);
    _mm_storeu_ps(out, _mm512_extractf32x4_ps(o, 0));
    _mm_storeu_ps(out + rows, _mm512_extractf32x4_ps(o, 1));
    _mm_storeu_ps(out + 2 * rows, _mm512_extractf32x4_ps(o, 2));
    _mm_storeu_ps(out + 3 * rows, _mm512_extractf32x4_ps(o, 3));
}
#define PYLLAMA_F32_LANES_PER_ELEMENT 1
typedef __m512 pyllama_f32_lanes;
#define PYLLAMA_TILE_SWITCH(R)                                                                       \
    PYLLAMA_TILE_CASE(R, 1) PYLLAMA_TILE_CASE(R, 2) PYLLAMA_TILE_CASE(R, 3) PYLLAMA_TILE_CASE(R, 4)
#elif PYLLAMA_F32_AVX2
/* The block product's blocking. A tile is R <= 4 rows of w times P <= 3 positions of x over one chunk
   of columns, for one half of the 16 lanes (h = 0: lanes 0-7, h = 1: lanes 8-15): 12 accumulators,
   each loaded weight vector used P times and each x vector R times (16 ymm registers in all). A
   row longer than PYLLAMA_F32_KC columns is cut into equal chunks of at most that many, so that
   the strip's chunk (at most 12 KiB) stays in L1 for every position of the block: over whole rows
   the FFN's down projection (1,376 or 2,048 columns) did not fit, and ran at 0.28-0.40 of
   OpenBLAS's sgemm on the same shapes against 0.6-0.9 for the 512-column matrices. A chunk ends
   with the accumulators stored in ``lanes`` and the next one starts from them, so every lane keeps
   one chain of FMAs in increasing j: exactly pyllama_dot_f32's lanes. The empty asm pins each loaded
   vector in a register: without it gcc folds the load into every FMA that uses it (seen in the
   generated code: 16 to 24 loads per 12 FMAs instead of 7). */
#define PYLLAMA_F32_KC 768
#define PYLLAMA_F32_TILE_POS 3
#define PYLLAMA_F32_GROUP 66 /* positions whose lanes a strip keeps between chunks (22 tiles) */

static inline __attribute__((always_inline)) void pyllama_tile_f32(const float* w, const float* x, Py_ssize_t cols,
                                                                   Py_ssize_t j0, Py_ssize_t j1, __m256* lanes,
                                                                   const int R, const int P) {
    /* lanes[(r * P + p) * 2 + h], read when j0 > 0 and written */
    for (int h = 0; h < 2; h++) {
        __m256 acc[4][3];
        for (int r = 0; r < R; r++)
            for (int p = 0; p < P; p++) acc[r][p] = j0 == 0 ? _mm256_setzero_ps() : lanes[(r * P + p) * 2 + h];
        const float* wh = w + 8 * h;
        const float* xh = x + 8 * h;
        for (Py_ssize_t j = j0; j < j1; j += 16) {
            __m256 xv[3];
            for (int p = 0; p < P; p++) {
                xv[p] = _mm256_loadu_ps(xh + p * cols + j);
                __asm__("" : "+x"(xv[p]));
            }
            for (int r = 0; r < R; r++) {
                __m256 wv = _mm256_loadu_ps(wh + r * cols + j);
                __asm__("" : "+x"(wv));
                for (int p = 0; p < P; p++) acc[r][p] = _mm256_fmadd_ps(wv, xv[p], acc[r][p]);
            }
        }
        for (int r = 0; r < R; r++)
            for (int p = 0; p < P; p++) lanes[(r * P + p) * 2 + h] = acc[r][p];
    }
}

/* element e's 16 -> 4 step, from its two vectors */
static inline __m128 pyllama_lanes_16to4(const __m256* lanes, int e) {
    return pyllama_halves_16to4(lanes[2 * e], lanes[2 * e + 1]);
}

#define PYLLAMA_F32_LANES_PER_ELEMENT 2
typedef __m256 pyllama_f32_lanes;
#define PYLLAMA_TILE_SWITCH(R) PYLLAMA_TILE_CASE(R, 1) PYLLAMA_TILE_CASE(R, 2) PYLLAMA_TILE_CASE(R, 3)
#endif

#if PYLLAMA_F32_AVX2 || PYLLAMA_F32_AVX512
/* The R x P elements of a tile from their lanes, written to out (row stride ``rows``): the 16 -> 4
   step per element (pyllama_lanes_16to4, the same additions on either width), then four elements of
   one position (four rows) at once, transposed so that lane r holds row r's l[u]: (l0 + l2) +
   (l1 + l3) for all four in three vector adds. Exactly pyllama_finish_f32_avx2's additions; the tail
   (cols mod 16) is added after, in order. */
static inline __attribute__((always_inline)) void pyllama_tile_finish_f32(
        const pyllama_f32_lanes* lanes, const float* w, const float* x, Py_ssize_t cols, float* out, Py_ssize_t rows,
        const int R, const int P) {
#if PYLLAMA_F32_AVX512
    if (R == 4 && P == 4 && cols % 16 == 0) {
        pyllama_tile_finish_4x4_avx512(lanes, out, rows);
        return;
    }
#endif
    for (int p = 0; p < P; p++) {
        __m128 s[4];
        for (int r = 0; r < 4; r++) s[r] = pyllama_lanes_16to4(lanes, (r * P + p) * (r < R));
        _MM_TRANSPOSE4_PS(s[0], s[1], s[2], s[3]); /* s[u] lane r = row r's l[u] */
        const __m128 total = _mm_add_ps(_mm_add_ps(s[0], s[2]), _mm_add_ps(s[1], s[3]));
        float* o = out + p * rows;
        if (R == 4 && cols % 16 == 0) {
            _mm_storeu_ps(o, total);
            continue;
        }
        float t[4];
        _mm_storeu_ps(t, total);
        for (int r = 0; r < R; r++) {
            float v = t[r];
            for (Py_ssize_t j = cols - cols % 16; j < cols; j++) v = v + w[r * cols + j] * x[p * cols + j];
            o[r] = v;
        }
    }
}

/* one tile over columns j0 .. j1 - 1; after the row's last chunk its elements are finished */
#define PYLLAMA_TILE_CASE(R, P)                                                                      \
    case 8 * (R) + (P):                                                                              \
        pyllama_tile_f32(wr, xp, cols, j0, j1, tile_lanes, R, P);                                    \
        if (j1 == n_main) pyllama_tile_finish_f32(tile_lanes, wr, xp, cols, out + p0 * rows + r0, rows, R, P); \
        break;

/* out[p * rows + r] = pyllama_dot_f32(w[r], x[p]) for rows r0 .. r1 - 1 (at most 4) and every
   position: per group of up to 66 positions, per chunk of columns, the tiles of three positions. */
PYLLAMA_F32_MAYBE_UNUSED static void pyllama_matmul_f32_rows(float* out, const float* w, const float* x, Py_ssize_t n_pos, Py_ssize_t rows,
                                    Py_ssize_t cols, Py_ssize_t r0, Py_ssize_t r1) {
    pyllama_f32_lanes lanes[4 * PYLLAMA_F32_GROUP * PYLLAMA_F32_LANES_PER_ELEMENT];
    const int R = (int)(r1 - r0);
    const float* wr = w + r0 * cols;
    const Py_ssize_t n_main = cols - cols % 16;
    /* equal chunks of whole groups of 16 columns, each at most PYLLAMA_F32_KC */
    const Py_ssize_t n_chunks = n_main > PYLLAMA_F32_KC ? (n_main + PYLLAMA_F32_KC - 1) / PYLLAMA_F32_KC : 1;
    const Py_ssize_t chunk = 16 * ((n_main / 16 + n_chunks - 1) / n_chunks);
    for (Py_ssize_t g0 = 0; g0 < n_pos; g0 += PYLLAMA_F32_GROUP) {
        const Py_ssize_t g1 = n_pos - g0 < PYLLAMA_F32_GROUP ? n_pos : g0 + PYLLAMA_F32_GROUP;
        Py_ssize_t j0 = 0;
        do {
            const Py_ssize_t j1 = n_main - j0 > chunk ? j0 + chunk : n_main;
            for (Py_ssize_t p0 = g0; p0 < g1; p0 += PYLLAMA_F32_TILE_POS) {
                const int P = g1 - p0 < PYLLAMA_F32_TILE_POS ? (int)(g1 - p0) : PYLLAMA_F32_TILE_POS;
                const float* xp = x + p0 * cols;
                pyllama_f32_lanes* tile_lanes = lanes + 4 * PYLLAMA_F32_LANES_PER_ELEMENT * (p0 - g0);
                switch (8 * R + P) {
                    PYLLAMA_TILE_SWITCH(1) PYLLAMA_TILE_SWITCH(2) PYLLAMA_TILE_SWITCH(3) PYLLAMA_TILE_SWITCH(4)
                }
            }
            j0 = j1;
        } while (j0 < n_main);
    }
}
#else
PYLLAMA_F32_MAYBE_UNUSED static void pyllama_matmul_f32_rows(float* out, const float* w, const float* x, Py_ssize_t n_pos, Py_ssize_t rows,
                                    Py_ssize_t cols, Py_ssize_t r0, Py_ssize_t r1) {
    for (Py_ssize_t r = r0; r < r1; r++)
        for (Py_ssize_t p = 0; p < n_pos; p++) out[p * rows + r] = pyllama_dot_f32(w + r * cols, x + p * cols, cols);
}
#endif

#endif
