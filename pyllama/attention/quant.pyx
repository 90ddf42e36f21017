"""KIVI-style quantisation of cached rows (Liu et al. 2024, arXiv 2402.02750), for memories that
keep old tokens in fewer bits (``tiered``'s warm tier).

A group of values gets a float32 zero point (its minimum) and scale ``(max - min) / (2^bits - 1)``;
``code = round((x - zero) / scale)``, so the error of an element is at most ``scale / 2``. Codes are
8 bits, or 4 bits packed two per byte (element 2i in the low nibble of byte i). The inline kernels
(``quant_range``, ``quant_code``, ``dequant``, ``set_code``, ``get_code``) are in quant.pxd; the
functions here run the same arithmetic on numpy arrays, for tests and notebooks.

A group of tokens (``KiviLayout``) is quantised as KIVI does: keys *per channel* over the group's
tokens, values *per token* over groups of ``vg`` channels that never cross a head.
``quantize_group`` writes a group's codes, scales and zero points; ``dequantize_token`` reads one
token back.
"""

from libc.stdint cimport uint8_t

import numpy as np


cdef void quantize_group(const KiviLayout* lay, const float* keys, const float* values, uint8_t* kcodes,
                         uint8_t* vcodes, float* kscale, float* kzero, float* vscale, float* vzero) noexcept nogil:
    """keys, values: [group, kv_dim] floats; codes [group, row_bytes]; kscale, kzero [kv_dim];
    vscale, vzero [group, n_vg]."""
    cdef long long G = lay.group
    cdef Py_ssize_t kv = lay.kv_dim, c, t, j, c0, c1
    cdef float* vs
    cdef float* vz
    for c in range(kv):  # keys: per channel over the group's tokens
        quant_range(keys + c, G, kv, lay.qmax, &kzero[c], &kscale[c])
        for t in range(G):
            set_code(kcodes + t * lay.row_bytes, c, quant_code(keys[t * kv + c], kzero[c], kscale[c], lay.qmax),
                     lay.bits)
    for t in range(G):  # values: per token over groups of channels within a head
        vs = vscale + t * lay.n_vg
        vz = vzero + t * lay.n_vg
        for j in range(lay.n_vg):
            c0 = (j // lay.n_vgh) * lay.head_dim + (j % lay.n_vgh) * lay.vg
            c1 = c0 + lay.vg
            if c1 > (j // lay.n_vgh + 1) * lay.head_dim:
                c1 = (j // lay.n_vgh + 1) * lay.head_dim
            quant_range(values + t * kv + c0, c1 - c0, 1, lay.qmax, &vz[j], &vs[j])
            for c in range(c0, c1):
                set_code(vcodes + t * lay.row_bytes, c, quant_code(values[t * kv + c], vz[j], vs[j], lay.qmax),
                         lay.bits)


cdef void dequantize_token(const KiviLayout* lay, const uint8_t* krow, const uint8_t* vrow, const float* kscale,
                           const float* kzero, const float* vscale, const float* vzero, Py_ssize_t c0,
                           Py_ssize_t c1, float* key, float* value) noexcept nogil:
    """Channels c0 .. c1-1 (whole heads) of one token: key[c - c0], value[c - c0]. krow, vrow: its
    codes; kscale, kzero: its group's [kv_dim]; vscale, vzero: its own [n_vg]."""
    cdef Py_ssize_t c, g0, g1, j, hd = lay.head_dim
    cdef float s, z
    # codes first (the bit width decided once), then code * scale + zero
    if lay.bits == 8:
        for c in range(c0, c1):
            key[c - c0] = <float>krow[c]
            value[c - c0] = <float>vrow[c]
    else:
        for c in range(c0, c1):
            key[c - c0] = <float>((krow[c >> 1] >> (4 * (c & 1))) & 0x0F)
            value[c - c0] = <float>((vrow[c >> 1] >> (4 * (c & 1))) & 0x0F)
    for c in range(c0, c1):  # keys: a scale and zero point per channel
        key[c - c0] = key[c - c0] * kscale[c] + kzero[c]
    g0 = c0
    while g0 < c1:  # values: one scale and zero point per group of channels inside a head
        g1 = g0 + lay.vg
        if g1 > (g0 // hd + 1) * hd:
            g1 = (g0 // hd + 1) * hd
        j = (g0 // hd) * lay.n_vgh + (g0 % hd) // lay.vg
        s = vscale[j]
        z = vzero[j]
        for c in range(g0, g1):
            value[c - c0] = value[c - c0] * s + z
        g0 = g1


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
