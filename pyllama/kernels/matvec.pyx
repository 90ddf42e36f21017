"""The products the engine calls: out[n_pos, rows] = x[n_pos, cols] @ W^T for a weight matrix of any type.

``matvec`` (one position: decode), ``matmul`` (a block of positions: prompts, teacher forcing; each weight
row read once per block) and ``matmul_many`` (up to MAX_MANY matrices over the same x: Q, K and V, the
FFN's gate and up) hand their matrices to the product loop of ``qproduct.pyx``, which reads each type's
row of the table (``qtypes.h``): what x is quantised to, how the matrix splits into units, and the kernels
of this build's SIMD path. Element (p, i) of a block product is bit-identical to ``matvec`` on x[p], and
every element is computed by one thread with fixed arithmetic, so the results are the same for any thread
count; the tests check this bit for bit. ``embedding_row`` is the type's row dequantiser.

``dot_f32`` is the float32 dot product's one order (``f32dot.h``), which the attention and the plugins
share with the F32 products.
"""

import os

import numpy as np

from pyllama.kernels.aligned import zeros_aligned

from pyllama.kernels.qproduct cimport QTYPE_F32, PackedCopy, dequantize_row, packed_size, product_many

# PYLLAMA_REPACK=off: every product reads the memory-mapped file (no packed copies; the same bits)
REPACK_ENV = "PYLLAMA_REPACK"

cdef extern from "f32dot.h":
    float dot_f32_c "pyllama_dot_f32"(const float* a, const float* b, Py_ssize_t n) noexcept nogil


cdef float dot_f32(const float* a, const float* b, Py_ssize_t n) noexcept nogil:
    """Dot product in 16 lanes; the summation order depends on n alone.

    Lane u accumulates a[j] * b[j] for j = u (mod 16) over the whole groups of 16 (fused
    multiply-adds where the CPU has them); the lanes are reduced 16 -> 4 -> 1 in a fixed order and
    the last n mod 16 products added in order. (C in f32dot.h, so that the F32 products' tiles and
    four-row form share it.)"""
    return dot_f32_c(a, b, n)


cdef void matvec(float* out, const Matrix* m, const float* x, QuantScratch* scratch, int n_threads) noexcept nogil:
    product_many(1, &out, &m, x, 1, scratch, n_threads)


cdef void matmul(float* out, const Matrix* m, const float* x, Py_ssize_t n_pos, QuantScratch* scratch,
                 int n_threads) noexcept nogil:
    """out[n_pos, rows] = x[n_pos, cols] @ W^T, each weight row read once per block of positions.

    Element (p, i) is bit-identical to ``matvec`` on x[p]: the same kernel of the same type, after the
    same activation quantisation (``scratch`` holds n_pos quantised vectors; see ``quant_scratch``)."""
    product_many(1, &out, &m, x, n_pos, scratch, n_threads)


cdef void matmul_many(int count, float** outs, const Matrix** ms, const float* x, Py_ssize_t n_pos,
                      QuantScratch* scratch, int n_threads) noexcept nogil:
    """outs[k][n_pos, ms[k].rows] = x @ W_k^T for k < count (count <= MAX_MANY, every W_k with x's
    columns), for a block or for one position (decode). Matrices whose rows share an activation type
    share one parallel loop (a Q4_K_M file's Q4_K and Q6_K matrices both take Q8_K): count - 1 barriers
    fewer per call and x quantised once. Every element is ``matmul``'s, so the bits do not depend on
    the grouping."""
    product_many(count, outs, ms, x, n_pos, scratch, n_threads)


cdef void embedding_row(float* out, const Matrix* m, Py_ssize_t row) noexcept nogil:
    """out[cols] = row ``row`` of m as float32 (the token embedding lookup)."""
    dequantize_row(out, m, row)


def matvec_np(const float[:, ::1] w, const float[::1] x, int n_threads=1):
    """float32 W @ x through the engine's product (for tests and benchmarks)."""
    if w.shape[1] != x.shape[0]:
        raise ValueError(f"matvec: W has {w.shape[1]} columns but x has {x.shape[0]} values")
    out = np.zeros(w.shape[0], dtype=np.float32)
    cdef float[::1] o = out
    cdef Matrix m
    cdef QuantScratch scratch  # float32 rows quantise nothing: the product reads x itself
    scratch.q, scratch.scales, scratch.sums, scratch.bsums, scratch.isums = NULL, NULL, NULL, NULL, NULL
    if w.shape[0] and w.shape[1]:
        m.qtype, m.data, m.pack, m.scales, m.group_size = QTYPE_F32, &w[0, 0], NULL, NULL, 0
        m.rows, m.cols = w.shape[0], w.shape[1]
        with nogil:
            matvec(&o[0], &m, &x[0], &scratch, n_threads)
    return out


