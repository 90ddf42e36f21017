"""Matrix-vector products: out[rows] = W[rows, cols] @ x[cols], the cost of decoding.

Decode reads every weight once per token, so these kernels are written to stream memory: a float32
row is a dot product in 16 lanes reduced in a fixed order (``f32dot.h``; no -ffast-math is needed,
nothing is reassociated), rows go four at a time (``pyllama_dot4_f32``, AVX2 or AVX-512), and rows
are split across OpenMP threads with a static schedule. The four rows of a group lie a quarter of
the matrix apart: four adjacent rows share their pages, and the hardware prefetcher, which follows
streams within a page, then stalls on the back-and-forth. Four distant rows are four clean streams
(measured from DRAM on a 60 MB matrix of 288-column rows, one AMD EPYC core: 13 GB/s for one row at a
time, 10 for four adjacent, 22 for four apart; in cache the same as adjacent). A row is always
computed by one thread with the same arithmetic, whichever form computes it, so the result is
bit-identical for any thread count; the tests check this bit for bit.

``matvec`` dispatches on the stored type; quantised types live in ``quant.pyx`` (F16, Q8_0, llama2.c
int8 groups), ``qlegacy.pyx`` (Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, BF16) and ``kquants.pyx`` (Q2_K-Q6_K).
``matmul`` is the block product (prompts, teacher forcing): each weight row is read once per block of
positions and every element keeps exactly ``matvec``'s arithmetic.
"""

from cython.parallel cimport prange

import numpy as np

from pyllama.kernels.aligned import zeros_aligned

from pyllama.kernels.f16 cimport matvec_f16, matmul_f16
from pyllama.kernels.quant cimport (
    matvec_q8_0, matvec_q8_0_many, matvec_q8_groups, matmul_q8_0, matmul_q8_0_many, matmul_q8_groups, dequantize_row,
)
from pyllama.kernels.threads cimport team_size
from pyllama.kernels.qlegacy cimport dequantize_row_qlegacy, qlegacy_product
from pyllama.kernels.kquants cimport dequantize_row_kquant, kquant_product
from pyllama.kernels.qproduct cimport RowProduct, quant_product_many

cdef extern from "f32dot.h":
    # the float32 dot product, its four-row form and the block tile, in one order (f32dot.h)
    bint HAVE_DOT4 "PYLLAMA_HAVE_DOT4"
    # rows per strip of the block product (each strip one thread's, one tile's rows)
    const Py_ssize_t STRIP "PYLLAMA_F32_STRIP"
    void dot4_f32 "pyllama_dot4_f32"(const float* w, Py_ssize_t stride, const float* x, Py_ssize_t n,
                                     float* out, Py_ssize_t out_stride) noexcept nogil
    float dot_f32_c "pyllama_dot_f32"(const float* a, const float* b, Py_ssize_t n) noexcept nogil
    void matmul_f32_rows "pyllama_matmul_f32_rows"(float* out, const float* w, const float* x, Py_ssize_t n_pos,
                                                   Py_ssize_t rows, Py_ssize_t cols, Py_ssize_t r0,
                                                   Py_ssize_t r1) noexcept nogil


cdef float dot_f32(const float* a, const float* b, Py_ssize_t n) noexcept nogil:
    """Dot product in 16 lanes; the summation order depends on n alone.

    Lane u accumulates a[j] * b[j] for j = u (mod 16) over the whole groups of 16 (fused
    multiply-adds where the CPU has them); the lanes are reduced 16 -> 4 -> 1 in a fixed order and
    the last n mod 16 products added in order. (C in f32dot.h, so that ``matmul``'s tile and the
    four-row form share it.)"""
    return dot_f32_c(a, b, n)


