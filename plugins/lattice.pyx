"""``lattice``: sinks + an exact window + a dyadic multi-resolution summary of the rest of the past.

Log-Linear Attention (Guo et al. 2025, arXiv 2506.04761) splits the prefix into a Fenwick-tree
partition: segments whose size doubles with their distance from the query. H-Transformer-1D (Zhu &
Soricut 2021, arXiv 2107.11906) attends coarsely to far context and finely to near context. Here
the coarse segments are summaries, as in the Compressive Transformer and ToMe: beyond the first
``sinks`` positions and the last ``window`` ones the past is held as *buckets*, each a summary
(mean key, mean value, count) attended as one row with a ``log(count)`` bias added to its score, so
a bucket weighs like ``count`` copies of its mean key.

Buckets form like the carries of a binary counter. Tokens leaving the window wait, exact, in a
staging area; when ``base`` of them have gathered they become one level-0 bucket of ``base``
tokens. A new bucket that meets an existing bucket of its level merges with it (count-weighted
means) into one bucket of the next level, and so on, so at most one bucket per level remains, level
l holding ``base * 2**l`` tokens, older levels higher. After ``n`` tokens have left the window the
bucket sizes are the binary representation of ``n // base`` (in units of ``base``) and
``n % base`` tokens are staged. ``levels`` caps the number of buckets: a carry that reaches the
top level merges into it, so the oldest bucket absorbs everything older.

State, allocated once in ``init`` (numpy owns the memory), keys and values each: the sink rows and
window ring of ``pyllama.attention.window`` (a token leaving the window reaches ``leave_window``),
a staging area ``[n_layers, base, kv_dim]`` and one summary row per level ``[n_layers, 62, kv_dim]``
with its count. Memory is O(sinks + window + base + log t), so
``max_positions`` is unbounded.

Positions. Without ``shift`` every key keeps the position it was rotated with, so past the trained
context the query meets distances it never saw in training. With ``shift`` positions are assigned
inside the memory, as StreamingLLM does for its cache (``sink:s,w,shift``): the rows sit at
consecutive positions ending at the query, so no distance exceeds the number of rows. The exact
tail (staged tokens and window) is contiguous, so it stays where it is; each bucket summary is
re-rotated so that the middle of its span lands on its row's position (RoPE is linear, so rotating
a mean key rotates every key it averages), and the sink keys move forward like StreamingLLM's
(``WindowAttention.moved``). That is a few RoPE rows per step on copies, O(sinks + log t) work.

Every step attends, per query head, with the shared routine over sinks, buckets (oldest first),
staged tokens and the window: ascending position order. With ``sinks + window`` >= the sequence
length nothing leaves the window and this is ``causal`` bit for bit.
"""

from cython.parallel cimport prange
from libc.math cimport logf
from libc.string cimport memcpy

import numpy as np

from pyllama.attention.base cimport threads_for
from pyllama.attention.gather cimport GatherAttention, take_rows
from pyllama.attention.window cimport WindowAttention, kept_span

from pyllama.attention.base import UNBOUNDED
from pyllama.attention.memory import require_memory
from pyllama.attention.spec import Knob, check_knobs
from pyllama.attention.window import sink_window_knobs

cdef enum:
    MAX_LEVELS = 62  # base * 2**62 tokens: more than any sequence


