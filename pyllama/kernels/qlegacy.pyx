"""Products over ggml's 32-value block types and BF16, on their own blocks (never expanded to float32).

Block layouts (ggml-common.h), weight value per element:

* ``Q4_0`` (18 bytes): fp16 d, 16 bytes of nibbles; w = d * (q - 8). Activation: Q8_0.
* ``Q4_1`` (20 bytes): fp16 d, fp16 m, nibbles; w = d * q + m. Activation: Q8_1.
* ``Q5_0`` (22 bytes): fp16 d, 32 high bits, nibbles; w = d * (q - 16). Activation: Q8_0.
* ``Q5_1`` (24 bytes): fp16 d, fp16 m, 32 high bits, nibbles; w = d * q + m. Activation: Q8_1.
* ``IQ4_NL`` (18 bytes): fp16 d, nibbles indexing a 16-entry int8 table; w = d * table[q]. Activation: Q8_0.
* ``BF16``: bfloat16 rows, widened exactly to float32 as they are read. The activation stays float32
  (llama.cpp rounds it to BF16 for its BF16 products; as for F16, pyllama keeps the more accurate
  float32 and documents the difference). 32 float lanes (j mod 32) in a fixed reduction, then the
  last cols mod 32 products in order.

Low nibbles are the block's elements 0-15, high nibbles 16-31; high bit j of a 5-bit type is bit j
of the little-endian uint32. Per block, the integer products are summed exactly; the float part
follows, bit for bit, the kernel llama.cpp runs for the matrix on an AVX2 CPU (ggml-cpu's
arch/x86/quants.c and repack.cpp; checked against libggml-cpu's own ``vec_dot`` and
``gemv_q4_0_8x8_q8_0`` on random rows, and by tests/test_ggml_order.py):

* ``ggml_vec_dot_*`` (Q4_1, Q5_0, Q5_1; Q4_0 and IQ4_NL when the row count is not a multiple of 8):
  8 int32 lanes per block (lane l: elements 4l..4l+3), each converted to float32 and fused-multiply-
  added with ``d_w * d_x`` into ONE accumulator, block after block, then ``hsum_float_8``'s reduction
  ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)). For Q4_1/Q5_1 the offset term ``m_w * s_x`` (s = d_x * sum q_x,
  from the Q8_1 activation) is a fused chain over the blocks in order, added last.
* IQ4_NL's vec_dot takes blocks in pairs into two accumulators (even, odd), adds them lane-wise, reduces
  as above, and adds an odd last block as total + (d_x * d_w) * isum (two roundings).
* Q4_0 and IQ4_NL matrices whose row count is a multiple of 8 are repacked by llama.cpp into 8-row
  groups and multiplied by ``gemv/gemm_q4_0_8x8_q8_0`` (decode and prompt alike, the same arithmetic
  per element): per block the whole 32-product integer sum, then one float chain
  acc = fma((float)isum, d_w * d_x, acc). pyllama computes those matrices eight rows at a time
  (an eight-row ``RowProduct``), lane j of one vector being row j's chain, without repacking the mapped
  file: the activation block is loaded once for the eight rows and, for Q4_0, the nibbles are used
  unsigned, (q - 8)·x = q·x - 8·Σx, which is the same integer.

AVX2 (with FMA) and the portable C path compute the same integers and the same float operations (one
rounding per fused multiply-add: ``_mm256_fmadd_ps`` or ``fmaf``), so the two builds give identical
bits (checked: every type at several row counts and lengths, an AVX2 build against a portable one, bit
for bit); the tests compare either against gguf-py and the emulation of ggml's order. There is no
AVX-512 path here (an AVX-512 machine runs the AVX2 code, with the same bits).
"""

from libc.stdint cimport uint8_t

from pyllama.kernels.matvec cimport (Matrix, QTYPE_Q4_0, QTYPE_Q4_1, QTYPE_Q5_0, QTYPE_Q5_1,
                                     QTYPE_IQ4_NL, QTYPE_BF16)
from pyllama.kernels.qproduct cimport (
    pyllama_qact, row_dot_fn, group8_dot_fn, RowProduct, ACT_Q8_0, ACT_Q8_1, ACT_F32,
)

