/* Packed copies of weight matrices: the rows of a matrix interleaved in groups of 16, so that a product
 * takes 16 rows in the lanes of one vector.
 *
 * Why: in the file's layout a row is a stream of blocks, and a vector instruction works on the values of
 * one row: the integer sums of a block sit in lanes that must be reduced across the vector before they
 * meet the float scales, and a block product spends more instructions moving lanes than multiplying.
 * In a packed group, the bytes of 16 rows that the same 4 weights occupy are side by side (64 bytes: one
 * zmm, or two ymm), so one vpdpbusd with the activation's 4 bytes broadcast gives 16 rows' 4-term sums,
 * lane r being row r; the scales of the 16 rows are one vector too, and nothing is reduced across lanes.
 * A group is read as one stream (decode), and in a block of positions each unpacked weight vector serves
 * several positions (prompts). llama.cpp repacks Q4_0 / Q4_K / IQ4_NL matrices for the same reason
 * (ggml-cpu/repack.cpp, eight rows per group).
 *
 * The packed layouts (qpacked_legacy.h: Q4_0 and Q5_0; qpacked_kquants.h: Q4_K, Q5_K and Q6_K) hold the
 * same values as the file's blocks, moved (Q4_K's scales unpacked, Q6_K's codes one to a byte; a block
 * product expands Q4_K's and Q5_K's codes to bytes group by group, qpacked_kcodes.h); the
 * arithmetic of every element is its type's (named there), so a
 * matrix multiplied from its packed copy and one multiplied from the mapped file give the same bits, and
 * the tests hold them equal.
 * A matrix whose row count is not a multiple of 16 has its last group padded with zero rows, whose
 * outputs are never stored.
 *
 * The copy is made lazily, once per matrix and process, on the first product that needs it
 * (qproduct.pyx's PackedCopy, which the tensor keeps; PYLLAMA_REPACK=off keeps every product on the
 * mapped file).
 *
 * The vector layer below is what lets each kernel be written once: a "vector" is LANES rows' 4-byte
 * slots (16 in a zmm, 8 in a ymm, 1 in a uint32 on the portable path), and a group of 16 rows is 16 /
 * LANES parts. Every integer is exact whatever the width, and the float operations are the same
 * operations on each lane (one rounding each: _mm*_fmadd_ps or fmaf), so every path gives the same bits.
 */
#ifndef PYLLAMA_QPACKED_H
#define PYLLAMA_QPACKED_H

#include "qblocks.h"

#define PYLLAMA_PACK_ROWS 16 /* rows per packed group */

static inline ptrdiff_t pyllama_pack_groups(ptrdiff_t rows) { return (rows + PYLLAMA_PACK_ROWS - 1) / PYLLAMA_PACK_ROWS; }

/* A matrix's packed copy is published once, by the thread that made it: its pointer is written before
   its state, which readers take with acquire order, so that one who sees it ready sees the bytes. */
static inline int pyllama_slot_state(const int* state) { return __atomic_load_n(state, __ATOMIC_ACQUIRE); }
static inline void pyllama_slot_publish(int* state, int value) { __atomic_store_n(state, value, __ATOMIC_RELEASE); }

/* every group of m packed into out, by n_threads OpenMP threads */
static void pyllama_pack_all(pyllama_pack_fn pack, const pyllama_matrix* m, uint8_t* out, int n_threads) {
    const ptrdiff_t n = pyllama_pack_groups(m->rows);
#if defined(_OPENMP)
#pragma omp parallel for num_threads(n_threads) schedule(static)
#endif
    for (ptrdiff_t g = 0; g < n; g++) pack(m, g, g + 1, out);
    (void)n_threads;
}

