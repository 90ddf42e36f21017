"""One product loop for every block-quantised weight type: quantise the activation, then row dots.

``quant_product_many`` computes ``out[p, r] = W[r] · x[p]`` for ``n_pos`` positions and up to
``MAX_MANY`` matrices that pair with the same activation type. The activation of each
position is quantised once, before any row is read, to the type llama.cpp pairs with the weight type
(Q8_0, Q8_1 or Q8_K: ``act``), into ``scratch`` (sized for ``n_pos`` positions by ``quant_scratch``).
Rows are split across OpenMP threads with a static schedule and the positions are the inner loop, so a
weight row is read from memory once per block of positions. Element (p, r) is ``dot(W[r], act[p])``
whatever ``n_pos``, the thread count or the row's thread: a block product is bit-identical to the
one-position product on x[p].
"""

from cython.parallel cimport parallel, prange

import numpy as np

from pyllama.kernels.matvec cimport MAX_MANY, matrix_of_unit
from pyllama.kernels.quant cimport quantize_q8_0
from pyllama.kernels.threads cimport team_barrier, team_size

cdef extern from "qblocks.h":
    const char* qblocks_path "pyllama_qblocks_path"() noexcept nogil
    bint qblocks_native "pyllama_qblocks_native"() noexcept nogil
    void quantize_q8_1 "pyllama_quantize_q8_1"(signed char* q, float* d, float* s, const float* x,
                                               Py_ssize_t n) noexcept nogil
    void quantize_q8_k "pyllama_quantize_q8_k"(signed char* q, float* d, short* bsums, const float* x,
                                               Py_ssize_t n) noexcept nogil

# Work in team_size's float32 multiply-add units: a 4-6-bit row streams about a quarter of the bytes
# of a float32 one, so its multiply-adds count a quarter (as int8 rows do in quant.pyx).
DEF QBLOCK_WORK_DIV = 4


