"""The per-KV-head row store of the KV-cache methods (h2o, tova, snapkv, ...; docs/methods.md).

Each (layer, KV head) holds its own rows: the sorted positions it keeps and their key and value rows,
compacted in position order, float32 ``[n_layers, n_kv_heads, P, head_dim]`` each, so that a KV head's
rows are contiguous and the shared routine's contiguous form (``attend_head_rows``, head.pyx) reads
them directly. A position is appended to every KV head (``append``); a method evicts per KV head
(``remove_marked`` closes the gaps, keeping the order), so KV heads may hold different numbers of
rows. A method may keep ``state_bytes`` of its own per row (H2O's received attention, Scissorhands'
marks), moved with the row. ``P`` is the most rows one KV head ever holds: the model's context (or
the ``positions`` knob), or ``capacity + 1`` for a method that evicts every step down to a capacity.

A selection (``mark_lowest``) keeps the protected rows (the first ``sinks`` positions and the last
``window``) and the candidates ranked highest by (score, position): among equal scores the older
position goes first, which is what a stable ascending sort of the scores over positions in ascending
order gives when its front is evicted (``tests/kv_methods_reference.py`` ranks with np.lexsort).

The ledger (``memory_bytes``) counts what is held: per row its key and value (head_dim x 4 bytes
each) and its state, plus what a method keeps besides rows (``state_bytes_of``, e.g. SnapKV's
observation queries), summed over the layers, each layer's part its own state's.
``held_positions(layer)`` lists the rows' positions per KV head.
"""

from cython.parallel cimport prange
from libc.stdlib cimport qsort
from libc.string cimport memcpy, memmove, memset

import numpy as np

from pyllama.attention.base cimport threads_for
from pyllama.attention.head cimport GGML_LANES, attend_head_rows

from pyllama.attention.budget import check_budget
from pyllama.attention.memory import gather_bytes


# ---- ranking -------------------------------------------------------------------------------------------
cdef int _cmp_ranked(const void* a, const void* b) noexcept nogil:
    cdef const Ranked* x = <const Ranked*>a
    cdef const Ranked* y = <const Ranked*>b
    if x.score != y.score:
        return -1 if x.score < y.score else 1
    if x.position != y.position:
        return -1 if x.position < y.position else 1
    return (x.head > y.head) - (x.head < y.head)


cdef void sort_ranked(Ranked* ranked, long long n) noexcept nogil:
    """Ascending (score, position, head): the order in which candidates are evicted."""
    qsort(ranked, n, sizeof(Ranked), _cmp_ranked)


cdef long long mark_lowest(const double* score, const long long* held, long long n, long long t, long long sinks,
                           long long window, long long target, Ranked* ranked, unsigned char* evict) noexcept nogil:
    """Flag in ``evict`` the rows a selection after position t removes from these n rows: it keeps the
    protected ones and the max(target - protected, 0) candidates ranked highest by (score, position).
    Returns how many are flagged."""
    cdef long long r, n_protected = 0, n_candidates = 0, n_evict, lowest = -1
    for r in range(n):
        evict[r] = 0
        if is_protected(held[r], t, sinks, window):
            n_protected += 1
    n_candidates = n - n_protected
    n_evict = n_candidates - min(max(target - n_protected, 0), n_candidates)
    if n_evict <= 0:
        return 0
    if n_evict == 1:  # the common step: one scan, the first (older) of equal lowest scores
        for r in range(n):
            if not is_protected(held[r], t, sinks, window) and (lowest < 0 or score[r] < score[lowest]):
                lowest = r
        evict[lowest] = 1
        return 1
    n_candidates = 0
    for r in range(n):
        if not is_protected(held[r], t, sinks, window):
            ranked[n_candidates].score = score[r]
            ranked[n_candidates].position = held[r]
            ranked[n_candidates].head = 0
            ranked[n_candidates].row = r
            n_candidates += 1
    sort_ranked(ranked, n_candidates)
    for r in range(n_evict):
        evict[ranked[r].row] = 1
    return n_evict


