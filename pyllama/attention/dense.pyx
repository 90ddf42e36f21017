"""A dense cache of every position, the layout of ``causal`` and ``kmeans``.

Keys and values of every position of every layer: float32 ``[n_layers, positions, row_floats]`` each,
allocated once by ``init_dense`` with the row tables and per-layer counters of ``GatherAttention``.
A row holds one position's ``kv_dim`` channels, padded to ``row_floats`` (``padded_row``) so that the
rows of a head do not all fall in the same few sets of the L1 cache. The padding is layout, not
information: ``planned_bytes`` counts it, the per-position ledger (``memory_bytes``) does not.
``positions`` is the plugin's ``max_positions``: the model's trained context unless the
``positions`` knob (``POSITIONS``) asks for more. ``keep(layer, pos, k, v)`` checks the order and
stores the position; ``take_positions`` and ``take_listed_positions`` (dense.pxd) append a head's
rows. ``dense_bytes`` is the plan of what ``init_dense`` allocates.
"""

from cython.parallel cimport prange
from libc.string cimport memcpy


from pyllama.attention.base cimport threads_for
from pyllama.attention.gather cimport GatherAttention

from pyllama.attention.memory import gather_bytes
from pyllama.attention.spec import Knob
from pyllama.kernels.aligned import zeros_aligned

POSITIONS = Knob("positions", int, 0, "cache size in positions; 0 = the model's trained context", min=0)


def padded_row(kv_dim: int) -> int:
    """Floats from one cached position to the next: kv_dim, plus one 64-byte line when the row is a
    multiple of 1 KiB. Attention reads one head's slice of many consecutive rows. Rows a multiple
    of 16 lines long start in at most 4 of the L1 cache's 64 sets (the 42M shape's 2 KiB rows in 2
    of them), more lines to a set than it has ways, so a tile of keys evicts itself; an odd number
    of lines spreads them over all 64. The causal block's attention over a 512-position prompt of
    the 42M shape: 123 -> 95 ms. Other rows (the 15M shape's 1,152 bytes, SmolLM2's 768) already
    spread enough."""
    return kv_dim + 16 if kv_dim % 256 == 0 else kv_dim


cdef class DenseAttention(GatherAttention):
    """Base of the plugins that keep every position (see the module docstring)."""

    def dense_bytes(self, config, rows, counters, score_rows=0):
        """What ``init_dense`` allocates for these arguments (Python integers: no overflow)."""
        cache = 2 * config.n_layers * int(self.max_positions) * padded_row(config.kv_dim) * 4
        return gather_bytes(config, rows, counters, score_rows) + cache

    cdef int init_dense(self, config, long long rows, int counters, long long score_rows=0) except -1:
        """init_gather, then the cache of max_positions positions."""
        self.positions = self.max_positions
        self.init_gather(config, rows, counters, score_rows)
        self.row_floats = padded_row(config.kv_dim)
        shape = (config.n_layers, self.positions, self.row_floats)
        self.keys = <float*>self.own(zeros_aligned(shape))
        self.values = <float*>self.own(zeros_aligned(shape))
        return 0

    cdef int keep(self, int layer, long long pos, const float* k, const float* v) except -1 nogil:
        """Store position pos of layer (positions come in order, within the cache)."""
        self.check_in_order(layer, pos, self.length[layer])
        cdef Py_ssize_t row = (layer * self.positions + pos) * self.row_floats
        memcpy(self.keys + row, k, self.kv_dim * sizeof(float))
        memcpy(self.values + row, v, self.kv_dim * sizeof(float))
        self.length[layer] = pos + 1
        return 0

    cdef int attend_every_row(self, int layer, long long pos, Py_ssize_t n, float* q, const float* k,
                              const float* v, float* out) except -1 nogil:
        """Keep positions pos .. pos + n - 1, then attend each to every position up to itself: each head's
        queries together (``attend_prefix``), with the bits of one position at a time. The scores scratch
        must hold BLOCK_QUERIES rows of the positions (init_dense's score_rows)."""
        cdef Py_ssize_t i, off
        cdef int h, hd = self.head_dim
        for i in range(n):
            self.keep(layer, pos + i, k + i * self.kv_dim, v + i * self.kv_dim)
        for h in prange(self.n_heads, schedule="static",
                        num_threads=threads_for(self.n_threads, (pos + n) * n * self.n_heads * hd)):
            off = layer * self.positions * self.row_floats + (h // self.kv_mul) * hd
            self.attend_prefix(h, q, self.keys + off, self.values + off, self.row_floats, pos, n, out)
        return 0