cdef extern from *:
    """
    #include "qblocks.h"

    enum { PL_Q4_0, PL_Q4_1, PL_Q5_0, PL_Q5_1, PL_IQ4_NL };
    static const int8_t pyllama_iq4nl_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                                    1, 13, 25, 38, 53, 69, 89, 113};
    static const int pyllama_legacy_bytes[5] = {18, 20, 22, 24, 18};
    static const int pyllama_legacy_qs[5] = {2, 4, 6, 8, 2};   /* where the nibbles start */
    static const int pyllama_legacy_qh[5] = {0, 0, 2, 4, 0};   /* where the high bits start */
    #define PL_HAS_MIN(kind) ((kind) == PL_Q4_1 || (kind) == PL_Q5_1)
    #define PL_HAS_HIGH(kind) ((kind) == PL_Q5_0 || (kind) == PL_Q5_1)

    /* a block's 32 integer weights, in element order */
    static inline void pyllama_legacy_unpack(int kind, const uint8_t* blk, int8_t* w) {
        const uint8_t* qs = blk + pyllama_legacy_qs[kind];
        uint32_t h = 0;
        if (PL_HAS_HIGH(kind)) memcpy(&h, blk + pyllama_legacy_qh[kind], 4);
        for (int j = 0; j < 16; j++) {
            int lo = qs[j] & 15, hi = qs[j] >> 4;
            if (PL_HAS_HIGH(kind)) { lo |= ((h >> j) & 1) << 4; hi |= ((h >> (j + 16)) & 1) << 4; }
            if (kind == PL_Q4_0) { lo -= 8; hi -= 8; }
            if (kind == PL_Q5_0) { lo -= 16; hi -= 16; }
            if (kind == PL_IQ4_NL) { lo = pyllama_iq4nl_values[lo]; hi = pyllama_iq4nl_values[hi]; }
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
        if (kind == PL_Q4_0) w = _mm256_sub_epi8(w, _mm256_set1_epi8(8));
        if (kind == PL_Q5_0) w = _mm256_sub_epi8(w, _mm256_set1_epi8(16));
        if (kind == PL_IQ4_NL)
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

    static inline ptrdiff_t pyllama_legacy_row_bytes(int kind, ptrdiff_t cols) {
        return cols / PYLLAMA_QK * pyllama_legacy_bytes[kind];
    }

    /* ggml's vec_dot order (ggml_vec_dot_q4_0_q8_0 and friends on AVX2): one accumulator of 8 float
       lanes, acc = fma(d_w * d_x, lanes, acc) block after block, then hsum_float_8's reduction; the
       Q4_1/Q5_1 offset term is a float sum over the blocks in order, added last. */
    static inline float pyllama_dot_legacy(int kind, const uint8_t* w, const pyllama_qact* a, ptrdiff_t cols) {
        const ptrdiff_t nb = cols / PYLLAMA_QK, bytes = pyllama_legacy_bytes[kind];
        float acc[8], mins = 0.0f;
    #if PYLLAMA_QBLOCKS_AVX2
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

    /* ggml_vec_dot_iq4_nl_q8_0's order (AVX2): blocks in pairs into two accumulators (even, odd), added
       lane-wise and reduced as hsum_float_8 does; an odd last block is added after that as
       total + (d_x * d_w) * (float)isum, two roundings. */
    static inline float pyllama_dot_iq4_nl_pairs(const uint8_t* w, const pyllama_qact* a, ptrdiff_t cols) {
        const ptrdiff_t nb = cols / PYLLAMA_QK, bytes = pyllama_legacy_bytes[PL_IQ4_NL];
        float a0[8], a1[8], mins = 0.0f;
        ptrdiff_t b = 0;
    #if PYLLAMA_QBLOCKS_AVX2
        __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
        for (; b + 1 < nb; b += 2) {
            const uint8_t* blk = w + bytes * b;
            pyllama_qprefetch(blk + PYLLAMA_QPREFETCH_AHEAD);
            acc0 = pyllama_legacy_block_avx2(PL_IQ4_NL, blk, a, b, acc0, &mins);
            acc1 = pyllama_legacy_block_avx2(PL_IQ4_NL, blk + bytes, a, b + 1, acc1, &mins);
        }
        _mm256_storeu_ps(a0, acc0);
        _mm256_storeu_ps(a1, acc1);
    #else
        for (int l = 0; l < 8; l++) { a0[l] = 0.0f; a1[l] = 0.0f; }
        for (; b < nb - (nb & 1); b++) {
            const uint8_t* blk = w + bytes * b;
            if ((b & 1) == 0) pyllama_qprefetch(blk + PYLLAMA_QPREFETCH_AHEAD);
            pyllama_legacy_block_c(PL_IQ4_NL, blk, a, b, (b & 1) ? a1 : a0, &mins);
        }
    #endif
        for (int l = 0; l < 8; l++) a0[l] = a0[l] + a1[l];
        float total = pyllama_qreduce8(a0);
        if (b < nb) {
            const uint8_t* blk = w + bytes * b;
            int8_t wq[32];
            int32_t lo, hi;
            pyllama_legacy_unpack(PL_IQ4_NL, blk, wq);
            pyllama_dot32_halves(wq, a->q + PYLLAMA_QK * b, &lo, &hi);
            /* ggml rounds this product before the add: volatile keeps the compiler from fusing them */
            volatile float tail = (a->d[b] * pyllama_half_at(blk)) * (float)(lo + hi);
            total = total + tail;
        }
        return total;
    }

    /* ggml's order for the weights it repacks into 8-row groups on AVX2 (Q4_0 and IQ4_NL when the row
       count is a multiple of 8: gemv/gemm_q4_0_8x8_q8_0): per block the whole 32-product integer sum
       (exact), then one float chain acc = fma((float)isum, d_w * d_x, acc) over the blocks in order. */
    static inline float pyllama_dot_legacy_chain(int kind, const uint8_t* w, const pyllama_qact* a, ptrdiff_t cols) {
        const ptrdiff_t nb = cols / PYLLAMA_QK, bytes = pyllama_legacy_bytes[kind];
        float acc = 0.0f;
        for (ptrdiff_t b = 0; b < nb; b++) {
            const uint8_t* blk = w + bytes * b;
            if ((b & 1) == 0) pyllama_qprefetch(blk + PYLLAMA_QPREFETCH_AHEAD);
            int32_t lo, hi;
    #if PYLLAMA_QBLOCKS_AVX2
            const __m256i l = pyllama_lanes_i8(pyllama_legacy_unpack_avx2(kind, blk),
                                               _mm256_loadu_si256((const __m256i*)(a->q + PYLLAMA_QK * b)));
            lo = pyllama_hsum_i32x4(_mm256_castsi256_si128(l));
            hi = pyllama_hsum_i32x4(_mm256_extracti128_si256(l, 1));
    #else
            int8_t wq[32];
            pyllama_legacy_unpack(kind, blk, wq);
            pyllama_dot32_halves(wq, a->q + PYLLAMA_QK * b, &lo, &hi);
    #endif
            acc = fmaf((float)(lo + hi), pyllama_half_at(blk) * a->d[b], acc);
        }
        return acc;
    }

    static inline short pyllama_i16_at(const uint8_t* p) {
        short v;
        memcpy(&v, p, 2);
        return v;
    }

    /* Eight consecutive rows at once in the chain order above (lane j = row j, so each lane is exactly
       pyllama_dot_legacy_chain of its row): per block, the eight 32-product integer sums are reduced
       into one vector (hadd, exact), scaled by the eight d_w * d_x and fused-multiply-added into the
       eight chains. The activation block is loaded once for the eight rows; the next group of rows is
       prefetched as a linear stream. out[0..7] are rows w, w + row_bytes, ... */
    static void pyllama_dot8_legacy_chain(int kind, const uint8_t* w, ptrdiff_t row_bytes, const pyllama_qact* a,
                                          ptrdiff_t cols, float* out) {
        const ptrdiff_t nb = cols / PYLLAMA_QK, bytes = pyllama_legacy_bytes[kind];
    #if PYLLAMA_QBLOCKS_AVX2 && defined(__F16C__)
        const uint8_t* next = w + 8 * row_bytes;
        const __m256i ones16 = _mm256_set1_epi16(1);
        __m256 acc = _mm256_setzero_ps();
        for (ptrdiff_t b = 0; b < nb; b++) {
            pyllama_qprefetch(next + 144 * b);
            pyllama_qprefetch(next + 144 * b + 64);
            pyllama_qprefetch(next + 144 * b + 128);
            const __m256i xq = _mm256_loadu_si256((const __m256i*)(a->q + PYLLAMA_QK * b));
            __m256i l[8];
            for (int j = 0; j < 8; j++) {
                const uint8_t* blk = w + j * row_bytes + bytes * b;
                if (kind == PL_Q4_0) {
                    /* (q - 8) x = q x - 8 x: unsigned nibbles need no sign trick; 8 * sum(x) comes off below.
                       The 16 bytes in both halves, the high half shifted by 4: low nibbles, then high. */
                    const __m256i packed = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)(blk + 2)));
                    const __m256i q = _mm256_and_si256(_mm256_srlv_epi64(packed, _mm256_set_epi64x(4, 4, 0, 0)),
                                                       _mm256_set1_epi8(15));
                    l[j] = _mm256_madd_epi16(_mm256_maddubs_epi16(q, xq), ones16);
                } else {
                    l[j] = pyllama_lanes_i8(pyllama_legacy_unpack_avx2(kind, blk), xq);
                }
            }
            const __m256i s0123 = _mm256_hadd_epi32(_mm256_hadd_epi32(l[0], l[1]), _mm256_hadd_epi32(l[2], l[3]));
            const __m256i s4567 = _mm256_hadd_epi32(_mm256_hadd_epi32(l[4], l[5]), _mm256_hadd_epi32(l[6], l[7]));
            __m256i isum = _mm256_add_epi32(_mm256_permute2x128_si256(s0123, s4567, 0x20),
                                            _mm256_permute2x128_si256(s0123, s4567, 0x31));
            if (kind == PL_Q4_0) {
                const __m256i lx = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), xq), ones16);
                const __m128i x4 = _mm_add_epi32(_mm256_castsi256_si128(lx), _mm256_extracti128_si256(lx, 1));
                isum = _mm256_sub_epi32(isum, _mm256_set1_epi32(8 * pyllama_hsum_i32x4(x4)));
            }
            const uint8_t* d0 = w + bytes * b;
            const __m256 dw = _mm256_cvtph_ps(_mm_set_epi16(
                pyllama_i16_at(d0 + 7 * row_bytes), pyllama_i16_at(d0 + 6 * row_bytes),
                pyllama_i16_at(d0 + 5 * row_bytes), pyllama_i16_at(d0 + 4 * row_bytes),
                pyllama_i16_at(d0 + 3 * row_bytes), pyllama_i16_at(d0 + 2 * row_bytes),
                pyllama_i16_at(d0 + row_bytes), pyllama_i16_at(d0)));
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(dw, _mm256_set1_ps(a->d[b])), acc);
        }
        _mm256_storeu_ps(out, acc);
    #else
        (void)nb;
        (void)bytes;
        for (int j = 0; j < 8; j++) out[j] = pyllama_dot_legacy_chain(kind, w + j * row_bytes, a, cols);
    #endif
    }
    static void pyllama_dot8_q4_0_chain(const uint8_t* w, ptrdiff_t row_bytes, const pyllama_qact* a, ptrdiff_t n,
                                        float* out) {
        pyllama_dot8_legacy_chain(PL_Q4_0, w, row_bytes, a, n, out);
    }
    static void pyllama_dot8_iq4_nl_chain(const uint8_t* w, ptrdiff_t row_bytes, const pyllama_qact* a,
                                          ptrdiff_t n, float* out) {
        pyllama_dot8_legacy_chain(PL_IQ4_NL, w, row_bytes, a, n, out);
    }

    static float pyllama_dot_q4_0(const uint8_t* w, const pyllama_qact* a, ptrdiff_t n) {
        return pyllama_dot_legacy(PL_Q4_0, w, a, n);
    }
    static float pyllama_dot_q4_1(const uint8_t* w, const pyllama_qact* a, ptrdiff_t n) {
        return pyllama_dot_legacy(PL_Q4_1, w, a, n);
    }
    static float pyllama_dot_q5_0(const uint8_t* w, const pyllama_qact* a, ptrdiff_t n) {
        return pyllama_dot_legacy(PL_Q5_0, w, a, n);
    }
    static float pyllama_dot_q5_1(const uint8_t* w, const pyllama_qact* a, ptrdiff_t n) {
        return pyllama_dot_legacy(PL_Q5_1, w, a, n);
    }
    static float pyllama_dot_iq4_nl(const uint8_t* w, const pyllama_qact* a, ptrdiff_t n) {
        return pyllama_dot_iq4_nl_pairs(w, a, n);
    }

    /* BF16 row times the float32 activation: 32 lanes (j mod 32), then the tail in order */
    static float pyllama_dot_bf16(const uint8_t* wb, const pyllama_qact* a, ptrdiff_t n) {
        const uint16_t* w = (const uint16_t*)wb;
        const float* x = a->x;
        const ptrdiff_t n_main = n - n % 32;
        float l[32];
    #if PYLLAMA_QBLOCKS_AVX2
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
    """
    int PL_Q4_0, PL_Q4_1, PL_Q5_0, PL_Q5_1, PL_IQ4_NL
    float dot_q4_0 "pyllama_dot_q4_0"(const uint8_t* w, const pyllama_qact* a, Py_ssize_t n) noexcept nogil
    float dot_q4_1 "pyllama_dot_q4_1"(const uint8_t* w, const pyllama_qact* a, Py_ssize_t n) noexcept nogil
    float dot_q5_0 "pyllama_dot_q5_0"(const uint8_t* w, const pyllama_qact* a, Py_ssize_t n) noexcept nogil
    float dot_q5_1 "pyllama_dot_q5_1"(const uint8_t* w, const pyllama_qact* a, Py_ssize_t n) noexcept nogil
    float dot_iq4_nl "pyllama_dot_iq4_nl"(const uint8_t* w, const pyllama_qact* a, Py_ssize_t n) noexcept nogil
    void dot8_q4_0_chain "pyllama_dot8_q4_0_chain"(const uint8_t* w, Py_ssize_t row_bytes, const pyllama_qact* a,
                                                   Py_ssize_t n, float* out) noexcept nogil
    void dot8_iq4_nl_chain "pyllama_dot8_iq4_nl_chain"(const uint8_t* w, Py_ssize_t row_bytes, const pyllama_qact* a,
                                                       Py_ssize_t n, float* out) noexcept nogil
    float dot_bf16 "pyllama_dot_bf16"(const uint8_t* w, const pyllama_qact* a, Py_ssize_t n) noexcept nogil
    void dequantize_legacy "pyllama_dequantize_legacy"(int kind, const uint8_t* data, Py_ssize_t row, float* out,
                                                       Py_ssize_t cols) noexcept nogil
    Py_ssize_t legacy_row_bytes "pyllama_legacy_row_bytes"(int kind, Py_ssize_t cols) noexcept nogil
    float bf16_to_float "pyllama_bf2f"(unsigned short h) noexcept nogil


