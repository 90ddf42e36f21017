/* The products over ggml's 32-value block types and BF16, on their own blocks (never expanded to float32):
 * the block layouts, the AVX-512 / AVX2 / portable lanes of one block or two, the row dots in ggml's
 * vec_dot order, BF16, and the dequantiser of one row. The four-row tiles are qlegacy_rows4.h, the
 * eight-row order of the matrices llama.cpp repacks qlegacy_rows8.h; qlegacy_products.h names them for
 * the types' rows (qtypes.h).
 *
 * Block layouts (ggml-common.h), weight value per element:
 *
 * * ``Q4_0`` (18 bytes): fp16 d, 16 bytes of nibbles; w = d * (q - 8). Activation: Q8_0.
 * * ``Q4_1`` (20 bytes): fp16 d, fp16 m, nibbles; w = d * q + m. Activation: Q8_1.
 * * ``Q5_0`` (22 bytes): fp16 d, 32 high bits, nibbles; w = d * (q - 16). Activation: Q8_0.
 * * ``Q5_1`` (24 bytes): fp16 d, fp16 m, 32 high bits, nibbles; w = d * q + m. Activation: Q8_1.
 * * ``IQ4_NL`` (18 bytes): fp16 d, nibbles indexing a 16-entry int8 table; w = d * table[q]. Activation: Q8_0.
 * * ``BF16``: bfloat16 rows, widened exactly to float32 as they are read. The activation stays float32
 *   (llama.cpp rounds it to BF16 for its BF16 products; as for F16, pyllama keeps the more accurate
 *   float32 and documents the difference). 32 float lanes (j mod 32) in a fixed reduction, then the
 *   last cols mod 32 products in order.
 *
 * Low nibbles are the block's elements 0-15, high nibbles 16-31; high bit j of a 5-bit type is bit j
 * of the little-endian uint32. Per block, the integer products are summed exactly; the float part
 * follows, bit for bit, the kernel llama.cpp runs for the matrix on an AVX2 CPU (ggml-cpu's
 * arch/x86/quants.c and repack.cpp; checked against libggml-cpu's own ``vec_dot`` and
 * ``gemv_q4_0_8x8_q8_0`` on random rows, and by tests/test_ggml_order.py):
 *
 * * ``ggml_vec_dot_*`` (Q4_1, Q5_0, Q5_1; Q4_0 and IQ4_NL when the row count is not a multiple of 8):
 *   8 int32 lanes per block (lane l: elements 4l..4l+3), each converted to float32 and fused-multiply-
 *   added with ``d_w * d_x`` into ONE accumulator, block after block, then ``hsum_float_8``'s reduction
 *   ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)). For Q4_1/Q5_1 the offset term ``m_w * s_x`` (s = d_x * sum q_x,
 *   from the Q8_1 activation) is a fused chain over the blocks in order, added last.
 * * IQ4_NL's vec_dot takes blocks in pairs into two accumulators (even, odd), adds them lane-wise, reduces
 *   as above, and adds an odd last block as total + (d_x * d_w) * isum (two roundings).
 * * Q4_0 and IQ4_NL matrices whose row count is a multiple of 8 are repacked by llama.cpp into 8-row
 *   groups and multiplied by ``gemv/gemm_q4_0_8x8_q8_0`` (decode and prompt alike, the same arithmetic
 *   per element): per block the whole 32-product integer sum, then one float chain
 *   acc = fma((float)isum, d_w * d_x, acc). pyllama computes those matrices eight rows at a time
 *   (qrows.h's eight-row forms), lane j of one vector being row j's chain, without repacking the mapped
 *   file: the activation block is loaded once for the eight rows and, for Q4_0, the nibbles are used
 *   unsigned, (q - 8)·x = q·x - 8·Σx, which is the same integer.
 *
 * In a block of positions (prompts, teacher forcing) the vec_dot types take four positions at a time: one
 * row (``tile4``), or four rows where the row count is a multiple of 4 (``rows4x4``, qlegacy_rows4.h), so that four rows share each activation load. Every element is still the row dot's.
 *
 * AVX2 (with FMA) and the portable C path compute the same integers and the same float operations (one
 * rounding per fused multiply-add: ``_mm256_fmadd_ps`` or ``fmaf``), so the two builds give identical
 * bits (checked: every type at several row counts and lengths, an AVX2 build against a portable one, bit
 * for bit); the tests compare either against gguf-py and the emulation of ggml's order. With AVX-512 (F
 * and BW; VNNI when the CPU has it) the integer part takes two blocks per 512-bit register (and two rows
 * of an eight-row group); its lanes are the AVX2 lanes, converted and fused into the same 8-lane float
 * chain block by block, so an AVX-512 build gives the AVX2 bits too. BF16 keeps its 32 float lanes in two
 * zmm registers. ``PYLLAMA_EMULATE_AVX512`` builds that path on a CPU without AVX-512 (docs/speed.md, Build
 * options), which is how a machine of either kind tests it.
 */