cdef inline pyllama_qact activation_of(const QuantScratch* scratch, const float* x, Py_ssize_t cols,
                                       Py_ssize_t p) noexcept nogil:
    """Position p's quantised activation: every buffer holds n_pos equal strides."""
    cdef pyllama_qact a
    a.q = scratch.q + p * cols
    a.d = scratch.scales + p * (cols // 32)
    a.s = scratch.sums + p * (cols // 32)
    a.bsums = scratch.bsums + p * (cols // 16)
    a.x = x + p * cols
    return a


cdef inline void quantize_position(Py_ssize_t cols, const float* x, Py_ssize_t p, QuantScratch* scratch,
                                   int act) noexcept nogil:
    """Position p's activation quantised to act; positions are independent (any thread, any order)."""
    cdef pyllama_qact a = activation_of(scratch, x, cols, p)
    if act == ACT_Q8_0:
        quantize_q8_0(<signed char*>a.q, <float*>a.d, a.x, cols)
    elif act == ACT_Q8_1:
        quantize_q8_1(<signed char*>a.q, <float*>a.d, <float*>a.s, a.x, cols)
    elif act == ACT_Q8_K:
        quantize_q8_k(<signed char*>a.q, <float*>a.d, <short*>a.bsums, a.x, cols)


cdef void quant_product_many(int count, float** outs, const Matrix** ms, const RowProduct* plans, const float* x,
                             Py_ssize_t n_pos, QuantScratch* scratch, int n_threads) noexcept nogil:
    """Units are single rows, or groups of eight or four rows (unit_rows), numbered one matrix after
    another; one static parallel loop over all of them (Q, K and V, or the FFN's gate and up, of one
    decode step or one block: one barrier instead of count, and x quantised once instead of count times).
    Element (p, r) of matrix k is plans[k]'s computation of W_k[r] and x[p], whatever the grouping, n_pos
    or the thread count."""
    cdef Py_ssize_t first[MAX_MANY + 1]
    cdef Py_ssize_t t, n_units, p, cols = ms[0].cols
    cdef long long work = 0
    cdef int k
    first[0] = 0
    for k in range(count):
        first[k + 1] = first[k] + ms[k].rows // unit_rows(&plans[k], ms[k].rows, n_pos)
        work += ms[k].rows * ms[k].cols * n_pos // QBLOCK_WORK_DIV
    n_units = first[count]
    cdef bint serial = team_size(n_threads, work) == 1
    if serial or n_pos == 1:
        # one position (decode) is quantised before the team starts: no barrier inside it
        for p in range(n_pos):
            quantize_position(cols, x, p, scratch, plans[0].act)
    if serial:
        for t in range(n_units):
            product_unit(outs, ms, plans, first, count, t, scratch, x, n_pos)
        return
    if n_pos == 1:
        for t in prange(n_units, schedule="static", num_threads=n_threads):
            product_unit(outs, ms, plans, first, count, t, scratch, x, n_pos)
        return
    # a block: the team quantises the positions (as matmul_q8_0_many does), waits until all are, then
    # multiplies
    with parallel(num_threads=n_threads):
        for p in prange(n_pos, schedule="static"):
            quantize_position(cols, x, p, scratch, plans[0].act)
        team_barrier()
        for t in prange(n_units, schedule="static"):
            product_unit(outs, ms, plans, first, count, t, scratch, x, n_pos)


cdef inline Py_ssize_t unit_rows(const RowProduct* plan, Py_ssize_t rows, Py_ssize_t n_pos) noexcept nogil:
    """Rows per unit: eight with an eight-row kernel; four in a block of four or more positions with a
    four-row kernel (rows % 4 == 0: four rows share each activation load); else one."""
    if plan.dot8 != NULL:
        return 8
    if plan.dot4x4 != NULL and n_pos >= 4 and rows % 4 == 0:
        return 4
    return 1


cdef inline void product_unit(float** outs, const Matrix** ms, const RowProduct* plans, const Py_ssize_t* first,
                              int count, Py_ssize_t t, const QuantScratch* scratch, const float* x,
                              Py_ssize_t n_pos) noexcept nogil:
    """Unit t (quant_product_many's numbering) for every position."""
    cdef int k = matrix_of_unit(first, count, t)
    cdef Py_ssize_t u = t - first[k], rows = ms[k].rows, cols = ms[k].cols, p
    cdef const RowProduct* plan = &plans[k]
    cdef const unsigned char* w = <const unsigned char*>ms[k].data
    cdef pyllama_qact a
    cdef pyllama_qact a4[4]
    cdef Py_ssize_t p0 = 0, j
    if plan.dot8 == NULL and unit_rows(plan, rows, n_pos) == 4:
        w += 4 * u * plan.row_bytes
        while p0 + 4 <= n_pos:
            for p in range(4):
                a4[p] = activation_of(scratch, x, cols, p0 + p)
            plan.dot4x4(w, plan.row_bytes, a4, cols, outs[k] + p0 * rows + 4 * u, rows)
            p0 += 4
        for p in range(p0, n_pos):
            a = activation_of(scratch, x, cols, p)
            for j in range(4):
                outs[k][p * rows + 4 * u + j] = plan.dot(w + j * plan.row_bytes, &a, cols)
        return
    if plan.dot8 != NULL:
        if plan.dot8x4 != NULL:
            while p0 + 4 <= n_pos:
                for p in range(4):
                    a4[p] = activation_of(scratch, x, cols, p0 + p)
                plan.dot8x4(w + 8 * u * plan.row_bytes, plan.row_bytes, a4, cols, outs[k] + p0 * rows + 8 * u, rows)
                p0 += 4
        for p in range(p0, n_pos):
            a = activation_of(scratch, x, cols, p)
            plan.dot8(w + 8 * u * plan.row_bytes, plan.row_bytes, &a, cols, outs[k] + p * rows + 8 * u)
        return
    if plan.tile4 != NULL:
        while p0 + 4 <= n_pos:
            for p in range(4):
                a4[p] = activation_of(scratch, x, cols, p0 + p)
            plan.tile4(w + u * plan.row_bytes, a4, cols, outs[k] + p0 * rows + u, rows)
            p0 += 4
    for p in range(p0, n_pos):
        a = activation_of(scratch, x, cols, p)
        outs[k][p * rows + u] = plan.dot(w + u * plan.row_bytes, &a, cols)


def quantize_activation_np(const float[::1] x, str kind):
    """The activation quantisation of the block products, for tests: ``kind`` Q8_0 -> (q, d, None),
    Q8_1 -> (q, d, s), Q8_K -> (q, d, bsums)."""
    block = {"Q8_0": 32, "Q8_1": 32, "Q8_K": 256}.get(kind)
    if block is None:
        raise ValueError(f"quantize_activation: unknown kind {kind!r} (Q8_0, Q8_1, Q8_K)")
    cdef Py_ssize_t n = x.shape[0]
    if n == 0 or n % block:
        raise ValueError(f"quantize_activation: {n} values is not a positive multiple of {block}")
    q = np.zeros(n, dtype=np.int8)
    d = np.zeros(n // block, dtype=np.float32)
    s = np.zeros(n // 32, dtype=np.float32)
    bsums = np.zeros(n // 16, dtype=np.int16)
    cdef signed char[::1] qv = q
    cdef float[::1] dv = d
    cdef float[::1] sv = s
    cdef short[::1] bv = bsums
    cdef int act = ACT_Q8_0 if kind == "Q8_0" else ACT_Q8_1 if kind == "Q8_1" else ACT_Q8_K
    with nogil:
        if act == ACT_Q8_0:
            quantize_q8_0(&qv[0], &dv[0], &x[0], n)
        elif act == ACT_Q8_1:
            quantize_q8_1(&qv[0], &dv[0], &sv[0], &x[0], n)
        else:
            quantize_q8_k(&qv[0], &dv[0], &bv[0], &x[0], n)
    return q, d, (None if kind == "Q8_0" else s if kind == "Q8_1" else bsums)


def simd_path() -> str:
    """The instruction set this build multiplies the block-quantised types with: ``avx512-vnni``,
    ``avx512``, ``avx2`` or ``portable`` (chosen at compile time, see build_config.py)."""
    return qblocks_path().decode()


def built_for_this_cpu() -> bool:
    """True for a -march=native build (the default); False for PYLLAMA_PORTABLE=1."""
    return qblocks_native()