static inline int32_t pyllama_i32_at(const void* p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

#if PYLLAMA_QBLOCKS_AVX512
#define PV_LANES 16
typedef __m512i pv_i;
typedef __m512 pv_f;
#define PV_LOAD(p) _mm512_loadu_si512((const void*)(p))
#define PV_STORE_I(p, v) _mm512_storeu_si512((void*)(p), v)
#define PV_ZERO() _mm512_setzero_si512()
#define PV_ZEROF() _mm512_setzero_ps()
#define PV_SET8(c) _mm512_set1_epi8((char)(c))
#define PV_SET32(v) _mm512_set1_epi32((int)(v))
#define PV_AND(a, b) _mm512_and_si512(a, b)
#define PV_OR(a, b) _mm512_or_si512(a, b)
#define PV_SRL16(a, n) _mm512_srli_epi16(a, n)
#define PV_SLL16(a, n) _mm512_slli_epi16(a, n)
#define PV_ADD32(a, b) _mm512_add_epi32(a, b)
#define PV_SUB32(a, b) _mm512_sub_epi32(a, b)
#define PV_MUL32(a, b) _mm512_mullo_epi32(a, b)
#define PV_SLL32(a, n) _mm512_slli_epi32(a, n)
#define PV_CVT(a) _mm512_cvtepi32_ps(a)
#define PV_SETF(v) _mm512_set1_ps(v)
#define PV_MULF(a, b) _mm512_mul_ps(a, b)
#define PV_ADDF(a, b) _mm512_add_ps(a, b)
#define PV_SUBF(a, b) _mm512_sub_ps(a, b)
#define PV_FMA(a, b, c) _mm512_fmadd_ps(a, b, c)
/* the lanes' 16 fp16 / unsigned and signed bytes, widened */
#define PV_HALVES(p) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(p)))
#define PV_U8(p) _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(p)))
#define PV_I8(p) _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(p)))
/* 32 bytes (two per lane) as the lanes' int16 pairs */
#define PV_U8PAIRS(p) _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i*)(p)))
#define PV_I8PAIRS(p) _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i*)(p)))
static inline void pv_store(float* out, pv_f v, int n) {
    if (n >= 16) _mm512_storeu_ps(out, v);
    else _mm512_mask_storeu_ps(out, (__mmask16)((1u << n) - 1), v);
}
/* v + add in the bytes whose bit is set in a 64-bit mask of a group's 16 rows (bit 4r + k: row r, byte
   k), starting at bit `bit0` (the part's first row times 4) */
static inline pv_i pv_add_where(pv_i v, const uint8_t* mask, int bit0, pv_i add) {
    uint64_t m;
    (void)bit0;
    memcpy(&m, mask, 8);
    return _mm512_mask_add_epi8(v, (__mmask64)m, v, add);
}
#elif PYLLAMA_QBLOCKS_AVX2
#define PV_LANES 8
typedef __m256i pv_i;
typedef __m256 pv_f;
#define PV_LOAD(p) _mm256_loadu_si256((const __m256i*)(p))
#define PV_STORE_I(p, v) _mm256_storeu_si256((__m256i*)(p), v)
#define PV_ZERO() _mm256_setzero_si256()
#define PV_ZEROF() _mm256_setzero_ps()
#define PV_SET8(c) _mm256_set1_epi8((char)(c))
#define PV_SET32(v) _mm256_set1_epi32((int)(v))
#define PV_AND(a, b) _mm256_and_si256(a, b)
#define PV_OR(a, b) _mm256_or_si256(a, b)
#define PV_SRL16(a, n) _mm256_srli_epi16(a, n)
#define PV_SLL16(a, n) _mm256_slli_epi16(a, n)
#define PV_ADD32(a, b) _mm256_add_epi32(a, b)
#define PV_SUB32(a, b) _mm256_sub_epi32(a, b)
#define PV_MUL32(a, b) _mm256_mullo_epi32(a, b)
#define PV_SLL32(a, n) _mm256_slli_epi32(a, n)
#define PV_CVT(a) _mm256_cvtepi32_ps(a)
#define PV_SETF(v) _mm256_set1_ps(v)
#define PV_MULF(a, b) _mm256_mul_ps(a, b)
#define PV_ADDF(a, b) _mm256_add_ps(a, b)
#define PV_SUBF(a, b) _mm256_sub_ps(a, b)
#define PV_FMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define PV_HALVES(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(p)))
#define PV_U8(p) _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(p)))
#define PV_I8(p) _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)(p)))
#define PV_U8PAIRS(p) _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i*)(p)))
#define PV_I8PAIRS(p) _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(p)))
static inline void pv_store(float* out, pv_f v, int n) {
    if (n >= 8) {
        _mm256_storeu_ps(out, v);
        return;
    }
    float t[8];
    _mm256_storeu_ps(t, v);
    for (int r = 0; r < n; r++) out[r] = t[r];
}
static inline pv_i pv_add_where(pv_i v, const uint8_t* mask, int bit0, pv_i add) {
    uint32_t m;
    memcpy(&m, mask + bit0 / 8, 4);
    /* byte k takes byte k / 8 of m, then keeps bit k % 8: 0xFF where it is set */
    const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32((int)m),
        _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0));
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    return _mm256_add_epi8(v, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit), add));
}
#else
/* the portable path: one lane, the 4 bytes of one row in a uint32 (little-endian: byte k is bits 8k..);
   the 16-bit shifts of the vector paths become 32-bit ones, which differ only in bits that every use masks */