#ifndef PYLLAMA_QLEGACY_H
#define PYLLAMA_QLEGACY_H

#include "qblocks.h"

/* The block layouts (ggml-common.h): bytes per block of 32 values, where the nibbles and the high
   bits start. A kernel's `kind` is its type's id (qtype.h). */
#define PYLLAMA_Q4_0_BYTES 18   /* fp16 d, 16 bytes of nibbles */
#define PYLLAMA_Q4_1_BYTES 20   /* fp16 d, fp16 m, nibbles */
#define PYLLAMA_Q5_0_BYTES 22   /* fp16 d, 32 high bits, nibbles */
#define PYLLAMA_Q5_1_BYTES 24   /* fp16 d, fp16 m, 32 high bits, nibbles */
#define PYLLAMA_IQ4_NL_BYTES 18 /* fp16 d, nibbles indexing pyllama_iq4nl_values */
static const int pyllama_legacy_bytes[PYLLAMA_N_QTYPES] = {
    [PYLLAMA_Q4_0] = PYLLAMA_Q4_0_BYTES, [PYLLAMA_Q4_1] = PYLLAMA_Q4_1_BYTES, [PYLLAMA_Q5_0] = PYLLAMA_Q5_0_BYTES,
    [PYLLAMA_Q5_1] = PYLLAMA_Q5_1_BYTES, [PYLLAMA_IQ4_NL] = PYLLAMA_IQ4_NL_BYTES};
static const int pyllama_legacy_qs[PYLLAMA_N_QTYPES] = {
    [PYLLAMA_Q4_0] = 2, [PYLLAMA_Q4_1] = 4, [PYLLAMA_Q5_0] = 6, [PYLLAMA_Q5_1] = 8, [PYLLAMA_IQ4_NL] = 2};
static const int pyllama_legacy_qh[PYLLAMA_N_QTYPES] = {[PYLLAMA_Q5_0] = 2, [PYLLAMA_Q5_1] = 4};
static const int8_t pyllama_iq4nl_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                                1, 13, 25, 38, 53, 69, 89, 113};
#define PL_HAS_MIN(kind) ((kind) == PYLLAMA_Q4_1 || (kind) == PYLLAMA_Q5_1)
#define PL_HAS_HIGH(kind) ((kind) == PYLLAMA_Q5_0 || (kind) == PYLLAMA_Q5_1)

/* a block's 32 integer weights, in element order */
static inline void pyllama_legacy_unpack(int kind, const uint8_t* blk, int8_t* w) {
    const uint8_t* qs = blk + pyllama_legacy_qs[kind];
    uint32_t h = 0;
    if (PL_HAS_HIGH(kind)) memcpy(&h, blk + pyllama_legacy_qh[kind], 4);
    for (int j = 0; j < 16; j++) {
        int lo = qs[j] & 15, hi = qs[j] >> 4;
        if (PL_HAS_HIGH(kind)) { lo |= ((h >> j) & 1) << 4; hi |= ((h >> (j + 16)) & 1) << 4; }
        if (kind == PYLLAMA_Q4_0) { lo -= 8; hi -= 8; }
        if (kind == PYLLAMA_Q5_0) { lo -= 16; hi -= 16; }
        if (kind == PYLLAMA_IQ4_NL) { lo = pyllama_iq4nl_values[lo]; hi = pyllama_iq4nl_values[hi]; }
        w[j] = (int8_t)lo;
        w[j + 16] = (int8_t)hi;
    }
}

