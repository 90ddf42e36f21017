"""Conversions and quantisers of the products, one value at a time, for tests: IEEE half <-> float32
(``halfbits.h``), the Q8_0 activation, and a row of a weight ``Tensor`` as float32.

The products themselves are the type table's (``qtypes.h``, run by ``qproduct.pyx``); these call the
same C.
"""

from libc.stdint cimport uint16_t

import numpy as np

from pyllama.kernels.matvec import embedding_row_tensor
from pyllama.kernels.qproduct import quantize_activation_np

cdef extern from "halfbits.h":
    float half_to_float "pyllama_half_to_float"(uint16_t h) noexcept nogil
    uint16_t float_to_half "pyllama_float_to_half"(float x) noexcept nogil


def quantize_q8_0_np(const float[::1] x):
    """The Q8_0 activation quantisation of the products: (int8[n], float32 scales[n // 32])."""
    if x.shape[0] % 32:
        raise ValueError(f"quantize_q8_0: {x.shape[0]} values is not a multiple of 32")
    if x.shape[0] == 0:
        return np.zeros(0, dtype=np.int8), np.zeros(0, dtype=np.float32)
    q, d, _ = quantize_activation_np(x, "Q8_0")
    return q, d


def dequantize_tensor_row(tensor, Py_ssize_t row):
    """Row ``row`` of a weight ``Tensor`` of any stored type as float32, through its type's dequantiser."""
    return embedding_row_tensor(tensor, row)


def half_to_float_np(const uint16_t[::1] h):
    """float32 values of IEEE half bit patterns, through the kernels' conversion."""
    out = np.zeros(h.shape[0], dtype=np.float32)
    cdef float[::1] o = out
    cdef Py_ssize_t i
    for i in range(h.shape[0]):
        o[i] = half_to_float(h[i])
    return out


def float_to_half_np(const float[::1] x):
    """IEEE half bit patterns (round to nearest-even) of float32 values, through the kernels' conversion."""
    out = np.zeros(x.shape[0], dtype=np.uint16)
    cdef uint16_t[::1] o = out
    cdef Py_ssize_t i
    for i in range(x.shape[0]):
        o[i] = float_to_half(x[i])
    return out