cdef inline int legacy_kind(int qtype) noexcept nogil:
    if qtype == QTYPE_Q4_0:
        return PL_Q4_0
    if qtype == QTYPE_Q4_1:
        return PL_Q4_1
    if qtype == QTYPE_Q5_0:
        return PL_Q5_0
    if qtype == QTYPE_Q5_1:
        return PL_Q5_1
    return PL_IQ4_NL


cdef RowProduct qlegacy_product(const Matrix* m) noexcept nogil:
    """How a matrix of this module's types is multiplied (dispatch on m.qtype)."""
    cdef RowProduct plan
    plan.dot, plan.dot8, plan.act = <row_dot_fn>dot_q4_0, NULL, ACT_Q8_0
    plan.row_bytes = legacy_row_bytes(legacy_kind(m.qtype), m.cols) if m.qtype != QTYPE_BF16 else m.cols * 2
    # llama.cpp repacks Q4_0 and IQ4_NL matrices whose row count is a multiple of 8 (see the docstring)
    if m.rows % 8 == 0 and (m.qtype == QTYPE_Q4_0 or m.qtype == QTYPE_IQ4_NL):
        plan.dot8 = <group8_dot_fn>(dot8_q4_0_chain if m.qtype == QTYPE_Q4_0 else dot8_iq4_nl_chain)
    if m.qtype == QTYPE_BF16:
        plan.dot, plan.act = <row_dot_fn>dot_bf16, ACT_F32
    elif m.qtype == QTYPE_Q4_1:
        plan.dot, plan.act = <row_dot_fn>dot_q4_1, ACT_Q8_1
    elif m.qtype == QTYPE_Q5_0:
        plan.dot = <row_dot_fn>dot_q5_0
    elif m.qtype == QTYPE_Q5_1:
        plan.dot, plan.act = <row_dot_fn>dot_q5_1, ACT_Q8_1
    elif m.qtype == QTYPE_IQ4_NL:
        plan.dot = <row_dot_fn>dot_iq4_nl
    return plan


cdef void dequantize_row_qlegacy(float* out, const Matrix* m, Py_ssize_t row) noexcept nogil:
    """out[cols] = row ``row`` of m as float32 (the token embedding lookup)."""
    cdef Py_ssize_t j
    cdef const unsigned short* h
    if m.qtype == QTYPE_BF16:
        h = (<const unsigned short*>m.data) + row * m.cols
        for j in range(m.cols):
            out[j] = bf16_to_float(h[j])
        return
    dequantize_legacy(legacy_kind(m.qtype), <const uint8_t*>m.data, row, out, m.cols)