#if PYLLAMA_QBLOCKS_AVX2
static inline __m256i pyllama_legacy_unpack_avx2(int kind, const uint8_t* blk) {
    const __m128i packed = _mm_loadu_si128((const __m128i*)(blk + pyllama_legacy_qs[kind]));
    __m256i w = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(packed, 4), packed), _mm256_set1_epi8(15));
    if (PL_HAS_HIGH(kind)) {
        uint32_t h;
        memcpy(&h, blk + pyllama_legacy_qh[kind], 4);
        /* byte k takes byte k/8 of h, then keeps bit k%8: 0xFF where element k's high bit is set */
        const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32((int)h),
            _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0));
        const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
        const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
        w = _mm256_or_si256(w, _mm256_and_si256(set, _mm256_set1_epi8(16)));
    }
    if (kind == PYLLAMA_Q4_0) w = _mm256_sub_epi8(w, _mm256_set1_epi8(8));
    if (kind == PYLLAMA_Q5_0) w = _mm256_sub_epi8(w, _mm256_set1_epi8(16));
    if (kind == PYLLAMA_IQ4_NL)
        w = _mm256_shuffle_epi8(
            _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)pyllama_iq4nl_values)), w);
    return w;
}

/* one block: acc + (d_w * d_x) * lanes, and the offset term into *mins */
static inline __m256 pyllama_legacy_block_avx2(int kind, const uint8_t* blk, const pyllama_qact* a,
                                               ptrdiff_t b, __m256 acc, float* mins) {
    const __m256i wq = pyllama_legacy_unpack_avx2(kind, blk);
    const __m256i xq = _mm256_loadu_si256((const __m256i*)(a->q + PYLLAMA_QK * b));
    const __m256i lanes = PL_HAS_MIN(kind) ? pyllama_lanes_u8(wq, xq) : pyllama_lanes_i8(wq, xq);
    const float d = pyllama_half_at(blk) * a->d[b];
    if (PL_HAS_MIN(kind)) *mins = fmaf(pyllama_half_at(blk + 2), a->s[b], *mins);
    return _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(lanes), acc);
}
#else
/* pyllama_legacy_block_avx2 in plain C, on the same lanes: acc[l] + (d_w * d_x) * lanes[l] */
static inline void pyllama_legacy_block_c(int kind, const uint8_t* blk, const pyllama_qact* a, ptrdiff_t b,
                                          float* acc, float* mins) {
    int8_t wq[32];
    pyllama_legacy_unpack(kind, blk, wq);
    const int8_t* xq = a->q + PYLLAMA_QK * b;
    const float d = pyllama_half_at(blk) * a->d[b];
    for (int l = 0; l < 8; l++) {
        int32_t s = 0;
        for (int k = 0; k < 4; k++) s += (int32_t)wq[4 * l + k] * xq[4 * l + k];
        acc[l] = fmaf(d, (float)s, acc[l]);
    }
    if (PL_HAS_MIN(kind)) *mins = fmaf(pyllama_half_at(blk + 2), a->s[b], *mins);
}
#endif

#if PYLLAMA_QBLOCKS_AVX512
/* pyllama_legacy_unpack_avx2 of two blocks: blk0's 32 integer weights in the low 256 bits, blk1's in
   the high 256 */
/* the 32 nibbles at q0 (16 bytes: elements 0-15 low, 16-31 high) in element order in the low 256 bits,
   those at q1 in the high 256 */
