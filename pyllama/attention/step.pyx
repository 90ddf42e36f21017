"""The base of the KV-cache methods that evict every step: H2O, TOVA, Scissorhands (docs/methods.md).

At position t the row store (``pyllama.attention.rows``) appends t to every KV head, each query head
attends its KV head's rows with the shared routine, and the method scores the rows from the softmax
weights the routine leaves in its scores scratch (``step_scores``: query head h's weight on row r is
``scores[h * score_rows + r]``; nothing is computed again). The base then evicts down to the target
after t: ``ceil((1 - ratio)(t + 1))`` rows (``n - floor(ratio n + 1e-9)``, n = t + 1) or
``min(t + 1, capacity)``, never a sink or a window position, the lowest (score, position) first
(``mark_lowest``), per KV head (in parallel: heads are independent) or, for a method that keeps one
set per layer (``one_set``: TOVA), once for the layer, the same rows leaving every KV head. From
position 0 on, so a compression event finds them compressed already; ``compress`` does nothing.

With ``capacity`` the memory is flat: a KV head holds at most capacity + 1 rows (the one appended
before the eviction), so these methods run past the model's context (``max_positions`` unbounded)
unless ``positions`` sizes them. Blocks of positions run position by position (the base's
``attend_block_c``): each position evicts before the next attends. A method computes what it derives
from the float32 weights in float64 (``head_mean``: the mean over a KV head's query group, the heads
in ascending order).
"""

from cython.parallel cimport prange

from pyllama.attention.base cimport threads_for
from pyllama.attention.rows cimport kept_of, mark_lowest

from pyllama.attention.base import UNBOUNDED


cdef class StepAttention(RowStore):
    """Base of the methods that evict every step (see the module docstring)."""

    def set_step_budget(self, ratio, capacity, window, sinks, positions):
        """set_budget; with a capacity and no ``positions``, the memory is flat and runs past the context."""
        self.set_budget(ratio, capacity, window, sinks, positions)
        if capacity > 0 and positions == 0:
            self.max_positions = UNBOUNDED

    def rows_per_head(self):
        if self.capacity > 0 and self.positions == 0:
            return int(self.capacity) + 1
        return int(self.max_positions)

    cdef int init_step(self, config, int state_bytes) except -1:
        self.init_rows(config, state_bytes, 0, 0)
        return 0

    cdef int attend_c(self, int layer, long long pos, float* q, float* k, float* v, float* out) except -1 nogil:
        self.append(layer, pos, k, v)
        self.attend_rows(layer, q, out, 1)
        self.evict_step(layer, pos)
        return 0

    cdef int evict_step(self, int layer, long long pos) except -1 nogil:
        """Score the rows of every KV head after position pos attended, and evict down to the target."""
        cdef long long target = kept_of(pos + 1, self.ratio, self.capacity)
        cdef long long window = self.window_at(target), n
        cdef Py_ssize_t P = self.P, at
        cdef int g
        if self.one_set:
            n = self.rows_held(layer, 0)[0]
            self.step_scores(layer, pos, 0, n, self.score)
            if mark_lowest(self.score, self.held + self.row_of(layer, 0), n, pos, self.sinks, window, target,
                           self.ranked, self.evict):
                for g in range(self.n_kv_heads):
                    self.remove_marked(layer, g, self.evict)
            return 0
        n = self.rows_held(layer, 0)[0]  # a KV head's work: its group's weights, a scan, a move of half its rows
        for g in prange(self.n_kv_heads, schedule="static",
                        num_threads=threads_for(self.n_threads, n * self.n_kv_heads * self.head_dim)):
            at = g * P
            self.step_scores(layer, pos, g, self.rows_held(layer, g)[0], self.score + at)
            if mark_lowest(self.score + at, self.held + self.row_of(layer, g), self.rows_held(layer, g)[0], pos,
                           self.sinks, window, target, self.ranked + at, self.evict + at):
                self.remove_marked(layer, g, self.evict + at)
        return 0

    cdef void step_scores(self, int layer, long long pos, int g, long long n, double* score) noexcept nogil:
        pass

    cdef void head_mean(self, int first, int n_heads, long long n, double* out) noexcept nogil:
        """out[r] = the mean of query heads first .. first + n_heads - 1's weights on row r (float64, the
        heads added in ascending order, then divided by their number)."""
        cdef long long r
        cdef int h
        cdef const float* w = self.scores + first * self.score_rows
        for r in range(n):
            out[r] = w[r]
        for h in range(1, n_heads):
            w = self.scores + (first + h) * self.score_rows
            for r in range(n):
                out[r] = out[r] + w[r]
        for r in range(n):
            out[r] = out[r] / n_heads