#define PV_LANES 1
typedef uint32_t pv_i;
typedef float pv_f;
#define PV_LOAD(p) ((uint32_t)pyllama_i32_at(p))
#define PV_STORE_I(p, v) pv_store_i(p, v)
static inline void pv_store_i(uint8_t* p, uint32_t v) { memcpy(p, &v, 4); }
#define PV_ZERO() 0u
#define PV_ZEROF() 0.0f
#define PV_SET8(c) (0x01010101u * (uint8_t)(c))
#define PV_SET32(v) ((uint32_t)(int32_t)(v))
#define PV_AND(a, b) ((a) & (b))
#define PV_OR(a, b) ((a) | (b))
#define PV_SRL16(a, n) ((a) >> (n))
#define PV_SLL16(a, n) ((a) << (n))
#define PV_ADD32(a, b) ((uint32_t)((int32_t)(a) + (int32_t)(b)))
#define PV_SUB32(a, b) ((uint32_t)((int32_t)(a) - (int32_t)(b)))
#define PV_MUL32(a, b) ((uint32_t)((int32_t)(a) * (int32_t)(b)))
#define PV_SLL32(a, n) ((uint32_t)((int32_t)(a) * (1 << (n))))
#define PV_CVT(a) ((float)(int32_t)(a))
#define PV_SETF(v) (v)
#define PV_MULF(a, b) ((a) * (b))
#define PV_ADDF(a, b) ((a) + (b))
#define PV_SUBF(a, b) ((a) - (b))
#define PV_FMA(a, b, c) fmaf(a, b, c)
static inline float pv_half_at(const void* p) { return pyllama_half_at((const uint8_t*)p); }
#define PV_HALVES(p) pv_half_at(p)
#define PV_U8(p) ((uint32_t) * (const uint8_t*)(p))
#define PV_I8(p) ((uint32_t)(int32_t) * (const int8_t*)(p))
/* the lane's int16 pair: byte 0 in the low half, byte 1 in the high */
#define PV_U8PAIRS(p) ((uint32_t)((const uint8_t*)(p))[0] | ((uint32_t)((const uint8_t*)(p))[1] << 16))
#define PV_I8PAIRS(p) ((uint32_t)(uint16_t)(int16_t)((const int8_t*)(p))[0] | \
                       ((uint32_t)(uint16_t)(int16_t)((const int8_t*)(p))[1] << 16))
static inline void pv_store(float* out, pv_f v, int n) {
    if (n >= 1) *out = v;
}
static inline pv_i pv_add_where(pv_i v, const uint8_t* mask, int bit0, pv_i add) {
    const unsigned m = (mask[bit0 / 8] >> (bit0 % 8)) & 15; /* the lane's 4 bits: its 4 bytes */
    uint32_t sel = 0;
    for (int k = 0; k < 4; k++)
        if (m & (1u << k)) sel |= 0xFFu << (8 * k);
    /* bytes of v stay below 256 - add: a bytewise add without carries is the word add */
    return v + (add & sel);
}
#endif

/* acc + sum over 4 bytes of u8 u times s8 s in each 4-byte lane (exact in int32 at the weights' sizes:
   |u| <= 63, |s| <= 127, so maddubs' int16 pair sums never saturate) */
#if PYLLAMA_QBLOCKS_AVX512 && PYLLAMA_QBLOCKS_VNNI
#define PV_DOT4(acc, u, s) _mm512_dpbusd_epi32(acc, u, s)
#define PV_DOT2(acc, a, b) _mm512_dpwssd_epi32(acc, a, b)
#elif PYLLAMA_QBLOCKS_AVX512
#define PV_DOT4(acc, u, s) _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(u, s), _mm512_set1_epi16(1)))
#define PV_DOT2(acc, a, b) _mm512_add_epi32(acc, _mm512_madd_epi16(a, b))
#elif PYLLAMA_QBLOCKS_AVX2 && PYLLAMA_QBLOCKS_VNNI
#define PV_DOT4(acc, u, s) _mm256_dpbusd_epi32(acc, u, s)
#define PV_DOT2(acc, a, b) _mm256_dpwssd_epi32(acc, a, b)
#elif PYLLAMA_QBLOCKS_AVX2
#define PV_DOT4(acc, u, s) _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)))
#define PV_DOT2(acc, a, b) _mm256_add_epi32(acc, _mm256_madd_epi16(a, b))
#else
static inline uint32_t pv_dot4(uint32_t acc, uint32_t u, uint32_t s) {
    int32_t sum = (int32_t)acc;
    for (int k = 0; k < 4; k++) sum += (int32_t)((u >> (8 * k)) & 255) * (int32_t)(int8_t)(s >> (8 * k));
    return (uint32_t)sum;
}
/* acc + a.lo16 * b.lo16 + a.hi16 * b.hi16, the int16 halves signed */
static inline uint32_t pv_dot2(uint32_t acc, uint32_t a, uint32_t b) {
    return (uint32_t)((int32_t)acc + (int32_t)(int16_t)a * (int16_t)b + (int32_t)(int16_t)(a >> 16) * (int16_t)(b >> 16));
}
#define PV_DOT4(acc, u, s) pv_dot4(acc, u, s)
#define PV_DOT2(acc, a, b) pv_dot2(acc, a, b)
#endif

