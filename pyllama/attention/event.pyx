"""The base of the KV-cache methods that compress at the event: SnapKV, PyramidKV, AdaKV, KNorm,
KeyDiff, Expected Attention, random (docs/methods.md).

Until a compression they attend exactly: every position is appended to the row store
(``pyllama.attention.rows``) and attended with the shared routine, so their bits are ``causal``'s.
A block of positions is attended at once (``attend_head_rows``, up to ``QUERIES`` queries per call)
as long as no compression falls inside it. The driver's ``compress(pos)`` (after every layer attended
pos, before pos + 1: kvpress's query-agnostic protocol) compresses every layer; with ``every=N`` a
layer compresses again by itself after pos + N, pos + 2N, ... (inside ``attend``, the block split
there, so that blocks stay exact). Without an event they never compress.

A compression of layer l after position t: ``prepare`` (what the method computes once), then per KV
head in parallel ``event_scores``, a float64 score per held row; then the selection: per KV head
(``mark_lowest``: the protected rows, the first ``sinks`` positions and the ``window`` most recent,
plus the candidates ranked highest by (score, position), ``event_target(n)`` rows in all, by default
``n - floor(ratio n + 1e-9)`` or ``min(n, capacity)``), or, when ``alpha >= 0`` (``adakv`` wrapping
the method), across the layer's KV heads (``select_across``). A method also sees every position it
appends (``observe``: its post-RoPE queries and, for a class that declares
``wants_pre_rope_query``, the queries before RoPE).

Compress once, branch many. ``start_from(layer, keys, values, queries, queries_pre_rope)`` builds,
from a recorded causal run of positions 0 .. T - 1, exactly the state the method has after attending
them (the rows copied, ``observe`` called position by position in order, so that accumulated
statistics are the same bits); then ``compress(T - 1)`` and the rest of the run give what running
from position 0 gives, bit for bit.
"""

from cython.parallel cimport prange
from libc.math cimport floor

from pyllama.attention.base cimport threads_for
from pyllama.attention.rows cimport QUERIES, Ranked, kept_of, mark_lowest, sort_ranked

import numpy as np

from pyllama.attention.budget import CAPACITY, EVERY, RATIO, sinks_knob, window_knob
from pyllama.attention.dense import POSITIONS
from pyllama.attention.memory import require_memory
from pyllama.attention.spec import check_knobs
from pyllama.errors import PositionError

# the knobs of the base's constructor: a method whose score takes no knob of its own (knorm, keydiff)
EVENT_KNOBS = (RATIO, CAPACITY, window_knob(0), sinks_knob(0), EVERY, POSITIONS)


