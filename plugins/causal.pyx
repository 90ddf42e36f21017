"""``causal``: exact attention over a dense KV cache, the reference every other plugin is measured against.

The cache holds every position's key and value for every layer: float32
``[n_layers, positions, row_floats]`` each (``kv_dim`` padded, ``pyllama.attention.dense``),
allocated once in ``init``.
``positions`` defaults to the model's trained context (like llama2.c's run.c);
``causal:positions=N`` makes a larger cache, the reference for behaviour past the context.

In a block of positions (``attend_block_c``: the base's ``attend_every_row``) it stores the block's
keys and values, then attends each head's queries together (``attend_prefix``, gather.pxd:
``attend_head_rows``, up to ``BLOCK_QUERIES`` at a time): a long cache is then read once per group
of queries instead of once per position, with the bits of one position at a time. The base's scores
scratch is sized for that, ``[n_heads, BLOCK_QUERIES, positions]`` floats; one position at a time
uses its first row, and attends the query heads that share a KV head together (``attend_heads``,
head.pyx's ``attend_group_rows``): that KV head's rows are read once per step, not once per head.
"""

from cython.parallel cimport prange

from pyllama.attention.base cimport threads_for
from pyllama.attention.dense cimport DenseAttention
from pyllama.attention.gather cimport BLOCK_QUERIES

from pyllama.attention.dense import POSITIONS
from pyllama.attention.memory import require_memory
from pyllama.attention.spec import check_knobs


cdef class Causal(DenseAttention):
    name = "causal"
    description = "exact attention over a dense cache of every position (the reference)"
    knobs = (POSITIONS,)

    def __init__(self, positions: int = 0):
        check_knobs(self, positions=positions)
        self.positions = positions
        if positions > 0:
            self.max_positions = positions

    def planned_bytes(self, config):
        """What init allocates (Python integers: no overflow for any knob value)."""
        return self.dense_bytes(config, int(self.max_positions), 1, BLOCK_QUERIES * int(self.max_positions))

    def init(self, config, pool):
        require_memory("causal", f"positions={int(self.max_positions):,}", self.planned_bytes(config))
        self.init_dense(config, self.max_positions, 1, BLOCK_QUERIES * self.max_positions)

    def memory_bytes(self):
        # the positions held, keys and values, summed over the layers
        if self._counts is None:
            return 0
        return int(2 * int(self._counts[0].sum()) * self.kv_dim * 4)

    cdef int attend_c(self, int layer, long long pos, float* q, float* k, float* v, float* out) except -1 nogil:
        self.keep(layer, pos, k, v)
        cdef long long n = pos + 1
        cdef int u, h0, count, hd = self.head_dim
        cdef int team = threads_for(self.n_threads, n * self.n_heads * hd)
        cdef int parts = self.group_parts(team)
        cdef Py_ssize_t off
        # the heads sharing a KV head together: its rows 0 .. pos read once for them
        for u in prange(self.n_kv_heads * parts, schedule="static", num_threads=team):
            h0 = self.part_first(u, parts)
            count = self.part_heads(u, parts)
            if count > 0:
                off = layer * self.positions * self.row_floats + (u // parts) * hd
                self.attend_heads(h0, count, q, self.keys + off, self.values + off, self.row_floats, n, out)
        return 0

    cdef int attend_block_c(self, int layer, long long pos, Py_ssize_t n, float* q, float* k, float* v,
                            float* out) except -1 nogil:
        return self.attend_every_row(layer, pos, n, q, k, v, out)
