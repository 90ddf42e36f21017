"""``quest``: each query attends the pages of keys whose upper bound on its scores is highest.

Quest (Tang et al. 2024, "Quest: Query-Aware Sparsity for Efficient Long-Context LLM Inference",
arXiv 2406.10774; KVCache-Factory's ``Quest``, no kvpress press). The cache keeps every position
(``pyllama.attention.dense``) and, per layer, pages of ``page`` positions (16i .. 16i + 15) with the
per-channel minimum m and maximum M of their keys. For query t and a page, ``sum_i max(q_i M_i, q_i
m_i)`` bounds q.k over the page's keys from above; a KV head's bound is the mean over its query
group (float64 throughout). With P = capacity // page pages allowed, a query whose sequence spans
at most P pages attends everything; otherwise its own (last, partial) page plus the P - 1 other
pages of highest bound, the older page dropped first among equal bounds, with the shared routine
in ascending position order. Every query head of a KV head attends the same pages.

As the paper, the first ``dense_layers`` layers attend every position, and so does the context:
Quest prefills densely and selects while decoding. Here the context ends at the compression event
(``compress(pos)``, after the prompt in ``generate``, a probe's haystack in a diff): positions up
to it are attended densely, and a run without an event selects nothing (the class says so with
``compresses_at_event``). ``dense_context=false`` selects from the first position on, as the
paper's perplexity runs do.

It saves compute, not memory (``holds = "everything"``): the float32 K/V cache stays, and the ledger
adds the page bounds (two float32 rows per page). A capacity that covers the sequence is ``causal``
bit for bit.
"""

from cython.parallel cimport prange
from libc.stdint cimport uint8_t
from libc.string cimport memcpy

import numpy as np

from pyllama.attention.base cimport threads_for
from pyllama.attention.dense cimport DenseAttention
from pyllama.attention.gather cimport BLOCK_QUERIES

from pyllama.attention.dense import POSITIONS
from pyllama.attention.memory import require_memory
from pyllama.attention.spec import REQUIRED, Knob, check_knobs
from pyllama.errors import PluginError


cdef struct PageScore:
    double score
    long long page


cdef inline bint ranks_above(double score, long long page, const PageScore* other) noexcept nogil:
    # a higher bound ranks above; among equal bounds the newer page (the older one is dropped first)
    return score > other.score or (score == other.score and page > other.page)


cdef inline long long keep_best(PageScore* best, long long n, long long k, double score, long long page) noexcept nogil:
    """Offer a page to best[0 .. n - 1], the (at most k) best so far in ascending rank; returns the new n.
    Insertion into a short sorted list: no allocation (qsort may allocate), O(pages x k) per query."""
    cdef long long i
    if n == k:
        if k == 0 or not ranks_above(score, page, &best[0]):
            return n
        for i in range(n - 1):  # drop the lowest
            best[i] = best[i + 1]
        n = n - 1
    i = n
    while i > 0 and not ranks_above(score, page, &best[i - 1]):
        best[i] = best[i - 1]
        i = i - 1
    best[i].score = score
    best[i].page = page
    return n + 1


