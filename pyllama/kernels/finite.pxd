# Finiteness of a float32 vector, cheap enough for every token: the engine checks its residual
# stream after each layer and the logits after each position (NaN or Inf must never be sampled).

from libc.stdint cimport uint32_t


cdef inline bint all_finite(const float* x, Py_ssize_t n) noexcept nogil:
    """True when no element of x[0:n] is NaN or +-Inf (its exponent bits are not all ones).

    An OR over integer tests, not a float reduction: the compiler may vectorise it freely, and a
    NaN cannot hide in a comparison that is false for NaN."""
    cdef const uint32_t* bits = <const uint32_t*>x
    cdef uint32_t bad = 0
    cdef Py_ssize_t i
    for i in range(n):
        bad = bad | ((bits[i] & 0x7F800000u) == 0x7F800000u)
    return bad == 0
