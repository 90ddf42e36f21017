"""``sink:s,w[,shift]``: the first s positions (attention sinks) plus the last w (StreamingLLM).

Xiao et al., "Efficient Streaming Language Models with Attention Sinks" (2023): keeping the first
few tokens, on which softmax attention dumps its surplus weight, next to a recent window lets a
model run far past its trained context with a fixed cache. State, allocated once in ``init``:
float32 sink rows ``[n_layers, s, kv_dim]`` and a ring buffer ``[n_layers, w, kv_dim]`` (position
t >= s in row ``(t - s) % w``), keys and values each. Memory is flat once s + w positions are held.

Positions. Without ``shift`` every key keeps the position it was rotated with (its place in the
text). With ``shift`` positions are assigned inside the cache, as the paper does: the cached keys
sit at 0 .. n-1 and the query at n-1. RoPE scores depend only on the distance between query and
key, and the window is contiguous, so that is the same as leaving the window's keys and the query
where they are and moving the s sink keys forward by the number of evicted positions
(``delta = first_window_position - s``): each step re-rotates a copy of the s sink keys by
``delta`` (``rope_rotate_delta``'s arithmetic, one RoPE row per step), O(s) work instead of
re-rotating the whole window.

Rows are gathered in ascending position order (sinks, then window) and attended by the shared
routine: with s + w >= the sequence length this is ``causal`` bit for bit (nothing is evicted, so
``shift`` changes nothing either), and ``sink:0,w`` is ``sliding:w``.
"""

from cython.parallel cimport prange
from libc.string cimport memcpy

import numpy as np

from pyllama.attention.base cimport threads_for
from pyllama.attention.gather cimport GatherAttention, kept_span, position_rows
from pyllama.kernels.rope cimport RopeSpec, rope_spec_of, rope_row, rope_apply

from pyllama.attention.base import UNBOUNDED
from pyllama.attention.memory import gather_bytes, require_memory
from pyllama.attention.spec import Knob


