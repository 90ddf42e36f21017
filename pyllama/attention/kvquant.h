/* llama.cpp's KV-cache types: one row quantised as llama.cpp's reference quantiser writes it
 * (ggml-quants.c, quantize_row_*_ref; gguf-py's gguf.quants.quantize writes the same bytes) and read
 * back as gguf-py's dequantize computes it. The block layouts are ggml-common.h's.
 *
 * Every float operation is the reference's, in its order, one rounding each: the build's default
 * lets GCC fuse a*b+c into one fma, which would move a Q4_1 code across a rounding boundary now and
 * then, and the dequantised (d*q)+m by an ulp. So contraction is off for this file's functions.
 *
 * Q8_0 follows the reference (round half away from zero, id = 1/d). llama.cpp's x86 CPU backend
 * writes its own cache with id = 127/amax and rounds halves to even: a few values per million land
 * on the other side of a half (tests/kvquant_reference.py measures it).
 */
#ifndef PYLLAMA_KVQUANT_H
#define PYLLAMA_KVQUANT_H

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "../kernels/halfbits.h"
#if defined(__F16C__)
#include <immintrin.h>
#endif

#if defined(__clang__)  /* clang's pragma holds for the compound statement it opens */
#define PYLLAMA_KVQ_NO_CONTRACT _Pragma("clang fp contract(off)")
#else
#define PYLLAMA_KVQ_NO_CONTRACT
#if defined(__GNUC__)
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
#endif
#endif

/* the cache types, in the order of kvquant.pyx's CACHE_TYPES */
enum { KVQ_F32, KVQ_F16, KVQ_BF16, KVQ_Q8_0, KVQ_Q4_0, KVQ_Q4_1, KVQ_IQ4_NL, KVQ_Q5_0, KVQ_Q5_1, KVQ_TYPES };

/* values per block and bytes per block (ggml's type traits) */
static const int pyllama_kvq_block_values[KVQ_TYPES] = {1, 1, 1, 32, 32, 32, 32, 32, 32};
static const int pyllama_kvq_block_bytes[KVQ_TYPES] = {4, 2, 2, 34, 18, 20, 18, 22, 24};
static const int8_t pyllama_kvq_iq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                             1, 13, 25, 38, 53, 69, 89, 113};

static inline void pyllama_kvq_put_half(uint8_t* p, float x) {
    const uint16_t h = pyllama_float_to_half(x);
    memcpy(p, &h, 2);
}

static inline float pyllama_kvq_get_half(const uint8_t* p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return pyllama_half_to_float(h);
}

/* ggml_compute_fp32_to_bf16: NaN kept quiet, otherwise round to nearest even */
static inline uint16_t pyllama_kvq_bf16(float x) {
    uint32_t u = pyllama_f2u(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 64);
    return (uint16_t)((u + (0x7fffu + ((u >> 16) & 1u))) >> 16);
}

/* the value of largest magnitude, the first of equals (Q4_0, Q5_0, IQ4_NL) */
static inline float pyllama_kvq_signed_max(const float* x, float* amax_out) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < 32; j++) {
        if (amax < fabsf(x[j])) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    }
    *amax_out = amax;
    return max;
}

static inline void pyllama_kvq_min_max(const float* x, float* min_out, float* max_out) {
    float min = FLT_MAX, max = -FLT_MAX;
    for (int j = 0; j < 32; j++) {
        if (x[j] < min) min = x[j];
        if (x[j] > max) max = x[j];
    }
    *min_out = min;
    *max_out = max;
}

static inline void pyllama_kvq_q8_0(const float* x, uint8_t* y) {
    PYLLAMA_KVQ_NO_CONTRACT
    float amax = 0.0f;
    for (int j = 0; j < 32; j++) amax = amax > fabsf(x[j]) ? amax : fabsf(x[j]);
    const float d = amax / 127;
    const float id = d ? 1.0f / d : 0.0f;
    pyllama_kvq_put_half(y, d);
    for (int j = 0; j < 32; j++) y[2 + j] = (uint8_t)(int8_t)roundf(x[j] * id);
}