# ---- the store -----------------------------------------------------------------------------------------
cdef class RowStore(GatherAttention):
    """Base of the KV-cache methods: rows per KV head (see the module docstring)."""

    def set_budget(self, ratio, capacity, window, sinks, positions):
        """The shared knobs (each checked by the subclass's check_knobs first), their combination checked
        here in one line naming the method and the knob; window -1: half the target (H2O)."""
        check_budget(type(self).name, ratio, capacity, window, sinks)
        self.ratio, self.capacity, self.window, self.sinks, self.positions = ratio, capacity, window, sinks, positions
        if positions > 0:
            self.max_positions = positions

    def rows_per_head(self):
        """P: the context's positions (or ``positions``); a subclass may hold fewer."""
        return int(self.max_positions)

    def rows_bytes(self, config, state_bytes, extra_counters, score_rows, scratch_bytes=0):
        """What ``init_rows`` allocates (Python integers: no overflow for any knob value)."""
        P, kv, L = int(self.rows_per_head()), config.n_kv_heads, config.n_layers
        per_row = 2 * config.head_dim * 4 + 8 + state_bytes  # key, value, position, state
        selection = kv * P * (8 + 32 + 1)  # score, Ranked, flag
        return (gather_bytes(config, 1, 1 + kv + extra_counters, score_rows) + L * kv * P * per_row + selection
                + scratch_bytes)

    cdef int init_rows(self, config, int state_bytes, int extra_counters, long long score_rows) except -1:
        """init_gather (scores scratch of score_rows floats per query head), then the rows and the
        selection scratch; counters: positions seen, rows held per KV head, extra_counters more."""
        self.P = self.rows_per_head()
        self.init_gather(config, 1, 1 + config.n_kv_heads + extra_counters, max(score_rows, self.P))
        L, kv, hd, P = config.n_layers, config.n_kv_heads, config.head_dim, self.P
        self.keys = <float*>self.own(np.zeros((L, kv, P, hd), dtype=np.float32))
        self.values = <float*>self.own(np.zeros((L, kv, P, hd), dtype=np.float32))
        self.held = <long long*>self.own(np.zeros((L, kv, P), dtype=np.int64))
        self.state_bytes = state_bytes
        self.row_state = NULL
        if state_bytes > 0:
            self.row_state = <char*>self.own(np.zeros((L, kv, P, state_bytes), dtype=np.uint8))
        self.score = <double*>self.own(np.zeros((kv, P), dtype=np.float64))
        self.ranked = <Ranked*>self.own(np.zeros((kv, P, sizeof(Ranked)), dtype=np.uint8))
        self.evict = <unsigned char*>self.own(np.zeros((kv, P), dtype=np.uint8))
        self.count = self.length + self.n_layers
        self.extra = self.length + (1 + self.n_kv_heads) * self.n_layers
        return 0

    cdef long long window_at(self, long long target) noexcept nogil:
        """The protected recent window for a selection keeping ``target`` rows (-1: half of it, H2O's split)."""
        return target // 2 if self.window < 0 else self.window

    cdef int append(self, int layer, long long pos, const float* k, const float* v) except -1 nogil:
        """Position pos (in order) appended to every KV head of layer, its row state zeroed."""
        self.check_in_order(layer, pos, self.length[layer])
        cdef int g, hd = self.head_dim
        cdef long long n
        cdef Py_ssize_t row
        for g in range(self.n_kv_heads):
            n = self.rows_held(layer, g)[0]
            if n >= self.P:
                with gil:
                    raise RuntimeError(f"{type(self).name}: layer {layer} KV head {g} holds {n} rows, its most")
            row = self.row_of(layer, g) + n
            memcpy(self.keys + row * hd, k + g * hd, hd * sizeof(float))
            memcpy(self.values + row * hd, v + g * hd, hd * sizeof(float))
            self.held[row] = pos
            if self.state_bytes > 0:
                memset(self.row_state + row * self.state_bytes, 0, self.state_bytes)
            self.rows_held(layer, g)[0] = n + 1
        self.length[layer] = pos + 1
        return 0

    cdef void attend_rows(self, int layer, const float* q, float* out, Py_ssize_t m) noexcept nogil:
        """The last m appended positions' queries (q, out: m rows of q_dim) attend, per query head, their
        KV head's rows up to their own, with the shared routine (``QUERIES`` at a time). For m = 1 the
        scores scratch of head h then holds its softmax weights over the KV head's rows."""
        cdef int h, g, u, h0, count, hd = self.head_dim, q_dim = self.n_heads * self.head_dim
        cdef Py_ssize_t c, j0, off
        cdef long long first, work = self.rows_held(layer, 0)[0] * m * self.n_heads * hd
        cdef int team = threads_for(self.n_threads, work), parts
        if m == 1:  # a step: the heads sharing a KV head together, its rows read once
            parts = self.group_parts(team)
            for u in prange(self.n_kv_heads * parts, schedule="static", num_threads=team):
                g = u // parts
                h0 = self.part_first(u, parts)
                count = self.part_heads(u, parts)
                if count > 0:
                    off = self.row_of(layer, g) * hd
                    self.attend_heads(h0, count, q, self.keys + off, self.values + off, hd,
                                      self.rows_held(layer, g)[0], out)
            return
        for h in prange(self.n_heads, schedule="static", num_threads=team):
            g = h // self.kv_mul
            first = self.rows_held(layer, g)[0] - m + 1  # the rows the block's first query attends
            off = self.row_of(layer, g) * hd
            for c in range((m + QUERIES - 1) // QUERIES):
                j0 = c * QUERIES
                attend_head_rows(q + j0 * q_dim + h * hd, q_dim, self.keys + off, self.values + off, hd, first + j0,
                                 min(<Py_ssize_t>QUERIES, m - j0), hd, self.scores + h * self.score_rows, self.P,
                                 out + j0 * q_dim + h * hd, q_dim, self.arithmetic, self.lanes + h * GGML_LANES * hd)

    cdef long long remove_marked(self, int layer, int g, const unsigned char* flags) noexcept nogil:
        """Drop the rows flagged in ``flags`` from KV head g of layer, closing the gaps in order; the count left."""
        cdef long long n = self.rows_held(layer, g)[0], r = 0, start, kept = 0
        cdef Py_ssize_t base = self.row_of(layer, g), hd = self.head_dim, sb = self.state_bytes
        while r < n:
            if flags[r]:
                r += 1
                continue
            start = r
            while r < n and not flags[r]:
                r += 1
            if start != kept:  # a run of kept rows moves down to where the kept ones end
                memmove(self.keys + (base + kept) * hd, self.keys + (base + start) * hd, (r - start) * hd * 4)
                memmove(self.values + (base + kept) * hd, self.values + (base + start) * hd, (r - start) * hd * 4)
                memmove(self.held + base + kept, self.held + base + start, (r - start) * 8)
                if sb > 0:
                    memmove(self.row_state + (base + kept) * sb, self.row_state + (base + start) * sb,
                            (r - start) * sb)
            kept += r - start
        self.rows_held(layer, g)[0] = kept
        return kept

    cdef long long state_bytes_of(self, int layer):
        """Bytes a method holds for layer besides its rows (0 here)."""
        return 0

    def held_positions(self, int layer):
        """Per KV head of ``layer``, the sorted positions of the rows held (int64 copies)."""
        if self._counts is None or not 0 <= layer < self.n_layers:
            return None
        cdef int g
        out = []
        held = np.asarray(<long long[:self.n_layers * self.n_kv_heads * self.P]>self.held)
        for g in range(self.n_kv_heads):
            start = self.row_of(layer, g)
            out.append(held[start:start + self.rows_held(layer, g)[0]].copy())
        return out

    def rows_held_per_head(self, int layer):
        """Per KV head of ``layer``, the number of rows held."""
        return [int(self.rows_held(layer, g)[0]) for g in range(self.n_kv_heads)]

    def memory_bytes(self):
        # per row its key, value and state, plus each layer's other state (state_bytes_of)
        if self._counts is None:
            return 0
        cdef int layer
        rows = int(self._counts[1:1 + self.n_kv_heads].sum())
        total = rows * (2 * self.head_dim * 4 + self.state_bytes)
        for layer in range(self.n_layers):
            total += self.state_bytes_of(layer)
        return int(total)
