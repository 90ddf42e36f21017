"""The sinks + window base of the built-in memories: the part StreamingLLM, lattice and tiered share.

Layout. Position t < ``sinks`` is kept exact in sink row t, a later one in ring row
``(t - sinks) % window``. A layer's sink rows and ring are one float32 ``[sinks + window, kv_dim]``
(of ``[n_layers, sinks + window, kv_dim]``, keys and values each, allocated once by ``init_window``
with the row tables of ``GatherAttention`` and its per-layer counters), so that until the ring
wraps, position t is in the layer's row t: a block of positions is then attended as ``causal``
attends one (``attend_held_block``). ``keep(layer, pos, k, v)`` checks the order, stores
this position and, when its ring row still holds position ``pos - window`` (which leaves the window
now), first hands that row to ``leave_window``: a no-op here, where a memory with an older tier
(staging, buckets, quantised groups) takes the token. ``kept_span`` (window.pxd) says which
positions the sinks and the window hold after a step; ``take_sinks`` and ``take_window`` append a
head's rows for them in ascending position order.

The shift (StreamingLLM's positions inside the cache, Xiao et al. 2023). RoPE scores depend only on
the distance between query and key, so moving a row to another position is a re-rotation of its key
by the position delta: ``moved(keys, n, delta, dst)`` copies n key rows into the scratch rows dst ..
dst + n - 1 and rotates each by delta (one RoPE row per call, ``rope_rotate_delta``'s arithmetic),
leaving the cache itself as it was.

A subclass declares its knobs (``sink_window_knobs`` gives the two of the layout), checks the
constructor's values with ``check_knobs`` and plans its bytes with ``window_bytes`` for the part
allocated here, so that knob values too large for the machine are refused before anything is
allocated (``pyllama.attention.memory``).
"""

from cython.parallel cimport prange
from libc.string cimport memcpy

import numpy as np

from pyllama.attention.base cimport threads_for
from pyllama.attention.gather cimport GatherAttention
from pyllama.kernels.rope cimport rope_spec_of, rope_row, rope_apply

from pyllama.attention.memory import gather_bytes
from pyllama.attention.spec import Knob


def sink_window_knobs(sinks, window, kept="kept"):
    """The knobs ``sinks`` and ``window`` with these defaults; ``kept`` says how their rows are held."""
    return (
        Knob("sinks", int, sinks, f"first positions always {kept} (attention sinks)", min=0),
        Knob("window", int, window, f"most recent positions {kept}, the current one included", min=1),
    )