cdef class Sink(GatherAttention):
    name = "sink"
    description = "first s positions (attention sinks) + last w (StreamingLLM); shift re-assigns positions"
    knobs = (
        Knob("sinks", int, 4, "first positions always kept (attention sinks)", min=0),
        Knob("window", int, 252, "most recent positions kept, the current one included", min=1),
        Knob("shift", bool, False, "assign positions inside the cache (StreamingLLM); off: original positions"),
    )

    cdef float* sink_k        # [n_layers, sinks, kv_dim]
    cdef float* sink_v
    cdef float* ring_k        # [n_layers, window, kv_dim]: position t >= sinks in row (t - sinks) % window
    cdef float* ring_v
    cdef float* shifted       # [sinks, kv_dim] this step's sink keys moved by delta (shift only)
    cdef float* rope_cos      # [n_rot / 2] RoPE row of delta
    cdef float* rope_sin
    cdef RopeSpec rope
    cdef readonly long long sinks, window
    cdef readonly bint shift
    cdef long long* length   # [n_layers] positions seen by each layer (blocks run layer by layer)
    cdef object _length      # the same counts as numpy, for memory_bytes

    def __init__(self, sinks: int = 4, window: int = 252, shift: bool = False):
        if sinks < 0:
            raise ValueError(f"sink: sinks must be >= 0, got {sinks}")
        if window < 1:
            raise ValueError(f"sink: window must be >= 1 (the current position is always attended), got {window}")
        self.sinks = sinks
        self.window = window
        self.shift = shift
        self.max_positions = UNBOUNDED

    def planned_bytes(self, config):
        """What init allocates (Python integers: no overflow for any knob value)."""
        S, W, L, kv = max(int(self.sinks), 1), int(self.window), config.n_layers, config.kv_dim
        rope = 2 * max(config.n_rot // 2, 1) * 4
        return (gather_bytes(config, int(self.sinks) + W) + 2 * L * S * kv * 4 + 2 * L * W * kv * 4 + S * kv * 4
                + rope + L * 8)

    def init(self, config, pool):
        require_memory("sink", f"sinks={int(self.sinks):,}, window={int(self.window):,}", self.planned_bytes(config))
        cdef long long S = self.sinks, W = self.window, C = self.sinks + self.window
        cdef Py_ssize_t half = max(config.n_rot // 2, 1)
        self.init_gather(config, C)
        self.rope = rope_spec_of(config)
        # max(…, 1): a valid pointer even for sinks=0
        self.sink_k = <float*>self.own(np.zeros((config.n_layers, max(S, 1), config.kv_dim), dtype=np.float32))
        self.sink_v = <float*>self.own(np.zeros((config.n_layers, max(S, 1), config.kv_dim), dtype=np.float32))
        self.ring_k = <float*>self.own(np.zeros((config.n_layers, W, config.kv_dim), dtype=np.float32))
        self.ring_v = <float*>self.own(np.zeros((config.n_layers, W, config.kv_dim), dtype=np.float32))
        self.shifted = <float*>self.own(np.zeros((max(S, 1), config.kv_dim), dtype=np.float32))
        self.rope_cos = <float*>self.own(np.zeros(2 * half, dtype=np.float32))
        self.rope_sin = self.rope_cos + half
        self._length = np.zeros(config.n_layers, dtype=np.int64)
        self.length = <long long*>self.own(self._length)

    def reset(self):
        if self._length is not None:
            self._length[:] = 0

    def memory_bytes(self):
        # keys and values of the sink rows and window rows in use, summed over the layers
        if self._length is None:
            return 0
        t = self._length
        held = np.minimum(t, self.sinks) + np.minimum(np.maximum(t - self.sinks, 0), self.window)
        return int(2 * int(held.sum()) * self.kv_dim * 4)

    cdef int attend_c(self, int layer, long long pos, float* q, float* k, float* v, float* out) except -1 nogil:
        self.check_in_order(layer, pos, self.length[layer])
        cdef long long S = self.sinks, W = self.window, C = self.sinks + self.window
        cdef Py_ssize_t kv = self.kv_dim
        cdef float* key_row
        cdef float* value_row
        position_rows(pos, layer, S, W, kv, self.sink_k, self.sink_v, self.ring_k, self.ring_v,
                      &key_row, &value_row)
        memcpy(key_row, k, kv * sizeof(float))
        memcpy(value_row, v, kv * sizeof(float))
        self.length[layer] = pos + 1

        # kept: sinks 0 .. n_sink-1, then the window ring_start .. pos
        cdef long long n_sink, ring_start, n_ring
        kept_span(pos, S, W, &n_sink, &ring_start, &n_ring)
        cdef long long n = n_sink + n_ring
        cdef long long delta = ring_start - S if self.shift else 0
        cdef const float* sink_keys = self.sink_k + layer * S * kv
        cdef long long j
        if delta > 0 and n_sink > 0:
            # StreamingLLM positions: sink keys move forward by the evicted count (see the module docstring)
            rope_row(&self.rope, delta, self.rope_cos, self.rope_sin)
            memcpy(self.shifted, sink_keys, n_sink * kv * sizeof(float))
            for j in range(n_sink):
                rope_apply(&self.rope, self.shifted + j * kv, self.n_kv_heads, self.rope_cos, self.rope_sin)
            sink_keys = self.shifted

        cdef int h
        cdef long long i
        cdef Py_ssize_t off
        cdef const float* ring_kbase
        cdef const float* ring_vbase
        for h in prange(self.n_heads, schedule="static",
                        num_threads=threads_for(self.n_threads, n * self.n_heads * self.head_dim)):
            off = (h // self.kv_mul) * self.head_dim
            for i in range(n_sink):
                self.kptr[h * C + i] = sink_keys + i * kv + off
                self.vptr[h * C + i] = self.sink_v + (layer * S + i) * kv + off
            ring_kbase = self.ring_k + layer * W * kv + off
            ring_vbase = self.ring_v + layer * W * kv + off
            for i in range(n_ring):  # ascending positions ring_start .. pos
                self.kptr[h * C + n_sink + i] = ring_kbase + ((ring_start + i - S) % W) * kv
                self.vptr[h * C + n_sink + i] = ring_vbase + ((ring_start + i - S) % W) * kv
            self.attend_gathered(h, q, NULL, n, out)
        return 0
