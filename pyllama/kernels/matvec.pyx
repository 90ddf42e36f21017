"""Matrix-vector products: out[rows] = W[rows, cols] @ x[cols], the cost of decoding.

Decode reads every weight once per token, so these kernels are written to stream memory: each row
is a dot product with 64 independent float accumulators (the compiler maps them to SIMD lanes
without reassociating anything, so no -ffast-math is needed), and rows are split across OpenMP
threads with a static schedule. A row is always computed by one thread with the same arithmetic,
so the result is bit-identical for any thread count.

With AVX-512, float32 rows go four at a time through ``pyllama_dot4_f32``: four weight streams in
flight per thread instead of one keep more cache-line fills outstanding, which is what a
memory-bound product needs (measured on the stories110M matrices at 2 threads: 18 -> 27 GB/s).
Each of the four rows gets exactly ``dot_f32``'s arithmetic (same lanes, same reduction order), so a
row's value does not depend on which group it falls in; the tests check this bit for bit.

``matvec`` dispatches on the stored type; quantised types live in ``quant.pyx`` (F16, Q8_0, llama2.c
int8 groups), ``qlegacy.pyx`` (Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, BF16) and ``kquants.pyx`` (Q2_K-Q6_K).
``matmul`` is the block product (prompts, teacher forcing): each weight row is read once per block of
positions and every element keeps exactly ``matvec``'s arithmetic.
"""

from cython.parallel cimport prange

import numpy as np

from pyllama.kernels.f16 cimport matvec_f16, matmul_f16
from pyllama.kernels.quant cimport (
    matvec_q8_0, matvec_q8_groups, matmul_q8_0, matmul_q8_groups, dequantize_row,
)
from pyllama.kernels.threads cimport team_size
from pyllama.kernels.qlegacy cimport matmul_qlegacy, dequantize_row_qlegacy
from pyllama.kernels.kquants cimport matmul_kquant, dequantize_row_kquant

DEF WIDE = 64  # 8 independent 8-float vectors: enough FMAs in flight to hide their latency
DEF LANES = 16

