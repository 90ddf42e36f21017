/* Q8_0 weights (GGUF type 8): ggml's block format, per 32 weights one fp16 scale d then 32 int8 qs;
 * weight = d * qs. Multiplied as llama.cpp does it (ggml_vec_dot_q8_0_q8_0): the activation is
 * quantised once per product to Q8_0 blocks (amax / 127 rounded to fp16, x * 127 / amax rounded to
 * nearest-even: what ggml's x86 quantize_row_q8_0 does, which is what made the llama.cpp references),
 * then each row is an integer dot product per block scaled by both block scales. Inside a block,
 * products are summed exactly in 8 int32 lanes (lane l holds the 4 products 4l..4l+3: one vpdpbusd, or
 * maddubs + madd), each lane is converted to float and fused-multiply-added with the block's
 * d_w * d_x into one accumulator, block after block, then reduced as ggml's hsum_float_8 does: the order
 * of ggml_vec_dot_q8_0_q8_0 on AVX2, bit for bit (llama.cpp does not repack Q8_0 on x86; its
 * prompt-time sgemm has the same order).
 *
 * Here: the row kernel, the block tiles of the block product (2 x 4 by |w| and sign(w) x; 4 x 4 by
 * x + 128 with VNNI), in AVX2 + FMA beside the plain C that computes the same lanes in the same order
 * (written as Cython loops over float acc[16] with a conversion call, gcc left them scalar, and
 * auto-vectorised int8 code came out as shuffles), the activation's quantisation, and the products and
 * the dequantiser the Q8_0 row of qtypes.h names. A single-vector product's unit is a row; a block
 * product's is a pair of rows (four with VNNI) read once for every position.
 */
#ifndef PYLLAMA_Q8_0_H
#define PYLLAMA_Q8_0_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#if defined(__F16C__) || defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif
#include "qblocks.h" /* PYLLAMA_QBLOCKS_VNNI: VNNI here, or emulated (PYLLAMA_EMULATE_AVX512=vnni) */

/* Weights are streamed from a memory-mapped file in 4 KiB pages, where the hardware prefetchers
   stop at every page boundary; asking for the bytes one page ahead keeps the stream going
   (measured on stories110M Q8_0: 1.5-1.8x faster decode). Prefetches never fault and do not
   change any result. */
#define PYLLAMA_Q8_0_BYTES 34 /* fp16 d, 32 int8 */
#define PYLLAMA_PREFETCH_AHEAD 4096
#if defined(__GNUC__)
#define pyllama_prefetch(p) __builtin_prefetch((const void*)(p), 0, 3)
#else
#define pyllama_prefetch(p) ((void)0)
#endif

#include "halfbits.h"  /* pyllama_half_to_float, pyllama_float_to_half */

/* ---- Q8_0 row times the Q8_0-quantised activation ----
   A block is fp16 d then 32 int8. Per block, 8 int32 lanes: lane l = sum_k w[4l+k] x[4l+k]
   (k < 4), exact. Each lane is converted to float and fused-multiply-added with d_w * d_x into
   one accumulator, block after block, which is reduced in a fixed order at the end.
   AVX2: the integer dot is |w| (unsigned) times
   sign(w)·x with maddubs + madd, or one vpdpbusd with VNNI; exact because |x| <= 127. The plain C
   path computes the same lanes. */
static inline float pyllama_reduce8(const float* a8) {
    return ((a8[0] + a8[4]) + (a8[2] + a8[6])) + ((a8[1] + a8[5]) + (a8[3] + a8[7]));
}

#if defined(__AVX2__) && defined(__FMA__)
/* the 8 lanes of one block from |w| (aw, unsigned bytes) and w: |w| times sign(w)·x */
static inline __m256i pyllama_lanes_abs_i8(__m256i aw, __m256i w, __m256i x) {
    const __m256i sx = _mm256_sign_epi8(x, w);  /* x * sign(w): |x| <= 127 never overflows */
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), aw, sx);
#elif defined(__AVXVNNI__)
    return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), aw, sx);
#else
    /* byte pairs to int16: |sum| <= 2 * 128 * 127 < 32767, so maddubs never saturates */
    return _mm256_madd_epi16(_mm256_maddubs_epi16(aw, sx), _mm256_set1_epi16(1));
#endif
}

