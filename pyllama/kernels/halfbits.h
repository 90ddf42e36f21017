/* Float32 bit patterns and IEEE binary16 <-> binary32 conversions: the one copy every kernel uses
 * (f16.h's F16 rows, qblocks.h's block scales, ggml_math.h's exp).
 *
 * binary16 -> binary32 is exact; binary32 -> binary16 rounds to nearest-even. With F16C they are the
 * vcvtph2ps / vcvtps2ph instructions, on aarch64 the compiler's _Float16, elsewhere the branch-free bit
 * conversions of Maratyszcza's FP16 library, which ggml uses too: all three give the same bits. */
#ifndef PYLLAMA_HALFBITS_H
#define PYLLAMA_HALFBITS_H

#include <math.h>
#include <stdint.h>
#include <string.h>
#if defined(__F16C__)
#include <immintrin.h>
#endif

static inline uint32_t pyllama_f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float pyllama_u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

#if defined(__F16C__)
static inline float pyllama_half_to_float(uint16_t h) { return _cvtsh_ss(h); }
static inline uint16_t pyllama_float_to_half(float x) { return (uint16_t)_cvtss_sh(x, 0); }
#elif defined(__FLT16_MANT_DIG__) && defined(__aarch64__)
static inline float pyllama_half_to_float(uint16_t h) {
    _Float16 f; memcpy(&f, &h, 2); return (float)f;
}
static inline uint16_t pyllama_float_to_half(float x) {
    _Float16 f = (_Float16)x; uint16_t h; memcpy(&h, &f, 2); return h;
}
#else
static inline float pyllama_half_to_float(uint16_t h) {
    const uint32_t w = (uint32_t)h << 16;
    const uint32_t sign = w & UINT32_C(0x80000000);
    const uint32_t two_w = w + w;
    const float normalized = pyllama_u2f((two_w >> 4) + (UINT32_C(0xE0) << 23)) * 0x1.0p-112f;
    const float denormalized = pyllama_u2f((two_w >> 17) | (UINT32_C(126) << 23)) - 0.5f;
    const uint32_t bits = two_w < (UINT32_C(1) << 27) ? pyllama_f2u(denormalized) : pyllama_f2u(normalized);
    return pyllama_u2f(sign | bits);
}
static inline uint16_t pyllama_float_to_half(float f) {
    float base = (fabsf(f) * 0x1.0p+112f) * 0x1.0p-110f;
    const uint32_t w = pyllama_f2u(f);
    const uint32_t shl1_w = w + w;
    const uint32_t sign = w & UINT32_C(0x80000000);
    uint32_t bias = shl1_w & UINT32_C(0xFF000000);
    if (bias < UINT32_C(0x71000000)) bias = UINT32_C(0x71000000);
    base = pyllama_u2f((bias >> 1) + UINT32_C(0x07800000)) + base;
    const uint32_t bits = pyllama_f2u(base);
    const uint32_t nonsign = ((bits >> 13) & UINT32_C(0x00007C00)) + (bits & UINT32_C(0x00000FFF));
    return (uint16_t)((sign >> 16) | (shl1_w > UINT32_C(0xFF000000) ? UINT16_C(0x7E00) : nonsign));
}
#endif

/* bfloat16 -> float32 (exact: the top half of the float's bits) */
static inline float pyllama_bf2f(uint16_t h) { return pyllama_u2f((uint32_t)h << 16); }

#endif /* PYLLAMA_HALFBITS_H */
