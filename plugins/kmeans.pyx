"""``kmeans``: clustered keys; a query attends exactly to the members of its best clusters.

Squeezed Attention (Hooper et al. 2024, arXiv 2411.09688), ClusterKV (Liu et al. 2024, arXiv
2412.03213) and RetroInfer (Chen et al. 2025, arXiv 2505.02922) cluster the cached keys and let a
query look at the centroids first, then attend only to the tokens of the clusters that matter.

Per layer and KV head, the keys of the *middle* positions (after the first ``sinks``, before the
last ``window``) are clustered (``pyllama.attention.cluster``): seeded k-means++ picks ``clusters``
centroids, then ``iters`` Lloyd steps (assign each key to the nearest centroid in squared Euclidean
distance, move each centroid to the mean of its members). A key that leaves the window later is
assigned to the nearest centroid and the centroid follows as a running mean; after ``recluster``
such tokens the middle is clustered again from scratch. Clustering starts the first time the middle
holds more than ``budget`` tokens; until then every position is attended (a block as ``causal``). The
random numbers come from a xorshift64* generator seeded from (``seed``, layer, KV head, how many times
that layer has clustered), so results do not depend on the thread count and a sequence replays exactly
after ``reset()``.

A query head scores each non-empty cluster by ``q·μ / sqrt(d)``, as ClusterKV does (with
``size_bias``, plus ``log(size)``: the log of the attention mass the cluster would get if every
member scored like its centroid; on stories260K that spends the budget on large clusters and does
no better), takes whole clusters in score order until at least ``budget`` tokens are chosen, and
attends with the shared routine over sinks ∪ chosen members ∪ window in ascending position order.
With ``estimate`` each cluster not chosen is attended as one pseudo-row (centroid, mean value,
``log(size)`` bias) after the exact rows. With ``budget`` >= the sequence length nothing is ever
left out and this is ``causal`` bit for bit.

It saves compute, not memory: the full float32 K/V cache stays (``pyllama.attention.dense``'s
``[n_layers, positions, row_floats]``, ``positions`` defaulting to the model's context like
``causal``), and the ledger adds the centroids, sizes and assignments. A decode step
costs O(sinks + window + budget + clusters) attention per head, a pass over the middle's cluster
labels, and the clustering, amortised: O(middle x clusters x (iters + 1) / recluster).
"""

from cython.parallel cimport prange
from libc.math cimport logf
from libc.stdint cimport int32_t, uint64_t, uint8_t

import numpy as np

from pyllama.attention.base cimport Attention, threads_for
from pyllama.attention.cluster cimport (Clusters, ClusterScratch, add_member, cluster_rows, rank_clusters,
                                        splitmix64)
from pyllama.attention.dense cimport DenseAttention
from pyllama.attention.gather cimport BLOCK_QUERIES
from pyllama.attention.window cimport kept_span

from pyllama.attention.dense import POSITIONS
from pyllama.attention.memory import require_memory
from pyllama.attention.spec import Knob, check_knobs
from pyllama.attention.window import sink_window_knobs