static inline __m256i pyllama_dot4_i8(const uint8_t* wq, const int8_t* xq) {
    const __m256i w = _mm256_loadu_si256((const __m256i*)wq);
    const __m256i x = _mm256_loadu_si256((const __m256i*)xq);
    return pyllama_lanes_abs_i8(_mm256_abs_epi8(w), w, x);  /* |w|: -128 gives 128, exact */
}
#endif

static inline float pyllama_q8_0_scale(const uint8_t* blk, const float* xs, ptrdiff_t b) {
    uint16_t dh;
    memcpy(&dh, blk, sizeof dh);
    return pyllama_half_to_float(dh) * xs[b];
}

static inline float pyllama_dot_q8_0(const uint8_t* w, const int8_t* xq, const float* xs, ptrdiff_t n_blocks) {
    float acc[8];
#if defined(__AVX2__) && defined(__FMA__)
    __m256 vacc = _mm256_setzero_ps();
    for (ptrdiff_t b = 0; b < n_blocks; b++) {
        const uint8_t* blk = w + PYLLAMA_Q8_0_BYTES * b;
        if ((b & 1) == 0) {
            pyllama_prefetch(blk + PYLLAMA_PREFETCH_AHEAD);
            pyllama_prefetch(blk + PYLLAMA_PREFETCH_AHEAD + 64);
        }
        const __m256i s = pyllama_dot4_i8(blk + 2, xq + 32 * b);
        vacc = _mm256_fmadd_ps(_mm256_set1_ps(pyllama_q8_0_scale(blk, xs, b)), _mm256_cvtepi32_ps(s), vacc);
    }
    _mm256_storeu_ps(acc, vacc);
#else
    for (int l = 0; l < 8; l++) acc[l] = 0.0f;
    for (ptrdiff_t b = 0; b < n_blocks; b++) {
        const uint8_t* blk = w + PYLLAMA_Q8_0_BYTES * b;
        if ((b & 1) == 0) {
            pyllama_prefetch(blk + PYLLAMA_PREFETCH_AHEAD);
            pyllama_prefetch(blk + PYLLAMA_PREFETCH_AHEAD + 64);
        }
        const int8_t* wq = (const int8_t*)(blk + 2);
        const int8_t* xb = xq + 32 * b;
        const float d = pyllama_q8_0_scale(blk, xs, b);
        for (int l = 0; l < 8; l++) {
            int32_t s = 0;
            for (int k = 0; k < 4; k++) s += (int32_t)wq[4 * l + k] * (int32_t)xb[4 * l + k];
            acc[l] = fmaf(d, (float)s, acc[l]);
        }
    }
#endif
    return pyllama_reduce8(acc);
}

/* Rows r0 and r0 + 1 (w, w + row_bytes) times positions p < 4 (xq + p * cols, xs + p * n_blocks):
   out[p * out_stride + r] for r < 2, each element exactly pyllama_dot_q8_0's computation (its lanes,
   its float product d_w * d_x, its fma per block in block order, its reduction), so a tile gives the
   bits of eight separate dots. The tile loads each weight block and its |w| once for four
   positions and each activation block once for both rows, and keeps the eight accumulators in
   registers: a block of positions multiplies at the speed of the arithmetic, not of the loads.
   xst holds the four positions' activation scales side by side per block (xst[4 b + p] =
   xs[p * n_blocks + b]): the eight products d_w * d_x of a block are two 4-wide multiplies, stored
   and read back as broadcasts from memory (load ports), where one scalar multiply and one
   register broadcast per element took two of the vector pipes that the integer products and the
   FMAs share. The same IEEE products, so the same bits. */
