"""llama.cpp's KV-cache types (``--cache-type-k/-v``): a row of float32 values stored in one of them
and read back, for the ``kvquant`` plugin.

A row is quantised block by block exactly as llama.cpp's ``quantize_row_*_ref`` (ggml-quants.c)
writes it, which is what gguf-py's ``gguf.quants.quantize`` writes (IQ4_NL, which gguf-py cannot
quantise: ``quantize_row_iq4_nl_ref``), and read back as gguf-py's ``dequantize`` computes it. The C
is ``kvquant.h``; ``quantize_row`` and ``dequantize_row`` run it on numpy arrays (tests). The types,
their blocks and their sizes are ggml's:

    type     values per block   bytes per block
    f32             1                 4
    f16             1                 2          IEEE half, nearest even
    bf16            1                 2          the top 16 bits, nearest even
    q8_0           32                34          half scale, 32 int8
    q4_0           32                18          half scale, 4-bit codes
    q4_1           32                20          half scale and minimum, 4-bit codes
    iq4_nl         32                18          half scale, 4-bit indices into a non-linear grid
    q5_0           32                22          half scale, 5-bit codes
    q5_1           32                24          half scale and minimum, 5-bit codes
"""

from libc.stdint cimport uint8_t

import numpy as np

from pyllama.errors import PluginError

cdef extern from "kvquant.h":
    void kvq_quantize "pyllama_kvq_quantize"(int type_code, const float* x, uint8_t* y, long n) nogil
    void kvq_dequantize "pyllama_kvq_dequantize"(int type_code, const uint8_t* y, float* x, long n) nogil
    void kvq_dequantize_rows "pyllama_kvq_dequantize_rows"(
        int type_code, const uint8_t* y, long y_stride, float* x, long x_stride, long n_rows, long n) nogil

# the types in kvquant.h's order (its KVQ_* codes): name -> (values per block, bytes per block)
CACHE_TYPES = {
    "f32": (1, 4),
    "f16": (1, 2),
    "bf16": (1, 2),
    "q8_0": (32, 34),
    "q4_0": (32, 18),
    "q4_1": (32, 20),
    "iq4_nl": (32, 18),
    "q5_0": (32, 22),
    "q5_1": (32, 24),
}
_CODES = {name: i for i, name in enumerate(CACHE_TYPES)}


def type_code(name: str) -> int:
    """The C code of a cache type (PluginError naming the types for an unknown one)."""
    if name not in _CODES:
        raise PluginError(f"kvquant: {name!r} is not a llama.cpp cache type; the types: {', '.join(CACHE_TYPES)}")
    return _CODES[name]


def row_bytes(name: str, n: int) -> int:
    """Bytes of ``n`` values stored as ``name`` (n must fill whole blocks)."""
    block, size = CACHE_TYPES[name]
    if n % block:
        raise ValueError(f"{name}: {n} values do not fill blocks of {block}")
    return n // block * size


cdef void quantize_row_c(int type_code, const float* x, uint8_t* y, Py_ssize_t n) noexcept nogil:
    kvq_quantize(type_code, x, y, n)


cdef void dequantize_row_c(int type_code, const uint8_t* y, float* x, Py_ssize_t n) noexcept nogil:
    kvq_dequantize(type_code, y, x, n)


cdef void dequantize_rows_c(int type_code, const uint8_t* y, Py_ssize_t y_stride, float* x, Py_ssize_t x_stride,
                            Py_ssize_t n_rows, Py_ssize_t n) noexcept nogil:
    kvq_dequantize_rows(type_code, y, y_stride, x, x_stride, n_rows, n)


def quantize_row(const float[::1] x, str name):
    """The bytes (uint8) of the row ``x`` stored as ``name``."""
    cdef int code = type_code(name)
    out = np.zeros(row_bytes(name, x.shape[0]), dtype=np.uint8)
    cdef uint8_t[::1] ov = out
    if x.shape[0]:
        quantize_row_c(code, &x[0], &ov[0], x.shape[0])
    return out


def dequantize_row(const uint8_t[::1] raw, str name):
    """The float32 values of a row of bytes stored as ``name``."""
    cdef int code = type_code(name)
    block, size = CACHE_TYPES[name]
    if raw.shape[0] % size:
        raise ValueError(f"{name}: {raw.shape[0]} bytes are not whole blocks of {size}")
    cdef Py_ssize_t n = raw.shape[0] // size * block
    out = np.zeros(n, dtype=np.float32)
    cdef float[::1] ov = out
    if n:
        dequantize_row_c(code, &raw[0], &ov[0], n)
    return out