cdef class Lattice(WindowAttention):
    name = "lattice"
    description = ("sinks + exact window + dyadic buckets of the past (size doubles with age, "
                   "log(count) bias; Log-Linear Attention): memory O(log t)")
    holds = "summaries"  # held_positions: every position seen (exact, or in a quantised tier or a summary)
    knobs = (
        *sink_window_knobs(4, 64, "kept exact"),
        Knob("base", int, 8, "tokens in a level-0 bucket; a level-l bucket holds base * 2^l", min=1),
        Knob("levels", int, 0, "at most this many buckets, the oldest absorbing the rest; 0 = no cap",
             min=0, max=MAX_LEVELS),
        Knob("shift", bool, False, "assign positions inside the memory (StreamingLLM); off: original positions"),
    )

    cdef object _buck_k, _buck_v, _buck_n  # also read from Python (inspection, ledger)
    cdef float* stage_k      # [n_layers, base, kv_dim]: exact tokens waiting to form a level-0 bucket
    cdef float* stage_v
    cdef float* buck_k       # [n_layers, MAX_LEVELS, kv_dim]: mean key of the bucket of each level
    cdef float* buck_v
    cdef long long* buck_n   # [n_layers, MAX_LEVELS]: tokens in it (0: no bucket at that level)
    cdef long long* n_stage  # [n_layers] tokens staged (the counters' row 1; row 0: positions seen)
    cdef double* carry       # [2, kv_dim]: the bucket being carried upwards (key mean, value mean)
    cdef float* bias         # [rows]: this step's per-row score bias (0 exact, log(count) bucket)
    cdef readonly long long base
    cdef readonly int levels
    cdef readonly bint shift
    cdef int cap             # levels in use (MAX_LEVELS when uncapped)

    def __init__(self, sinks: int = 4, window: int = 64, base: int = 8, levels: int = 0, shift: bool = False):
        check_knobs(self, sinks=sinks, window=window, base=base, levels=levels, shift=shift)
        self.sinks = sinks
        self.window = window
        self.base = base
        self.levels = levels
        self.shift = shift
        self.cap = levels if levels > 0 else MAX_LEVELS
        self.max_positions = UNBOUNDED

    def planned_bytes(self, config):
        """What init allocates (Python integers: no overflow for any knob value)."""
        S, W, B, L, kv = int(self.sinks), int(self.window), int(self.base), config.n_layers, config.kv_dim
        rows = S + MAX_LEVELS + B + W
        staging = 2 * L * B * kv * 4
        buckets = 2 * L * MAX_LEVELS * kv * 4 + L * MAX_LEVELS * 8
        scratch = 2 * kv * 8 + rows * 4  # carry, bias
        return self.window_bytes(config, rows, 2, S + MAX_LEVELS if self.shift else 0) + staging + buckets + scratch

    def init(self, config, pool):
        require_memory("lattice", f"sinks={int(self.sinks):,}, window={int(self.window):,}, base={int(self.base):,}",
                       self.planned_bytes(config))
        cdef long long S = self.sinks, B = self.base
        L, kv = config.n_layers, config.kv_dim
        # shift: scratch rows for the moved sink keys and one per bucket
        self.init_window(config, S + MAX_LEVELS + B + self.window, 2, S + MAX_LEVELS if self.shift else 0)
        self.n_stage = self.length + self.n_layers
        self._buck_k = np.zeros((L, MAX_LEVELS, kv), dtype=np.float32)
        self._buck_v = np.zeros((L, MAX_LEVELS, kv), dtype=np.float32)
        self._buck_n = np.zeros((L, MAX_LEVELS), dtype=np.int64)
        self.stage_k = <float*>self.own(np.zeros((L, B, kv), dtype=np.float32))
        self.stage_v = <float*>self.own(np.zeros((L, B, kv), dtype=np.float32))
        self.buck_k = <float*>self.own(self._buck_k)
        self.buck_v = <float*>self.own(self._buck_v)
        self.buck_n = <long long*>self.own(self._buck_n)
        self.carry = <double*>self.own(np.zeros((2, kv), dtype=np.float64))
        self.bias = <float*>self.own(np.zeros(self.rows, dtype=np.float32))

    def reset(self):
        WindowAttention.reset(self)
        if self._buck_n is not None:
            self._buck_n[...] = 0

    def held_positions(self, int layer):
        return GatherAttention.held_positions(self, layer)

    def memory_bytes(self):
        # exact rows (sinks, window, staged) and bucket summaries (mean key, mean value, int64 count)
        if self._counts is None:
            return 0
        row = 2 * self.kv_dim * 4
        total = 0
        held = self.held_exact()
        for layer in range(self.n_layers):
            exact = int(held[layer]) + int(self._counts[1, layer])
            buckets = int(np.count_nonzero(self._buck_n[layer]))
            total += exact * row + buckets * (row + 8)
        return total

    # ---- introspection (tests, experiments) ---------------------------------------------------------
    def bucket_sizes(self, int layer, int kv_head=0):
        """Token counts of the buckets of ``layer``, oldest first (the same for every KV head)."""
        self._check_layer(layer, kv_head)
        return [int(n) for n in self._buck_n[layer][::-1] if n > 0]

    def staged(self, int layer):
        """Tokens that left the window and wait, exact, for the next level-0 bucket."""
        self._check_layer(layer, 0)
        return int(self._counts[1, layer])

    def buckets(self, int layer, int kv_head=0):
        """``(mean keys [n, head_dim], mean values [n, head_dim], counts [n])`` of ``layer``'s buckets
        for one KV head, oldest first (copies)."""
        self._check_layer(layer, kv_head)
        lv = np.nonzero(self._buck_n[layer])[0][::-1]
        sl = slice(kv_head * self.head_dim, (kv_head + 1) * self.head_dim)
        return (self._buck_k[layer, lv, sl].copy(), self._buck_v[layer, lv, sl].copy(),
                self._buck_n[layer, lv].copy())

    def _check_layer(self, layer, kv_head):
        if self._counts is None:
            raise RuntimeError("lattice: not initialised (bind it to a model or call init first)")
        if not 0 <= layer < self.n_layers or not 0 <= kv_head < self.kv_dim // self.head_dim:
            raise IndexError(f"lattice: layer {layer} / KV head {kv_head} out of range")

    # ---- the step -----------------------------------------------------------------------------------
    cdef void _push_bucket(self, int layer, long long count) noexcept nogil:
        """Add the level-0 bucket in ``carry`` (means, ``count`` tokens) and propagate the carries."""
        cdef Py_ssize_t kv = self.kv_dim, i
        cdef int lvl = 0
        cdef long long n_old, n_new
        cdef float* mk
        cdef float* mv
        cdef double* ck = self.carry
        cdef double* cv = self.carry + kv
        while True:
            n_old = self.buck_n[layer * MAX_LEVELS + lvl]
            mk = self.buck_k + (layer * MAX_LEVELS + lvl) * kv
            mv = self.buck_v + (layer * MAX_LEVELS + lvl) * kv
            if n_old > 0:  # the older bucket of this level merges with the carry (count-weighted means)
                n_new = n_old + count
                for i in range(kv):
                    ck[i] = (mk[i] * <double>n_old + ck[i] * <double>count) / <double>n_new
                    cv[i] = (mv[i] * <double>n_old + cv[i] * <double>count) / <double>n_new
                count = n_new
                self.buck_n[layer * MAX_LEVELS + lvl] = 0
            if n_old == 0 or lvl == self.cap - 1:
                break
            lvl += 1
        for i in range(kv):
            mk[i] = <float>ck[i]
            mv[i] = <float>cv[i]
        self.buck_n[layer * MAX_LEVELS + lvl] = count

    cdef void leave_window(self, int layer, const float* key, const float* value) noexcept nogil:
        """One token leaves the window: stage it; ``base`` staged tokens become a level-0 bucket."""
        cdef Py_ssize_t kv = self.kv_dim, i
        cdef long long B = self.base, j, ns = self.n_stage[layer]
        cdef const float* sk = self.stage_k + layer * B * kv
        cdef const float* sv = self.stage_v + layer * B * kv
        memcpy(self.stage_k + (layer * B + ns) * kv, key, kv * sizeof(float))
        memcpy(self.stage_v + (layer * B + ns) * kv, value, kv * sizeof(float))
        ns += 1
        if ns < B:
            self.n_stage[layer] = ns
            return
        for i in range(kv):
            self.carry[i] = 0.0
            self.carry[kv + i] = 0.0
        for j in range(B):
            for i in range(kv):
                self.carry[i] += sk[j * kv + i]
                self.carry[kv + i] += sv[j * kv + i]
        for i in range(2 * kv):
            self.carry[i] /= <double>B
        self.n_stage[layer] = 0
        self._push_bucket(layer, B)

    cdef int attend_c(self, int layer, long long pos, float* q, float* k, float* v, float* out) except -1 nogil:
        self.keep(layer, pos, k, v)  # a token leaving the window is staged (leave_window)
        cdef long long S = self.sinks, B = self.base, R = self.rows
        cdef Py_ssize_t kv = self.kv_dim

        # rows, ascending in position: sinks, buckets (oldest = highest level first), staged, window
        cdef long long n_sink, ring_start, n_ring
        kept_span(pos, S, self.window, &n_sink, &ring_start, &n_ring)
        cdef long long ns = self.n_stage[layer]
        cdef long long n_buck = 0, n, i
        cdef int lvl
        for lvl in range(self.cap - 1, -1, -1):
            if self.buck_n[layer * MAX_LEVELS + lvl] > 0:
                self.bias[n_sink + n_buck] = logf(<float>self.buck_n[layer * MAX_LEVELS + lvl])
                n_buck += 1
        if n_buck > 0:
            for i in range(n_sink):
                self.bias[i] = 0.0
            for i in range(n_sink + n_buck, n_sink + n_buck + ns + n_ring):
                self.bias[i] = 0.0
        n = n_sink + n_buck + ns + n_ring
        cdef const float* bias = self.bias if n_buck > 0 else NULL

        # shift: the rows before the exact tail move to the positions just before it
        cdef const float* sink_keys = self.sink_k + self.layer_at(layer)
        cdef const float* buck_keys[MAX_LEVELS]
        cdef long long offset = (pos + 1 - ns - n_ring) - n_sink - n_buck
        cdef long long start, count, b = 0
        if self.shift and offset != 0 and n_sink > 0:
            sink_keys = self.moved(sink_keys, n_sink, offset, 0)
        start = S  # the oldest bucket starts right after the sinks
        for lvl in range(self.cap - 1, -1, -1):
            count = self.buck_n[layer * MAX_LEVELS + lvl]
            if count == 0:
                continue
            buck_keys[b] = self.buck_k + (layer * MAX_LEVELS + lvl) * kv
            if self.shift and offset != 0:  # the middle of positions start .. start + count - 1 goes to row n_sink + b
                buck_keys[b] = self.moved(buck_keys[b], 1, n_sink + b + offset - (start + (count - 1) // 2), S + b)
            start += count
            b += 1

        cdef int h
        cdef long long j
        cdef Py_ssize_t off
        cdef const float** kp
        cdef const float** vp
        for h in prange(self.n_heads, schedule="static",
                        num_threads=threads_for(self.n_threads, n * self.n_heads * self.head_dim)):
            off = (h // self.kv_mul) * self.head_dim
            kp = self.kptr + h * R
            vp = self.vptr + h * R
            j = self.take_sinks(kp, vp, NULL, 0, layer, sink_keys, n_sink, off)
            for lvl in range(self.cap - 1, -1, -1):
                if self.buck_n[layer * MAX_LEVELS + lvl] > 0:
                    kp[j] = buck_keys[j - n_sink] + off
                    vp[j] = self.buck_v + (layer * MAX_LEVELS + lvl) * kv + off
                    j = j + 1
            j = take_rows(kp, vp, NULL, j, self.stage_k + layer * B * kv + off, self.stage_v + layer * B * kv + off,
                          ns, kv)
            self.take_window(kp, vp, NULL, j, layer, ring_start, n_ring, off)
            self.attend_gathered(h, q, bias, n, out)
        return 0