static inline __m512i pyllama_nibbles2_avx512(const uint8_t* q0, const uint8_t* q1) {
    /* 128-bit lanes: q0's 16 bytes twice, then q1's twice; each second copy shifted down by 4 */
    const __m256i both = _mm256_set_m128i(_mm_loadu_si128((const __m128i*)q1), _mm_loadu_si128((const __m128i*)q0));
    const __m512i packed = _mm512_permutexvar_epi64(_mm512_set_epi64(3, 2, 3, 2, 1, 0, 1, 0),
                                                    _mm512_castsi256_si512(both));
    return _mm512_and_si512(_mm512_srlv_epi64(packed, _mm512_set_epi64(4, 4, 0, 0, 4, 4, 0, 0)),
                            _mm512_set1_epi8(15));
}

static inline __m512i pyllama_legacy_unpack2_avx512(int kind, const uint8_t* blk0, const uint8_t* blk1) {
    const int qs = pyllama_legacy_qs[kind];
    __m512i w = pyllama_nibbles2_avx512(blk0 + qs, blk1 + qs);
    if (PL_HAS_HIGH(kind)) {
        uint32_t h0, h1;
        memcpy(&h0, blk0 + pyllama_legacy_qh[kind], 4);
        memcpy(&h1, blk1 + pyllama_legacy_qh[kind], 4);
        /* byte k of each block takes byte k/8 of its h, then tests bit k%8 */
        const __m512i h = _mm512_set1_epi64((long long)(((uint64_t)h1 << 32) | h0));
        const __m512i spread = _mm512_shuffle_epi8(h, _mm512_set_epi64(
            0x0707070707070707, 0x0606060606060606, 0x0505050505050505, 0x0404040404040404,
            0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0));
        const __mmask64 set = _mm512_test_epi8_mask(spread, _mm512_set1_epi64((long long)0x8040201008040201ULL));
        w = _mm512_mask_add_epi8(w, set, w, _mm512_set1_epi8(16));
    }
    if (kind == PYLLAMA_Q4_0) w = _mm512_sub_epi8(w, _mm512_set1_epi8(8));
    if (kind == PYLLAMA_Q5_0) w = _mm512_sub_epi8(w, _mm512_set1_epi8(16));
    if (kind == PYLLAMA_IQ4_NL)
        w = _mm512_shuffle_epi8(_mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i*)pyllama_iq4nl_values)), w);
    return w;
}

/* the 8 lanes of blocks b (low half) and b + 1 (high half), blk1 = the block after blk0 in its row */
static inline __m512i pyllama_legacy_pair_lanes(int kind, const uint8_t* blk0, const uint8_t* blk1,
                                                const pyllama_qact* a, ptrdiff_t b) {
    const __m512i wq = pyllama_legacy_unpack2_avx512(kind, blk0, blk1);
    const __m512i xq = _mm512_loadu_si512((const void*)(a->q + PYLLAMA_QK * b));
    return PL_HAS_MIN(kind) ? pyllama_lanes_u8_x2(wq, xq) : pyllama_lanes_i8_x2(wq, xq);
}

/* acc + (d_w * d_x) * lanes for one block's lanes, and its offset term into *mins: the float part of
   pyllama_legacy_block_avx2, in its order */
static inline __m256 pyllama_legacy_scale_avx512(int kind, const uint8_t* blk, const pyllama_qact* a,
                                                 ptrdiff_t b, __m256i lanes, __m256 acc, float* mins) {
    const float d = pyllama_half_at(blk) * a->d[b];
    if (PL_HAS_MIN(kind)) *mins = fmaf(pyllama_half_at(blk + 2), a->s[b], *mins);
    return _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(lanes), acc);
}
#endif

static inline ptrdiff_t pyllama_legacy_row_bytes(int kind, ptrdiff_t cols) {
    return cols / PYLLAMA_QK * pyllama_legacy_bytes[kind];
}

/* ggml's vec_dot order (ggml_vec_dot_q4_0_q8_0 and friends on AVX2): one accumulator of 8 float
   lanes, acc = fma(d_w * d_x, lanes, acc) block after block, then hsum_float_8's reduction; the
   Q4_1/Q5_1 offset term is a float sum over the blocks in order, added last. */
