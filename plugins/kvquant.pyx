"""``kvquant:k=TYPE,v=TYPE``: the keys and values stored in one of llama.cpp's KV-cache types.

llama.cpp's ``--cache-type-k`` / ``--cache-type-v`` (``-ctk q8_0 -ctv q8_0``): every position's key
and value rows are written once, when they arrive, in f32, f16, bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0
or q5_1, each row quantised exactly as llama.cpp's reference quantiser writes it
(``pyllama.attention.kvquant``: gguf-py's ``quantize`` writes the same bytes). Nothing else is kept:
the cache is ``[n_layers, positions, row bytes]`` for keys and for values, and the ledger counts
those bytes (q4_0: 18 per 32 values against float32's 128).

A step reads the rows back (gguf-py's ``dequantize``: d * q, or (d * q) + m) into a scratch of one
layer, ``[n_kv_heads, positions, head_dim]`` per tensor, and attends them with the shared routine,
in ascending position order; a block of positions is read back once and its queries attended
together (``attend_prefix``). With ``k=f32,v=f32`` the rows are read where they are stored (no
scratch), and this is ``causal`` bit for bit. llama.cpp stores a quantised row in blocks of 32
values and refuses such a cache when the head size is not a multiple of 32 ("K cache type q8_0 with
block size 32 does not divide n_embd_head_k"); so does this plugin (stories260K's heads of 8 take
f32, f16 and bf16).

It compresses every row, when stored; there is no event, and every position is kept (``holds =
"everything"``): the memory is saved by the representation, not by a selection. What differs from
llama.cpp's own quantised cache (docs/methods.md has the agreement measured): its CPU flash
attention quantises the query to the key type's dot-product type (Q8_0, or half for f16 keys) and
accumulates f16 values in half; its x86 Q8_0 writer rounds halves to even; and the version compared
(0c1e570) rotates queries, keys and values by a Hadamard matrix before a quantised cache when the
head size is a multiple of 64 (``LLAMA_ATTN_ROT_DISABLE=1`` turns that off), which this plugin does
not. So only the stored bytes can be identical, and they are where the rows going in are (tested at
layer 0).
"""

from cython.parallel cimport prange
from libc.stdint cimport uint8_t

import numpy as np

from pyllama.attention.base cimport threads_for
from pyllama.attention.gather cimport BLOCK_QUERIES, GatherAttention
from pyllama.attention.kvquant cimport dequantize_rows_c, quantize_row_c

from pyllama.attention.dense import POSITIONS
from pyllama.attention.kvquant import CACHE_TYPES, row_bytes, type_code
from pyllama.attention.memory import gather_bytes, require_memory
from pyllama.attention.spec import Knob, check_knobs
from pyllama.errors import PluginError
from pyllama.kernels.aligned import zeros_aligned

_TYPES = tuple(CACHE_TYPES)
_F32 = type_code("f32")

# rows read back per unit of work: a KV head's rows are split in runs so that two threads share a layer
cdef enum:
    ROW_RUN = 256


