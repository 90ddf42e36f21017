"""A dense cache of every position, the layout of ``causal`` and ``kmeans``.

Keys and values of every position of every layer: float32 ``[n_layers, positions, kv_dim]`` each,
allocated once by ``init_dense`` with the row tables and per-layer counters of ``GatherAttention``.
``positions`` is the plugin's ``max_positions``: the model's trained context unless the
``positions`` knob (``POSITIONS``) asks for more. ``keep(layer, pos, k, v)`` checks the order and
stores the position; ``take_positions`` and ``take_listed_positions`` (dense.pxd) append a head's
rows. ``dense_bytes`` is the plan of what ``init_dense`` allocates.
"""

from libc.string cimport memcpy

import numpy as np

from pyllama.attention.gather cimport GatherAttention

from pyllama.attention.memory import gather_bytes
from pyllama.attention.spec import Knob

POSITIONS = Knob("positions", int, 0, "cache size in positions; 0 = the model's trained context", min=0)


cdef class DenseAttention(GatherAttention):
    """Base of the plugins that keep every position (see the module docstring)."""

    def dense_bytes(self, config, rows, counters, score_rows=0):
        """What ``init_dense`` allocates for these arguments (Python integers: no overflow)."""
        cache = 2 * config.n_layers * int(self.max_positions) * config.kv_dim * 4
        return gather_bytes(config, rows, counters, score_rows) + cache

    cdef int init_dense(self, config, long long rows, int counters, long long score_rows=0) except -1:
        """init_gather, then the cache of max_positions positions."""
        self.positions = self.max_positions
        self.init_gather(config, rows, counters, score_rows)
        shape = (config.n_layers, self.positions, config.kv_dim)
        self.keys = <float*>self.own(np.zeros(shape, dtype=np.float32))
        self.values = <float*>self.own(np.zeros(shape, dtype=np.float32))
        return 0

    cdef int keep(self, int layer, long long pos, const float* k, const float* v) except -1 nogil:
        """Store position pos of layer (positions come in order, within the cache)."""
        self.check_in_order(layer, pos, self.length[layer])
        cdef Py_ssize_t row = (layer * self.positions + pos) * self.kv_dim
        memcpy(self.keys + row, k, self.kv_dim * sizeof(float))
        memcpy(self.values + row, v, self.kv_dim * sizeof(float))
        self.length[layer] = pos + 1
        return 0