static inline float pyllama_dot_legacy(int kind, const uint8_t* w, const pyllama_qact* a, ptrdiff_t cols) {
    const ptrdiff_t nb = cols / PYLLAMA_QK, bytes = pyllama_legacy_bytes[kind];
    float acc[8], mins = 0.0f;
#if PYLLAMA_QBLOCKS_AVX512
    __m256 vacc = _mm256_setzero_ps();
    ptrdiff_t b = 0;
    for (; b + 1 < nb; b += 2) {
        const uint8_t* blk = w + bytes * b;
        pyllama_qprefetch(blk + PYLLAMA_QPREFETCH_AHEAD);
        const __m512i lanes = pyllama_legacy_pair_lanes(kind, blk, blk + bytes, a, b);
        vacc = pyllama_legacy_scale_avx512(kind, blk, a, b, _mm512_castsi512_si256(lanes), vacc, &mins);
        vacc = pyllama_legacy_scale_avx512(kind, blk + bytes, a, b + 1, _mm512_extracti64x4_epi64(lanes, 1),
                                           vacc, &mins);
    }
    if (b < nb) vacc = pyllama_legacy_block_avx2(kind, w + bytes * b, a, b, vacc, &mins);
    _mm256_storeu_ps(acc, vacc);
#elif PYLLAMA_QBLOCKS_AVX2
    __m256 vacc = _mm256_setzero_ps();
    for (ptrdiff_t b = 0; b < nb; b++) {
        const uint8_t* blk = w + bytes * b;
        if ((b & 1) == 0) pyllama_qprefetch(blk + PYLLAMA_QPREFETCH_AHEAD);
        vacc = pyllama_legacy_block_avx2(kind, blk, a, b, vacc, &mins);
    }
    _mm256_storeu_ps(acc, vacc);
#else
    for (int l = 0; l < 8; l++) acc[l] = 0.0f;
    for (ptrdiff_t b = 0; b < nb; b++) {
        const uint8_t* blk = w + bytes * b;
        if ((b & 1) == 0) pyllama_qprefetch(blk + PYLLAMA_QPREFETCH_AHEAD);
        pyllama_legacy_block_c(kind, blk, a, b, acc, &mins);
    }
#endif
    return pyllama_qreduce8(acc) + mins;
}

/* One row times four positions (a[0..3]) of a block: out[p * out_stride] = pyllama_dot_legacy(kind, w, &a[p],
   cols), each element's lanes, float steps and offset sum exactly that dot's, while the row's blocks are
   unpacked once for the four (one position at a time, a block of SmolLM2's Q4_1 spent 74% of its time
   in the dot, unpacking every row's nibbles again for every position). Four accumulators in variables,
   not an array, so that they stay in registers. */
#if PYLLAMA_QBLOCKS_AVX512
#define PYLLAMA_LEGACY_PAIR(P)                                                                          \
    {                                                                                                   \
        const __m512i xq = _mm512_loadu_si512((const void*)(a[P].q + PYLLAMA_QK * b));                  \
        const __m512i lanes = PL_HAS_MIN(kind) ? pyllama_lanes_u8_x2(wq, xq) : pyllama_lanes_i8_x2(wq, xq); \
        v##P = pyllama_legacy_scale_avx512(kind, blk, &a[P], b, _mm512_castsi512_si256(lanes), v##P, &m##P); \
        v##P = pyllama_legacy_scale_avx512(kind, blk + bytes, &a[P], b + 1, _mm512_extracti64x4_epi64(lanes, 1), \
                                           v##P, &m##P);                                                 \
    }
#elif PYLLAMA_QBLOCKS_AVX2
#define PYLLAMA_LEGACY_ONE(P)                                                                           \
    {                                                                                                   \
        const __m256i xq = _mm256_loadu_si256((const __m256i*)(a[P].q + PYLLAMA_QK * b));               \
        const __m256i lanes = PL_HAS_MIN(kind) ? pyllama_lanes_u8(wq, xq) : pyllama_lanes_i8(wq, xq);   \
        const float d = pyllama_half_at(blk) * a[P].d[b];                                               \
        if (PL_HAS_MIN(kind)) m##P = fmaf(pyllama_half_at(blk + 2), a[P].s[b], m##P);                   \
        v##P = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(lanes), v##P);                     \
    }
