"""GGUF string arrays: find and decode thousands of length-prefixed strings in one C pass.

A GGUF array of strings is ``count`` times (uint64 little-endian byte length, the bytes). The
offsets cannot be computed without walking the lengths, and a Python loop over 150,000 tokens
and as many merges costs a tenth of a second per pass; these two loops cost a millisecond.
Every length is checked against the end of the buffer before it is used.
"""

from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.stdint cimport int64_t, uint64_t
from libc.string cimport memcpy

import numpy as np


def scan(const unsigned char[::1] data, Py_ssize_t offset, Py_ssize_t count):
    """(starts, lengths, end): int64 arrays of each string's byte offset and length, and the
    offset just past the last string. A string that runs past the end of ``data`` gives
    end = -1 - i, with i its index and ``starts[i]`` the offset of its length prefix."""
    starts_arr = np.empty(count, dtype=np.int64)
    lengths_arr = np.empty(count, dtype=np.int64)
    cdef int64_t[::1] starts = starts_arr
    cdef int64_t[::1] lengths = lengths_arr
    cdef Py_ssize_t size = data.shape[0]
    cdef Py_ssize_t i, failed = -1
    cdef uint64_t n
    with nogil:
        for i in range(count):
            if offset < 0 or offset > size - 8:
                starts[i] = offset
                failed = i
                break
            memcpy(&n, &data[offset], 8)  # GGUF is little-endian, and so is every host pyllama builds on
            if n > <uint64_t>(size - offset - 8):
                starts[i] = offset
                failed = i
                break
            starts[i] = offset + 8
            lengths[i] = <int64_t>n
            offset += 8 + <Py_ssize_t>n
    if failed >= 0:
        return starts_arr, lengths_arr, -1 - failed
    return starts_arr, lengths_arr, offset


def decode(const unsigned char[::1] data, const int64_t[::1] starts, const int64_t[::1] lengths, str errors):
    """Every string as ``str`` (UTF-8 with the given error handler); the spans come from ``scan``."""
    cdef Py_ssize_t i, count = starts.shape[0]
    cdef bytes handler = errors.encode("ascii")
    cdef const char* c_errors = handler
    cdef const char* base = <const char*>&data[0] if data.shape[0] else NULL
    out = [None] * count
    for i in range(count):
        out[i] = PyUnicode_DecodeUTF8(base + starts[i], lengths[i], c_errors)
    return out