/* Q4_0 and Q5_0: d = max / -(2^(bits-1)), codes trunc(x/d + 2^(bits-1) + 0.5) */
static inline void pyllama_kvq_q_0(const float* x, uint8_t* y, int bits) {
    PYLLAMA_KVQ_NO_CONTRACT
    float amax;
    const float max = pyllama_kvq_signed_max(x, &amax);
    const float offset = bits == 4 ? 8.5f : 16.5f;
    const int top = (1 << bits) - 1;
    const float d = max / (bits == 4 ? -8 : -16);
    const float id = d ? 1.0f / d : 0.0f;
    uint32_t qh = 0;
    uint8_t* qs = y + (bits == 4 ? 2 : 6);
    pyllama_kvq_put_half(y, d);
    for (int j = 0; j < 16; j++) {
        const int8_t c0 = (int8_t)(x[j] * id + offset), c1 = (int8_t)(x[16 + j] * id + offset);
        const uint8_t xi0 = (uint8_t)(c0 < top ? c0 : top), xi1 = (uint8_t)(c1 < top ? c1 : top);
        qs[j] = (uint8_t)((xi0 & 0x0F) | ((xi1 & 0x0F) << 4));
        qh |= ((uint32_t)(xi0 & 0x10u) >> 4) << j;
        qh |= ((uint32_t)(xi1 & 0x10u) >> 4) << (j + 16);
    }
    if (bits == 5) memcpy(y + 2, &qh, 4);
}

/* Q4_1 and Q5_1: d = (max - min) / (2^bits - 1), m = min, codes trunc((x - min)/d + 0.5) */
static inline void pyllama_kvq_q_1(const float* x, uint8_t* y, int bits) {
    PYLLAMA_KVQ_NO_CONTRACT
    float min, max;
    pyllama_kvq_min_max(x, &min, &max);
    const float d = (max - min) / ((1 << bits) - 1);
    const float id = d ? 1.0f / d : 0.0f;
    uint32_t qh = 0;
    uint8_t* qs = y + (bits == 4 ? 4 : 8);
    pyllama_kvq_put_half(y, d);
    pyllama_kvq_put_half(y + 2, min);
    for (int j = 0; j < 16; j++) {
        const float x0 = (x[j] - min) * id, x1 = (x[16 + j] - min) * id;
        uint8_t xi0, xi1;
        if (bits == 4) {  /* the reference clips Q4_1's codes (MIN(15, (int8_t)...)), not Q5_1's */
            const int8_t c0 = (int8_t)(x0 + 0.5f), c1 = (int8_t)(x1 + 0.5f);
            xi0 = (uint8_t)(c0 < 15 ? c0 : 15);
            xi1 = (uint8_t)(c1 < 15 ? c1 : 15);
        } else {
            xi0 = (uint8_t)(x0 + 0.5f);
            xi1 = (uint8_t)(x1 + 0.5f);
        }
        qs[j] = (uint8_t)((xi0 & 0x0F) | ((xi1 & 0x0F) << 4));
        qh |= ((uint32_t)(xi0 & 0x10u) >> 4) << j;
        qh |= ((uint32_t)(xi1 & 0x10u) >> 4) << (j + 16);
    }
    if (bits == 5) memcpy(y + 4, &qh, 4);
}

/* ggml's best_index_int8: the grid level nearest x (the upper one at a midpoint) */
static inline int pyllama_kvq_nearest_level(float x) {
    const int8_t* val = pyllama_kvq_iq4nl;
    if (x <= val[0]) return 0;
    if (x >= val[15]) return 15;
    int ml = 0, mu = 15;
    while (mu - ml > 1) {
        const int mav = (ml + mu) / 2;
        if (x < val[mav]) mu = mav; else ml = mav;
    }
    return x - val[mu - 1] < val[mu] - x ? mu - 1 : mu;
}

/* quantize_row_iq4_nl_ref: quantize_row_iq4_nl_impl over one block of 32, no importance weights
 * (w = x^2), ntry = -1: levels at d = max / -127, then d = sum(w q x) / sum(w q q). An all-but-zero
 * block (|x| < 1e-15) gets d = 0 and level 0 (llama.cpp leaves its level buffer as it was: the
 * values read back are zeros either way). */