cdef class KMeans(DenseAttention):
    name = "kmeans"
    description = ("clustered keys (ClusterKV/Squeezed Attention): sinks + window + the best clusters' "
                   "members, exact; saves compute, not memory (keeps the full K/V)")
    holds = "everything"  # held_positions: every position seen (all kept; a selection per query)
    knobs = (
        Knob("clusters", int, 32, "centroids per layer and KV head", min=1),
        Knob("budget", int, 64, "middle tokens attended: whole clusters in score order until this many", min=0),
        *sink_window_knobs(4, 64, "attended"),
        # bounded so that a typo cannot make one re-clustering run for hours (a few steps converge)
        Knob("iters", int, 4, "Lloyd steps after k-means++ seeding", min=1, max=1000),
        Knob("recluster", int, 256, "cluster the middle again after this many new tokens", min=1),
        Knob("seed", int, 0, "seed of the k-means++ draws", min=0),
        Knob("estimate", bool, False, "attend each unchosen cluster as one row (centroid, mean value, log size)"),
        Knob("size_bias", bool, False, "rank clusters by q·μ/sqrt(d) + log(size) instead of q·μ alone"),
        POSITIONS,
    )

    cdef object _cent, _cval, _csize, _assign, _sel, _last  # also read from Python (inspection)
    cdef float* cent          # [n_layers, n_kv_heads, clusters, head_dim] centroids (mean keys)
    cdef float* cval          # [n_layers, n_kv_heads, clusters, head_dim] mean values (estimate)
    cdef float* cnorm         # [n_layers, n_kv_heads, clusters] |centroid|^2
    cdef long long* csize     # [n_layers, n_kv_heads, clusters] members
    cdef int32_t* assign      # [n_layers, n_kv_heads, positions] cluster of each middle position
    cdef long long* n_mid     # [n_layers] the counters' rows 1 .. 4 (row 0: positions seen): middle tokens
    cdef long long* since     # middle tokens added since the last clustering
    cdef long long* epoch     # clusterings so far (part of the seed)
    cdef long long* have      # 1 once the middle is clustered
    cdef float* dist          # [n_kv_heads, positions] k-means++ D^2 (scratch of the clustering)
    cdef float* xnorm         # [n_kv_heads, positions] |key|^2
    cdef double* sums         # [n_kv_heads, clusters, head_dim]
    cdef double* vsums
    cdef long long* cnt       # [n_kv_heads, clusters]
    cdef float* cscore        # [n_heads, clusters] this step's cluster scores
    cdef int32_t* corder      # [n_heads, clusters] clusters in score order
    cdef uint8_t* cmark       # [n_heads, clusters] chosen
    cdef long long* sel       # [n_heads, positions] chosen middle positions
    cdef long long* last      # [n_heads, 2]: chosen positions (-1: all) and estimate rows of the last call
    cdef float* bias          # [n_heads, rows]
    cdef readonly long long clusters, budget, sinks, window, iters, recluster, seed
    cdef readonly bint estimate, size_bias
    cdef long long last_layer, last_pos

    def __init__(self, clusters: int = 32, budget: int = 64, sinks: int = 4, window: int = 64, iters: int = 4,
                 recluster: int = 256, seed: int = 0, estimate: bool = False, size_bias: bool = False,
                 positions: int = 0):
        check_knobs(self, clusters=clusters, budget=budget, sinks=sinks, window=window, iters=iters,
                    recluster=recluster, seed=seed, estimate=estimate, size_bias=size_bias, positions=positions)
        self.clusters = clusters
        self.budget = budget
        self.sinks = sinks
        self.window = window
        self.iters = iters
        self.recluster = recluster
        self.seed = seed
        self.estimate = estimate
        self.size_bias = size_bias
        self.positions = positions
        if positions > 0:
            self.max_positions = positions

    @property
    def exact_prefix(self):  # its middle first outgrows the budget there (attend_c's need)
        return int(self.sinks + self.window + self.budget)

    def start_from(self, int layer, keys, values, queries=None, queries_pre_rope=None):
        """What attending positions 0 .. T - 1 (T at most ``exact_prefix``) of a fresh ``layer`` leaves,
        from a recorded causal run: the rows kept, the middle counted, no clustering (attend_block_c's)."""
        cdef long long T = self.keep_recorded(layer, keys, values)
        self.n_mid[layer] = max(0, T - self.sinks - self.window)
        self._last[:] = (-1, 0)  # what attend_block_c leaves for selected() and estimated(): every row
        self.last_layer, self.last_pos = layer, T - 1

    def planned_bytes(self, config):
        """What init allocates (Python integers: no overflow for any knob value)."""
        P, C, E = int(self.max_positions), int(self.clusters), int(self.clusters) if self.estimate else 1
        L, KVH, H, hd = config.n_layers, config.n_kv_heads, config.n_heads, config.head_dim
        members = L * KVH * P * 4  # cluster of each position
        clusters = L * KVH * (C + E) * hd * 4 + L * KVH * C * (8 + 4)  # centroids, values, sizes, |centroid|^2
        scratch = (H * P * 8 + H * 2 * 8 + 2 * KVH * P * 4 + 2 * KVH * C * hd * 8 + KVH * C * 8
                   + H * C * (4 + 4 + 1) + H * (P + C) * 4)
        return self.dense_bytes(config, P + C, 5, BLOCK_QUERIES * P) + members + clusters + scratch

    def init(self, config, pool):
        require_memory("kmeans", f"positions={int(self.max_positions):,}, clusters={int(self.clusters):,}",
                       self.planned_bytes(config))
        cdef long long P = self.max_positions, C = self.clusters
        L, KVH, H, hd = config.n_layers, config.n_kv_heads, config.n_heads, config.head_dim
        self.init_dense(config, P + C, 5, BLOCK_QUERIES * P)  # a block's queries' scores: attend_block_c
        self.n_mid = self.length + self.n_layers
        self.since = self.length + 2 * self.n_layers
        self.epoch = self.length + 3 * self.n_layers
        self.have = self.length + 4 * self.n_layers
        self._cent = np.zeros((L, KVH, C, hd), dtype=np.float32)
        self._cval = np.zeros((L, KVH, C if self.estimate else 1, hd), dtype=np.float32)
        self._csize = np.zeros((L, KVH, C), dtype=np.int64)
        self._assign = np.zeros((L, KVH, P), dtype=np.int32)
        self._sel = np.zeros((H, P), dtype=np.int64)
        self._last = np.zeros((H, 2), dtype=np.int64)
        self.cent = <float*>self.own(self._cent)
        self.cval = <float*>self.own(self._cval)
        self.cnorm = <float*>self.own(np.zeros((L, KVH, C), dtype=np.float32))
        self.csize = <long long*>self.own(self._csize)
        self.assign = <int32_t*>self.own(self._assign)
        self.dist = <float*>self.own(np.zeros((KVH, P), dtype=np.float32))
        self.xnorm = <float*>self.own(np.zeros((KVH, P), dtype=np.float32))
        self.sums = <double*>self.own(np.zeros((KVH, C, hd), dtype=np.float64))
        self.vsums = <double*>self.own(np.zeros((KVH, C, hd), dtype=np.float64))
        self.cnt = <long long*>self.own(np.zeros((KVH, C), dtype=np.int64))
        self.cscore = <float*>self.own(np.zeros((H, C), dtype=np.float32))
        self.corder = <int32_t*>self.own(np.zeros((H, C), dtype=np.int32))
        self.cmark = <uint8_t*>self.own(np.zeros((H, C), dtype=np.uint8))
        self.sel = <long long*>self.own(self._sel)
        self.last = <long long*>self.own(self._last)
        self.bias = <float*>self.own(np.zeros((H, self.rows), dtype=np.float32))
        self.last_layer = -1

    def reset(self):
        DenseAttention.reset(self)
        self.last_layer = -1

    def scalar_state(self):
        return self.last_layer, self.last_pos  # the last step, which selected() and estimated() describe

    def set_scalar_state(self, state):
        self.last_layer, self.last_pos = state

    def memory_bytes(self):
        # the full K/V cache, plus per clustered layer and KV head: centroids (and mean values with
        # estimate), |centroid|^2 and sizes, and an assignment per middle token
        if self._counts is None:
            return 0
        kv, hd, C, KVH = self.kv_dim, self.head_dim, self.clusters, self.n_kv_heads
        per_cluster = hd * 4 * (2 if self.estimate else 1) + 4 + 8
        total = 0
        for layer in range(self.n_layers):
            total += 2 * int(self._counts[0, layer]) * kv * 4
            if self._counts[4, layer]:
                total += KVH * (C * per_cluster + int(self._counts[1, layer]) * 4)
        return total

    # ---- introspection (tests, experiments) ---------------------------------------------------------
    def _check(self, layer, kv_head):
        if self._counts is None:
            raise RuntimeError("kmeans: not initialised (bind it to a model or call init first)")
        if not 0 <= layer < self.n_layers or not 0 <= kv_head < self.n_kv_heads:
            raise IndexError(f"kmeans: layer {layer} / KV head {kv_head} out of range")

    def clustered(self, int layer):
        """True once ``layer``'s middle tokens are clustered (it held more than ``budget`` of them)."""
        self._check(layer, 0)
        return bool(self._counts[4, layer])

    def assignments(self, int layer, int kv_head):
        """Cluster of each middle position ``sinks, sinks+1, ...`` (int32; -1 before clustering starts)."""
        self._check(layer, kv_head)
        n = int(self._counts[1, layer])
        if not self._counts[4, layer]:
            return np.full(n, -1, dtype=np.int32)
        return self._assign[layer, kv_head, self.sinks:self.sinks + n].copy()

    def centroids(self, int layer, int kv_head):
        """float32 [clusters, head_dim] (rows of empty clusters are meaningless)."""
        self._check(layer, kv_head)
        return self._cent[layer, kv_head].copy()

    def mean_values(self, int layer, int kv_head):
        """float32 [clusters, head_dim] mean value of each cluster (kept with ``estimate`` only)."""
        self._check(layer, kv_head)
        if not self.estimate:
            raise RuntimeError("kmeans: mean values are kept only with estimate")
        return self._cval[layer, kv_head].copy()

    def cluster_sizes(self, int layer, int kv_head):
        self._check(layer, kv_head)
        if not self._counts[4, layer]:
            return np.zeros(self.clusters, dtype=np.int64)
        return self._csize[layer, kv_head].copy()

    def selected(self, int head):
        """Positions query head ``head`` attended exactly in the last call (ascending)."""
        if not 0 <= head < self.n_heads:
            raise IndexError(f"kmeans: query head {head} out of range")
        if self.last_layer < 0:
            return []
        pos = self.last_pos
        S, W = self.sinks, self.window
        ring_start = max(S, pos + 1 - W)
        chosen = int(self._last[head, 0])
        if chosen < 0:
            return list(range(pos + 1))
        return list(range(min(pos + 1, S))) + [int(p) for p in self._sel[head, :chosen]] + \
            list(range(ring_start, pos + 1))

    def estimated(self, int head):
        """Clusters query head ``head`` attended as one estimate row in the last call."""
        return int(self._last[head, 1]) if self.last_layer >= 0 else 0

    # ---- clustering ---------------------------------------------------------------------------------
    cdef Clusters _clusters(self, int layer, int g) noexcept nogil:
        """The clusters of one layer and KV head (pointers into the plugin's arrays)."""
        cdef Clusters cl
        cdef long long base = (layer * self.n_kv_heads + g) * self.clusters
        cl.n = self.clusters
        cl.dim = self.head_dim
        cl.cent = self.cent + base * self.head_dim
        cl.cnorm = self.cnorm + base
        cl.cval = self.cval + base * self.head_dim if self.estimate else NULL
        cl.size = self.csize + base
        cl.assign = self.assign + (layer * self.n_kv_heads + g) * self.positions
        return cl

    cdef void _recluster(self, int layer, int g) noexcept nogil:
        """Cluster the middle keys of one layer and KV head from scratch, seeded by (seed, layer, g, epoch)."""
        cdef Clusters cl = self._clusters(layer, g)
        cdef ClusterScratch w
        w.dist = self.dist + g * self.positions
        w.xnorm = self.xnorm + g * self.positions
        w.sums = self.sums + g * self.clusters * self.head_dim
        w.vsums = self.vsums + g * self.clusters * self.head_dim
        w.cnt = self.cnt + g * self.clusters
        cdef uint64_t state = splitmix64(splitmix64(splitmix64(splitmix64(<uint64_t>self.seed) ^ <uint64_t>layer)
                                                    ^ <uint64_t>g) ^ <uint64_t>self.epoch[layer])
        if state == 0:
            state = 1
        cdef Py_ssize_t row = layer * self.positions * self.row_floats + g * self.head_dim
        cluster_rows(&cl, &w, self.keys + row, self.values + row, self.row_floats, self.sinks, self.n_mid[layer],
                     self.iters, state)

    cdef void _add_member(self, int layer, int g, long long p) noexcept nogil:
        """Middle position ``p`` joins its nearest cluster."""
        cdef Clusters cl = self._clusters(layer, g)
        cdef Py_ssize_t row = (layer * self.positions + p) * self.row_floats + g * self.head_dim
        add_member(&cl, self.keys + row, self.values + row, p)

    cdef long long _choose(self, int h, int layer, const float* qh, long long* n_order) noexcept nogil:
        """Rank the non-empty clusters for query head h (descending score, ties: lower index first), take whole
        clusters until ``budget`` tokens, list their members in sel[h] in position order; returns how many."""
        cdef long long C = self.clusters, P = self.positions, c, a, n_sel = 0, chosen = 0, p
        cdef int gh = h // self.kv_mul
        cdef Clusters cl = self._clusters(layer, gh)
        cdef int32_t* order = self.corder + h * C
        cdef uint8_t* mark = self.cmark + h * C
        cdef long long* sel = self.sel + h * P
        n_order[0] = rank_clusters(&cl, qh, self.size_bias, self.cscore + h * C, order, mark)
        for a in range(n_order[0]):
            if chosen >= self.budget:
                break
            c = order[a]
            mark[c] = 1
            chosen = chosen + cl.size[c]
        # every middle position has a cluster: one pass in order lists the chosen members sorted
        for p in range(self.sinks, self.sinks + self.n_mid[layer]):
            if n_sel == chosen:
                break
            if mark[cl.assign[p]]:
                sel[n_sel] = p
                n_sel = n_sel + 1
        return n_sel

    cdef long long _estimates(self, int h, int layer, long long n_order, long long j) noexcept nogil:
        """Each ranked cluster left out as one row at j ..: centroid, mean value, log(size). Returns how many."""
        cdef long long C = self.clusters, R = self.rows, a, c, n_est = 0
        cdef long long base = (layer * self.n_kv_heads + h // self.kv_mul) * C
        cdef Py_ssize_t hd = self.head_dim
        for a in range(n_order):
            c = self.corder[h * C + a]
            if self.cmark[h * C + c]:
                continue
            self.kptr[h * R + j + n_est] = self.cent + (base + c) * hd
            self.vptr[h * R + j + n_est] = self.cval + (base + c) * hd
            self.bias[h * R + j + n_est] = logf(<float>self.csize[base + c])
            n_est = n_est + 1
        return n_est

    # ---- the step -----------------------------------------------------------------------------------
    cdef int attend_c(self, int layer, long long pos, float* q, float* k, float* v, float* out) except -1 nogil:
        self.keep(layer, pos, k, v)
        cdef long long W = self.window, C = self.clusters, R = self.rows
        cdef Py_ssize_t kv = self.kv_dim, hd = self.head_dim

        # position pos - W leaves the window and joins the middle
        cdef bint joined = pos >= self.sinks + W
        if joined:
            self.n_mid[layer] += 1
        cdef long long M = self.n_mid[layer]
        cdef bint need = M > self.budget
        cdef bint add = joined and self.have[layer] != 0
        cdef bint again = need and (self.have[layer] == 0 or self.since[layer] + (1 if add else 0) >= self.recluster)
        cdef int g
        if again:
            for g in prange(self.n_kv_heads, schedule="static",
                            num_threads=threads_for(self.n_threads, M * C * (self.iters + 1) * kv)):
                self._recluster(layer, g)
            self.have[layer] = 1
            self.since[layer] = 0
            self.epoch[layer] += 1
        elif add:
            for g in prange(self.n_kv_heads, schedule="static", num_threads=threads_for(self.n_threads, C * kv)):
                self._add_member(layer, g, pos - W)
            self.since[layer] += 1

        cdef long long n_sink, ring_start, n_ring
        kept_span(pos, self.sinks, W, &n_sink, &ring_start, &n_ring)
        cdef int h
        cdef long long j, n, n_order, n_sel, n_est
        cdef Py_ssize_t off
        cdef const float** kp
        cdef const float** vp
        cdef float* bias
        # rows attended per head: everything, or sinks + window + about the budget (+ estimates)
        cdef long long work = (pos + 1 if not need else n_sink + n_ring + 2 * self.budget + C) * self.n_heads * hd
        for h in prange(self.n_heads, schedule="static", num_threads=threads_for(self.n_threads, work)):
            off = (h // self.kv_mul) * hd
            kp = self.kptr + h * R
            vp = self.vptr + h * R
            bias = self.bias + h * R
            n_est = 0
            # assigned here so that each thread has its own: _choose counts through its address, and a
            # variable only written through a pointer would be shared by the loop's threads (Cython
            # makes private what the body assigns)
            n_order = 0
            if not need:  # every position, in order: exactly causal's rows
                n = self.take_positions(kp, vp, NULL, 0, layer, 0, pos + 1, off)
                self.last[h * 2] = -1
            else:  # sinks, the chosen clusters' members, the window: ascending positions
                n_sel = self._choose(h, layer, q + h * hd, &n_order)
                j = self.take_positions(kp, vp, bias, 0, layer, 0, n_sink, off)
                j = self.take_listed_positions(kp, vp, bias, j, layer, self.sel + h * self.positions, n_sel, off)
                j = self.take_positions(kp, vp, bias, j, layer, ring_start, n_ring, off)
                if self.estimate:
                    n_est = self._estimates(h, layer, n_order, j)
                n = j + n_est
                self.last[h * 2] = n_sel
            self.last[h * 2 + 1] = n_est
            self.attend_gathered(h, q, bias if n_est > 0 else NULL, n, out)
        self.last_layer = layer
        self.last_pos = pos
        return 0

    cdef int attend_block_c(self, int layer, long long pos, Py_ssize_t n, float* q, float* k, float* v,
                            float* out) except -1 nogil:
        # every position is attended in order (causal's rows) until the middle holds more than budget tokens
        cdef long long h, start = self.sinks + self.window  # positions from here on join the middle (attend_c)
        if pos + n > start + self.budget:
            return Attention.attend_block_c(self, layer, pos, n, q, k, v, out)
        self.attend_every_row(layer, pos, n, q, k, v, out)
        self.n_mid[layer] += max(0, pos + n - max(pos, start))
        for h in range(self.n_heads):  # what attend_c leaves for selected() and estimated(): every row
            self.last[h * 2], self.last[h * 2 + 1] = -1, 0
        self.last_layer, self.last_pos = layer, pos + n - 1
        return 0
