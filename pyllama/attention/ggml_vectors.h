/* One vector type for the block attention's kernels (ggml_attend_group.h, runc_attend_group.h, scores_tile.h): the
 * widest the build has, AVX-512 (16 floats) or AVX2 (8), with fused multiply-adds. A kernel written
 * with these computes each float lane on its own, so its bits do not depend on the width; without
 * either (the portable build) PYLLAMA_GV is undefined and the kernels take their scalar forms. */
#ifndef PYLLAMA_GGML_VECTORS_H
#define PYLLAMA_GGML_VECTORS_H
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

#if defined(__AVX512F__) && defined(__FMA__)
#define PYLLAMA_GV __m512
#define PYLLAMA_GV_WIDTH 16
#define PYLLAMA_GV_ZERO() _mm512_setzero_ps()
#define PYLLAMA_GV_LOAD(p) _mm512_loadu_ps(p)
#define PYLLAMA_GV_STORE(p, a) _mm512_storeu_ps(p, a)
#define PYLLAMA_GV_FMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define PYLLAMA_GV_SET1(x) _mm512_set1_ps(x)
#define PYLLAMA_GV_ADD(a, b) _mm512_add_ps(a, b)
#define PYLLAMA_GV_MUL(a, b) _mm512_mul_ps(a, b)
#define PYLLAMA_GV_DIV(a, b) _mm512_div_ps(a, b)
#elif defined(__AVX2__) && defined(__FMA__)
#define PYLLAMA_GV __m256
#define PYLLAMA_GV_WIDTH 8
#define PYLLAMA_GV_ZERO() _mm256_setzero_ps()
#define PYLLAMA_GV_LOAD(p) _mm256_loadu_ps(p)
#define PYLLAMA_GV_STORE(p, a) _mm256_storeu_ps(p, a)
#define PYLLAMA_GV_FMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define PYLLAMA_GV_SET1(x) _mm256_set1_ps(x)
#define PYLLAMA_GV_ADD(a, b) _mm256_add_ps(a, b)
#define PYLLAMA_GV_MUL(a, b) _mm256_mul_ps(a, b)
#define PYLLAMA_GV_DIV(a, b) _mm256_div_ps(a, b)
#endif
/* for Cython, which cannot test a macro's definition: 1 where the vector kernels exist */
#ifdef PYLLAMA_GV
#define PYLLAMA_BLOCK_VECTORS 1
#else
#define PYLLAMA_BLOCK_VECTORS 0
#endif
#endif