#endif

static inline void pyllama_tile4_legacy(int kind, const uint8_t* w, const pyllama_qact* a, ptrdiff_t cols,
                                        float* out, ptrdiff_t out_stride) {
#if PYLLAMA_QBLOCKS_AVX512 || PYLLAMA_QBLOCKS_AVX2
    const ptrdiff_t nb = cols / PYLLAMA_QK, bytes = pyllama_legacy_bytes[kind];
    float m0 = 0.0f, m1 = 0.0f, m2 = 0.0f, m3 = 0.0f;
    __m256 v0 = _mm256_setzero_ps(), v1 = v0, v2 = v0, v3 = v0;
    ptrdiff_t b = 0;
#if PYLLAMA_QBLOCKS_AVX512
    for (; b + 1 < nb; b += 2) {
        const uint8_t* blk = w + bytes * b;
        pyllama_qprefetch(blk + PYLLAMA_QPREFETCH_AHEAD);
        const __m512i wq = pyllama_legacy_unpack2_avx512(kind, blk, blk + bytes);
        PYLLAMA_LEGACY_PAIR(0) PYLLAMA_LEGACY_PAIR(1) PYLLAMA_LEGACY_PAIR(2) PYLLAMA_LEGACY_PAIR(3)
    }
    if (b < nb) { /* an odd last block, as pyllama_dot_legacy takes it */
        const uint8_t* blk = w + bytes * b;
        v0 = pyllama_legacy_block_avx2(kind, blk, &a[0], b, v0, &m0);
        v1 = pyllama_legacy_block_avx2(kind, blk, &a[1], b, v1, &m1);
        v2 = pyllama_legacy_block_avx2(kind, blk, &a[2], b, v2, &m2);
        v3 = pyllama_legacy_block_avx2(kind, blk, &a[3], b, v3, &m3);
    }
#else
    for (; b < nb; b++) {
        const uint8_t* blk = w + bytes * b;
        if ((b & 1) == 0) pyllama_qprefetch(blk + PYLLAMA_QPREFETCH_AHEAD);
        const __m256i wq = pyllama_legacy_unpack_avx2(kind, blk);
        PYLLAMA_LEGACY_ONE(0) PYLLAMA_LEGACY_ONE(1) PYLLAMA_LEGACY_ONE(2) PYLLAMA_LEGACY_ONE(3)
    }
#endif
    float acc[8];
    _mm256_storeu_ps(acc, v0);
    out[0] = pyllama_qreduce8(acc) + m0;
    _mm256_storeu_ps(acc, v1);
    out[out_stride] = pyllama_qreduce8(acc) + m1;
    _mm256_storeu_ps(acc, v2);
    out[2 * out_stride] = pyllama_qreduce8(acc) + m2;
    _mm256_storeu_ps(acc, v3);
    out[3 * out_stride] = pyllama_qreduce8(acc) + m3;
#else
    for (int p = 0; p < 4; p++) out[p * out_stride] = pyllama_dot_legacy(kind, w, &a[p], cols);
#endif
}
#undef PYLLAMA_LEGACY_PAIR
#undef PYLLAMA_LEGACY_ONE

/* ggml_vec_dot_iq4_nl_q8_0's order (AVX2): blocks in pairs into two accumulators (even, odd), added
   lane-wise and reduced as hsum_float_8 does; an odd last block is added after that as
   total + (d_x * d_w) * (float)isum, two roundings. */