static inline void pyllama_q8_0_tile_2x4(const uint8_t* w, ptrdiff_t row_bytes, const int8_t* xq,
                                         const float* xs, const float* xst, ptrdiff_t cols, ptrdiff_t n_blocks,
                                         float* out, ptrdiff_t out_stride) {
#if defined(__AVX2__) && defined(__FMA__)
    __m256 acc[2][4];
    for (int r = 0; r < 2; r++)
        for (int p = 0; p < 4; p++) acc[r][p] = _mm256_setzero_ps();
    for (ptrdiff_t b = 0; b < n_blocks; b++) {
        const uint8_t* blk0 = w + PYLLAMA_Q8_0_BYTES * b;
        const uint8_t* blk1 = blk0 + row_bytes;
        if ((b & 1) == 0) {
            pyllama_prefetch(blk0 + PYLLAMA_PREFETCH_AHEAD);
            pyllama_prefetch(blk1 + PYLLAMA_PREFETCH_AHEAD);
        }
        uint16_t h0, h1;
        memcpy(&h0, blk0, sizeof h0);
        memcpy(&h1, blk1, sizeof h1);
        const __m128 dx4 = _mm_loadu_ps(xst + 4 * b);
        float d[8] __attribute__((aligned(32)));  /* d[4 r + p] = d_w(r) * d_x(p) */
        _mm_store_ps(d, _mm_mul_ps(_mm_set1_ps(pyllama_half_to_float(h0)), dx4));
        _mm_store_ps(d + 4, _mm_mul_ps(_mm_set1_ps(pyllama_half_to_float(h1)), dx4));
        /* read d back from memory: gcc would otherwise forward the stores as register shuffles */
        __asm__("" : : "r"(d) : "memory");
        const __m256i w0 = _mm256_loadu_si256((const __m256i*)(blk0 + 2));
        const __m256i w1 = _mm256_loadu_si256((const __m256i*)(blk1 + 2));
        const __m256i aw0 = _mm256_abs_epi8(w0), aw1 = _mm256_abs_epi8(w1);
        for (int p = 0; p < 4; p++) {
            const __m256i x = _mm256_loadu_si256((const __m256i*)(xq + p * cols + 32 * b));
            acc[0][p] = _mm256_fmadd_ps(_mm256_broadcast_ss(d + p),
                                        _mm256_cvtepi32_ps(pyllama_lanes_abs_i8(aw0, w0, x)), acc[0][p]);
            acc[1][p] = _mm256_fmadd_ps(_mm256_broadcast_ss(d + 4 + p),
                                        _mm256_cvtepi32_ps(pyllama_lanes_abs_i8(aw1, w1, x)), acc[1][p]);
        }
    }
    float a8[8];
    for (int r = 0; r < 2; r++)
        for (int p = 0; p < 4; p++) {
            _mm256_storeu_ps(a8, acc[r][p]);
            out[p * out_stride + r] = pyllama_reduce8(a8);
        }
#else
    (void)xst;
    for (int r = 0; r < 2; r++)
        for (int p = 0; p < 4; p++)
            out[p * out_stride + r] = pyllama_dot_q8_0(w + r * row_bytes, xq + p * cols, xs + p * n_blocks,
                                                       n_blocks);
#endif
}

/* ---- the block tile with VNNI: R <= 4 rows times 4 positions, the activation offset to unsigned ----
   vpdpbusd multiplies unsigned bytes by signed ones. The tile's positions are stored as x + 128
   (unsigned; pyllama_q8_0_unsign, at quantisation) and each row's lanes start from -128 * (w[4l] +
   ... + w[4l+3]) instead of 0, computed once per row and block for the four positions:
   (x + 128) . w - 128 sum(w) = x . w, exactly, in int32 (|each product| <= 255 * 128). So one
   vpdpbusd per row and position gives pyllama_dot_q8_0's lanes, where the |w|, sign(w) x way takes a
   vpsignb more; and four rows share each activation load (the 2 x 4 tile's positions were read from
   L2 once per row pair, twice as often). The float work is the 2 x 4 tile's: d_w * d_x per element,
   one fma per block in block order, the same reduction, so the same bits. 16 accumulators, 4 rows,
   4 starting lanes: AVX-512VL's 32 vector registers. Built where qblocks.h's VNNI path is, so SIMDe's
   emulation (tests/test_simd_paths.py) tests it on a CPU without VNNI. */
#if PYLLAMA_QBLOCKS_VNNI && defined(__FMA__)
#define PYLLAMA_Q8_0_UNSIGNED_TILE 1
#define PYLLAMA_Q8_0_UNIT_ROWS 4

static inline void pyllama_q8_0_unsign(int8_t* q, ptrdiff_t n) {
    for (ptrdiff_t i = 0; i < n; i++) q[i] = (int8_t)((uint8_t)q[i] ^ 0x80);
}

/* The tile: rows row[0..3] times 4 positions. Each accumulator is a variable of its own: gcc kept an
   array of 16 vectors in memory, loading and storing all of them every block; as variables they stay
   in 16 of the 32 registers. */