cdef extern from *:
    """
    #if defined(__AVX512F__) && defined(__FMA__)
    #include <immintrin.h>
    #define PYLLAMA_HAVE_DOT4 1
    /* out[r] = dot_f32(w + r * stride, x, n) for r < 4: lane u of row r accumulates the products
       at j = u (mod 64) with fused multiply-adds, lanes 0-15 take the 16-wide tail, then the same
       64 -> 16 -> 4 -> 1 reduction and scalar tail as dot_f32. */
    static void pyllama_dot4_f32(const float* w, Py_ssize_t stride, const float* x, Py_ssize_t n,
                                 float* out) {
        __m512 a[4][4];
        const Py_ssize_t n_wide = n - n % 64, n_main = n - n % 16;
        for (int r = 0; r < 4; r++)
            for (int k = 0; k < 4; k++) a[r][k] = _mm512_setzero_ps();
        for (Py_ssize_t j = 0; j < n_wide; j += 64) {
            const __m512 x0 = _mm512_loadu_ps(x + j), x1 = _mm512_loadu_ps(x + j + 16);
            const __m512 x2 = _mm512_loadu_ps(x + j + 32), x3 = _mm512_loadu_ps(x + j + 48);
            for (int r = 0; r < 4; r++) {
                const float* row = w + r * stride + j;
                a[r][0] = _mm512_fmadd_ps(_mm512_loadu_ps(row), x0, a[r][0]);
                a[r][1] = _mm512_fmadd_ps(_mm512_loadu_ps(row + 16), x1, a[r][1]);
                a[r][2] = _mm512_fmadd_ps(_mm512_loadu_ps(row + 32), x2, a[r][2]);
                a[r][3] = _mm512_fmadd_ps(_mm512_loadu_ps(row + 48), x3, a[r][3]);
            }
        }
        for (Py_ssize_t j = n_wide; j < n_main; j += 16) {
            const __m512 xv = _mm512_loadu_ps(x + j);
            for (int r = 0; r < 4; r++)
                a[r][0] = _mm512_fmadd_ps(_mm512_loadu_ps(w + r * stride + j), xv, a[r][0]);
        }
        for (int r = 0; r < 4; r++) {
            float l[16];
            _mm512_storeu_ps(l, _mm512_add_ps(_mm512_add_ps(a[r][0], a[r][1]),
                                              _mm512_add_ps(a[r][2], a[r][3])));
            for (int u = 0; u < 4; u++) l[u] = (l[u] + l[u + 4]) + (l[u + 8] + l[u + 12]);
            float total = (l[0] + l[2]) + (l[1] + l[3]);
            for (Py_ssize_t j = n_main; j < n; j++) total = total + w[r * stride + j] * x[j];
            out[r] = total;
        }
    }
    #else
    #define PYLLAMA_HAVE_DOT4 0
    static void pyllama_dot4_f32(const float* w, Py_ssize_t stride, const float* x, Py_ssize_t n,
                                 float* out) { (void)w; (void)stride; (void)x; (void)n; (void)out; }
    #endif

    /* ---- float32 dot product: the lanes of dot_f32 (see its docstring), written out so that the
       block tile below provably gives the same bits: lane u is a chain of fused multiply-adds over
       j = u (mod 64), lanes 0-15 then take the whole groups of 16 that remain. ---- */
    #if defined(__AVX2__) && defined(__FMA__)
    #include <immintrin.h>
    #define PYLLAMA_F32_AVX2 1
    #else
    #define PYLLAMA_F32_AVX2 0
    #endif

    /* the fixed reduction 64 -> 16 -> 4 -> 1 of the lanes l (overwritten), then the tail in order */
    static inline float pyllama_finish_f32(float* l, const float* a, const float* b, Py_ssize_t n) {
        const Py_ssize_t n_main = n - n % 16;
        for (int u = 0; u < 16; u++) l[u] = (l[u] + l[u + 16]) + (l[u + 32] + l[u + 48]);
        for (int u = 0; u < 4; u++) l[u] = (l[u] + l[u + 4]) + (l[u + 8] + l[u + 12]);
        float total = (l[0] + l[2]) + (l[1] + l[3]);
        for (Py_ssize_t j = n_main; j < n; j++) total = total + a[j] * b[j];
        return total;
    }

    #if PYLLAMA_F32_AVX2
    /* pyllama_finish_f32 on lanes held as 8 vectors (acc[k] = lanes 8k .. 8k + 7): the same additions
       in the same order, four or eight at a time. 64 -> 16: lanes 0-7 are (acc0 + acc2) + (acc4 + acc6),
       lanes 8-15 (acc1 + acc3) + (acc5 + acc7); 16 -> 4: (l[u] + l[u+4]) + (l[u+8] + l[u+12]) is
       (low + high half of lanes 0-7) + (low + high half of lanes 8-15); then (l0 + l2) + (l1 + l3). */
    static inline float pyllama_finish_f32_avx2(const __m256* acc, const float* a, const float* b,
                                                Py_ssize_t n) {
        const Py_ssize_t n_main = n - n % 16;
        const __m256 lo = _mm256_add_ps(_mm256_add_ps(acc[0], acc[2]), _mm256_add_ps(acc[4], acc[6]));
        const __m256 hi = _mm256_add_ps(_mm256_add_ps(acc[1], acc[3]), _mm256_add_ps(acc[5], acc[7]));
        const __m128 s = _mm_add_ps(_mm_add_ps(_mm256_castps256_ps128(lo), _mm256_extractf128_ps(lo, 1)),
                                    _mm_add_ps(_mm256_castps256_ps128(hi), _mm256_extractf128_ps(hi, 1)));
        const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));  /* t0 = l0 + l2, t1 = l1 + l3 */
        float total = _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)));
        for (Py_ssize_t j = n_main; j < n; j++) total = total + a[j] * b[j];
        return total;
    }
    #endif

    static float pyllama_dot_f32(const float* a, const float* b, Py_ssize_t n) {
        const Py_ssize_t n_wide = n - n % 64, n_main = n - n % 16;
        Py_ssize_t j;
    #if PYLLAMA_F32_AVX2
        __m256 acc[8];
        for (int k = 0; k < 8; k++) acc[k] = _mm256_setzero_ps();
        for (j = 0; j < n_wide; j += 64)
            for (int k = 0; k < 8; k++)
                acc[k] = _mm256_fmadd_ps(_mm256_loadu_ps(a + j + 8 * k), _mm256_loadu_ps(b + j + 8 * k), acc[k]);
        for (; j < n_main; j += 16)
            for (int k = 0; k < 2; k++)
                acc[k] = _mm256_fmadd_ps(_mm256_loadu_ps(a + j + 8 * k), _mm256_loadu_ps(b + j + 8 * k), acc[k]);
        return pyllama_finish_f32_avx2(acc, a, b, n);
    #else
        float l[64];
        for (int u = 0; u < 64; u++) l[u] = 0.0f;
        for (j = 0; j < n_wide; j += 64)
            for (int u = 0; u < 64; u++) l[u] = l[u] + a[j + u] * b[j + u];
        for (; j < n_main; j += 16)
            for (int u = 0; u < 16; u++) l[u] = l[u] + a[j + u] * b[j + u];
        return pyllama_finish_f32(l, a, b, n);
    #endif
    }

    #if PYLLAMA_F32_AVX2
    /* The block tile: R rows of w times P positions of x (R <= 4, P <= 3), every (r, p) with exactly
       pyllama_dot_f32's lanes. The 64 lanes of 12 products do not fit in 16 registers, so the tile
       runs one group of 8 lanes at a time over the whole row (the rows stay in cache): 12
       accumulators, each loaded weight vector used P times and each x vector R times (16 ymm registers
       in all). The lanes go to lanes[(r * P + p) * 64 ...] and are reduced by
       pyllama_finish_f32_avx2, which a profile showed costing as much as the FMAs when it was scalar. */
    /* one step of the tile at column j: P x vectors, then each row's w vector times all of them. The
       empty asm pins each loaded vector in a register: without it gcc folds the load into every FMA
       that uses it (seen in the generated code: 16 to 24 loads per 12 FMAs instead of 7). */
    #define PYLLAMA_TILE_STEP(j) {                                                        \
            __m256 xv[3];                                                                 \
            for (int p = 0; p < P; p++) {                                                 \
                xv[p] = _mm256_loadu_ps(xk + p * cols + (j));                             \
                __asm__("" : "+x"(xv[p]));                                                \
            }                                                                             \
            for (int r = 0; r < R; r++) {                                                 \
                __m256 wv = _mm256_loadu_ps(wk + r * cols + (j));                         \
                __asm__("" : "+x"(wv));                                                   \
                for (int p = 0; p < P; p++) acc[r][p] = _mm256_fmadd_ps(wv, xv[p], acc[r][p]); \
            }                                                                             \
        }

    static inline __attribute__((always_inline)) void pyllama_tile_f32(
            const float* w, const float* x, Py_ssize_t cols, float* lanes, const int R, const int P) {
        const Py_ssize_t n_wide = cols - cols % 64, n_main = cols - cols % 16;
        for (int k = 0; k < 8; k++) {
            __m256 acc[4][3];
            for (int r = 0; r < R; r++)
                for (int p = 0; p < P; p++) acc[r][p] = _mm256_setzero_ps();
            const float* wk = w + 8 * k;
            const float* xk = x + 8 * k;
            for (Py_ssize_t j = 0; j < n_wide; j += 64) PYLLAMA_TILE_STEP(j)
            if (k < 2)
                for (Py_ssize_t j = n_wide; j < n_main; j += 16) PYLLAMA_TILE_STEP(j)
            for (int r = 0; r < R; r++)
                for (int p = 0; p < P; p++) _mm256_storeu_ps(lanes + (r * P + p) * 64 + 8 * k, acc[r][p]);
        }
    }

    #define PYLLAMA_TILE_CASE(R, P) case 4 * (R) + (P): pyllama_tile_f32(w, x, cols, lanes, R, P); break;

    /* out[p * rows + r] = pyllama_dot_f32(w[r], x[p]) for rows r0 .. r1 - 1 (at most 4) and every position */
    static void pyllama_matmul_f32_rows(float* out, const float* w, const float* x, Py_ssize_t n_pos,
                                        Py_ssize_t rows, Py_ssize_t cols, Py_ssize_t r0, Py_ssize_t r1) {
        float lanes[4 * 3 * 64] __attribute__((aligned(32)));  /* read back as __m256 */
        const int R = (int)(r1 - r0);
        const float* wr = w + r0 * cols;
        for (Py_ssize_t p0 = 0; p0 < n_pos; p0 += 3) {
            const int P = n_pos - p0 < 3 ? (int)(n_pos - p0) : 3;
            const float* xp = x + p0 * cols;
            {
                const float* w = wr;
                const float* x = xp;
                switch (4 * R + P) {
                    PYLLAMA_TILE_CASE(1, 1) PYLLAMA_TILE_CASE(1, 2) PYLLAMA_TILE_CASE(1, 3)
                    PYLLAMA_TILE_CASE(2, 1) PYLLAMA_TILE_CASE(2, 2) PYLLAMA_TILE_CASE(2, 3)
                    PYLLAMA_TILE_CASE(3, 1) PYLLAMA_TILE_CASE(3, 2) PYLLAMA_TILE_CASE(3, 3)
                    PYLLAMA_TILE_CASE(4, 1) PYLLAMA_TILE_CASE(4, 2) PYLLAMA_TILE_CASE(4, 3)
                }
            }
            for (int r = 0; r < R; r++)
                for (int p = 0; p < P; p++)
                    out[(p0 + p) * rows + r0 + r] = pyllama_finish_f32_avx2(
                        (const __m256*)(lanes + (r * P + p) * 64), wr + r * cols, xp + p * cols, cols);
        }
    }
    #else
    static void pyllama_matmul_f32_rows(float* out, const float* w, const float* x, Py_ssize_t n_pos,
                                        Py_ssize_t rows, Py_ssize_t cols, Py_ssize_t r0, Py_ssize_t r1) {
        for (Py_ssize_t r = r0; r < r1; r++)
            for (Py_ssize_t p = 0; p < n_pos; p++)
                out[p * rows + r] = pyllama_dot_f32(w + r * cols, x + p * cols, cols);
    }
    #endif
    """
    bint HAVE_DOT4 "PYLLAMA_HAVE_DOT4"
    void dot4_f32 "pyllama_dot4_f32"(const float* w, Py_ssize_t stride, const float* x, Py_ssize_t n,
                                     float* out) noexcept nogil
    float dot_f32_c "pyllama_dot_f32"(const float* a, const float* b, Py_ssize_t n) noexcept nogil
    void matmul_f32_rows "pyllama_matmul_f32_rows"(float* out, const float* w, const float* x, Py_ssize_t n_pos,
                                                   Py_ssize_t rows, Py_ssize_t cols, Py_ssize_t r0,
                                                   Py_ssize_t r1) noexcept nogil


