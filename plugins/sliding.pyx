"""``sliding:N``: exact attention over the last N positions (the current one included).

The cache is a ring buffer of N rows per layer: float32 ``[n_layers, window, kv_dim]`` keys and
values, allocated once in ``init``; position t lives in row ``t % window``. Memory stops growing
after N positions, so the plugin runs at any length (``max_positions`` is unbounded; the engine
computes RoPE rows past the trained context on the fly).

Rows are gathered in ascending position order and attended by the shared routine, so with
N >= the sequence length this is ``causal`` bit for bit, and ``sink:0,N`` is ``sliding:N``.
"""

from cython.parallel cimport prange
from libc.string cimport memcpy

import numpy as np

from pyllama.attention.base cimport threads_for
from pyllama.attention.gather cimport GatherAttention

from pyllama.attention.base import UNBOUNDED
from pyllama.attention.memory import gather_bytes, require_memory
from pyllama.attention.spec import Knob


cdef class Sliding(GatherAttention):
    name = "sliding"
    description = "the last N positions (ring buffer): memory stays flat however long the sequence"
    knobs = (
        Knob("window", int, 256, "positions kept, the current one included", min=1),
    )

    cdef float* keys         # [n_layers, window, kv_dim] ring buffer: position t in row t % window
    cdef float* values
    cdef readonly long long window
    cdef long long* length   # [n_layers] positions seen by each layer (blocks run layer by layer)
    cdef object _length      # the same counts as numpy, for memory_bytes

    def __init__(self, window: int = 256):
        if window < 1:
            raise ValueError(f"sliding: window must be >= 1, got {window}")
        self.window = window
        self.max_positions = UNBOUNDED

    def planned_bytes(self, config):
        """What init allocates (Python integers: no overflow for any knob value)."""
        W = int(self.window)
        return gather_bytes(config, W) + 2 * config.n_layers * W * config.kv_dim * 4 + config.n_layers * 8

    def init(self, config, pool):
        require_memory("sliding", f"window={int(self.window):,}", self.planned_bytes(config))
        cdef long long W = self.window
        self.init_gather(config, W)
        self.keys = <float*>self.own(np.zeros((config.n_layers, W, config.kv_dim), dtype=np.float32))
        self.values = <float*>self.own(np.zeros((config.n_layers, W, config.kv_dim), dtype=np.float32))
        self._length = np.zeros(config.n_layers, dtype=np.int64)
        self.length = <long long*>self.own(self._length)

    def reset(self):
        if self._length is not None:
            self._length[:] = 0

    def memory_bytes(self):
        # keys and values of the rows in use, summed over the layers
        if self._length is None:
            return 0
        return int(2 * int(np.minimum(self._length, self.window).sum()) * self.kv_dim * 4)

    cdef int attend_c(self, int layer, long long pos, float* q, float* k, float* v, float* out) except -1 nogil:
        self.check_in_order(layer, pos, self.length[layer])
        cdef long long W = self.window
        cdef Py_ssize_t layer_base = layer * W * self.kv_dim
        cdef Py_ssize_t row = layer_base + (pos % W) * self.kv_dim
        memcpy(self.keys + row, k, self.kv_dim * sizeof(float))
        memcpy(self.values + row, v, self.kv_dim * sizeof(float))
        self.length[layer] = pos + 1
        cdef long long n = pos + 1 if pos + 1 < W else W
        cdef long long start = pos + 1 - n
        cdef int h
        cdef long long i
        cdef const float* kbase
        cdef const float* vbase
        for h in prange(self.n_heads, schedule="static",
                        num_threads=threads_for(self.n_threads, n * self.n_heads * self.head_dim)):
            kbase = self.keys + layer_base + (h // self.kv_mul) * self.head_dim
            vbase = self.values + layer_base + (h // self.kv_mul) * self.head_dim
            for i in range(n):  # ascending positions start .. pos
                self.kptr[h * W + i] = kbase + ((start + i) % W) * self.kv_dim
                self.vptr[h * W + i] = vbase + ((start + i) % W) * self.kv_dim
            self.attend_gathered(h, q, NULL, n, out)
        return 0