cdef class EventAttention(RowStore):
    """Base of the methods that compress at the event (see the module docstring)."""

    compresses_at_event = True

    def __cinit__(self, *args, **kwargs):
        self.alpha = -1.0

    def __init__(self, ratio: float = 0.5, capacity: int = 0, window: int = 0, sinks: int = 0, every: int = 0,
                 positions: int = 0):
        check_knobs(self, ratio=ratio, capacity=capacity, window=window, sinks=sinks, every=every,
                    positions=positions)
        self.set_event_budget(ratio, capacity, window, sinks, every, positions)

    def scratch_per_head(self, config):
        """The scorer's float64 scratch per KV head (``work``), in doubles: none unless a method says."""
        return 0

    def planned_bytes(self, config):
        return self.event_bytes(config, self.scratch_per_head(config))

    def init(self, config, pool):
        require_memory(type(self).name, f"positions={int(self.max_positions):,}", self.planned_bytes(config))
        self.init_event(config, self.scratch_per_head(config))

    def set_event_budget(self, ratio, capacity, window, sinks, every, positions):
        self.set_budget(ratio, capacity, window, sinks, positions)
        self.every = every

    def event_bytes(self, config, work_size):
        """What init_event allocates (Python integers)."""
        return self.rows_bytes(config, 0, 2, QUERIES * int(self.max_positions),
                               config.n_kv_heads * int(work_size) * 8)

    cdef int init_event(self, config, Py_ssize_t work_size) except -1:
        """init_rows with a row of scores per query of a block, two counters per layer and the scorer's
        float64 scratch of work_size per KV head."""
        self.init_rows(config, 0, 2, QUERIES * self.max_positions)
        self.due = self.extra
        self.events = self.extra + self.n_layers
        self.work_size = max(work_size, 1)
        self.work = <double*>self.own(np.zeros((config.n_kv_heads, self.work_size), dtype=np.float64))
        return 0

    # ---- attending ---------------------------------------------------------------------------------
    cdef int attend_c(self, int layer, long long pos, float* q, float* k, float* v, float* out) except -1 nogil:
        self.append(layer, pos, k, v)
        self.observe(layer, pos, q, self.pre_rope_query(q))
        self.attend_rows(layer, q, out, 1)
        if self.due[layer] == pos + 1:
            self.compress_layer(layer, pos)
            self.due[layer] += self.every
        return 0

    cdef int attend_block_c(self, int layer, long long pos, Py_ssize_t n, float* q, float* k, float* v,
                            float* out) except -1 nogil:
        cdef Py_ssize_t i = 0, j, m, q_dim = self.n_heads * self.head_dim, kv_dim = self.kv_dim
        cdef long long due
        while i < n:
            m = n - i
            due = self.due[layer] - 1  # the block ends at a compression, the rest follows it
            if pos + i <= due < pos + n:
                m = due - (pos + i) + 1
            for j in range(i, i + m):
                self.append(layer, pos + j, k + j * kv_dim, v + j * kv_dim)
                self.observe(layer, pos + j, q + j * q_dim, self.pre_rope_query(q + j * q_dim))
            self.attend_rows(layer, q + i * q_dim, out + i * q_dim, m)
            if self.due[layer] == pos + i + m:
                self.compress_layer(layer, pos + i + m - 1)
                self.due[layer] += self.every
            i += m
        return 0

    # ---- compressing -------------------------------------------------------------------------------
    def compress(self, long long pos):
        """The context ended after position ``pos``: compress every layer now (and, with ``every``,
        again after every ``every`` new positions). A layer that has attended nothing is one the
        method does not govern (a model's local layers, ``attention/layers.pyx``): it holds no row,
        and nothing is compressed there; at least one layer must have attended up to ``pos``."""
        if self._counts is None:
            return
        cdef int layer
        cdef bint any_attended = False
        for layer in range(self.n_layers):
            if self.length[layer] != pos + 1 and self.length[layer] != 0:
                raise PositionError(
                    f"{type(self).name}: compress({pos}) but layer {layer} has attended {self.length[layer]} "
                    "positions (the event comes after position pos has attended, before pos + 1)")
            any_attended = any_attended or self.length[layer] == pos + 1
        if not any_attended:
            raise PositionError(
                f"{type(self).name}: compress({pos}) but no layer has attended position {pos} "
                "(the event comes after position pos has attended, before pos + 1)")
        with nogil:
            for layer in range(self.n_layers):
                self.compress_layer(layer, pos)
                self.due[layer] = pos + 1 + self.every if self.every > 0 else 0

    cdef int compress_layer(self, int layer, long long pos) except -1 nogil:
        """Score every KV head of layer after position pos and keep what the selection keeps."""
        cdef int g
        cdef long long n, rows = 0, kept = 0
        cdef Py_ssize_t P = self.P
        for g in range(self.n_kv_heads):
            n = self.rows_held(layer, g)[0]
            rows += n
            kept += kept_of(n, self.ratio, self.capacity) if self.alpha >= 0 else self.event_target(layer, n)
        if kept < rows:  # else nothing would go (ratio 0, fewer rows than the capacity): nothing to score
            self.prepare(layer, pos)
            for g in prange(self.n_kv_heads, schedule="dynamic",
                            num_threads=threads_for(self.n_threads, rows * 4096)):
                self.event_scores(layer, pos, g, self.rows_held(layer, g)[0], self.score + g * P)
            if self.alpha >= 0:
                self.select_across(layer, pos)
            else:
                for g in prange(self.n_kv_heads, schedule="static", num_threads=threads_for(self.n_threads, rows * 64)):
                    n = self.rows_held(layer, g)[0]
                    if mark_lowest(self.score + g * P, self.held + self.row_of(layer, g), n, pos, self.sinks,
                                   self.window, self.event_target(layer, n), self.ranked + g * P, self.evict + g * P):
                        self.remove_marked(layer, g, self.evict + g * P)
        self.events[layer] += 1  # the scorers read the index of this compression (random's draws)
        return 0

    cdef void select_across(self, int layer, long long pos) noexcept nogil:
        """AdaKV's selection: the layer keeps the sum over its KV heads of their targets. Each KV head first
        keeps its protected rows and its best up to floor(alpha x target) (protected counted); every other
        (head, row) competes in one ranking by (score, position, head), the lowest evicted."""
        cdef int g
        cdef long long n, target, r, rows = 0, kept = 0, pooled = 0, n_evict
        cdef Py_ssize_t P = self.P, at
        cdef Ranked* ranked = self.ranked
        for g in range(self.n_kv_heads):  # the floor: flags the rows outside it (evict), each head alone
            at = g * P
            n = self.rows_held(layer, g)[0]
            target = kept_of(n, self.ratio, self.capacity)
            rows += n
            kept += target
            mark_lowest(self.score + at, self.held + self.row_of(layer, g), n, pos, self.sinks, self.window,
                        <long long>floor(self.alpha * target + 1e-9), self.ranked + at, self.evict + at)
        for g in range(self.n_kv_heads):  # the rows outside the floors, pooled across heads
            at = g * P
            for r in range(self.rows_held(layer, g)[0]):
                if self.evict[at + r]:
                    ranked[pooled].score = self.score[at + r]
                    ranked[pooled].position = self.held[self.row_of(layer, g) + r]
                    ranked[pooled].head = g
                    ranked[pooled].row = r
                    pooled += 1
                    self.evict[at + r] = 0
        n_evict = min(max(rows - kept, 0), pooled)
        sort_ranked(ranked, pooled)
        for r in range(n_evict):
            self.evict[ranked[r].head * P + ranked[r].row] = 1
        for g in range(self.n_kv_heads):
            self.remove_marked(layer, g, self.evict + g * P)

    # ---- the method's part (defaults) --------------------------------------------------------------
    cdef int observe(self, int layer, long long pos, const float* q, const float* q_pre) except -1 nogil:
        return 0

    cdef int prepare(self, int layer, long long pos) except -1 nogil:
        return 0

    cdef void event_scores(self, int layer, long long pos, int g, long long n, double* score) noexcept nogil:
        pass

    cdef long long event_target(self, int layer, long long n) noexcept nogil:
        return kept_of(n, self.ratio, self.capacity)

    # ---- compress once, branch many ----------------------------------------------------------------
    def start_from(self, int layer, keys, values, queries=None, queries_pre_rope=None):
        """The state after positions 0 .. T - 1 of ``layer`` attended exactly, from a recorded causal run:
        ``keys``, ``values`` float32[T, kv_dim] (post-RoPE keys), ``queries``, ``queries_pre_rope``
        float32[T, q_dim] (None where the method does not read them). The layer must be fresh (after
        ``reset``). Call it for every layer, then ``compress(T - 1)``."""
        keys, values = self.recorded_rows(layer, keys, values)
        cfg = self.config
        cdef const float[:, ::1] kv = keys
        cdef const float[:, ::1] vv = values
        cdef const float[:, ::1] qv = None if queries is None else np.ascontiguousarray(queries, dtype=np.float32)
        pre = None if queries_pre_rope is None else np.ascontiguousarray(queries_pre_rope, dtype=np.float32)
        cdef const float[:, ::1] pv = pre
        cdef Py_ssize_t T = kv.shape[0], t
        cdef bint has_q = qv is not None, has_pre = pv is not None
        if (has_q and (qv.shape[0] != T or qv.shape[1] != cfg.q_dim)) or (
                has_pre and (pv.shape[0] != T or pv.shape[1] != cfg.q_dim)):
            raise ValueError(f"{type(self).name}: start_from: queries [T, {cfg.q_dim}] beside keys [T, {cfg.kv_dim}]")
        with nogil:
            for t in range(T):
                self.append(layer, t, &kv[t, 0], &vv[t, 0])
                self.observe(layer, t, &qv[t, 0] if has_q else NULL, &pv[t, 0] if has_pre else NULL)