cdef class WindowAttention(GatherAttention):
    """Base of the memories that keep sinks + a window exact (see the module docstring)."""

    def window_bytes(self, config, rows, counters, n_shifted, score_rows=0):
        """What ``init_window`` allocates for these arguments (Python integers: no overflow)."""
        S, W, L, kv = int(self.sinks), int(self.window), config.n_layers, config.kv_dim
        shift = n_shifted * kv * 4 + 2 * max(config.n_rot // 2, 1) * 4 if n_shifted > 0 else 0
        windows = L * 8  # model_window: each layer's own window, int64
        return gather_bytes(config, rows, counters, score_rows) + 2 * L * (S + W) * kv * 4 + shift + windows

    def held_exact(self):
        """Per layer, the positions the sinks and the window hold now within the model's window (int64)."""
        t = self._counts[0]
        sinks = np.minimum(t, self.sinks)
        ring = np.minimum(np.maximum(t - self.sinks, 0), self.window)
        W = np.asarray(getattr(self.config, "layer_windows", ()) or (0,) * len(t), dtype=np.int64)
        hidden = np.where(W > 0, np.maximum(t - W, 0), 0)  # positions 0 .. t - W - 1 are out of the model's window
        ring_start = t - ring
        return np.maximum(sinks - hidden, 0) + ring - np.clip(hidden - ring_start, 0, ring)

    def held_positions(self, int layer):
        """The sink and window positions held after the last call (the same for every KV head)."""
        t = int(self._counts[0][layer]) if self._counts is not None else 0
        if t == 0:
            return [np.zeros(0, dtype=np.int64) for _ in range(self.n_kv_heads)]
        cdef long long first, n_sink, start, n_ring
        self.visible_span(layer, t - 1, &first, &n_sink, &start, &n_ring)
        held = np.concatenate([np.arange(first, n_sink), np.arange(start, start + n_ring)]).astype(np.int64)
        return [held.copy() for _ in range(self.n_kv_heads)]

    cdef int init_window(self, config, long long rows, int counters, long long n_shifted,
                         long long score_rows=0) except -1:
        """init_gather, then the sink and ring rows; n_shifted > 0: that many scratch rows for ``moved``;
        score_rows: init_gather's, for a plugin that attends a block's queries together."""
        cdef Py_ssize_t half = max(config.n_rot // 2, 1)
        L, kv = config.n_layers, config.kv_dim
        self.init_gather(config, rows, counters, score_rows)
        self.rope = rope_spec_of(config, config.rope_theta)
        windows = getattr(config, "layer_windows", ()) or (0,) * L
        self.model_window = <long long*>self.own(np.asarray(windows, dtype=np.int64))
        self.layer_rows = self.sinks + self.window
        self.sink_k = <float*>self.own(np.zeros((L, self.layer_rows, kv), dtype=np.float32))
        self.sink_v = <float*>self.own(np.zeros((L, self.layer_rows, kv), dtype=np.float32))
        self.ring_k = self.sink_k + self.sinks * self.kv_dim
        self.ring_v = self.sink_v + self.sinks * self.kv_dim
        self.shifted = NULL
        if n_shifted > 0:
            self.shifted = <float*>self.own(np.zeros((n_shifted, kv), dtype=np.float32))
            self.rope_cos = <float*>self.own(np.zeros(2 * half, dtype=np.float32))
            self.rope_sin = self.rope_cos + half
        return 0

    cdef int keep(self, int layer, long long pos, const float* k, const float* v) except -1 nogil:
        """Store position pos of layer (in order); the row it overwrites goes to leave_window first."""
        self.check_in_order(layer, pos, self.length[layer])
        cdef long long S = self.sinks, W = self.window
        cdef Py_ssize_t kv = self.kv_dim, row
        cdef float* key_row
        cdef float* value_row
        if pos < S:
            row = self.layer_at(layer) + pos * kv
            key_row = self.sink_k + row
            value_row = self.sink_v + row
        else:
            row = self.layer_at(layer) + (pos - S) % W * kv
            key_row = self.ring_k + row
            value_row = self.ring_v + row
            if pos >= S + W:  # the row still holds position pos - W, which leaves the window now
                self.leave_window(layer, key_row, value_row)
        memcpy(key_row, k, kv * sizeof(float))
        memcpy(value_row, v, kv * sizeof(float))
        self.length[layer] = pos + 1
        return 0

    cdef bint attend_held_block(self, int layer, long long pos, Py_ssize_t n, float* q, const float* k,
                                const float* v, float* out) except -1 nogil:
        """Keep and attend positions pos .. pos + n - 1 as causal does a block, if the sinks and the window
        hold every position up to the block's last (no ring row overwritten, none hidden by the model's
        window): each head's queries together over its layer's rows 0 .., which are then positions 0 ..
        (``attend_prefix``). False, with nothing done, otherwise. The scores scratch must hold
        BLOCK_QUERIES rows of sinks + window (init_window's score_rows)."""
        cdef Py_ssize_t i, off
        cdef int h, hd = self.head_dim
        cdef long long model_window = self.model_window[layer]
        if pos + n > self.layer_rows or (model_window > 0 and pos + n > model_window):
            return False
        for i in range(n):
            self.keep(layer, pos + i, k + i * self.kv_dim, v + i * self.kv_dim)  # position t in row t
        for h in prange(self.n_heads, schedule="static",
                        num_threads=threads_for(self.n_threads, (pos + n) * n * self.n_heads * hd)):
            off = self.layer_at(layer) + (h // self.kv_mul) * hd
            self.attend_prefix(h, q, self.sink_k + off, self.sink_v + off, self.kv_dim, pos, n, out)
        return True

    cdef void leave_window(self, int layer, const float* key, const float* value) noexcept nogil:
        """A token leaves the window (its rows are overwritten right after): sinks + window forget it."""

    cdef const float* moved(self, const float* keys, long long n, long long delta, long long dst) noexcept nogil:
        """n key rows copied to shifted rows dst .. dst + n - 1, each re-rotated by delta positions."""
        cdef Py_ssize_t kv = self.kv_dim
        cdef float* rows = self.shifted + dst * kv
        cdef long long j
        rope_row(&self.rope, delta, self.rope_cos, self.rope_sin)
        memcpy(rows, keys, n * kv * sizeof(float))
        for j in range(n):
            rope_apply(&self.rope, rows + j * kv, self.n_kv_heads, self.rope_cos, self.rope_sin)
        return rows
