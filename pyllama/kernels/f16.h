/* F16 weights (GGUF type 1), multiplied without expanding them to float32 in memory.
 *
 * Each weight is converted to float32 in registers as it is read (F16C/AVX-512 vcvtph2ps, or ggml's
 * branch-free bit conversion without F16C: halfbits.h) and multiplied with the float32 activation in 64
 * independent lanes reduced in a fixed order. (llama.cpp rounds the activation to fp16 for its F16
 * matmuls; pyllama keeps it float32, which is more accurate and costs nothing.) The row kernel is
 * AVX-512 (four zmm), F16C + FMA (eight ymm), or plain C over the same 64 lanes in the same order; the
 * F16 row of qtypes.h multiplies a matrix row by row with it (qrows.h), a block of positions reading
 * each row once.
 */
#ifndef PYLLAMA_F16_H
#define PYLLAMA_F16_H

#include "qblocks.h" /* halfbits.h, pyllama_qprefetch */
#include "qrows.h"

/* ---- F16 row: sum_j half(w[j]) * x[j] ----
   64 float lanes, enough fused multiply-adds in flight to hide their latency: lane u accumulates
   j = u (mod 64) over the whole groups of 64, lanes 0..15 then take the remaining whole groups of
   16, the lanes are reduced in a fixed order ((u, u+16, u+32, u+48), then (u, u+4, u+8, u+12),
   then (0+2)+(1+3)) and the last n mod 16 products are added in order. AVX-512: four zmm;
   F16C + FMA: eight ymm; elsewhere plain C over the same lanes. Not inlined: inlined into the row loop
   of qrows.h, GCC compiled the lane reduction to scalar adds (the 42M shape's F16 decode 18% slower). */
static __attribute__((noinline)) float pyllama_dot_f16(const uint16_t* w, const float* x, ptrdiff_t n) {
    const ptrdiff_t n_wide = n - n % 64, n_main = n - n % 16;
    ptrdiff_t j;
    float l[64];
#if defined(__AVX512F__)
    __m512 a[4];
    for (int k = 0; k < 4; k++) a[k] = _mm512_setzero_ps();
    for (j = 0; j < n_wide; j += 64) {
        pyllama_qprefetch((const char*)(w + j) + PYLLAMA_QPREFETCH_AHEAD);
        pyllama_qprefetch((const char*)(w + j) + PYLLAMA_QPREFETCH_AHEAD + 64);
        for (int k = 0; k < 4; k++)
            a[k] = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(w + j + 16 * k))),
                                   _mm512_loadu_ps(x + j + 16 * k), a[k]);
    }
    for (; j < n_main; j += 16)
        a[0] = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(w + j))),
                               _mm512_loadu_ps(x + j), a[0]);
    for (int k = 0; k < 4; k++) _mm512_storeu_ps(l + 16 * k, a[k]);
#elif defined(__F16C__) && defined(__FMA__)
    __m256 a[8];
    for (int k = 0; k < 8; k++) a[k] = _mm256_setzero_ps();
    for (j = 0; j < n_wide; j += 64) {
        pyllama_qprefetch((const char*)(w + j) + PYLLAMA_QPREFETCH_AHEAD);
        pyllama_qprefetch((const char*)(w + j) + PYLLAMA_QPREFETCH_AHEAD + 64);
        for (int k = 0; k < 8; k++)
            a[k] = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(w + j + 8 * k))),
                                   _mm256_loadu_ps(x + j + 8 * k), a[k]);
    }
    for (; j < n_main; j += 16)
        for (int k = 0; k < 2; k++)
            a[k] = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(w + j + 8 * k))),
                                   _mm256_loadu_ps(x + j + 8 * k), a[k]);
    for (int k = 0; k < 8; k++) _mm256_storeu_ps(l + 8 * k, a[k]);
#else
    for (int u = 0; u < 64; u++) l[u] = 0.0f;
    for (j = 0; j < n_wide; j += 64) {
        pyllama_qprefetch((const char*)(w + j) + PYLLAMA_QPREFETCH_AHEAD);
        pyllama_qprefetch((const char*)(w + j) + PYLLAMA_QPREFETCH_AHEAD + 64);
        for (int u = 0; u < 64; u++) l[u] = l[u] + pyllama_half_to_float(w[j + u]) * x[j + u];
    }
    for (; j < n_main; j += 16)
        for (int u = 0; u < 16; u++) l[u] = l[u] + pyllama_half_to_float(w[j + u]) * x[j + u];
#endif
    for (int u = 0; u < 16; u++) l[u] = (l[u] + l[u + 16]) + (l[u + 32] + l[u + 48]);
    for (int u = 0; u < 4; u++) l[u] = (l[u] + l[u + 4]) + (l[u + 8] + l[u + 12]);
    float total = (l[0] + l[2]) + (l[1] + l[3]);
    for (j = n_main; j < n; j++) total = total + pyllama_half_to_float(w[j]) * x[j];
    return total;
}

static float pyllama_dot_f16_row(const uint8_t* w, const pyllama_qact* a, ptrdiff_t cols) {
    return pyllama_dot_f16((const uint16_t*)w, a->x, cols);
}

PYLLAMA_ROW_PRODUCTS(f16, .block = 1, .block_bytes = 2, .dot = pyllama_dot_f16_row)

static void pyllama_dequantize_f16(const pyllama_matrix* m, ptrdiff_t r, float* out) {
    const uint16_t* h = (const uint16_t*)m->data + r * m->cols;
    for (ptrdiff_t j = 0; j < m->cols; j++) out[j] = pyllama_half_to_float(h[j]);
}

#endif /* PYLLAMA_F16_H */