cdef class KVQuant(GatherAttention):
    name = "kvquant"
    description = ("K and V stored in one of llama.cpp's cache types (f16, q8_0, q4_0 ...), attended over the "
                   "rows read back; the ledger counts the stored bytes")
    knobs = (
        Knob("k", _TYPES, "f16", "the keys' cache type (llama.cpp's --cache-type-k)"),
        Knob("v", _TYPES, "f16", "the values' cache type (llama.cpp's --cache-type-v)"),
        POSITIONS,
    )
    holds = "everything"

    cdef uint8_t* kcache       # [n_layers, positions, k_row] bytes
    cdef uint8_t* vcache       # [n_layers, positions, v_row] bytes
    cdef float* deq_k          # [n_kv_heads, positions, head_dim] one layer's keys read back (NULL: f32, f32)
    cdef float* deq_v
    cdef bint in_place         # k=f32,v=f32: attend the stored rows, no scratch
    cdef readonly str k, v
    cdef readonly long long positions
    cdef int k_code, v_code
    cdef Py_ssize_t k_row, v_row, k_head, v_head  # bytes of a position's row and of one KV head in it

    def __init__(self, k: str = "f16", v: str = "f16", positions: int = 0):
        check_knobs(self, k=k, v=v, positions=positions)
        self.k = k
        self.v = v
        self.k_code = type_code(k)
        self.v_code = type_code(v)
        self.positions = positions
        if positions > 0:
            self.max_positions = positions

    def _check_model(self, config):
        for knob, name in (("k", self.k), ("v", self.v)):
            block = CACHE_TYPES[name][0]
            if config.head_dim % block:
                raise PluginError(
                    f"kvquant: {knob}={name} stores blocks of {block} values, which do not divide this model's "
                    f"head_dim of {config.head_dim} (llama.cpp refuses this cache too); use f32, f16 or bf16"
                )

    def planned_bytes(self, config):
        """What init allocates (Python integers: no overflow for any knob value)."""
        P, L, kv = int(self.max_positions), config.n_layers, config.kv_dim
        cache = L * P * (row_bytes(self.k, kv) + row_bytes(self.v, kv))
        scratch = 0 if self.k == self.v == "f32" else 2 * P * kv * 4
        return gather_bytes(config, 1, 1, BLOCK_QUERIES * P) + cache + scratch

    def init(self, config, pool):
        self._check_model(config)
        require_memory("kvquant", f"positions={int(self.max_positions):,}", self.planned_bytes(config))
        cdef long long P = self.max_positions
        self.positions = P
        # the rows are read back contiguously (attend_prefix): no pointer tables beyond one row
        self.init_gather(config, 1, 1, BLOCK_QUERIES * P)
        kv, hd, KVH = config.kv_dim, config.head_dim, config.n_kv_heads
        self.k_row, self.v_row = row_bytes(self.k, kv), row_bytes(self.v, kv)
        self.k_head, self.v_head = row_bytes(self.k, hd), row_bytes(self.v, hd)
        self.kcache = <uint8_t*>self.own(zeros_aligned((config.n_layers, P, self.k_row), np.uint8))
        self.vcache = <uint8_t*>self.own(zeros_aligned((config.n_layers, P, self.v_row), np.uint8))
        self.in_place = self.k_code == _F32 and self.v_code == _F32
        self.deq_k = NULL if self.in_place else <float*>self.own(zeros_aligned((KVH, P, hd)))
        self.deq_v = NULL if self.in_place else <float*>self.own(zeros_aligned((KVH, P, hd)))

    def memory_bytes(self):
        # the stored rows, keys and values, summed over the layers
        if self._counts is None:
            return 0
        return int(self._counts[0].sum()) * int(self.k_row + self.v_row)

    def held_positions(self, int layer):
        """Every position seen, for each KV head (each kept as a row of the cache types)."""
        if self._counts is None:
            return None
        held = np.arange(int(self._counts[0, layer]), dtype=np.int64)
        return [held.copy() for _ in range(self.n_kv_heads)]

    def stored_rows(self, int layer):
        """``(keys, values)``: the cache's bytes of ``layer``'s positions, uint8 [positions, row bytes]."""
        if self._counts is None:
            raise RuntimeError("kvquant: not initialised (bind it to a model or call init first)")
        n = int(self._counts[0, layer])
        keys = np.asarray(<uint8_t[:self.n_layers * self.positions * self.k_row]>self.kcache)
        values = np.asarray(<uint8_t[:self.n_layers * self.positions * self.v_row]>self.vcache)
        return (keys.reshape(self.n_layers, self.positions, self.k_row)[layer, :n].copy(),
                values.reshape(self.n_layers, self.positions, self.v_row)[layer, :n].copy())

    cdef int store(self, int layer, long long pos, const float* k, const float* v) except -1 nogil:
        """Position pos of layer, written in the cache types (positions come in order, within the cache)."""
        self.check_in_order(layer, pos, self.length[layer])
        cdef Py_ssize_t row = layer * self.positions + pos
        quantize_row_c(self.k_code, k, self.kcache + row * self.k_row, self.kv_dim)
        quantize_row_c(self.v_code, v, self.vcache + row * self.v_row, self.kv_dim)
        self.length[layer] = pos + 1
        return 0

    cdef void read_back(self, int layer, long long n) noexcept nogil:
        """Rows 0 .. n - 1 of every KV head of layer into the scratch."""
        cdef long long runs = (n + ROW_RUN - 1) // ROW_RUN, u, t, t1
        cdef int g
        cdef Py_ssize_t hd = self.head_dim, base = layer * self.positions
        for u in prange(self.n_kv_heads * runs, schedule="static",
                        num_threads=threads_for(self.n_threads, n * self.kv_dim)):
            g = u // runs
            t1 = min((u % runs + 1) * ROW_RUN, n)
            t = (u % runs) * ROW_RUN
            dequantize_rows_c(self.k_code, self.kcache + (base + t) * self.k_row + g * self.k_head, self.k_row,
                              self.deq_k + (g * self.positions + t) * hd, hd, t1 - t, hd)
            dequantize_rows_c(self.v_code, self.vcache + (base + t) * self.v_row + g * self.v_head, self.v_row,
                              self.deq_v + (g * self.positions + t) * hd, hd, t1 - t, hd)

    cdef void attend_rows(self, int layer, long long pos, Py_ssize_t m, const float* q, float* out) noexcept nogil:
        """The queries of positions pos .. pos + m - 1 over the rows read back (or stored: f32, f32)."""
        cdef int h, g, hd = self.head_dim
        cdef Py_ssize_t off, stride = self.kv_dim if self.in_place else hd
        cdef const float* keys = <const float*>self.kcache + layer * self.positions * self.kv_dim
        cdef const float* values = <const float*>self.vcache + layer * self.positions * self.kv_dim
        if not self.in_place:
            self.read_back(layer, pos + m)
            keys, values = self.deq_k, self.deq_v
        for h in prange(self.n_heads, schedule="static",
                        num_threads=threads_for(self.n_threads, (pos + m) * m * self.n_heads * hd)):
            g = h // self.kv_mul
            off = g * hd if self.in_place else g * self.positions * hd
            self.attend_prefix(h, q, keys + off, values + off, stride, pos, m, out)

    cdef int attend_c(self, int layer, long long pos, float* q, float* k, float* v, float* out) except -1 nogil:
        self.store(layer, pos, k, v)
        self.attend_rows(layer, pos, 1, q, out)
        return 0

    cdef int attend_block_c(self, int layer, long long pos, Py_ssize_t n, float* q, float* k, float* v,
                            float* out) except -1 nogil:
        cdef Py_ssize_t i
        for i in range(n):
            self.store(layer, pos + i, k + i * self.kv_dim, v + i * self.kv_dim)
        self.attend_rows(layer, pos, n, q, out)
        return 0