/* Without VNNI, PV_DOT2 is a multiply and an add, and gcc regroups a chain of such integer adds into a
   tree of products held at once, which spills past AVX2's 16 registers: an empty asm on the running sum
   after each step keeps the chain (the sum is the same in any order) */
#if PYLLAMA_QBLOCKS_AVX2 && !PYLLAMA_QBLOCKS_VNNI && !PYLLAMA_QBLOCKS_AVX512
#define PV_KEEP(x) __asm__("" : "+x"(x))
#else
#define PV_KEEP(x) ((void)0)
#endif

/* the int16 sums of each lane's byte pairs (u8 u times s8 s; bytes 0-1 in the low half, 2-3 in the
   high): exact where |u| <= 63, |s| <= 128, as every caller's are; and a lane's value (0 <= v < 2^15 or
   a sign-extended int16) in both int16 halves, so that PV_DOT2 with it scales the two pair sums alike */
#if PYLLAMA_QBLOCKS_AVX512
#define PV_MADDUBS(u, s) _mm512_maddubs_epi16(u, s)
#define PV_DUP16(v) _mm512_or_si512(_mm512_and_si512(v, _mm512_set1_epi32(0xFFFF)), _mm512_slli_epi32(v, 16))
#elif PYLLAMA_QBLOCKS_AVX2
#define PV_MADDUBS(u, s) _mm256_maddubs_epi16(u, s)
#define PV_DUP16(v) _mm256_or_si256(_mm256_and_si256(v, _mm256_set1_epi32(0xFFFF)), _mm256_slli_epi32(v, 16))
#else
static inline uint32_t pv_maddubs(uint32_t u, uint32_t s) {
    int32_t half[2];
    for (int h = 0; h < 2; h++) {
        half[h] = 0;
        for (int k = 2 * h; k < 2 * h + 2; k++) half[h] += (int32_t)((u >> (8 * k)) & 255) * (int32_t)(int8_t)(s >> (8 * k));
    }
    return (uint32_t)(uint16_t)(int16_t)half[0] | ((uint32_t)(uint16_t)(int16_t)half[1] << 16);
}
#define PV_MADDUBS(u, s) pv_maddubs(u, s)
#define PV_DUP16(v) (((v) & 0xFFFFu) | ((v) << 16))
#endif

/* the activation's 4 int8 values at element e of a position (a pyllama_qact), in every lane */
#define PV_X4(a, e) PV_SET32(pyllama_i32_at((a).q + (e)))

/* The products of a packed matrix, in units of one group of 16 rows: the type's tile function
   TILE(group, n_blocks, acts, P, out, out_stride, n_rows) computes the group's rows at P positions
   (P a constant after inlining: 1 for decode, PT in a block, 1 for the positions left over), writing
   only its first n_rows rows. Every element is the same arithmetic whatever P. */