static inline float pyllama_dot_iq4_nl_pairs(const uint8_t* w, const pyllama_qact* a, ptrdiff_t cols) {
    const ptrdiff_t nb = cols / PYLLAMA_QK, bytes = pyllama_legacy_bytes[PYLLAMA_IQ4_NL];
    float a0[8], a1[8], mins = 0.0f;
    ptrdiff_t b = 0;
#if PYLLAMA_QBLOCKS_AVX512
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    for (; b + 1 < nb; b += 2) {
        const uint8_t* blk = w + bytes * b;
        pyllama_qprefetch(blk + PYLLAMA_QPREFETCH_AHEAD);
        const __m512i lanes = pyllama_legacy_pair_lanes(PYLLAMA_IQ4_NL, blk, blk + bytes, a, b);
        acc0 = pyllama_legacy_scale_avx512(PYLLAMA_IQ4_NL, blk, a, b, _mm512_castsi512_si256(lanes), acc0, &mins);
        acc1 = pyllama_legacy_scale_avx512(PYLLAMA_IQ4_NL, blk + bytes, a, b + 1, _mm512_extracti64x4_epi64(lanes, 1),
                                           acc1, &mins);
    }
    _mm256_storeu_ps(a0, acc0);
    _mm256_storeu_ps(a1, acc1);
#elif PYLLAMA_QBLOCKS_AVX2
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    for (; b + 1 < nb; b += 2) {
        const uint8_t* blk = w + bytes * b;
        pyllama_qprefetch(blk + PYLLAMA_QPREFETCH_AHEAD);
        acc0 = pyllama_legacy_block_avx2(PYLLAMA_IQ4_NL, blk, a, b, acc0, &mins);
        acc1 = pyllama_legacy_block_avx2(PYLLAMA_IQ4_NL, blk + bytes, a, b + 1, acc1, &mins);
    }
    _mm256_storeu_ps(a0, acc0);
    _mm256_storeu_ps(a1, acc1);
#else
    for (int l = 0; l < 8; l++) { a0[l] = 0.0f; a1[l] = 0.0f; }
    for (; b < nb - (nb & 1); b++) {
        const uint8_t* blk = w + bytes * b;
        if ((b & 1) == 0) pyllama_qprefetch(blk + PYLLAMA_QPREFETCH_AHEAD);
        pyllama_legacy_block_c(PYLLAMA_IQ4_NL, blk, a, b, (b & 1) ? a1 : a0, &mins);
    }
#endif
    for (int l = 0; l < 8; l++) a0[l] = a0[l] + a1[l];
    float total = pyllama_qreduce8(a0);
    if (b < nb) {
        const uint8_t* blk = w + bytes * b;
        int8_t wq[32];
        int32_t lo, hi;
        pyllama_legacy_unpack(PYLLAMA_IQ4_NL, blk, wq);
        pyllama_dot32_halves(wq, a->q + PYLLAMA_QK * b, &lo, &hi);
        /* ggml rounds this product before the add: volatile keeps the compiler from fusing them */
        volatile float tail = (a->d[b] * pyllama_half_at(blk)) * (float)(lo + hi);
        total = total + tail;
    }
    return total;
}

static float pyllama_dot_q4_0(const uint8_t* w, const pyllama_qact* a, ptrdiff_t n) {
    return pyllama_dot_legacy(PYLLAMA_Q4_0, w, a, n);
}
static float pyllama_dot_q4_1(const uint8_t* w, const pyllama_qact* a, ptrdiff_t n) {
    return pyllama_dot_legacy(PYLLAMA_Q4_1, w, a, n);
}
static float pyllama_dot_q5_0(const uint8_t* w, const pyllama_qact* a, ptrdiff_t n) {
    return pyllama_dot_legacy(PYLLAMA_Q5_0, w, a, n);
}
static float pyllama_dot_q5_1(const uint8_t* w, const pyllama_qact* a, ptrdiff_t n) {
    return pyllama_dot_legacy(PYLLAMA_Q5_1, w, a, n);
}
static float pyllama_dot_iq4_nl(const uint8_t* w, const pyllama_qact* a, ptrdiff_t n) {
    return pyllama_dot_iq4_nl_pairs(w, a, n);
}

