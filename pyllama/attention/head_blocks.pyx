"""The block forms of the shared routine on numpy arrays, for tests (head.pyx holds the routines).

``attend_head_block`` runs ``attend_head_rows`` (a block's consecutive queries of one head),
``attend_head_group`` runs ``attend_group_rows`` (the query heads of one position sharing a KV head)
and ``attend_head_window_block`` runs ``attend_head_window`` (queries whose windows are a row apart
after fixed rows): the tests compare each query's output with ``attend_one_head`` and with a numpy
emulation of llama.cpp's order, bit for bit.
"""

from pyllama.attention.head cimport GGML_LANES, attend_group_rows, attend_head_rows, attend_head_window
from pyllama.kernels.elementwise cimport arithmetic_code

import numpy as np


def attend_head_block(const float[:, ::1] q, const float[:, ::1] keys, const float[:, ::1] values, long long n,
                      arithmetic="run.c"):
    """``attend_head_rows`` on numpy arrays (for tests): query j of q [m, head_dim] attends rows
    0 .. n + j - 1 of keys/values [n + m - 1 or more, head_dim]; returns out [m, head_dim]."""
    cdef Py_ssize_t m = q.shape[0]
    cdef int hd = q.shape[1]
    if m == 0 or n < 1 or keys.shape[0] < n + m - 1 or keys.shape[1] != hd or values.shape[0] != keys.shape[0] \
            or values.shape[1] != hd:
        raise ValueError("attend_head_block: q [m >= 1, head_dim], keys and values [n + m - 1 or more, head_dim], "
                         "n >= 1")
    # the scratch starts as NaN, as stale as the engine's: a score read beyond a query's rows shows
    scores = np.full((m, n + m - 1), np.nan, dtype=np.float32)
    out = np.zeros((m, hd), dtype=np.float32)
    lanes = np.full(GGML_LANES * hd, np.nan, dtype=np.float32)
    cdef float[:, ::1] sv = scores
    cdef float[:, ::1] ov = out
    cdef float[::1] lv = lanes
    cdef int arith = arithmetic_code(arithmetic)
    attend_head_rows(&q[0, 0], hd, &keys[0, 0], &values[0, 0], hd, n, m, hd, &sv[0, 0], n + m - 1, &ov[0, 0], hd,
                     arith, &lv[0])
    return out


def attend_head_group(const float[:, ::1] q, const float[:, ::1] keys, const float[:, ::1] values,
                      arithmetic="run.c"):
    """``attend_group_rows`` on numpy arrays (for tests): each query head j of q [g, head_dim] (the
    heads of one position sharing a KV head) attends every row of keys/values [n, head_dim]; returns
    (out [g, head_dim], the heads' softmax weights [g, n])."""
    cdef Py_ssize_t g = q.shape[0], n = keys.shape[0]
    cdef int hd = q.shape[1]
    if g == 0 or n == 0 or keys.shape[1] != hd or values.shape[0] != n or values.shape[1] != hd:
        raise ValueError("attend_head_group: q [g >= 1, head_dim], keys and values [n >= 1, head_dim]")
    weights = np.full((g, n), np.nan, dtype=np.float32)
    out = np.full((g, hd), np.nan, dtype=np.float32)
    cdef float[:, ::1] wv = weights
    cdef float[:, ::1] ov = out
    lanes = np.full(GGML_LANES * hd, np.nan, dtype=np.float32)
    cdef float[::1] lv = lanes
    cdef int arith = arithmetic_code(arithmetic)
    attend_group_rows(&q[0, 0], &keys[0, 0], &values[0, 0], hd, n, <int>g, hd, &wv[0, 0], n, &ov[0, 0], arith,
                      &lv[0])
    return out, weights


def attend_head_window_block(const float[:, ::1] q, const float[:, ::1] keys, const float[:, ::1] values,
                             long long fixed, long long window, arithmetic="run.c"):
    """``attend_head_window`` on numpy arrays (for tests): query j of q [m, head_dim] attends rows
    0 .. fixed - 1 and fixed + j .. fixed + j + window - 1 of keys/values [fixed + window + m - 1 or
    more, head_dim]; returns out [m, head_dim]."""
    cdef Py_ssize_t m = q.shape[0]
    cdef int hd = q.shape[1]
    cdef long long n = fixed + window
    if m == 0 or fixed < 0 or window < 1 or keys.shape[0] < n + m - 1 or keys.shape[1] != hd \
            or values.shape[0] != keys.shape[0] or values.shape[1] != hd:
        raise ValueError("attend_head_window_block: q [m >= 1, head_dim], keys and values [fixed + window + m - 1 "
                         "or more, head_dim], fixed >= 0, window >= 1")
    # the scratch starts as NaN, as stale as the engine's: a score read beyond a query's rows shows
    scores = np.full((m, n + m - 1), np.nan, dtype=np.float32)
    out = np.zeros((m, hd), dtype=np.float32)
    lanes = np.full(GGML_LANES * hd, np.nan, dtype=np.float32)
    tables = np.zeros((2, n), dtype=np.uintp)
    cdef float[:, ::1] sv = scores
    cdef float[:, ::1] ov = out
    cdef float[::1] lv = lanes
    cdef size_t[:, ::1] tv = tables
    cdef int arith = arithmetic_code(arithmetic)
    attend_head_window(&q[0, 0], hd, &keys[0, 0], &values[0, 0], hd, fixed, window, m, hd, &sv[0, 0], n + m - 1,
                       &ov[0, 0], hd, arith, &lv[0], <const float**>&tv[0, 0], <const float**>&tv[1, 0])
    return out
