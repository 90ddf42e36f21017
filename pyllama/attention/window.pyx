"""The sinks + window base of the built-in memories: the part StreamingLLM, lattice and tiered share.

Layout. Position t < ``sinks`` is kept exact in sink row t, a later one in ring row ``(t - sinks) %
window``. A layer's sink rows and ring are one float32 ``[sinks + window, kv_dim]`` (of ``[n_layers,
sinks + window, kv_dim]``, keys and values each, allocated once by ``init_window`` with the row
tables of ``GatherAttention`` and its per-layer counters), so that until the ring wraps, position t
is in the layer's row t: a block of positions is then attended as ``causal`` attends one
(``attend_held_block``). Past the first eviction, ``attend_window_block`` takes a block 16 positions
at a time whose spans are the same sinks and windows one row apart, each KV head's rows copied
together once for the 16 and their keys scored once (one position at a time read its whole window
again: sliding:3072 over 4,096 SmolLM2 tokens took twice causal's time). ``keep(layer, pos, k, v)``
checks the order, stores this position and, when its ring row still holds position ``pos - window``
(which leaves the window now), first hands that row to ``leave_window``: a no-op here, where a
memory with an older tier (staging, buckets, quantised groups) takes the token. ``kept_span``
(window.pxd) says which positions the sinks and the window hold after a step; ``take_sinks`` and
``take_window`` append a head's rows for them in ascending position order.

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

from pyllama.attention.base cimport Attention, threads_for
from pyllama.attention.gather cimport BLOCK_QUERIES, GatherAttention
from pyllama.attention.head cimport GGML_LANES, attend_head_window
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

    def window_bytes(self, config, rows, counters, n_shifted, score_rows=0, blocks=False):
        """What ``init_window`` allocates for these arguments, and ``init_window_blocks`` if blocks (Python
        integers: no overflow)."""
        S, W, L, kv = int(self.sinks), int(self.window), config.n_layers, config.kv_dim
        shift = n_shifted * kv * 4 + 2 * max(config.n_rot // 2, 1) * 4 if n_shifted > 0 else 0
        windows = L * 8  # model_window: each layer's own window, int64
        spans = 2 * config.n_kv_heads * (S + W + BLOCK_QUERIES) * config.head_dim * 4 if blocks else 0
        return gather_bytes(config, rows, counters, score_rows) + 2 * L * (S + W) * kv * 4 + shift + windows + spans

    def held_exact(self):
        """Per layer, the positions the sinks and the window hold now within the model's window (int64)."""
        t = self._counts[0]
        sinks = np.minimum(t, self.sinks)
        ring = np.minimum(np.maximum(t - self.sinks, 0), self.window)
        W = np.asarray(getattr(self.config, "layer_windows", ()) or (0,) * len(t), dtype=np.int64)
        hidden = np.where(W > 0, np.maximum(t - W, 0), 0)  # positions 0 .. t - W - 1 are out of the model's window
        ring_start = t - ring
        return np.maximum(sinks - hidden, 0) + ring - np.clip(hidden - ring_start, 0, ring)

    def memory_bytes(self):
        # keys and values of the sink and window rows in use, summed over the layers (a memory that keeps
        # more, lattice's and tiered's summaries, counts them in its own)
        if self._counts is None:
            return 0
        return int(2 * int(self.held_exact().sum()) * self.kv_dim * 4)

    def held_positions(self, int layer):
        """The sink and window positions held after the last call (the same for every KV head)."""
        t = int(self._counts[0][layer]) if self._counts is not None else 0
        if t == 0:
            return [np.zeros(0, dtype=np.int64) for _ in range(self.n_kv_heads)]
        cdef long long first, n_sink, start, n_ring
        self.visible_span(layer, t - 1, &first, &n_sink, &start, &n_ring)
        held = np.concatenate([np.arange(first, n_sink), np.arange(start, start + n_ring)]).astype(np.int64)
        return [held.copy() for _ in range(self.n_kv_heads)]

    def start_from(self, int layer, keys, values, queries=None, queries_pre_rope=None):
        """The state after positions 0 .. T - 1 of a fresh ``layer``, T at most ``exact_prefix`` (0 here:
        a subclass that keeps nothing but its rows over its prefix declares it), from a recorded causal
        run: those positions' rows kept, as attending them would keep them. The queries are not read."""
        self.keep_recorded(layer, keys, values)

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
        self.span_rows = NULL
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

    cdef int attend_held_block(self, int layer, long long pos, Py_ssize_t n, float* q, float* k, float* v,
                               float* out) except -1 nogil:
        """Keep and attend positions pos .. pos + n - 1 as causal does a block if the sinks and the window
        hold every position up to the block's last (no ring row overwritten, none hidden by the model's
        window): each head's queries together over its layer's rows 0 .., which are then positions 0 ..
        (``attend_prefix``). Otherwise ``attend_window_block``. The scores scratch must hold BLOCK_QUERIES
        rows of sinks + window + BLOCK_QUERIES (init_window's score_rows)."""
        cdef Py_ssize_t i, off
        cdef int h, hd = self.head_dim
        cdef long long model_window = self.model_window[layer]
        if pos + n > self.layer_rows or (model_window > 0 and pos + n > model_window):
            return self.attend_window_block(layer, pos, n, q, k, v, out)
        for i in range(n):
            self.keep(layer, pos + i, k + i * self.kv_dim, v + i * self.kv_dim)  # position t in row t
        for h in prange(self.n_heads, schedule="static",
                        num_threads=threads_for(self.n_threads, (pos + n) * n * self.n_heads * hd)):
            off = self.layer_at(layer) + (h // self.kv_mul) * hd
            self.attend_prefix(h, q, self.sink_k + off, self.sink_v + off, self.kv_dim, pos, n, out)
        return 0

    cdef int init_window_blocks(self) except -1:
        """The scratch of ``attend_window_block`` (``window_bytes(..., blocks=True)``): without it a block
        that is not held whole runs one position at a time."""
        self.span_rows = <float*>self.own(np.zeros((self.n_kv_heads, 2, self.layer_rows + BLOCK_QUERIES,
                                                    self.head_dim), dtype=np.float32))
        return 0

    cdef int attend_window_block(self, int layer, long long pos, Py_ssize_t n, float* q, float* k, float* v,
                                 float* out) except -1 nogil:
        """Keep and attend positions pos .. pos + n - 1, BLOCK_QUERIES at a time. Where every query of a
        chunk sees the same sink rows and a window of the same length, one position further on for each
        (past the first eviction), each KV head's rows for the chunk are copied together into span_rows
        (its sinks; the window of the chunk's first query up to the position before the chunk, from the
        ring; the chunk's own keys and values), its query heads attend the chunk's queries over them
        (``attend_head_window``: the keys scored once for the chunk, each query's softmax and sum as one
        position's), and then the chunk's positions are kept. Any other chunk (the window still filling,
        sinks leaving a model's window), and every chunk without ``init_window_blocks``, runs one
        position at a time (the base's attend_block_c)."""
        cdef Py_ssize_t c0 = 0, m, j, q_dim = self.n_heads * self.head_dim, kv = self.kv_dim
        cdef Py_ssize_t cap = self.layer_rows + BLOCK_QUERIES, hd = self.head_dim, at = self.layer_at(layer)
        cdef long long p0, f0, s0, w0, r0, f1, s1, w1, r1, fixed, t, ring_row
        cdef int g, h, threads
        cdef float* keys
        cdef float* values
        while c0 < n:
            m = min(<Py_ssize_t>BLOCK_QUERIES, n - c0)
            p0 = pos + c0
            self.visible_span(layer, p0, &f0, &s0, &w0, &r0)
            self.visible_span(layer, p0 + m - 1, &f1, &s1, &w1, &r1)
            if self.span_rows == NULL or f0 != f1 or s0 != s1 or r0 != r1 or w1 != w0 + m - 1:
                Attention.attend_block_c(self, layer, p0, m, q + c0 * q_dim, k + c0 * kv, v + c0 * kv,
                                         out + c0 * q_dim)
                c0 += m
                continue
            fixed = s0 - f0
            threads = threads_for(self.n_threads, (fixed + r0) * m * self.n_heads * hd)
            for g in prange(self.n_kv_heads, schedule="static", num_threads=threads):
                keys = self.span_rows + 2 * g * cap * hd
                values = keys + cap * hd
                for t in range(fixed):  # sink positions f0 .. s0 - 1
                    memcpy(keys + t * hd, self.sink_k + at + (f0 + t) * kv + g * hd, hd * sizeof(float))
                    memcpy(values + t * hd, self.sink_v + at + (f0 + t) * kv + g * hd, hd * sizeof(float))
                for t in range(r0 - 1):  # positions w0 .. p0 - 1, from their ring rows
                    ring_row = (w0 + t - self.sinks) % self.window
                    memcpy(keys + (fixed + t) * hd, self.ring_k + at + ring_row * kv + g * hd, hd * sizeof(float))
                    memcpy(values + (fixed + t) * hd, self.ring_v + at + ring_row * kv + g * hd, hd * sizeof(float))
                for t in range(m):  # the chunk's own positions, from the block
                    memcpy(keys + (fixed + r0 - 1 + t) * hd, k + (c0 + t) * kv + g * hd, hd * sizeof(float))
                    memcpy(values + (fixed + r0 - 1 + t) * hd, v + (c0 + t) * kv + g * hd, hd * sizeof(float))
            for h in prange(self.n_heads, schedule="static", num_threads=threads):
                keys = self.span_rows + 2 * (h // self.kv_mul) * cap * hd
                attend_head_window(q + c0 * q_dim + h * hd, q_dim, keys, keys + cap * hd, hd, fixed, r0, m, hd,
                                   self.scores + h * self.score_rows, self.score_rows // BLOCK_QUERIES,
                                   out + c0 * q_dim + h * hd, q_dim, self.arithmetic,
                                   self.lanes + h * GGML_LANES * hd, self.kptr + h * self.rows,
                                   self.vptr + h * self.rows)
            for j in range(m):
                self.keep(layer, p0 + j, k + (c0 + j) * kv, v + (c0 + j) * kv)
            c0 += m
        return 0

    cdef int attend_kept(self, int layer, const float* q, const float* sink_keys, long long first, long long n_sink,
                         long long ring_start, long long n_ring, float* out) except -1 nogil:
        """Each query head over sink positions first .. n_sink - 1 and the window ring_start .. (n_ring),
        in ascending order, with the shared routine; sink_keys: the layer's sink keys, moved or not."""
        cdef long long n = n_sink - first + n_ring
        cdef int h, hd = self.head_dim
        cdef int threads = threads_for(self.n_threads, n * self.n_heads * hd)
        for h in prange(self.n_heads, schedule="static", num_threads=threads):
            self.take_kept(h, layer, sink_keys, first, n_sink, ring_start, n_ring, (h // self.kv_mul) * hd)
            self.attend_gathered(h, q, NULL, n, out)
        return 0

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