cdef class Quest(DenseAttention):
    name = "quest"
    description = ("Quest: each query attends its own page and the pages (16 positions) of highest key bound, "
                   "up to capacity positions; saves compute, not memory (keeps the full K/V)")
    knobs = (
        Knob("capacity", int, REQUIRED, "positions a query attends: its own page and whole pages of highest bound",
             min=1),
        Knob("page", int, 16, "positions per page", min=1),
        Knob("dense_layers", int, 2, "the first layers attend every position", min=0),
        Knob("dense_context", bool, True, "attend every position up to the compression event (the dense prefill); "
             "false: select pages from the first position"),
        POSITIONS,
    )
    holds = "everything"
    compresses_at_event = True  # with the default dense_context; an instance with dense_context=false is not

    cdef dict __dict__           # compresses_at_event per instance
    cdef float* pmin             # [n_layers, n_pages, kv_dim] per-channel key minima of each page
    cdef float* pmax             # [n_layers, n_pages, kv_dim] maxima
    cdef PageScore* ranked       # [n_kv_heads, allowed] this step's best pages, ascending
    cdef uint8_t* chosen         # [n_kv_heads, n_pages] the pages the last sparse step attended
    cdef readonly long long capacity, page, dense_layers, context_end
    cdef readonly bint dense_context
    cdef long long n_pages, allowed
    cdef long long last_pos
    cdef bint last_dense

    def __init__(self, capacity: int, page: int = 16, dense_layers: int = 2, dense_context: bool = True,
                 positions: int = 0):
        check_knobs(self, capacity=capacity, page=page, dense_layers=dense_layers, dense_context=dense_context,
                    positions=positions)
        if capacity < page:
            raise PluginError(f"quest: capacity={capacity} is smaller than a page ({page} positions): a query "
                              f"attends at least its own page; give capacity >= {page}")
        self.capacity = capacity
        self.page = page
        self.allowed = capacity // page
        self.dense_layers = dense_layers
        self.dense_context = dense_context
        self.compresses_at_event = dense_context
        self.positions = positions
        self.context_end = -1
        if positions > 0:
            self.max_positions = positions

    def planned_bytes(self, config):
        """What init allocates (Python integers: no overflow for any knob value)."""
        P, L, kv, KVH = int(self.max_positions), config.n_layers, config.kv_dim, config.n_kv_heads
        NP = -(-P // int(self.page))
        rows = min(int(self.allowed) * int(self.page), P)
        return (self.dense_bytes(config, rows, 1, BLOCK_QUERIES * P) + 2 * L * NP * kv * 4
                + KVH * (int(self.allowed) * sizeof(PageScore) + NP))

    def init(self, config, pool):
        require_memory("quest", f"positions={int(self.max_positions):,}", self.planned_bytes(config))
        cdef long long P = self.max_positions
        self.n_pages = (P + self.page - 1) // self.page
        self.init_dense(config, min(self.allowed * self.page, P), 1, BLOCK_QUERIES * P)
        L, kv, KVH = config.n_layers, config.kv_dim, config.n_kv_heads
        self.pmin = <float*>self.own(np.zeros((L, self.n_pages, kv), dtype=np.float32))
        self.pmax = <float*>self.own(np.zeros((L, self.n_pages, kv), dtype=np.float32))
        self.ranked = <PageScore*>self.own(np.zeros(KVH * self.allowed * sizeof(PageScore), dtype=np.uint8))
        self.chosen = <uint8_t*>self.own(np.zeros((KVH, self.n_pages), dtype=np.uint8))
        self.context_end = -1
        self.last_pos = -1

    def reset(self):
        DenseAttention.reset(self)
        self.context_end = -1
        self.last_pos = -1

    def scalar_state(self):
        return self.context_end, self.last_pos, self.last_dense

    def set_scalar_state(self, state):
        self.context_end, self.last_pos, self.last_dense = state

    def compress(self, long long pos):
        """The context ended after ``pos``: from pos + 1 on, the queries select pages (dense_context)."""
        if self.context_end < 0:
            self.context_end = pos

    def memory_bytes(self):
        # the full K/V cache and the bounds (minima and maxima) of every page begun, summed over the layers
        if self._counts is None:
            return 0
        total = 0
        for layer in range(self.n_layers):
            n = int(self._counts[0, layer])
            total += (2 * n + 2 * (-(-n // self.page))) * self.kv_dim * 4
        return total

    def held_positions(self, int layer):
        """Every position seen, for each KV head (quest keeps everything and selects per query)."""
        if self._counts is None:
            return None
        held = np.arange(int(self._counts[0, layer]), dtype=np.int64)
        return [held.copy() for _ in range(self.n_kv_heads)]

    def attended(self, int kv_head):
        """The positions the last query (the last position of the last call) of ``kv_head`` attended."""
        if not 0 <= kv_head < self.n_kv_heads:
            raise IndexError(f"quest: KV head {kv_head} out of range")
        if self.last_pos < 0:
            return np.zeros(0, dtype=np.int64)
        if self.last_dense:
            return np.arange(self.last_pos + 1, dtype=np.int64)
        own = self.last_pos // self.page
        pages = [p for p in range(own) if self.chosen[kv_head * self.n_pages + p]]
        runs = [np.arange(p * self.page, (p + 1) * self.page) for p in pages]
        return np.concatenate([*runs, np.arange(own * self.page, self.last_pos + 1)]).astype(np.int64)

    cdef bint is_dense(self, int layer, long long pos) noexcept nogil:
        return (layer < self.dense_layers or pos // self.page + 1 <= self.allowed
                or (self.dense_context and (self.context_end < 0 or pos <= self.context_end)))

    cdef int store(self, int layer, long long pos, const float* k, const float* v) except -1 nogil:
        """Keep position pos and fold its key into its page's bounds."""
        self.keep(layer, pos, k, v)
        cdef Py_ssize_t i, kv = self.kv_dim, at = (layer * self.n_pages + pos // self.page) * kv
        cdef float* lo = self.pmin + at
        cdef float* hi = self.pmax + at
        if pos % self.page == 0:
            memcpy(lo, k, kv * sizeof(float))
            memcpy(hi, k, kv * sizeof(float))
            return 0
        for i in range(kv):
            if k[i] < lo[i]:
                lo[i] = k[i]
            if k[i] > hi[i]:
                hi[i] = k[i]
        return 0

    cdef void select_pages(self, int layer, int g, const float* q, long long own) noexcept nogil:
        """Mark in chosen[g] the allowed - 1 pages before page ``own`` of highest bound for KV head g."""
        cdef PageScore* best = self.ranked + g * self.allowed
        cdef uint8_t* mark = self.chosen + g * self.n_pages
        cdef Py_ssize_t i, kv = self.kv_dim, hd = self.head_dim, off = g * self.head_dim
        cdef const float* lo
        cdef const float* hi
        cdef const float* qh
        cdef double total, bound, a, b
        cdef long long p, n = 0
        cdef int h
        for p in range(own):
            lo = self.pmin + (layer * self.n_pages + p) * kv + off
            hi = self.pmax + (layer * self.n_pages + p) * kv + off
            total = 0.0
            for h in range(g * self.kv_mul, (g + 1) * self.kv_mul):
                qh = q + h * hd
                bound = 0.0
                for i in range(hd):
                    a = <double>qh[i] * <double>hi[i]
                    b = <double>qh[i] * <double>lo[i]
                    bound = bound + (a if a > b else b)
                total = bound if h == g * self.kv_mul else total + bound
            n = keep_best(best, n, self.allowed - 1, total / self.kv_mul, p)
            mark[p] = 0
        for p in range(n):
            mark[best[p].page] = 1

    cdef void attend_one(self, int layer, long long pos, const float* q, float* out) noexcept nogil:
        cdef int h, g
        cdef long long own = pos // self.page, p, j
        cdef Py_ssize_t off, hd = self.head_dim, row = layer * self.positions * self.row_floats
        cdef const float** kp
        cdef const float** vp
        self.last_pos = pos
        self.last_dense = self.is_dense(layer, pos)
        if self.last_dense:
            for h in prange(self.n_heads, schedule="static",
                            num_threads=threads_for(self.n_threads, (pos + 1) * self.n_heads * hd)):
                off = row + (h // self.kv_mul) * hd
                self.attend_prefix(h, q, self.keys + off, self.values + off, self.row_floats, pos, 1, out)
            return
        for g in prange(self.n_kv_heads, schedule="static",
                        num_threads=threads_for(self.n_threads, own * self.n_heads * hd)):
            self.select_pages(layer, g, q, own)
        for h in prange(self.n_heads, schedule="static",
                        num_threads=threads_for(self.n_threads, self.rows * self.n_heads * hd)):
            g = h // self.kv_mul
            kp = self.kptr + h * self.rows
            vp = self.vptr + h * self.rows
            j = 0
            for p in range(own):
                if self.chosen[g * self.n_pages + p]:
                    j = self.take_positions(kp, vp, NULL, j, layer, p * self.page, self.page, g * hd)
            j = self.take_positions(kp, vp, NULL, j, layer, own * self.page, pos - own * self.page + 1, g * hd)
            self.attend_gathered(h, q, NULL, j, out)

    cdef int attend_c(self, int layer, long long pos, float* q, float* k, float* v, float* out) except -1 nogil:
        self.store(layer, pos, k, v)
        self.attend_one(layer, pos, q, out)
        return 0

    cdef int attend_block_c(self, int layer, long long pos, Py_ssize_t n, float* q, float* k, float* v,
                            float* out) except -1 nogil:
        cdef Py_ssize_t i, off, q_dim = self.n_heads * self.head_dim
        cdef int h, hd = self.head_dim
        for i in range(n):
            self.store(layer, pos + i, k + i * self.kv_dim, v + i * self.kv_dim)
        if not self.is_dense(layer, pos + n - 1):  # dense positions come first: one at a time from here
            for i in range(n):
                self.attend_one(layer, pos + i, q + i * q_dim, out + i * q_dim)
            return 0
        self.last_pos = pos + n - 1
        self.last_dense = True
        for h in prange(self.n_heads, schedule="static",
                        num_threads=threads_for(self.n_threads, (pos + n) * n * self.n_heads * hd)):
            off = layer * self.positions * self.row_floats + (h // self.kv_mul) * hd
            self.attend_prefix(h, q, self.keys + off, self.values + off, self.row_floats, pos, n, out)
        return 0
