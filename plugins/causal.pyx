"""``causal``: exact attention over a dense KV cache, the reference every other plugin is measured against.

The cache holds every position's key and value for every layer: float32
``[n_layers, positions, kv_dim]`` each, allocated once in ``init``. ``positions`` defaults to the
model's trained context (like llama2.c's run.c); ``causal:positions=N`` makes a larger cache, the
reference for behaviour past the context.
"""

from cython.parallel cimport prange
from libc.string cimport memcpy

import numpy as np

from pyllama.attention.base cimport Attention, threads_for
from pyllama.attention.head cimport attend_head

from pyllama.attention.spec import Knob


cdef class Causal(Attention):
    name = "causal"
    description = "exact attention over a dense cache of every position (the reference)"
    knobs = (
        Knob("positions", int, 0, "cache size in positions; 0 = the model's trained context", min=0),
    )

    cdef object _keys, _values, _scores, _kptr, _vptr
    cdef float* keys        # [n_layers, positions, kv_dim]
    cdef float* values
    cdef float* scores      # [n_heads, positions]
    cdef const float** kptr  # [n_heads, positions] rows gathered for the shared routine
    cdef const float** vptr
    cdef long long positions
    cdef long long length   # positions held (of the last layer written)
    cdef int n_layers, n_heads, head_dim, kv_dim, kv_mul

    def __cinit__(self, *args, **kwargs):
        self.native = True

    def __init__(self, positions: int = 0):
        if positions < 0:
            raise ValueError(f"causal: positions must be >= 0 (0: the model's context), got {positions}")
        self.positions = positions
        if positions > 0:
            self.max_positions = positions

    def init(self, config, pool):
        cdef long long P = self.max_positions
        self.positions = P
        self.n_layers = config.n_layers
        self.n_heads = config.n_heads
        self.head_dim = config.head_dim
        self.kv_dim = config.kv_dim
        self.kv_mul = config.kv_mul
        self._keys = np.zeros((config.n_layers, P, config.kv_dim), dtype=np.float32)
        self._values = np.zeros((config.n_layers, P, config.kv_dim), dtype=np.float32)
        self._scores = np.zeros((config.n_heads, P), dtype=np.float32)
        self._kptr = np.zeros((config.n_heads, P), dtype=np.uintp)
        self._vptr = np.zeros((config.n_heads, P), dtype=np.uintp)
        self.keys = <float*><size_t>self._keys.ctypes.data
        self.values = <float*><size_t>self._values.ctypes.data
        self.scores = <float*><size_t>self._scores.ctypes.data
        self.kptr = <const float**><size_t>self._kptr.ctypes.data
        self.vptr = <const float**><size_t>self._vptr.ctypes.data
        self.length = 0

    def reset(self):
        self.length = 0

    def memory_bytes(self):
        # the positions held, keys and values, all layers
        return int(2 * self.n_layers * self.length * self.kv_dim * 4)

    cdef int attend_c(self, int layer, long long pos, float* q, float* k, float* v, float* out) except -1 nogil:
        if pos >= self.positions or pos < 0:
            with gil:
                raise IndexError(f"causal: position {pos} is outside its cache of {self.positions}")
        cdef Py_ssize_t row = (layer * self.positions + pos) * self.kv_dim
        memcpy(self.keys + row, k, self.kv_dim * sizeof(float))
        memcpy(self.values + row, v, self.kv_dim * sizeof(float))
        self.length = pos + 1
        cdef int h
        cdef Py_ssize_t t, n = pos + 1, P = self.positions
        cdef const float* kbase
        cdef const float* vbase
        for h in prange(self.n_heads, schedule="static",
                        num_threads=threads_for(self.n_threads, n * self.n_heads * self.head_dim)):
            kbase = self.keys + layer * P * self.kv_dim + (h // self.kv_mul) * self.head_dim
            vbase = self.values + layer * P * self.kv_dim + (h // self.kv_mul) * self.head_dim
            for t in range(n):
                self.kptr[h * P + t] = kbase + t * self.kv_dim
                self.vptr[h * P + t] = vbase + t * self.kv_dim
            attend_head(q + h * self.head_dim, self.kptr + h * P, self.vptr + h * P, NULL, n,
                        self.head_dim, self.scores + h * P, out + h * self.head_dim)
        return 0