static inline void pyllama_kvq_iq4_nl(const float* x, uint8_t* y) {
    PYLLAMA_KVQ_NO_CONTRACT
    float amax;
    const float max = pyllama_kvq_signed_max(x, &amax);
    uint8_t levels[32];
    float d = 0.0f;
    memset(levels, 0, sizeof(levels));
    if (amax >= 1e-15f) {
        d = max / pyllama_kvq_iq4nl[0];
        const float id = 1 / d;
        float sumqx = 0, sumq2 = 0;
        for (int j = 0; j < 32; j++) {
            const int l = pyllama_kvq_nearest_level(id * x[j]);
            const float q = pyllama_kvq_iq4nl[l], w = x[j] * x[j];
            levels[j] = (uint8_t)l;
            sumqx += w * q * x[j];
            sumq2 += w * q * q;
        }
        d = sumq2 > 0 ? sumqx / sumq2 : 0.f;
    }
    pyllama_kvq_put_half(y, d);
    for (int j = 0; j < 16; j++) y[2 + j] = (uint8_t)(levels[j] | (levels[16 + j] << 4));
}

/* The two entry points are never inlined: a caller compiled with contraction on would otherwise
 * fuse their operations (GCC declines to inline across the setting anyway; this says so). */
#define PYLLAMA_KVQ_ENTRY static __attribute__((noinline, unused))

/* n values (whole blocks) of x into the cache's bytes y */
PYLLAMA_KVQ_ENTRY void pyllama_kvq_quantize(int type, const float* x, uint8_t* y, long n) {
    const long nb = n / pyllama_kvq_block_values[type];
    const int bytes = pyllama_kvq_block_bytes[type];
    switch (type) {
    case KVQ_F32: memcpy(y, x, (size_t)n * 4); return;
    case KVQ_F16: for (long i = 0; i < n; i++) pyllama_kvq_put_half(y + 2 * i, x[i]); return;
    case KVQ_BF16:
        for (long i = 0; i < n; i++) {
            const uint16_t h = pyllama_kvq_bf16(x[i]);
            memcpy(y + 2 * i, &h, 2);
        }
        return;
    }
    for (long b = 0; b < nb; b++) {
        const float* xb = x + 32 * b;
        uint8_t* yb = y + bytes * b;
        switch (type) {
        case KVQ_Q8_0: pyllama_kvq_q8_0(xb, yb); break;
        case KVQ_Q4_0: pyllama_kvq_q_0(xb, yb, 4); break;
        case KVQ_Q5_0: pyllama_kvq_q_0(xb, yb, 5); break;
        case KVQ_Q4_1: pyllama_kvq_q_1(xb, yb, 4); break;
        case KVQ_Q5_1: pyllama_kvq_q_1(xb, yb, 5); break;
        case KVQ_IQ4_NL: pyllama_kvq_iq4_nl(xb, yb); break;
        }
    }
}

/* One block's 32 values: q_j = low nibble (+ bit j of qh as bit 4), for j < 16 from the low nibbles
 * of qs and for j >= 16 from the high ones; value = d * (q - offset), or (d * q) + m with a minimum.
 * Written per type, on pointers that alias nothing (a uint8_t pointer may alias anything otherwise),
 * so that the compiler vectorises each loop. */
static inline void pyllama_kvq_block_4(const uint8_t* __restrict qs, float d, int offset, float* __restrict x) {
    PYLLAMA_KVQ_NO_CONTRACT
    for (int j = 0; j < 16; j++) {
        x[j] = d * (float)((int)(qs[j] & 0x0F) - offset);
        x[j + 16] = d * (float)((int)(qs[j] >> 4) - offset);
    }
}

static inline void pyllama_kvq_block_4m(const uint8_t* __restrict qs, float d, float m, float* __restrict x) {
    PYLLAMA_KVQ_NO_CONTRACT
    for (int j = 0; j < 16; j++) {
        x[j] = d * (float)(qs[j] & 0x0F) + m;
        x[j + 16] = d * (float)(qs[j] >> 4) + m;
    }
}