#define PYLLAMA_PACKED_PRODUCTS(name, TILE, PT, BLOCK, GROUP_BLOCK_BYTES)                                      \
    __attribute__((unused)) static void pyllama_pvec_##name(const pyllama_matrix* m, ptrdiff_t u0, ptrdiff_t u1, \
                                                            const pyllama_acts* a, float* out) {                \
        const ptrdiff_t nb = m->cols / (BLOCK), group_bytes = nb * (GROUP_BLOCK_BYTES);                         \
        const uint8_t* w = (const uint8_t*)m->packed;                                                           \
        const pyllama_qact a0 = pyllama_act_at(a, 0);                                                          \
        for (ptrdiff_t u = u0; u < u1; u++) {                                                                   \
            const ptrdiff_t r0 = PYLLAMA_PACK_ROWS * u;                                                         \
            const int n_rows = (int)(m->rows - r0 < PYLLAMA_PACK_ROWS ? m->rows - r0 : PYLLAMA_PACK_ROWS);       \
            TILE(w + u * group_bytes, nb, &a0, 1, out + r0, 0, n_rows);                                         \
        }                                                                                                       \
    }                                                                                                           \
    static void pyllama_pmat_##name(const pyllama_matrix* m, ptrdiff_t u0, ptrdiff_t u1, const pyllama_acts* acts, \
                                    float* out) {                                                               \
        const pyllama_acts own = *acts, *a = &own;                                                             \
        const ptrdiff_t nb = m->cols / (BLOCK), group_bytes = nb * (GROUP_BLOCK_BYTES), rows = m->rows;         \
        const uint8_t* w = (const uint8_t*)m->packed;                                                           \
        pyllama_qact at[PT];                                                                                    \
        for (ptrdiff_t u = u0; u < u1; u++) {                                                                   \
            const ptrdiff_t r0 = PYLLAMA_PACK_ROWS * u;                                                         \
            const int n_rows = (int)(rows - r0 < PYLLAMA_PACK_ROWS ? rows - r0 : PYLLAMA_PACK_ROWS);             \
            ptrdiff_t p = 0;                                                                                    \
            for (; p + (PT) <= a->n_pos; p += (PT)) {                                                           \
                for (int k = 0; k < (PT); k++) at[k] = pyllama_act_at(a, p + k);                                \
                TILE(w + u * group_bytes, nb, at, PT, out + p * rows + r0, rows, n_rows);                       \
            }                                                                                                   \
            for (; p < a->n_pos; p++) {                                                                         \
                at[0] = pyllama_act_at(a, p);                                                                   \
                TILE(w + u * group_bytes, nb, at, 1, out + p * rows + r0, rows, n_rows);                        \
            }                                                                                                   \
        }                                                                                                       \
    }

/* a type's units, vec and mat as its table row names them: the packed products above when the matrix
   has its packed copy, the products on the file's layout (named <name>_mapped) otherwise */
#define PYLLAMA_PACKED_OR_MAPPED(name)                                                                          \
    static ptrdiff_t pyllama_units_##name(const pyllama_matrix* m, ptrdiff_t n_pos) {                           \
        return m->packed ? pyllama_pack_groups(m->rows) : pyllama_units_##name##_mapped(m, n_pos);              \
    }                                                                                                           \
    static void pyllama_vec_##name(const pyllama_matrix* m, ptrdiff_t u0, ptrdiff_t u1, const pyllama_acts* a,   \
                                   float* out) {                                                                \
        if (m->packed) pyllama_pvec_##name(m, u0, u1, a, out);                                                  \
        else pyllama_vec_##name##_mapped(m, u0, u1, a, out);                                                    \
    }                                                                                                           \
    static void pyllama_mat_##name(const pyllama_matrix* m, ptrdiff_t u0, ptrdiff_t u1, const pyllama_acts* a,   \
                                   float* out) {                                                                \
        if (m->packed) pyllama_pmat_##name(m, u0, u1, a, out);                                                  \
        else pyllama_mat_##name##_mapped(m, u0, u1, a, out);                                                    \
    }

/* the same for a type whose packed copy serves blocks of positions only: its single-vector product (decode)
   reads the file's layout, where its tile of one position was measured slower (Q6_K). Both give the
   same bits. */
#define PYLLAMA_PACKED_BLOCKS_OR_MAPPED(name)                                                                   \
    static ptrdiff_t pyllama_units_##name(const pyllama_matrix* m, ptrdiff_t n_pos) {                           \
        return m->packed && n_pos > 1 ? pyllama_pack_groups(m->rows) : pyllama_units_##name##_mapped(m, n_pos);  \
    }                                                                                                           \
    static void pyllama_vec_##name(const pyllama_matrix* m, ptrdiff_t u0, ptrdiff_t u1, const pyllama_acts* a,   \
                                   float* out) {                                                                \
        pyllama_vec_##name##_mapped(m, u0, u1, a, out);                                                         \
    }                                                                                                           \
    static void pyllama_mat_##name(const pyllama_matrix* m, ptrdiff_t u0, ptrdiff_t u1, const pyllama_acts* a,   \
                                   float* out) {                                                                \
        if (m->packed) pyllama_pmat_##name(m, u0, u1, a, out);                                                  \
        else pyllama_mat_##name##_mapped(m, u0, u1, a, out);                                                    \
    }

#endif /* PYLLAMA_QPACKED_H */
