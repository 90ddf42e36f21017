# KIVI-style asymmetric min/max quantisation of cached rows, int8 or packed int4 (quant.pyx).

from libc.math cimport floorf
from libc.stdint cimport uint8_t


cdef inline int quant_code(float x, float zero, float scale, int qmax) noexcept nogil:
    cdef float c
    if not scale > 0.0:
        return 0
    c = floorf((x - zero) / scale + <float>0.5)
    if c < 0.0:
        return 0
    if c > qmax:
        return qmax
    return <int>c


cdef inline float dequant(int code, float zero, float scale) noexcept nogil:
    return <float>code * scale + zero


cdef inline void set_code(uint8_t* row, Py_ssize_t i, int code, int bits) noexcept nogil:
    if bits == 8:
        row[i] = <uint8_t>code
    elif i & 1:
        row[i >> 1] = <uint8_t>((row[i >> 1] & 0x0F) | (code << 4))
    else:
        row[i >> 1] = <uint8_t>((row[i >> 1] & 0xF0) | code)


cdef inline int get_code(const uint8_t* row, Py_ssize_t i, int bits) noexcept nogil:
    if bits == 8:
        return row[i]
    return (row[i >> 1] >> (4 * (i & 1))) & 0x0F


cdef inline void quant_range(const float* x, Py_ssize_t n, Py_ssize_t stride, int qmax, float* zero,
                             float* scale) noexcept nogil:
    """Zero point and scale of the ``n`` values ``x[0], x[stride], ...``."""
    cdef float mn = x[0], mx = x[0], a
    cdef Py_ssize_t i
    for i in range(1, n):
        a = x[i * stride]
        if a < mn:
            mn = a
        if a > mx:
            mx = a
    zero[0] = mn
    scale[0] = (mx - mn) / <float>qmax


cdef struct KiviLayout:  # how a warm tier quantises a group of `group` tokens of kv_dim channels each
    int bits             # 4 or 8
    int qmax             # 2^bits - 1
    long long group      # tokens per group: a key scale and zero point per channel over them
    Py_ssize_t kv_dim, head_dim
    Py_ssize_t row_bytes  # bytes of one token's codes (kv_dim, or (kv_dim + 1) // 2 packed)
    int vg, n_vgh, n_vg  # channels per value group (never crossing a head), value groups per head and per token


cdef void quantize_group(const KiviLayout* lay, const float* keys, const float* values, uint8_t* kcodes,
                         uint8_t* vcodes, float* kscale, float* kzero, float* vscale, float* vzero) noexcept nogil
cdef void dequantize_token(const KiviLayout* lay, const uint8_t* krow, const uint8_t* vrow, const float* kscale,
                           const float* kzero, const float* vscale, const float* vzero, Py_ssize_t c0,
                           Py_ssize_t c1, float* key, float* value) noexcept nogil