static inline void pyllama_kvq_block_5(const uint8_t* __restrict qs, uint32_t qh, float d, int offset, int has_min,
                                       float m, float* __restrict x) {
    PYLLAMA_KVQ_NO_CONTRACT
    for (int j = 0; j < 16; j++) {
        const int lo = (int)((qs[j] & 0x0F) | (((qh >> j) & 1u) << 4));
        const int hi = (int)((qs[j] >> 4) | (((qh >> (j + 16)) & 1u) << 4));
        if (has_min) {
            x[j] = d * (float)lo + m;
            x[j + 16] = d * (float)hi + m;
        } else {
            x[j] = d * (float)(lo - offset);
            x[j + 16] = d * (float)(hi - offset);
        }
    }
}

static inline void pyllama_kvq_block_8(const uint8_t* __restrict qs, float d, float* __restrict x) {
    for (int j = 0; j < 32; j++) x[j] = (float)(int8_t)qs[j] * d;
}

static inline void pyllama_kvq_block_nl(const uint8_t* __restrict qs, float d, float* __restrict x) {
    for (int j = 0; j < 16; j++) {
        x[j] = d * (float)pyllama_kvq_iq4nl[qs[j] & 0x0F];
        x[j + 16] = d * (float)pyllama_kvq_iq4nl[qs[j] >> 4];
    }
}

/* n values (whole blocks) read back from the cache's bytes y, as gguf-py's dequantize computes them:
 * d * q, or (d * q) + m for the types with a minimum */
static inline void pyllama_kvq_dequantize_one(int type, const uint8_t* y, float* x, long n) {
    PYLLAMA_KVQ_NO_CONTRACT
    const long nb = n / pyllama_kvq_block_values[type];
    const int bytes = pyllama_kvq_block_bytes[type];
    uint16_t h;
    uint32_t qh;
    switch (type) {
    case KVQ_F32: memcpy(x, y, (size_t)n * 4); return;
    case KVQ_F16: {
        long i = 0;
#if defined(__F16C__)
        for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(y + 2 * i))));
#endif
        for (; i < n; i++) x[i] = pyllama_kvq_get_half(y + 2 * i);
        return;
    }
    case KVQ_BF16:
        for (long i = 0; i < n; i++) {
            memcpy(&h, y + 2 * i, 2);
            x[i] = pyllama_bf2f(h);
        }
        return;
    }
    for (long b = 0; b < nb; b++) {
        const uint8_t* yb = y + bytes * b;
        float* xb = x + 32 * b;
        const float d = pyllama_kvq_get_half(yb);
        switch (type) {
        case KVQ_Q8_0: pyllama_kvq_block_8(yb + 2, d, xb); break;
        case KVQ_Q4_0: pyllama_kvq_block_4(yb + 2, d, 8, xb); break;
        case KVQ_Q4_1: pyllama_kvq_block_4m(yb + 4, d, pyllama_kvq_get_half(yb + 2), xb); break;
        case KVQ_Q5_0:
            memcpy(&qh, yb + 2, 4);
            pyllama_kvq_block_5(yb + 6, qh, d, 16, 0, 0.0f, xb);
            break;
        case KVQ_Q5_1:
            memcpy(&qh, yb + 4, 4);
            pyllama_kvq_block_5(yb + 8, qh, d, 0, 1, pyllama_kvq_get_half(yb + 2), xb);
            break;
        case KVQ_IQ4_NL: pyllama_kvq_block_nl(yb + 2, d, xb); break;
        }
    }
}

PYLLAMA_KVQ_ENTRY void pyllama_kvq_dequantize(int type, const uint8_t* y, float* x, long n) {
    pyllama_kvq_dequantize_one(type, y, x, n);
}

/* rows row .. row + n_rows - 1 of n values each: the bytes of row r at y + r * y_stride, its values to
 * x + r * x_stride (a run of cached rows of one head into the attention's scratch) */
PYLLAMA_KVQ_ENTRY void pyllama_kvq_dequantize_rows(int type, const uint8_t* y, long y_stride, float* x, long x_stride,
                                                   long n_rows, long n) {
    for (long r = 0; r < n_rows; r++) pyllama_kvq_dequantize_one(type, y + r * y_stride, x + r * x_stride, n);
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#endif

#endif /* PYLLAMA_KVQUANT_H */
