"""KIVI-style quantisation of cached rows (Liu et al. 2024, arXiv 2402.02750), for memories that
keep old tokens in fewer bits (``tiered``'s warm tier).

A group of values gets a float32 zero point (its minimum) and scale ``(max - min) / (2^bits - 1)``;
``code = round((x - zero) / scale)``, so the error of an element is at most ``scale / 2``. Codes are
8 bits, or 4 bits packed two per byte (element 2i in the low nibble of byte i). The inline kernels
(``quant_range``, ``quant_code``, ``dequant``, ``set_code``, ``get_code``) are in quant.pxd; the
functions here run the same arithmetic on numpy arrays, for tests and notebooks.
"""

from libc.stdint cimport uint8_t

import numpy as np


def quantize(x, int bits):
    """KIVI-style quantisation with the plugin's arithmetic: each row of ``x`` (float32 [n, m]) is
    one group. Returns ``(codes uint8 [n, m], scale float32 [n], zero float32 [n])``; the plugin
    quantises key channels (a row = one channel over ``group`` tokens) and value groups this way."""
    if bits not in (4, 8):
        raise ValueError(f"quantize: bits must be 4 or 8, got {bits}")
    cdef const float[:, ::1] xv = np.ascontiguousarray(x, dtype=np.float32)
    cdef Py_ssize_t n = xv.shape[0], m = xv.shape[1], r, c
    if m < 1:
        raise ValueError("quantize: groups must hold at least one value")
    codes = np.zeros((n, m), dtype=np.uint8)
    scale = np.zeros(n, dtype=np.float32)
    zero = np.zeros(n, dtype=np.float32)
    cdef uint8_t[:, ::1] cv = codes
    cdef float[::1] sv = scale
    cdef float[::1] zv = zero
    cdef int qmax = (1 << bits) - 1
    for r in range(n):
        quant_range(&xv[r, 0], m, 1, qmax, &zv[r], &sv[r])
        for c in range(m):
            cv[r, c] = quant_code(xv[r, c], zv[r], sv[r], qmax)
    return codes, scale, zero


def dequantize(codes, scale, zero):
    """The inverse of :func:`quantize`: float32 [n, m] = code * scale + zero, row by row."""
    cdef const uint8_t[:, ::1] cv = np.ascontiguousarray(codes, dtype=np.uint8)
    cdef const float[::1] sv = np.ascontiguousarray(scale, dtype=np.float32)
    cdef const float[::1] zv = np.ascontiguousarray(zero, dtype=np.float32)
    cdef Py_ssize_t n = cv.shape[0], m = cv.shape[1], r, c
    if sv.shape[0] != n or zv.shape[0] != n:
        raise ValueError("dequantize: one scale and one zero point per row")
    out = np.zeros((n, m), dtype=np.float32)
    cdef float[:, ::1] ov = out
    for r in range(n):
        for c in range(m):
            ov[r, c] = dequant(cv[r, c], zv[r], sv[r])
    return out


def pack4(codes):
    """4-bit codes (uint8 [n, m], values < 16) packed two per byte as the plugin stores them:
    element 2i in the low nibble of byte i, element 2i+1 in the high nibble."""
    cdef const uint8_t[:, ::1] cv = np.ascontiguousarray(codes, dtype=np.uint8)
    cdef Py_ssize_t n = cv.shape[0], m = cv.shape[1], r, c
    out = np.zeros((n, (m + 1) // 2), dtype=np.uint8)
    cdef uint8_t[:, ::1] ov = out
    for r in range(n):
        for c in range(m):
            set_code(&ov[r, 0], c, cv[r, c] & 0x0F, 4)
    return out


def unpack4(packed, Py_ssize_t m):
    """The inverse of :func:`pack4` for rows of ``m`` codes."""
    cdef const uint8_t[:, ::1] pv = np.ascontiguousarray(packed, dtype=np.uint8)
    cdef Py_ssize_t n = pv.shape[0], r, c
    if pv.shape[1] != (m + 1) // 2:
        raise ValueError(f"unpack4: rows of {m} codes take {(m + 1) // 2} bytes, got {pv.shape[1]}")
    out = np.zeros((n, m), dtype=np.uint8)
    cdef uint8_t[:, ::1] ov = out
    for r in range(n):
        for c in range(m):
            ov[r, c] = get_code(&pv[r, 0], c, 4)
    return out
