"""Matrix-vector products: out[rows] = W[rows, cols] @ x[cols], the cost of decoding.

Decode reads every weight once per token, so these kernels are written to stream memory: each row
is a dot product with 16 independent float accumulators (the compiler maps them to SIMD lanes
without reassociating anything, so no -ffast-math is needed), and rows are split across OpenMP
threads with a static schedule. A row is always computed by one thread with the same arithmetic,
so the result is bit-identical for any thread count.

``matvec`` dispatches on the stored type; quantised types live in ``quant.pyx``.
"""

from cython.parallel cimport prange

import numpy as np

from pyllama.kernels.quant cimport matvec_f16, matvec_q8_0, matvec_q8_groups, dequantize_row

DEF WIDE = 64  # 8 independent 8-float vectors: enough FMAs in flight to hide their latency
DEF LANES = 16
# Below this many weights a matrix is multiplied on the calling thread: waking the team costs more
# than it saves (the result is the same either way: a row is one dot product whoever computes it).
DEF SERIAL_BELOW = 1 << 15


cdef float dot_f32(const float* a, const float* b, Py_ssize_t n) noexcept nogil:
    """Dot product with independent accumulators; the summation order depends on n alone."""
    cdef float acc[WIDE]
    cdef Py_ssize_t j, u
    cdef Py_ssize_t n_wide = n - n % WIDE
    cdef Py_ssize_t n_main = n - n % LANES
    for u in range(WIDE):
        acc[u] = 0.0
    for j in range(0, n_wide, WIDE):
        for u in range(WIDE):
            acc[u] = acc[u] + a[j + u] * b[j + u]
    for j in range(n_wide, n_main, LANES):
        for u in range(LANES):
            acc[u] = acc[u] + a[j + u] * b[j + u]
    # fixed reduction: 64 lanes to 16, 16 to 4, 4 to 1, then the tail in order
    for u in range(LANES):
        acc[u] = (acc[u] + acc[u + 16]) + (acc[u + 32] + acc[u + 48])
    for u in range(4):
        acc[u] = (acc[u] + acc[u + 4]) + (acc[u + 8] + acc[u + 12])
    cdef float total = (acc[0] + acc[2]) + (acc[1] + acc[3])
    for j in range(n_main, n):
        total = total + a[j] * b[j]
    return total


cdef void matvec_f32(float* out, const float* w, const float* x, Py_ssize_t rows, Py_ssize_t cols,
                     int n_threads) noexcept nogil:
    cdef Py_ssize_t i
    if rows * cols < SERIAL_BELOW:
        for i in range(rows):
            out[i] = dot_f32(w + i * cols, x, cols)
        return
    for i in prange(rows, schedule="static", num_threads=n_threads):
        out[i] = dot_f32(w + i * cols, x, cols)


cdef void matvec(float* out, const Matrix* m, const float* x, QuantScratch* scratch, int n_threads) noexcept nogil:
    if m.qtype == QTYPE_F32:
        matvec_f32(out, <const float*>m.data, x, m.rows, m.cols, n_threads)
    elif m.qtype == QTYPE_F16:
        matvec_f16(out, m, x, n_threads)
    elif m.qtype == QTYPE_Q8_0:
        matvec_q8_0(out, m, x, scratch, n_threads)
    elif m.qtype == QTYPE_Q8_GROUPS:
        matvec_q8_groups(out, m, x, scratch, n_threads)


cdef void embedding_row(float* out, const Matrix* m, Py_ssize_t row) noexcept nogil:
    """out[cols] = row ``row`` of m as float32 (the token embedding lookup)."""
    cdef const float* src
    cdef Py_ssize_t j
    if m.qtype == QTYPE_F32:
        src = (<const float*>m.data) + row * m.cols
        for j in range(m.cols):
            out[j] = src[j]
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


def matvec_tensor(tensor, const float[::1] x, int n_threads=1):
    """W @ x for a weight ``Tensor`` of any stored type, through the engine's kernels."""
    if tensor.cols != x.shape[0] or tensor.cols == 0 or tensor.rows == 0:
        raise ValueError(f"matvec: W is {tensor.rows}x{tensor.cols} but x has {x.shape[0]} values")
    cdef Matrix m = matrix_of(tensor)
    cdef QuantScratch scratch
    q = np.zeros(tensor.cols, dtype=np.int8)
    s = np.zeros(tensor.cols, dtype=np.float32)
    cdef signed char[::1] qv = q
    cdef float[::1] sv = s
    scratch.q = &qv[0]
    scratch.scales = &sv[0]
    out = np.zeros(tensor.rows, dtype=np.float32)
    cdef float[::1] o = out
    with nogil:
        matvec(&o[0], &m, &x[0], &scratch, n_threads)
    return out
