/* ggml's single-precision exp and SiLU, lane for lane: the AVX2 ggml_v_expf of ggml-cpu's vec.h
 * (a degree-5 polynomial after a round-to-nearest range reduction, with fused multiply-adds) written
 * per element with fmaf, so that every build of pyllama gives the bits llama.cpp's AVX2 build gives.
 * llama.cpp applies it to whole groups of 8 and libm's expf to the remainder of a row. */
#ifndef PYLLAMA_GGML_MATH_H
#define PYLLAMA_GGML_MATH_H
#include <math.h>
#include <stdint.h>
#include <string.h>
#include "halfbits.h"


static inline float pyllama_ggml_expf(float x) {
    const float r = 0x1.8p23f;
    const float z = fmaf(x, 0x1.715476p+0f, r);
    const float n = z - r;
    const float b = fmaf(-n, 0x1.7f7d1cp-20f, fmaf(-n, 0x1.62e4p-1f, x));
    const uint32_t e = pyllama_f2u(z) << 23;
    const float k = pyllama_u2f(e + pyllama_f2u(1.0f));
    const float u = b * b;
    const float j = fmaf(fmaf(fmaf(0x1.0e4020p-7f, b, 0x1.573e2ep-5f), u,
                              fmaf(0x1.555e66p-3f, b, 0x1.fffdb6p-2f)),
                         u, 0x1.ffffecp-1f * b);
    if (!(fabsf(n) > 126.0f))
        return fmaf(j, k, k);
    const uint32_t g = (n <= 0.0f) ? 0x82000000u : 0u;
    const float s1 = pyllama_u2f(g + 0x7f000000u);
    const float s2 = pyllama_u2f(e - g);
    if (fabsf(n) > 192.0f)
        return s1 * s1;
    return fmaf(s2, j, s2) * s1;
}

/* ggml_vec_silu_f32 followed by ggml_mul: hb = silu(hb) * hb2 */
static inline void pyllama_ggml_swiglu(float *hb, const float *hb2, long n) {
    long i = 0;
    for (; i + 7 < n; i += 8)
        for (long l = i; l < i + 8; l++)
            hb[l] = (hb[l] / (1.0f + pyllama_ggml_expf(0.0f - hb[l]))) * hb2[l];
    for (; i < n; i++)
        hb[i] = (hb[i] / (1.0f + expf(-hb[i]))) * hb2[i];
}
#endif

