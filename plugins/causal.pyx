"""``causal``: exact attention over a dense KV cache, the reference every other plugin is measured against.

The cache holds every position's key and value for every layer: float32
``[n_layers, positions, kv_dim]`` each, allocated once in ``init``. ``positions`` defaults to the
model's trained context (like llama2.c's run.c); ``causal:positions=N`` makes a larger cache, the
reference for behaviour past the context.
"""

from cython.parallel cimport prange
from libc.string cimport memcpy

import numpy as np

from pyllama.attention.base cimport threads_for
from pyllama.attention.gather cimport GatherAttention

from pyllama.attention.memory import gather_bytes, require_memory
from pyllama.attention.spec import Knob


cdef class Causal(GatherAttention):
    name = "causal"
    description = "exact attention over a dense cache of every position (the reference)"
    knobs = (
        Knob("positions", int, 0, "cache size in positions; 0 = the model's trained context", min=0),
    )

    cdef float* keys        # [n_layers, positions, kv_dim]
    cdef float* values
    cdef long long positions
    cdef long long* length   # [n_layers] positions seen by each layer (blocks run layer by layer)
    cdef object _length      # the same counts as numpy, for memory_bytes

    def __init__(self, positions: int = 0):
        if positions < 0:
            raise ValueError(f"causal: positions must be >= 0 (0: the model's context), got {positions}")
        self.positions = positions
        if positions > 0:
            self.max_positions = positions

    def planned_bytes(self, config):
        """What init allocates (Python integers: no overflow for any knob value)."""
        P = int(self.max_positions)
        return gather_bytes(config, P) + 2 * config.n_layers * P * config.kv_dim * 4 + config.n_layers * 8

    def init(self, config, pool):
        require_memory("causal", f"positions={int(self.max_positions):,}", self.planned_bytes(config))
        cdef long long P = self.max_positions
        self.positions = P
        self.init_gather(config, P)
        self.keys = <float*>self.own(np.zeros((config.n_layers, P, config.kv_dim), dtype=np.float32))
        self.values = <float*>self.own(np.zeros((config.n_layers, P, config.kv_dim), dtype=np.float32))
        self._length = np.zeros(config.n_layers, dtype=np.int64)
        self.length = <long long*>self.own(self._length)

    def reset(self):
        if self._length is not None:
            self._length[:] = 0

    def memory_bytes(self):
        # the positions held, keys and values, summed over the layers
        if self._length is None:
            return 0
        return int(2 * int(self._length.sum()) * self.kv_dim * 4)

    cdef int attend_c(self, int layer, long long pos, float* q, float* k, float* v, float* out) except -1 nogil:
        self.check_in_order(layer, pos, self.length[layer])
        cdef Py_ssize_t row = (layer * self.positions + pos) * self.kv_dim
        memcpy(self.keys + row, k, self.kv_dim * sizeof(float))
        memcpy(self.values + row, v, self.kv_dim * sizeof(float))
        self.length[layer] = pos + 1
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
            self.attend_gathered(h, q, NULL, n, out)
        return 0