#define PYLLAMA_Q8U_ROW(r)                                                                            \
    memcpy(&h, row[r] + PYLLAMA_Q8_0_BYTES * b, sizeof h);                                                            \
    _mm_store_ps(d + 4 * r, _mm_mul_ps(_mm_set1_ps(pyllama_half_to_float(h)), dx4));                 \
    const __m256i w##r = _mm256_loadu_si256((const __m256i*)(row[r] + PYLLAMA_Q8_0_BYTES * b + 2));                  \
    const __m256i s##r = _mm256_sub_epi32(zero, _mm256_dpbusd_epi32(zero, k128, w##r));
#define PYLLAMA_Q8U_STEP(r, p)                                                                        \
    a##r##p = _mm256_fmadd_ps(_mm256_set1_ps(d[4 * r + p]),                                           \
                              _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(s##r, x##p, w##r)), a##r##p);
#define PYLLAMA_Q8U_POSITION(p)                                                                       \
    {                                                                                                 \
        const __m256i x##p = _mm256_loadu_si256((const __m256i*)(xu + p * cols + 32 * b));            \
        PYLLAMA_Q8U_STEP(0, p) PYLLAMA_Q8U_STEP(1, p) PYLLAMA_Q8U_STEP(2, p) PYLLAMA_Q8U_STEP(3, p)   \
    }

static void pyllama_q8_0_tile_u4(const uint8_t* const* row, const uint8_t* xu, const float* xst, ptrdiff_t cols,
                                 ptrdiff_t n_blocks, float* out, ptrdiff_t out_stride) {
    __m256 a00 = _mm256_setzero_ps(), a01 = a00, a02 = a00, a03 = a00, a10 = a00, a11 = a00, a12 = a00,
           a13 = a00, a20 = a00, a21 = a00, a22 = a00, a23 = a00, a30 = a00, a31 = a00, a32 = a00, a33 = a00;
    const __m256i k128 = _mm256_set1_epi8((char)0x80), zero = _mm256_setzero_si256();
    float d[16] __attribute__((aligned(64)));
    for (ptrdiff_t b = 0; b < n_blocks; b++) {
        if ((b & 1) == 0)
            for (int r = 0; r < 4; r++) pyllama_prefetch(row[r] + PYLLAMA_Q8_0_BYTES * b + PYLLAMA_PREFETCH_AHEAD);
        const __m128 dx4 = _mm_loadu_ps(xst + 4 * b);
        uint16_t h;
        PYLLAMA_Q8U_ROW(0) PYLLAMA_Q8U_ROW(1) PYLLAMA_Q8U_ROW(2) PYLLAMA_Q8U_ROW(3)
        __asm__("" : "+m"(d));
        PYLLAMA_Q8U_POSITION(0) PYLLAMA_Q8U_POSITION(1) PYLLAMA_Q8U_POSITION(2) PYLLAMA_Q8U_POSITION(3)
    }
    /* rows 0-3 of positions 0 and 1, then of 2 and 3: each position's four rows are contiguous in out */
    const __m256 r01 = pyllama_qreduce8_x8(a00, a10, a20, a30, a01, a11, a21, a31);
    const __m256 r23 = pyllama_qreduce8_x8(a02, a12, a22, a32, a03, a13, a23, a33);
    _mm_storeu_ps(out, _mm256_castps256_ps128(r01));
    _mm_storeu_ps(out + out_stride, _mm256_extractf128_ps(r01, 1));
    _mm_storeu_ps(out + 2 * out_stride, _mm256_castps256_ps128(r23));
    _mm_storeu_ps(out + 3 * out_stride, _mm256_extractf128_ps(r23, 1));
}

/* rows r < R (R <= 4, row_bytes apart) times the 4 unsigned positions at xu (cols apart). Fewer than 4
   rows (the last unit of a matrix whose rows are not a multiple of 4) repeat the last row in the
   missing places, into a scratch tile of which only the R real rows are kept. */
static void pyllama_q8_0_tile_u(const uint8_t* w, ptrdiff_t row_bytes, const int8_t* xu, const float* xst,
                                ptrdiff_t cols, ptrdiff_t n_blocks, float* out, ptrdiff_t out_stride, int R) {
    const uint8_t* x = (const uint8_t*)xu;
    const uint8_t* row[4];
    for (int r = 0; r < 4; r++) row[r] = w + (r < R ? r : R - 1) * row_bytes;
    if (R == 4) {
        pyllama_q8_0_tile_u4(row, x, xst, cols, n_blocks, out, out_stride);
        return;
    }
    float tile[16];
    pyllama_q8_0_tile_u4(row, x, xst, cols, n_blocks, tile, 4);
    for (int p = 0; p < 4; p++)
        for (int r = 0; r < R; r++) out[p * out_stride + r] = tile[4 * p + r];
}
#else
#define PYLLAMA_Q8_0_UNSIGNED_TILE 0
#define PYLLAMA_Q8_0_UNIT_ROWS 2
static inline void pyllama_q8_0_unsign(int8_t* q, ptrdiff_t n) { (void)q; (void)n; }
static void pyllama_q8_0_tile_u(const uint8_t* w, ptrdiff_t row_bytes, const int8_t* xu, const float* xst,
                                ptrdiff_t cols, ptrdiff_t n_blocks, float* out, ptrdiff_t out_stride, int R) {
    (void)w; (void)row_bytes; (void)xu; (void)xst; (void)cols; (void)n_blocks; (void)out; (void)out_stride;
    (void)R; /* never called: pyllama_mat_q8_0 takes the 2 x 4 tile in builds without VNNI */
}
#endif

/* ---- the activation ---- */

/* x[n] (n a multiple of 32) -> int8 q[n] and one scale per block (the fp16 scale as float32) */
static inline void pyllama_quantize_q8_0(int8_t* q, float* scales, const float* x, ptrdiff_t n) {
    for (ptrdiff_t b = 0; b < n / 32; b++) {
        const float amax = pyllama_absmax(x + 32 * b, 32);
        /* ggml stores d = amax / 127 as fp16; the dot product reads it back as float32 */
        scales[b] = pyllama_half_to_float(pyllama_float_to_half(amax / 127.0f));
        const float inv = amax != 0.0f ? 127.0f / amax : 0.0f;
        (void)pyllama_round32(q + 32 * b, x + 32 * b, inv);
    }
}

/* position p of the Q8_0 activation of the 32-value types (PYLLAMA_ACT_Q8_0): the int8 values and scales,
   and, where the scratch has room (isums), the offsets from which the packed products start their sums
   of unsigned weights times the activation (qpacked_legacy.h): -16 times the sum of each 4 values (Q5_0's
   lanes, q - 16) and -8 times the sum of each 32 (Q4_0's blocks, q - 8), stored so that a product reads
   each one with a broadcast load */
static void pyllama_act_q8_0(const pyllama_acts* a, ptrdiff_t p) {
    const int8_t* q = a->q + p * a->cols;
    pyllama_quantize_q8_0(a->q + p * a->cols, a->d + p * a->d_stride, a->x + p * a->cols, a->cols);
    if (a->isums == NULL) return;
    int32_t* o4 = a->isums + p * (a->cols / 4 + a->cols / 32);
    int32_t* o32 = o4 + a->cols / 4;
    for (ptrdiff_t b = 0; b < a->cols / 32; b++) {
        int32_t block = 0;
        for (int j = 0; j < 8; j++) {
            const int8_t* v = q + 32 * b + 4 * j;
            const int32_t s = (int32_t)v[0] + v[1] + v[2] + v[3];
            o4[8 * b + j] = -16 * s;
            block += s;
        }
        o32[b] = -8 * block;
    }
}

static void pyllama_act_q8_0_plain(const pyllama_acts* a, ptrdiff_t p) {
    pyllama_quantize_q8_0(a->q + p * a->cols, a->d + p * a->d_stride, a->x + p * a->cols, a->cols);
}

/* Position p of the activation of Q8_0's own products (PYLLAMA_ACT_Q8_0_TILE): quantised as above and,
   in a whole tile of 4 positions, its scales also side by side with the tile's others after all the
   positions' (the tiles read 4 per block) and, for the VNNI tile, its int8 values stored as x + 128
   (only the tile reads a whole tile's positions). Positions are independent: any thread may take any. */
static void pyllama_act_q8_0_tile(const pyllama_acts* a, ptrdiff_t p) {
    const ptrdiff_t n_blocks = a->d_stride, n_pos = a->n_pos;
    float* side_by_side = a->d + n_pos * n_blocks; /* room: the scratch holds cols * n_pos */
    pyllama_act_q8_0_plain(a, p);
    if (p < n_pos - n_pos % 4) {
        for (ptrdiff_t b = 0; b < n_blocks; b++)
            side_by_side[(p - p % 4) * n_blocks + 4 * b + p % 4] = a->d[p * n_blocks + b];
        if (PYLLAMA_Q8_0_UNSIGNED_TILE) pyllama_q8_0_unsign(a->q + p * a->cols, a->cols);
    }
}

/* ---- the products of qtypes.h's Q8_0 row ---- */

static ptrdiff_t pyllama_units_q8_0(const pyllama_matrix* m, ptrdiff_t n_pos) {
    return n_pos == 1 ? m->rows : (m->rows + PYLLAMA_Q8_0_UNIT_ROWS - 1) / PYLLAMA_Q8_0_UNIT_ROWS;
}

/* rows u0 .. u1 - 1 at one position */
static void pyllama_vec_q8_0(const pyllama_matrix* m, ptrdiff_t u0, ptrdiff_t u1, const pyllama_acts* a, float* out) {
    const ptrdiff_t n_blocks = m->cols / 32, row_bytes = n_blocks * PYLLAMA_Q8_0_BYTES;
    for (ptrdiff_t r = u0; r < u1; r++)
        out[r] = pyllama_dot_q8_0((const uint8_t*)m->data + r * row_bytes, a->q, a->d, n_blocks);
}

/* Units u0 .. u1 - 1 (PYLLAMA_Q8_0_UNIT_ROWS rows each, fewer at the end) at every position: tiles over
   the whole tiles of 4 positions, then the remaining positions one dot at a time; every element is
   pyllama_dot_q8_0's computation. The VNNI tile takes any 1-4 rows (its positions were stored unsigned,
   so it must); the 2 x 4 tile takes a pair, and a lone last row goes one dot at a time. */
static void pyllama_mat_q8_0(const pyllama_matrix* m, ptrdiff_t u0, ptrdiff_t u1, const pyllama_acts* a, float* out) {
    const ptrdiff_t rows = m->rows, cols = m->cols, n_pos = a->n_pos, n_blocks = cols / 32;
    const ptrdiff_t row_bytes = n_blocks * PYLLAMA_Q8_0_BYTES;
    const uint8_t* w = (const uint8_t*)m->data;
    const float* side_by_side = a->d + n_pos * n_blocks; /* pyllama_act_q8_0_tile's */
    for (ptrdiff_t u = u0; u < u1; u++) {
        const ptrdiff_t i = PYLLAMA_Q8_0_UNIT_ROWS * u;
        const ptrdiff_t n_rows = rows - i < PYLLAMA_Q8_0_UNIT_ROWS ? rows - i : PYLLAMA_Q8_0_UNIT_ROWS;
        const uint8_t* wi = w + i * row_bytes;
        ptrdiff_t p = 0;
        if (PYLLAMA_Q8_0_UNSIGNED_TILE || n_rows == 2)
            for (; p + 4 <= n_pos; p += 4) {
                if (PYLLAMA_Q8_0_UNSIGNED_TILE)
                    pyllama_q8_0_tile_u(wi, row_bytes, a->q + p * cols, side_by_side + p * n_blocks, cols, n_blocks,
                                        out + p * rows + i, rows, (int)n_rows);
                else
                    pyllama_q8_0_tile_2x4(wi, row_bytes, a->q + p * cols, a->d + p * n_blocks,
                                          side_by_side + p * n_blocks, cols, n_blocks, out + p * rows + i, rows);
            }
        for (; p < n_pos; p++)
            for (ptrdiff_t r = i; r < i + n_rows; r++)
                out[p * rows + r] = pyllama_dot_q8_0(w + r * row_bytes, a->q + p * cols, a->d + p * n_blocks, n_blocks);
    }
}

static void pyllama_dequantize_q8_0(const pyllama_matrix* m, ptrdiff_t r, float* out) {
    const ptrdiff_t n_blocks = m->cols / 32;
    const uint8_t* blk = (const uint8_t*)m->data + r * n_blocks * PYLLAMA_Q8_0_BYTES;
    for (ptrdiff_t b = 0; b < n_blocks; b++, blk += PYLLAMA_Q8_0_BYTES) {
        const float d = pyllama_half_at(blk);
        const int8_t* q = (const int8_t*)(blk + 2);
        for (int k = 0; k < 32; k++) out[32 * b + k] = d * q[k];
    }
}

#endif