static void pyllama_tile4_q4_1(const uint8_t* w, const pyllama_qact* a, ptrdiff_t n, float* out, ptrdiff_t stride) {
    pyllama_tile4_legacy(PYLLAMA_Q4_1, w, a, n, out, stride);
}
static void pyllama_tile4_q5_0(const uint8_t* w, const pyllama_qact* a, ptrdiff_t n, float* out, ptrdiff_t stride) {
    pyllama_tile4_legacy(PYLLAMA_Q5_0, w, a, n, out, stride);
}
static void pyllama_tile4_q5_1(const uint8_t* w, const pyllama_qact* a, ptrdiff_t n, float* out, ptrdiff_t stride) {
    pyllama_tile4_legacy(PYLLAMA_Q5_1, w, a, n, out, stride);
}

/* BF16 row times the float32 activation: 32 lanes (j mod 32), then the tail in order */
static float pyllama_dot_bf16(const uint8_t* wb, const pyllama_qact* a, ptrdiff_t n) {
    const uint16_t* w = (const uint16_t*)wb;
    const float* x = a->x;
    const ptrdiff_t n_main = n - n % 32;
    float l[32];
#if PYLLAMA_QBLOCKS_AVX512
    /* the same 32 lanes in two zmm registers: lane u is element j + u's chain */
    __m512 acc[2];
    for (int k = 0; k < 2; k++) acc[k] = _mm512_setzero_ps();
    for (ptrdiff_t j = 0; j < n_main; j += 32) {
        pyllama_qprefetch((const char*)(w + j) + PYLLAMA_QPREFETCH_AHEAD);
        for (int k = 0; k < 2; k++) {
            const __m512i h = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)(w + j + 16 * k)));
            acc[k] = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_slli_epi32(h, 16)),
                                     _mm512_loadu_ps(x + j + 16 * k), acc[k]);
        }
    }
    for (int k = 0; k < 2; k++) _mm512_storeu_ps(l + 16 * k, acc[k]);
#elif PYLLAMA_QBLOCKS_AVX2
    __m256 acc[4];
    for (int k = 0; k < 4; k++) acc[k] = _mm256_setzero_ps();
    for (ptrdiff_t j = 0; j < n_main; j += 32) {
        pyllama_qprefetch((const char*)(w + j) + PYLLAMA_QPREFETCH_AHEAD);
        for (int k = 0; k < 4; k++) {
            const __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)(w + j + 8 * k)));
            acc[k] = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(h, 16)),
                                     _mm256_loadu_ps(x + j + 8 * k), acc[k]);
        }
    }
    for (int k = 0; k < 4; k++) _mm256_storeu_ps(l + 8 * k, acc[k]);
#else
    for (int u = 0; u < 32; u++) l[u] = 0.0f;
    for (ptrdiff_t j = 0; j < n_main; j += 32) {
        pyllama_qprefetch((const char*)(w + j) + PYLLAMA_QPREFETCH_AHEAD);
        for (int u = 0; u < 32; u++) l[u] = fmaf(pyllama_bf2f(w[j + u]), x[j + u], l[u]);
    }
#endif
    for (int u = 0; u < 8; u++) l[u] = (l[u] + l[u + 8]) + (l[u + 16] + l[u + 24]);
    float total = pyllama_qreduce8(l);
    for (ptrdiff_t j = n_main; j < n; j++) total = fmaf(pyllama_bf2f(w[j]), x[j], total);
    return total;
}

/* a row as float32: w = d * q (+ m), one rounding each (fmaf for the offset types) */
static void pyllama_dequantize_legacy(int kind, const uint8_t* data, ptrdiff_t r, float* out, ptrdiff_t cols) {
    const uint8_t* row = data + r * pyllama_legacy_row_bytes(kind, cols);
    for (ptrdiff_t b = 0; b < cols / PYLLAMA_QK; b++) {
        const uint8_t* blk = row + pyllama_legacy_bytes[kind] * b;
        int8_t wq[32];
        pyllama_legacy_unpack(kind, blk, wq);
        const float d = pyllama_half_at(blk);
        const float m = PL_HAS_MIN(kind) ? pyllama_half_at(blk + 2) : 0.0f;
        for (int k = 0; k < 32; k++)
            out[PYLLAMA_QK * b + k] = PL_HAS_MIN(kind) ? fmaf(d, (float)wq[k], m) : d * (float)wq[k];
    }
}

#endif