def repack_enabled() -> bool:
    """Whether products may take packed copies (PYLLAMA_REPACK is not "off")."""
    return os.environ.get(REPACK_ENV, "on").lower() not in ("off", "0", "no", "false")


def packing_of(tensor):
    """The tensor's ``PackedCopy`` (made now if it has none; empty until a product needs it), or None when
    its matrix is multiplied from the file's layout (its type or shape has no packed layout)."""
    if packed_size(int(tensor.qtype), tensor.rows, tensor.cols) <= 0:
        return None
    if tensor.packing is None:
        tensor.packing = PackedCopy(tensor)
    return tensor.packing


cdef Matrix matrix_of(object tensor, bint pack=True):
    """The kernel's view of a ``pyllama.checkpoint.weights.Tensor`` (pointers into its arrays). With
    ``pack`` (and repacking enabled), its first product makes the tensor's packed copy, which every later
    product of any Matrix of that tensor reads."""
    cdef Matrix m
    cdef PackedCopy packing = packing_of(tensor) if pack and repack_enabled() else None
    m.qtype = int(tensor.qtype)
    m.data = <const void*><size_t>tensor.data.ctypes.data
    m.pack = &packing.slot if packing is not None else NULL
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
             np.zeros(n // 32 + 1, dtype=np.float32), np.zeros(n // 16 + 1, dtype=np.int16),
             np.zeros(n // 4 + n // 32 + 1, dtype=np.int32))
    scratch.q = <signed char*><size_t>owner[0].ctypes.data
    scratch.scales = <float*><size_t>owner[1].ctypes.data
    scratch.sums = <float*><size_t>owner[2].ctypes.data
    scratch.bsums = <short*><size_t>owner[3].ctypes.data
    scratch.isums = <int*><size_t>owner[4].ctypes.data
    return owner


def matvec_tensor(tensor, const float[::1] x, int n_threads=1, bint packed=True):
    """W @ x for a weight ``Tensor`` of any stored type, through the engine's kernels (``packed=False``:
    never from its packed copy)."""
    if tensor.cols != x.shape[0] or tensor.cols == 0 or tensor.rows == 0:
        raise ValueError(f"matvec: W is {tensor.rows}x{tensor.cols} but x has {x.shape[0]} values")
    cdef Matrix m = matrix_of(tensor, packed)
    cdef QuantScratch scratch
    _owner = quant_scratch(&scratch, tensor.cols)  # keeps the buffers alive
    out = np.zeros(tensor.rows, dtype=np.float32)
    cdef float[::1] o = out
    with nogil:
        matvec(&o[0], &m, &x[0], &scratch, n_threads)
    return out


def matmul_tensor(tensor, const float[:, ::1] x, int n_threads=1, bint packed=True):
    """x @ W^T (float32[n_pos, rows]) for a weight ``Tensor`` of any stored type, through ``matmul``."""
    if tensor.cols != x.shape[1] or tensor.cols == 0 or tensor.rows == 0 or x.shape[0] == 0:
        raise ValueError(f"matmul: W is {tensor.rows}x{tensor.cols} but x is {x.shape[0]}x{x.shape[1]}")
    cdef Matrix m = matrix_of(tensor, packed)
    cdef QuantScratch scratch
    _owner = quant_scratch(&scratch, tensor.cols, x.shape[0])  # keeps the buffers alive
    out = np.zeros((x.shape[0], tensor.rows), dtype=np.float32)
    cdef float[:, ::1] o = out
    with nogil:
        matmul(&o[0, 0], &m, &x[0, 0], x.shape[0], &scratch, n_threads)
    return out


def matmul_many_tensors(tensors, const float[:, ::1] x, int n_threads=1, bint packed=True):
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
        ms[k] = matrix_of(tensors[k], packed)
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
    cdef Matrix m = matrix_of(tensor, False)
    out = np.zeros(tensor.cols, dtype=np.float32)
    cdef float[::1] o = out
    if tensor.cols:
        with nogil:
            embedding_row(&o[0], &m, row)
    return out
