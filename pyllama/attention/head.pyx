"""The shared exact routine: attention of one query head over ``n`` cached rows.

Every built-in plugin gathers the rows it keeps (exact keys, dequantised keys, bucket summaries)
as pointers in ascending position order and calls ``attend_head``. Because the arithmetic is one
piece of code in one order, two plugins that keep the same rows give bit-identical outputs: that
is what makes "max |Δlogit| = 0" a meaningful test of a degenerate setting.

    score_t = (q · k_t) / sqrt(head_dim) [+ bias_t]     (bias: e.g. log(count) of a summary row)
    a = softmax(score)                                   (max subtracted, fast exp, serial sum)
    out = Σ_t a_t v_t                                    (t ascending)
"""

from libc.math cimport sqrtf

from pyllama.kernels.elementwise cimport softmax
from pyllama.kernels.matvec cimport dot_f32

import numpy as np


cdef void attend_head(const float* q, const float** keys, const float** values, const float* bias,
                      Py_ssize_t n, int head_dim, float* scores, float* out) noexcept nogil:
    cdef Py_ssize_t t, i
    cdef float scale = sqrtf(<float>head_dim)
    cdef float a
    cdef const float* vrow
    for t in range(n):
        scores[t] = dot_f32(q, keys[t], head_dim) / scale
    if bias != NULL:
        for t in range(n):
            scores[t] = scores[t] + bias[t]
    softmax(scores, n)
    for i in range(head_dim):
        out[i] = 0.0
    for t in range(n):
        a = scores[t]
        vrow = values[t]
        for i in range(head_dim):
            out[i] = out[i] + a * vrow[i]


def attend_one_head(const float[::1] q, const float[:, ::1] keys, const float[:, ::1] values, bias=None):
    """The shared routine on numpy arrays (for tests): q [head_dim], keys/values [n, head_dim]."""
    cdef Py_ssize_t n = keys.shape[0]
    cdef int hd = q.shape[0]
    if keys.shape[1] != hd or values.shape[1] != hd or values.shape[0] != n or n == 0:
        raise ValueError("attend_one_head: keys and values must be [n >= 1, head_dim]")
    kp = np.array([<size_t>&keys[t, 0] for t in range(n)], dtype=np.uintp)
    vp = np.array([<size_t>&values[t, 0] for t in range(n)], dtype=np.uintp)
    cdef size_t[::1] kpv = kp
    cdef size_t[::1] vpv = vp
    cdef const float[::1] bv
    cdef const float* bptr = NULL
    if bias is not None:
        bv = np.ascontiguousarray(bias, dtype=np.float32)
        if bv.shape[0] != n:
            raise ValueError("attend_one_head: bias must have one value per row")
        bptr = &bv[0]
    scores = np.zeros(n, dtype=np.float32)
    out = np.zeros(hd, dtype=np.float32)
    cdef float[::1] sv = scores
    cdef float[::1] ov = out
    attend_head(&q[0], <const float**>&kpv[0], <const float**>&vpv[0], bptr, n, hd, &sv[0], &ov[0])
    return out
