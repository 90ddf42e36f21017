"""Quantised matrix-vector products that never expand weights to float32 in memory.

* ``Q8_GROUPS`` — llama2.c version-2 checkpoints (``runq.c``): int8 weights with one float32 scale
  per ``group_size`` values. The activation vector is quantised once per matvec to int8 groups of
  the same size (symmetric, scale = max|x| / 127, round half away from zero as C's ``round``),
  then each group is an integer dot product scaled by both scales, exactly as ``runq.c`` does.
"""

from cython.parallel cimport prange
from libc.math cimport fabsf, roundf

from pyllama.kernels.matvec cimport QTYPE_F16, QTYPE_Q8_0, QTYPE_Q8_GROUPS


cdef void quantize_groups(signed char* q, float* scales, const float* x, Py_ssize_t n, int gs) noexcept nogil:
    cdef Py_ssize_t g, i
    cdef float wmax, scale, inv
    for g in range(n // gs):
        wmax = 0.0
        for i in range(gs):
            if fabsf(x[g * gs + i]) > wmax:
                wmax = fabsf(x[g * gs + i])
        scale = wmax / 127.0
        scales[g] = scale
        for i in range(gs):
            # run.c divides by the scale (0/0 when a group is all zero gives NaN -> int8 0 there too)
            q[g * gs + i] = <signed char>roundf(x[g * gs + i] / scale) if scale != 0 else 0


cdef inline float dot_q8_groups(const signed char* wq, const float* ws, const signed char* xq,
                                const float* xs, Py_ssize_t n, int gs) noexcept nogil:
    cdef float val = 0.0
    cdef int ival
    cdef Py_ssize_t g, j, k
    for g in range(n // gs):
        j = g * gs
        ival = 0
        for k in range(gs):
            ival = ival + (<int>xq[j + k]) * (<int>wq[j + k])
        val = val + (<float>ival) * ws[g] * xs[g]
    return val


cdef void matvec_q8_groups(float* out, const Matrix* m, const float* x, QuantScratch* scratch,
                           int n_threads) noexcept nogil:
    cdef int gs = m.group_size
    cdef Py_ssize_t cols = m.cols
    quantize_groups(scratch.q, scratch.scales, x, cols, gs)
    cdef const signed char* w = <const signed char*>m.data
    cdef Py_ssize_t i
    for i in prange(m.rows, schedule="static", num_threads=n_threads):
        out[i] = dot_q8_groups(w + i * cols, m.scales + i * (cols // gs), scratch.q, scratch.scales, cols, gs)


cdef void matvec_f16(float* out, const Matrix* m, const float* x, int n_threads) noexcept nogil:
    pass


cdef void matvec_q8_0(float* out, const Matrix* m, const float* x, QuantScratch* scratch, int n_threads) noexcept nogil:
    pass


cdef void dequantize_row(float* out, const Matrix* m, Py_ssize_t row) noexcept nogil:
    cdef Py_ssize_t j
    cdef const signed char* q
    cdef const float* s
    if m.qtype == QTYPE_Q8_GROUPS:
        q = (<const signed char*>m.data) + row * m.cols
        s = m.scales + row * (m.cols // m.group_size)
        for j in range(m.cols):
            out[j] = q[j] * s[j // m.group_size]