cdef float dot_f32(const float* a, const float* b, Py_ssize_t n) noexcept nogil:
    """Dot product with 64 independent accumulators; the summation order depends on n alone.

    Lane u accumulates a[j] * b[j] for j = u (mod 64) over the whole groups of 64 (fused
    multiply-adds where the CPU has them), lanes 0-15 then the remaining whole groups of 16; the
    lanes are reduced 64 -> 16 -> 4 -> 1 in a fixed order and the last n mod 16 products added in
    order. (C in the block above, so that ``matmul``'s tile shares it.)"""
    return dot_f32_c(a, b, n)


cdef void matvec_f32(float* out, const float* w, const float* x, Py_ssize_t rows, Py_ssize_t cols,
                     int n_threads) noexcept nogil:
    cdef Py_ssize_t i, g
    cdef Py_ssize_t grouped = rows - rows % 4 if HAVE_DOT4 else 0
    # small matrices stay on the calling thread (threads.pyx); a row is one dot product whoever computes it
    if team_size(n_threads, rows * cols) == 1:
        for g in range(0, grouped, 4):
            dot4_f32(w + g * cols, cols, x, cols, out + g)
    else:
        # groups of four rows are fixed by the row index, so the split is the same for any team size
        for g in prange(grouped // 4, schedule="static", num_threads=n_threads):
            dot4_f32(w + 4 * g * cols, cols, x, cols, out + 4 * g)
        if grouped == 0:
            for i in prange(rows, schedule="static", num_threads=n_threads):
                out[i] = dot_f32(w + i * cols, x, cols)
            return
    for i in range(grouped, rows):
        out[i] = dot_f32(w + i * cols, x, cols)


cdef void matmul_f32(float* out, const float* w, const float* x, Py_ssize_t n_pos, Py_ssize_t rows, Py_ssize_t cols,
                     int n_threads) noexcept nogil:
    """out[p, i] = dot_f32(w[i], x[p]) bit for bit, in tiles of 4 rows x 3 positions that reuse every
    loaded vector (AVX2 + FMA; elsewhere one dot_f32 per element). A tile of rows is read from
    memory once per block and stays in cache for all positions; tiles are split over threads."""
    cdef Py_ssize_t t, n_tiles = (rows + 3) // 4
    if team_size(n_threads, rows * cols * n_pos) == 1:
        for t in range(n_tiles):
            matmul_f32_rows(out, w, x, n_pos, rows, cols, 4 * t, min(4 * t + 4, rows))
        return
    for t in prange(n_tiles, schedule="static", num_threads=n_threads):
        matmul_f32_rows(out, w, x, n_pos, rows, cols, 4 * t, min(4 * t + 4, rows))


cdef void matmul(float* out, const Matrix* m, const float* x, Py_ssize_t n_pos, QuantScratch* scratch,
                 int n_threads) noexcept nogil:
    """out[n_pos, rows] = x[n_pos, cols] @ W^T, each weight row read once per block of positions.

    Element (p, i) is bit-identical to ``matvec`` on x[p]: the same dot product of the same type,
    after the same activation quantisation (``scratch`` holds n_pos quantised vectors; see
    ``quant_scratch``). Rows are split over threads with a static schedule, as in ``matvec``."""
    if n_pos == 1:
        matvec(out, m, x, scratch, n_threads)
    elif m.qtype == QTYPE_F32:
        matmul_f32(out, <const float*>m.data, x, n_pos, m.rows, m.cols, n_threads)
    elif m.qtype == QTYPE_F16:
        matmul_f16(out, m, x, n_pos, n_threads)
    elif m.qtype == QTYPE_Q8_0:
        matmul_q8_0(out, m, x, n_pos, scratch, n_threads)
    elif m.qtype == QTYPE_Q8_GROUPS:
        matmul_q8_groups(out, m, x, n_pos, scratch, n_threads)
    elif QTYPE_Q4_0 <= m.qtype <= QTYPE_BF16:
        matmul_qlegacy(out, m, x, n_pos, scratch, n_threads)
    elif QTYPE_Q2_K <= m.qtype <= QTYPE_Q6_K:
        matmul_kquant(out, m, x, n_pos, scratch, n_threads)


cdef void matvec(float* out, const Matrix* m, const float* x, QuantScratch* scratch, int n_threads) noexcept nogil:
    if m.qtype == QTYPE_F32:
        matvec_f32(out, <const float*>m.data, x, m.rows, m.cols, n_threads)
    elif m.qtype == QTYPE_F16:
        matvec_f16(out, m, x, n_threads)
    elif m.qtype == QTYPE_Q8_0:
        matvec_q8_0(out, m, x, scratch, n_threads)
    elif m.qtype == QTYPE_Q8_GROUPS:
        matvec_q8_groups(out, m, x, scratch, n_threads)
    elif QTYPE_Q4_0 <= m.qtype <= QTYPE_BF16:
        matmul_qlegacy(out, m, x, 1, scratch, n_threads)
    elif QTYPE_Q2_K <= m.qtype <= QTYPE_Q6_K:
        matmul_kquant(out, m, x, 1, scratch, n_threads)


cdef void embedding_row(float* out, const Matrix* m, Py_ssize_t row) noexcept nogil:
    """out[cols] = row ``row`` of m as float32 (the token embedding lookup)."""
    cdef const float* src
    cdef Py_ssize_t j
    if m.qtype == QTYPE_F32:
        src = (<const float*>m.data) + row * m.cols
        for j in range(m.cols):
            out[j] = src[j]
    elif QTYPE_Q4_0 <= m.qtype <= QTYPE_BF16:
        dequantize_row_qlegacy(out, m, row)
    elif QTYPE_Q2_K <= m.qtype <= QTYPE_Q6_K:
        dequantize_row_kquant(out, m, row)
    else:
        dequantize_row(out, m, row)


def matvec_np(const float[:, ::1] w, const float[::1] x, int n_threads=1):
    """float32 W @ x through the engine's kernel (for tests and benchmarks)."""
    if w.shape[1] != x.shape[0]:
        raise ValueError(f"matvec: W has {w.shape[1]} columns but x has {x.shape[0]} values")
    out = np.zeros(w.shape[0], dtype=np.float32)
    cdef float[::1] o = out
    if w.shape[0] and w.shape[1]:
        with nogil:
            matvec_f32(&o[0], &w[0, 0], &x[0], w.shape[0], w.shape[1], n_threads)
    return out


cdef Matrix matrix_of(object tensor):
    """The kernel's view of a ``pyllama.checkpoint.weights.Tensor`` (pointers into its arrays)."""
    cdef Matrix m
    m.qtype = int(tensor.qtype)
    m.data = <const void*><size_t>tensor.data.ctypes.data
    m.scales = NULL
    m.group_size = tensor.group_size
    if tensor.scales is not None:
        m.scales = <const float*><size_t>tensor.scales.ctypes.data
    m.rows = tensor.rows
    m.cols = tensor.cols
    return m


cdef object quant_scratch(QuantScratch* scratch, Py_ssize_t cols, Py_ssize_t n_pos=1):
    """Point ``scratch`` at new buffers for products over ``cols`` inputs at ``n_pos`` positions (the
    activation quantised to Q8_0, Q8_1, Q8_K or int8 groups); keep the returned owner alive."""
    n = max(cols * n_pos, 1)
    owner = (np.zeros(n, dtype=np.int8), np.zeros(n, dtype=np.float32),
             np.zeros(n // 32 + 1, dtype=np.float32), np.zeros(n // 16 + 1, dtype=np.int16))
    scratch.q = <signed char*><size_t>owner[0].ctypes.data
    scratch.scales = <float*><size_t>owner[1].ctypes.data
    scratch.sums = <float*><size_t>owner[2].ctypes.data
    scratch.bsums = <short*><size_t>owner[3].ctypes.data
    return owner


def matvec_tensor(tensor, const float[::1] x, int n_threads=1):
    """W @ x for a weight ``Tensor`` of any stored type, through the engine's kernels."""
    if tensor.cols != x.shape[0] or tensor.cols == 0 or tensor.rows == 0:
        raise ValueError(f"matvec: W is {tensor.rows}x{tensor.cols} but x has {x.shape[0]} values")
    cdef Matrix m = matrix_of(tensor)
    cdef QuantScratch scratch
    _owner = quant_scratch(&scratch, tensor.cols)  # keeps the buffers alive
    out = np.zeros(tensor.rows, dtype=np.float32)
    cdef float[::1] o = out
    with nogil:
        matvec(&o[0], &m, &x[0], &scratch, n_threads)
    return out


def matmul_tensor(tensor, const float[:, ::1] x, int n_threads=1):
    """x @ W^T (float32[n_pos, rows]) for a weight ``Tensor`` of any stored type, through ``matmul``."""
    if tensor.cols != x.shape[1] or tensor.cols == 0 or tensor.rows == 0 or x.shape[0] == 0:
        raise ValueError(f"matmul: W is {tensor.rows}x{tensor.cols} but x is {x.shape[0]}x{x.shape[1]}")
    cdef Matrix m = matrix_of(tensor)
    cdef QuantScratch scratch
    _owner = quant_scratch(&scratch, tensor.cols, x.shape[0])  # keeps the buffers alive
    out = np.zeros((x.shape[0], tensor.rows), dtype=np.float32)
    cdef float[:, ::1] o = out
    with nogil:
        matmul(&o[0, 0], &m, &x[0, 0], x.shape[0], &scratch, n_threads)
    return out


def embedding_row_tensor(tensor, Py_ssize_t row):
    """Row ``row`` of a weight ``Tensor`` of any stored type as float32, through ``embedding_row``."""
    if not 0 <= row < tensor.rows:
        raise IndexError(f"row {row} is outside a tensor of {tensor.rows} rows")
    cdef Matrix m = matrix_of(tensor)
    out = np.zeros(tensor.cols, dtype=np.float32)
    cdef float[::1] o = out
    if tensor.cols:
        with nogil:
            embedding_row(&o[0], &m, row)
    return out