cdef void matvec_f32(float* out, const float* w, const float* x, Py_ssize_t rows, Py_ssize_t cols,
                     int n_threads) noexcept nogil:
    cdef Py_ssize_t i, g
    # group g is rows g, g + q, g + 2q and g + 3q: four weight streams (see the module's docstring)
    cdef Py_ssize_t q = (rows // 4) if HAVE_DOT4 else 0
    cdef Py_ssize_t grouped = 4 * q
    # small matrices stay on the calling thread (threads.pyx); a row is one dot product whoever computes it
    if team_size(n_threads, rows * cols) == 1:
        for g in range(q):
            dot4_f32(w + g * cols, q * cols, x, cols, out + g, q)
    else:
        # the groups are fixed by the row index, so the split is the same for any team size
        for g in prange(q, schedule="static", num_threads=n_threads):
            dot4_f32(w + g * cols, q * cols, x, cols, out + g, q)
        if grouped == 0:
            for i in prange(rows, schedule="static", num_threads=n_threads):
                out[i] = dot_f32(w + i * cols, x, cols)
            return
    for i in range(grouped, rows):
        out[i] = dot_f32(w + i * cols, x, cols)


cdef void matmul_f32_many(int count, float** outs, const Matrix** ms, const float* x, Py_ssize_t n_pos,
                          int n_threads) noexcept nogil:
    """outs[k][p, i] = dot_f32(W_k[i], x[p]) bit for bit for count <= MAX_MANY matrices over the same x,
    in strips of 4 rows (f32dot.h: tiles of 4 rows x 3 positions over chunks of columns that keep the
    strip in L1; AVX2 + FMA, elsewhere one dot_f32 per element). A strip is read from memory once per
    block; the strips of all the matrices are split over threads in one parallel loop (one barrier
    instead of count)."""
    cdef Py_ssize_t first[MAX_MANY + 1]
    cdef Py_ssize_t t, n_strips = number_units(first, ms, count, STRIP)
    cdef long long work = 0
    cdef int k
    for k in range(count):
        work += ms[k].rows * ms[k].cols * n_pos
    if team_size(n_threads, work) == 1:
        for t in range(n_strips):
            f32_strip_of(outs, ms, first, count, t, x, n_pos)
        return
    for t in prange(n_strips, schedule="static", num_threads=n_threads):
        f32_strip_of(outs, ms, first, count, t, x, n_pos)


cdef inline void f32_strip_of(float** outs, const Matrix** ms, const Py_ssize_t* first, int count, Py_ssize_t t,
                              const float* x, Py_ssize_t n_pos) noexcept nogil:
    """Strip t of the matrices taken one after another."""
    cdef int k = matrix_of_unit(first, count, t)
    cdef Py_ssize_t r0 = STRIP * (t - first[k])
    matmul_f32_rows(outs[k], <const float*>ms[k].data, x, n_pos, ms[k].rows, ms[k].cols, r0,
                    min(r0 + STRIP, ms[k].rows))


cdef void matvec_f32_many(int count, float** outs, const Matrix** ms, const float* x, int n_threads) noexcept nogil:
    """matvec_f32 of count <= MAX_MANY float32 matrices over the same x: the four-row groups of all of
    them in one parallel loop (a decode step's Q, K and V, or gate and up: one barrier instead of
    count), then each matrix's last rows % 4 rows; every row is matvec_f32's computation."""
    cdef Py_ssize_t first[MAX_MANY + 1]
    cdef Py_ssize_t t
    cdef long long work = 0
    cdef int k
    first[0] = 0
    for k in range(count):
        first[k + 1] = first[k] + ms[k].rows // 4
        work += ms[k].rows * ms[k].cols
    if team_size(n_threads, work) == 1:
        for t in range(first[count]):
            f32_group_of(outs, ms, first, count, t, x)
    else:
        for t in prange(first[count], schedule="static", num_threads=n_threads):
            f32_group_of(outs, ms, first, count, t, x)
    cdef Py_ssize_t i, cols
    for k in range(count):
        cols = ms[k].cols
        for i in range(4 * (ms[k].rows // 4), ms[k].rows):
            outs[k][i] = dot_f32((<const float*>ms[k].data) + i * cols, x, cols)


cdef inline void f32_group_of(float** outs, const Matrix** ms, const Py_ssize_t* first, int count, Py_ssize_t t,
                              const float* x) noexcept nogil:
    """Four-row group t of the matrices taken one after another: rows g, g + q, g + 2q, g + 3q of its
    matrix (q = rows // 4), as matvec_f32 groups them."""
    cdef int k = matrix_of_unit(first, count, t)
    cdef Py_ssize_t g = t - first[k], q = ms[k].rows // 4, cols = ms[k].cols
    dot4_f32((<const float*>ms[k].data) + g * cols, q * cols, x, cols, outs[k] + g, q)


cdef bint block_quantised(int qtype) noexcept nogil:
    return QTYPE_Q4_0 <= qtype <= QTYPE_BF16 or QTYPE_Q2_K <= qtype <= QTYPE_Q6_K


cdef RowProduct product_of(const Matrix* m) noexcept nogil:
    """How a block-quantised matrix is multiplied: qlegacy.pyx's types or kquants.pyx's."""
    return qlegacy_product(m) if m.qtype <= QTYPE_BF16 else kquant_product(m)


cdef void matmul_block_quantised(float* out, const Matrix* m, const float* x, Py_ssize_t n_pos,
                                 QuantScratch* scratch, int n_threads) noexcept nogil:
    """A block-quantised matrix alone: quant_product_many's group of one."""
    cdef RowProduct plan = product_of(m)
    quant_product_many(1, &out, &m, &plan, x, n_pos, scratch, n_threads)


cdef void matmul_many(int count, float** outs, const Matrix** ms, const float* x, Py_ssize_t n_pos,
                      QuantScratch* scratch, int n_threads) noexcept nogil:
    """outs[k][n_pos, ms[k].rows] = x @ W_k^T for k < count (count <= MAX_MANY, every W_k with x's
    columns), for a block or for one position (decode). Matrices that can share one parallel loop do:
    all F32, all Q8_0, or all block-quantised types that pair with the same activation type (a Q4_K_M
    file's Q4_K and Q6_K matrices both take Q8_K). That saves count - 1 barriers per call (Q, K and V;
    the FFN's gate and up) and, for the quantised types, quantising x again for each matrix. Any
    other mix is one ``matmul`` after another. Every element is ``matmul``'s (``matvec``'s for one
    position), so the bits do not depend on the grouping."""
    cdef int k
    cdef bint same_cols = True, same_type = True
    cdef RowProduct plans[MAX_MANY]
    for k in range(1, count):
        same_cols = same_cols and ms[k].cols == ms[0].cols
        same_type = same_type and ms[k].qtype == ms[0].qtype
    if same_cols and same_type and ms[0].qtype == QTYPE_F32:
        if n_pos > 1:
            matmul_f32_many(count, outs, ms, x, n_pos, n_threads)
        elif HAVE_DOT4:
            matvec_f32_many(count, outs, ms, x, n_threads)
        else:
            matmul_each(count, outs, ms, x, n_pos, scratch, n_threads)
        return
    if same_cols and same_type and ms[0].qtype == QTYPE_Q8_0:
        if n_pos > 1:
            matmul_q8_0_many(count, outs, ms, x, n_pos, scratch, n_threads)
        else:
            matvec_q8_0_many(count, outs, ms, x, scratch, n_threads)
        return
    cdef bint grouped = same_cols
    for k in range(count):
        grouped = grouped and block_quantised(ms[k].qtype)
        if grouped:
            plans[k] = product_of(ms[k])
            grouped = plans[k].act == plans[0].act
    if grouped:
        quant_product_many(count, outs, ms, plans, x, n_pos, scratch, n_threads)
    else:
        matmul_each(count, outs, ms, x, n_pos, scratch, n_threads)


cdef inline void matmul_each(int count, float** outs, const Matrix** ms, const float* x, Py_ssize_t n_pos,
                             QuantScratch* scratch, int n_threads) noexcept nogil:
    cdef int k
    for k in range(count):
        matmul(outs[k], ms[k], x, n_pos, scratch, n_threads)


cdef void matmul(float* out, const Matrix* m, const float* x, Py_ssize_t n_pos, QuantScratch* scratch,
                 int n_threads) noexcept nogil:
    """out[n_pos, rows] = x[n_pos, cols] @ W^T, each weight row read once per block of positions.

    Element (p, i) is bit-identical to ``matvec`` on x[p]: the same dot product of the same type,
    after the same activation quantisation (``scratch`` holds n_pos quantised vectors; see
    ``quant_scratch``). Rows are split over threads with a static schedule, as in ``matvec``."""
    if n_pos == 1:
        matvec(out, m, x, scratch, n_threads)
    elif m.qtype == QTYPE_F32:
        matmul_f32_many(1, &out, &m, x, n_pos, n_threads)
    elif m.qtype == QTYPE_F16:
        matmul_f16(out, m, x, n_pos, n_threads)
    elif m.qtype == QTYPE_Q8_0:
        matmul_q8_0(out, m, x, n_pos, scratch, n_threads)
    elif m.qtype == QTYPE_Q8_GROUPS:
        matmul_q8_groups(out, m, x, n_pos, scratch, n_threads)
    elif block_quantised(m.qtype):
        matmul_block_quantised(out, m, x, n_pos, scratch, n_threads)


cdef void matvec(float* out, const Matrix* m, const float* x, QuantScratch* scratch, int n_threads) noexcept nogil:
    if m.qtype == QTYPE_F32:
        matvec_f32(out, <const float*>m.data, x, m.rows, m.cols, n_threads)
    elif m.qtype == QTYPE_F16:
        matvec_f16(out, m, x, n_threads)
    elif m.qtype == QTYPE_Q8_0:
        matvec_q8_0(out, m, x, scratch, n_threads)
    elif m.qtype == QTYPE_Q8_GROUPS:
        matvec_q8_groups(out, m, x, scratch, n_threads)
    elif block_quantised(m.qtype):
        matmul_block_quantised(out, m, x, 1, scratch, n_threads)


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
    owner = (zeros_aligned(n, np.int8), zeros_aligned(n, np.float32),  # the kernels load these in vectors
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


def matmul_many_tensors(tensors, const float[:, ::1] x, int n_threads=1):
    """[x @ W_k^T for each weight ``Tensor``] through ``matmul_many`` (up to MAX_MANY tensors of x's
    columns; one position is decode's grouped product, several a block's)."""
    cdef int count = len(tensors), k
    if not 1 <= count <= MAX_MANY:
        raise ValueError(f"matmul_many: 1 to {MAX_MANY} tensors, got {count}")
    if x.shape[0] == 0 or x.shape[1] == 0 or any(t.cols != x.shape[1] or t.rows == 0 for t in tensors):
        raise ValueError(f"matmul_many: every tensor needs x's {x.shape[1]} columns and rows")
    cdef Matrix ms[MAX_MANY]
    cdef const Matrix* mp[MAX_MANY]
    cdef float* op[MAX_MANY]
    cdef float[:, ::1] o
    cdef QuantScratch scratch
    _owner = quant_scratch(&scratch, x.shape[1], x.shape[0])  # keeps the buffers alive
    outs = [np.zeros((x.shape[0], t.rows), dtype=np.float32) for t in tensors]
    for k in range(count):
        ms[k] = matrix_of(tensors[k])
        mp[k] = &ms[k]
        o = outs[k]
        op[k] = &o[0, 0]
    with nogil:
        matmul_many(count, op, mp, &x[0, 0], x.shape[0], &scratch, n_threads)
    return outs


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
