"""``kmeans``: clustered keys; a query attends exactly to the members of its best clusters.

Squeezed Attention (Hooper et al. 2024, arXiv 2411.09688), ClusterKV (Liu et al. 2024, arXiv
2412.03213) and RetroInfer (Chen et al. 2025, arXiv 2505.02922) cluster the cached keys and let a
query look at the centroids first, then attend only to the tokens of the clusters that matter.

Per layer and KV head, the keys of the *middle* positions (after the first ``sinks``, before the
last ``window``) are clustered: seeded k-means++ picks ``clusters`` centroids, then ``iters`` Lloyd
steps (assign each key to the nearest centroid in squared Euclidean distance, move each centroid to
the mean of its members). A key that leaves the window later is assigned to the nearest centroid
and the centroid follows as a running mean; after ``recluster`` such tokens the middle is clustered
again from scratch. Clustering starts the first time the middle holds more than ``budget`` tokens;
until then every position is attended. The random numbers come from a xorshift64* generator seeded
from (``seed``, layer, KV head, how many times that layer has clustered), so results do not depend
on the thread count and a sequence replays exactly after ``reset()``.

A query head scores each non-empty cluster by ``q·μ / sqrt(d)``, as ClusterKV does (with
``size_bias``, plus ``log(size)``: the log of the attention mass the cluster would get if every
member scored like its centroid; on stories260K that spends the budget on large clusters and does
no better), takes whole clusters in score order until at least ``budget`` tokens are chosen, and
attends with the shared routine over sinks ∪ chosen members ∪ window in ascending position order.
With ``estimate`` each cluster not chosen is attended as one pseudo-row (centroid, mean value,
``log(size)`` bias) after the exact rows. With ``budget`` >= the sequence length nothing is ever
left out and this is ``causal`` bit for bit.

It saves compute, not memory: the full float32 K/V cache stays (``[n_layers, positions, kv_dim]``,
``positions`` defaulting to the model's context like ``causal``), and the ledger adds the
centroids, sizes, assignments and member lists. A decode step costs O(sinks + window + budget +
clusters) attention per head plus the clustering, amortised over ``recluster`` tokens:
O(middle x clusters x (iters + 1) / recluster).
"""

from cython.parallel cimport prange
from libc.math cimport logf, sqrtf
from libc.stdint cimport int32_t, uint64_t, uint8_t
from libc.stdlib cimport qsort
from libc.string cimport memcpy

import numpy as np

from pyllama.attention.base cimport threads_for
from pyllama.attention.gather cimport GatherAttention, kept_span
from pyllama.kernels.matvec cimport dot_f32

from pyllama.attention.memory import gather_bytes, require_memory
from pyllama.attention.spec import Knob


# ---- seeded random numbers (xorshift64*, seeded with splitmix64) ----------------------------------
cdef inline uint64_t splitmix64(uint64_t x) noexcept nogil:
    x = x + <uint64_t>0x9E3779B97F4A7C15ULL
    x = (x ^ (x >> 30)) * <uint64_t>0xBF58476D1CE4E5B9ULL
    x = (x ^ (x >> 27)) * <uint64_t>0x94D049BB133111EBULL
    return x ^ (x >> 31)


cdef inline uint64_t xorshift64s(uint64_t* state) noexcept nogil:
    cdef uint64_t x = state[0]
    x = x ^ (x >> 12)
    x = x ^ (x << 25)
    x = x ^ (x >> 27)
    state[0] = x
    return x * <uint64_t>0x2545F4914F6CDD1DULL


cdef inline double uniform01(uint64_t* state) noexcept nogil:
    return <double>(xorshift64s(state) >> 11) * (1.0 / 9007199254740992.0)


cdef int cmp_position(const void* a, const void* b) noexcept nogil:
    cdef long long x = (<const long long*>a)[0]
    cdef long long y = (<const long long*>b)[0]
    return (x > y) - (x < y)


cdef class KMeans(GatherAttention):
    name = "kmeans"
    description = ("clustered keys (ClusterKV/Squeezed Attention): sinks + window + the best clusters' "
                   "members, exact; saves compute, not memory (keeps the full K/V)")
    knobs = (
        Knob("clusters", int, 32, "centroids per layer and KV head", min=1),
        Knob("budget", int, 64, "middle tokens attended: whole clusters in score order until this many", min=0),
        Knob("sinks", int, 4, "first positions always attended (attention sinks)", min=0),
        Knob("window", int, 64, "most recent positions always attended, the current one included", min=1),
        Knob("iters", int, 4, "Lloyd steps after k-means++ seeding", min=1),
        Knob("recluster", int, 256, "cluster the middle again after this many new tokens", min=1),
        Knob("seed", int, 0, "seed of the k-means++ draws", min=0),
        Knob("estimate", bool, False, "attend each unchosen cluster as one row (centroid, mean value, log size)"),
        Knob("size_bias", bool, False, "rank clusters by q·μ/sqrt(d) + log(size) instead of q·μ alone"),
        Knob("positions", int, 0, "cache size in positions; 0 = the model's trained context", min=0),
    )

    cdef object _cent, _cval, _csize, _assign, _counts, _sel, _last  # also read from Python (inspection)
    cdef float* keys          # [n_layers, positions, kv_dim]: the full cache
    cdef float* values
    cdef float* cent          # [n_layers, n_kv_heads, clusters, head_dim] centroids (mean keys)
    cdef float* cval          # [n_layers, n_kv_heads, clusters, head_dim] mean values (estimate)
    cdef float* cnorm         # [n_layers, n_kv_heads, clusters] |centroid|^2
    cdef long long* csize     # [n_layers, n_kv_heads, clusters] members
    cdef int32_t* chead       # [n_layers, n_kv_heads, clusters] first and last member (-1: none)
    cdef int32_t* ctail
    cdef int32_t* assign      # [n_layers, n_kv_heads, positions] cluster of each middle position
    cdef int32_t* nxt         # [n_layers, n_kv_heads, positions] next member of the same cluster (-1: end)
    cdef long long* length    # [n_layers] positions seen; then n_mid, since, epoch, have
    cdef long long* n_mid     # middle tokens (positions sinks .. sinks + n_mid - 1)
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
    cdef readonly long long clusters, budget, sinks, window, iters, recluster, seed, positions
    cdef readonly bint estimate, size_bias
    cdef long long last_layer, last_pos

    def __init__(self, clusters: int = 32, budget: int = 64, sinks: int = 4, window: int = 64, iters: int = 4,
                 recluster: int = 256, seed: int = 0, estimate: bool = False, size_bias: bool = False,
                 positions: int = 0):
        if clusters < 1 or budget < 0 or sinks < 0 or window < 1 or iters < 1 or recluster < 1 or seed < 0 \
                or positions < 0:
            raise ValueError(f"kmeans: need clusters >= 1, budget >= 0, sinks >= 0, window >= 1, iters >= 1, "
                             f"recluster >= 1, seed >= 0, positions >= 0; got {clusters}, {budget}, {sinks}, "
                             f"{window}, {iters}, {recluster}, {seed}, {positions}")
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

    def planned_bytes(self, config):
        """What init allocates (Python integers: no overflow for any knob value)."""
        P, C, E = int(self.max_positions), int(self.clusters), int(self.clusters) if self.estimate else 1
        L, KVH, H, hd, kv = config.n_layers, config.n_kv_heads, config.n_heads, config.head_dim, config.kv_dim
        cache = 2 * L * P * kv * 4 + 2 * L * KVH * P * 4  # keys, values; cluster of each position, next member
        clusters = L * KVH * (C + E) * hd * 4 + L * KVH * C * (8 + 4 + 4 + 4)  # centroids, values, sizes, lists
        scratch = (5 * L * 8 + H * P * 8 + H * 2 * 8 + 2 * KVH * P * 4 + 2 * KVH * C * hd * 8 + KVH * C * 8
                   + H * C * (4 + 4 + 1) + H * (P + C) * 4)
        return gather_bytes(config, P + C) + cache + clusters + scratch

    def init(self, config, pool):
        require_memory("kmeans", f"positions={int(self.max_positions):,}, clusters={int(self.clusters):,}",
                       self.planned_bytes(config))
        cdef long long P = self.max_positions, C = self.clusters
        L, KVH, H, hd, kv = config.n_layers, config.n_kv_heads, config.n_heads, config.head_dim, config.kv_dim
        self.positions = P
        self.init_gather(config, P + C)
        self._cent = np.zeros((L, KVH, C, hd), dtype=np.float32)
        self._cval = np.zeros((L, KVH, C if self.estimate else 1, hd), dtype=np.float32)
        self._csize = np.zeros((L, KVH, C), dtype=np.int64)
        self._assign = np.zeros((L, KVH, P), dtype=np.int32)
        self._counts = np.zeros((5, L), dtype=np.int64)
        self._sel = np.zeros((H, P), dtype=np.int64)
        self._last = np.zeros((H, 2), dtype=np.int64)
        self.keys = <float*>self.own(np.zeros((L, P, kv), dtype=np.float32))
        self.values = <float*>self.own(np.zeros((L, P, kv), dtype=np.float32))
        self.cent = <float*>self.own(self._cent)
        self.cval = <float*>self.own(self._cval)
        self.cnorm = <float*>self.own(np.zeros((L, KVH, C), dtype=np.float32))
        self.csize = <long long*>self.own(self._csize)
        self.chead = <int32_t*>self.own(np.full((L, KVH, C), -1, dtype=np.int32))
        self.ctail = <int32_t*>self.own(np.full((L, KVH, C), -1, dtype=np.int32))
        self.assign = <int32_t*>self.own(self._assign)
        self.nxt = <int32_t*>self.own(np.zeros((L, KVH, P), dtype=np.int32))
        self.length = <long long*>self.own(self._counts)
        self.n_mid = self.length + self.n_layers
        self.since = self.length + 2 * self.n_layers
        self.epoch = self.length + 3 * self.n_layers
        self.have = self.length + 4 * self.n_layers
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
        if self._counts is not None:
            self._counts[...] = 0
            self.last_layer = -1

    def memory_bytes(self):
        # the full K/V cache, plus per clustered layer and KV head: centroids (and mean values with
        # estimate), |centroid|^2, sizes, list heads/tails, and an assignment and a link per middle token
        if self._counts is None:
            return 0
        kv, hd, C, KVH = self.kv_dim, self.head_dim, self.clusters, self.n_kv_heads
        per_cluster = hd * 4 * (2 if self.estimate else 1) + 4 + 8 + 2 * 4
        total = 0
        for layer in range(self.n_layers):
            total += 2 * int(self._counts[0, layer]) * kv * 4
            if self._counts[4, layer]:
                total += KVH * (C * per_cluster + int(self._counts[1, layer]) * (4 + 4))
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
    cdef inline float* _key(self, int layer, long long p, int g) noexcept nogil:
        return self.keys + (layer * self.positions + p) * self.kv_dim + g * self.head_dim

    cdef inline float* _value(self, int layer, long long p, int g) noexcept nogil:
        return self.values + (layer * self.positions + p) * self.kv_dim + g * self.head_dim

    cdef int _nearest(self, int layer, int g, const float* x, long long n_valid) noexcept nogil:
        """Nearest centroid of ``x`` among the first ``n_valid`` (only non-empty ones when -1)."""
        cdef long long C = self.clusters, c
        cdef long long base = (layer * self.n_kv_heads + g) * C
        cdef float d, best_d = 0.0
        cdef int best = -1
        for c in range(C if n_valid < 0 else n_valid):
            if n_valid < 0 and self.csize[base + c] == 0:
                continue
            # |x - μ|^2 - |x|^2 = |μ|^2 - 2 x·μ: the same order of candidates
            d = self.cnorm[base + c] - 2.0 * dot_f32(x, self.cent + (base + c) * self.head_dim, self.head_dim)
            if best < 0 or d < best_d:
                best = <int>c
                best_d = d
        return best

    cdef void _recluster(self, int layer, int g) noexcept nogil:
        """k-means++ seeding then ``iters`` Lloyd steps over the middle keys of one layer and KV head."""
        cdef long long C = self.clusters, S = self.sinks, P = self.positions, M = self.n_mid[layer]
        cdef long long K = C if C < M else M
        cdef Py_ssize_t hd = self.head_dim
        cdef long long base = (layer * self.n_kv_heads + g) * C
        cdef float* cent = self.cent + base * hd
        cdef float* cnorm = self.cnorm + base
        cdef float* dist = self.dist + g * P
        cdef float* xnorm = self.xnorm + g * P
        cdef double* sums = self.sums + g * C * hd
        cdef double* vsums = self.vsums + g * C * hd
        cdef long long* cnt = self.cnt + g * C
        cdef int32_t* assign = self.assign + (layer * self.n_kv_heads + g) * P
        cdef int32_t* nxt = self.nxt + (layer * self.n_kv_heads + g) * P
        cdef int32_t* head = self.chead + base
        cdef int32_t* tail = self.ctail + base
        cdef uint64_t state = splitmix64(splitmix64(splitmix64(splitmix64(<uint64_t>self.seed) ^ <uint64_t>layer)
                                                    ^ <uint64_t>g) ^ <uint64_t>self.epoch[layer])
        if state == 0:
            state = 1
        cdef long long i, c, _it, pick
        cdef Py_ssize_t d
        cdef const float* x
        cdef float dd
        cdef double total, r, acc
        # k-means++: the first centroid uniformly, then each with probability proportional to D^2
        for i in range(M):
            x = self._key(layer, S + i, g)
            xnorm[i] = dot_f32(x, x, hd)
        pick = <long long>(xorshift64s(&state) % <uint64_t>M)
        for c in range(K):
            if c > 0:
                total = 0.0
                for i in range(M):
                    total = total + dist[i]
                if total > 0.0:
                    r = uniform01(&state) * total
                    acc = 0.0
                    pick = M - 1
                    for i in range(M):
                        acc = acc + dist[i]
                        if acc > r and dist[i] > 0.0:
                            pick = i
                            break
                else:
                    pick = <long long>(xorshift64s(&state) % <uint64_t>M)
            memcpy(cent + c * hd, self._key(layer, S + pick, g), hd * sizeof(float))
            cnorm[c] = xnorm[pick]
            for i in range(M):
                x = self._key(layer, S + i, g)
                dd = xnorm[i] + cnorm[c] - 2.0 * dot_f32(x, cent + c * hd, hd)
                if dd < 0.0:
                    dd = 0.0
                if c == 0 or dd < dist[i]:
                    dist[i] = dd
        # Lloyd: assign, then move each centroid to the mean of its members
        for _it in range(self.iters):
            for c in range(K):
                cnt[c] = 0
                for d in range(hd):
                    sums[c * hd + d] = 0.0
            for i in range(M):
                x = self._key(layer, S + i, g)
                c = self._nearest(layer, g, x, K)
                assign[S + i] = <int32_t>c
                cnt[c] += 1
                for d in range(hd):
                    sums[c * hd + d] += x[d]
            for c in range(K):
                if cnt[c] > 0:
                    for d in range(hd):
                        cent[c * hd + d] = <float>(sums[c * hd + d] / <double>cnt[c])
                    cnorm[c] = dot_f32(cent + c * hd, cent + c * hd, hd)
        for c in range(C):
            self.csize[base + c] = cnt[c] if c < K else 0
            head[c] = -1
            tail[c] = -1
        if self.estimate:
            for c in range(K):
                for d in range(hd):
                    vsums[c * hd + d] = 0.0
            for i in range(M):
                c = assign[S + i]
                x = self._value(layer, S + i, g)
                for d in range(hd):
                    vsums[c * hd + d] += x[d]
            for c in range(K):
                if cnt[c] > 0:
                    for d in range(hd):
                        self.cval[(base + c) * hd + d] = <float>(vsums[c * hd + d] / <double>cnt[c])
        # member lists, ascending in position
        for i in range(M):
            c = assign[S + i]
            nxt[S + i] = -1
            if tail[c] >= 0:
                nxt[tail[c]] = <int32_t>(S + i)
            else:
                head[c] = <int32_t>(S + i)
            tail[c] = <int32_t>(S + i)

    cdef void _add_member(self, int layer, int g, long long p) noexcept nogil:
        """Middle position ``p`` joins its nearest cluster, which moves to the new running mean."""
        cdef long long C = self.clusters, P = self.positions
        cdef Py_ssize_t hd = self.head_dim, d
        cdef long long base = (layer * self.n_kv_heads + g) * C
        cdef const float* x = self._key(layer, p, g)
        cdef const float* xv
        cdef int c = self._nearest(layer, g, x, -1)
        cdef long long n = self.csize[base + c] + 1
        cdef float fn = <float>n
        cdef float* mu = self.cent + (base + c) * hd
        cdef float* mv
        for d in range(hd):
            mu[d] = mu[d] + (x[d] - mu[d]) / fn
        self.cnorm[base + c] = dot_f32(mu, mu, hd)
        if self.estimate:
            xv = self._value(layer, p, g)
            mv = self.cval + (base + c) * hd
            for d in range(hd):
                mv[d] = mv[d] + (xv[d] - mv[d]) / fn
        self.csize[base + c] = n
        cdef int32_t* nxt = self.nxt + (layer * self.n_kv_heads + g) * P
        self.assign[(layer * self.n_kv_heads + g) * P + p] = c
        nxt[p] = -1
        if self.ctail[base + c] >= 0:
            nxt[self.ctail[base + c]] = <int32_t>p
        else:
            self.chead[base + c] = <int32_t>p
        self.ctail[base + c] = <int32_t>p

    # ---- the step -----------------------------------------------------------------------------------
    cdef int attend_c(self, int layer, long long pos, float* q, float* k, float* v, float* out) except -1 nogil:
        self.check_in_order(layer, pos, self.length[layer])
        cdef long long S = self.sinks, W = self.window, C = self.clusters, P = self.positions, R = self.rows
        cdef Py_ssize_t kv = self.kv_dim, hd = self.head_dim
        memcpy(self.keys + (layer * P + pos) * kv, k, kv * sizeof(float))
        memcpy(self.values + (layer * P + pos) * kv, v, kv * sizeof(float))
        self.length[layer] = pos + 1

        # position pos - W leaves the window and joins the middle
        cdef bint joined = pos >= S + W
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
        kept_span(pos, S, W, &n_sink, &ring_start, &n_ring)
        cdef float inv_scale = 1.0 / sqrtf(<float>hd)
        cdef int h, gh
        cdef long long i, j, c, a, n, n_order, n_sel, chosen, n_est, base, p
        cdef int32_t key_c
        cdef float key_s
        cdef Py_ssize_t off
        cdef const float** kp
        cdef const float** vp
        cdef float* bias
        cdef float* cs
        cdef int32_t* order
        cdef uint8_t* mark
        cdef long long* sel
        cdef int32_t* nxt
        cdef const float* qh
        # rows attended per head: everything, or sinks + window + about the budget (+ estimates)
        cdef long long work = (pos + 1 if not need else n_sink + n_ring + 2 * self.budget + C) * self.n_heads * hd
        for h in prange(self.n_heads, schedule="static", num_threads=threads_for(self.n_threads, work)):
            gh = h // self.kv_mul
            off = gh * hd
            qh = q + h * hd
            kp = self.kptr + h * R
            vp = self.vptr + h * R
            bias = self.bias + h * R
            n_est = 0
            if not need:  # every position, in order: exactly causal's rows
                for i in range(pos + 1):
                    kp[i] = self.keys + (layer * P + i) * kv + off
                    vp[i] = self.values + (layer * P + i) * kv + off
                n = pos + 1
                self.last[h * 2] = -1
            else:
                base = (layer * self.n_kv_heads + gh) * C
                cs = self.cscore + h * C
                order = self.corder + h * C
                mark = self.cmark + h * C
                # non-empty clusters in descending score (ties: lower index first)
                n_order = 0
                for c in range(C):
                    mark[c] = 0
                    if self.csize[base + c] == 0:
                        continue
                    cs[c] = dot_f32(qh, self.cent + (base + c) * hd, hd) * inv_scale
                    if self.size_bias:
                        cs[c] = cs[c] + logf(<float>self.csize[base + c])
                    key_c = <int32_t>c
                    key_s = cs[c]
                    a = n_order
                    while a > 0 and cs[order[a - 1]] < key_s:
                        order[a] = order[a - 1]
                        a = a - 1
                    order[a] = key_c
                    n_order = n_order + 1
                # whole clusters until the budget is filled, then their members in position order
                sel = self.sel + h * P
                nxt = self.nxt + (layer * self.n_kv_heads + gh) * P
                n_sel = 0
                chosen = 0
                for a in range(n_order):
                    if chosen >= self.budget:
                        break
                    c = order[a]
                    mark[c] = 1
                    chosen = chosen + self.csize[base + c]
                    p = self.chead[base + c]
                    while p >= 0:
                        sel[n_sel] = p
                        n_sel = n_sel + 1
                        p = nxt[p]
                qsort(sel, n_sel, sizeof(long long), cmp_position)
                for i in range(n_sink):
                    kp[i] = self.keys + (layer * P + i) * kv + off
                    vp[i] = self.values + (layer * P + i) * kv + off
                    bias[i] = 0.0
                j = n_sink
                for i in range(n_sel):
                    kp[j + i] = self.keys + (layer * P + sel[i]) * kv + off
                    vp[j + i] = self.values + (layer * P + sel[i]) * kv + off
                    bias[j + i] = 0.0
                j = j + n_sel
                for i in range(n_ring):  # ascending positions ring_start .. pos
                    kp[j + i] = self.keys + (layer * P + ring_start + i) * kv + off
                    vp[j + i] = self.values + (layer * P + ring_start + i) * kv + off
                    bias[j + i] = 0.0
                j = j + n_ring
                if self.estimate:  # each cluster left out as one row: centroid, mean value, log(size)
                    for a in range(n_order):
                        c = order[a]
                        if mark[c]:
                            continue
                        kp[j + n_est] = self.cent + (base + c) * hd
                        vp[j + n_est] = self.cval + (base + c) * hd
                        bias[j + n_est] = logf(<float>self.csize[base + c])
                        n_est = n_est + 1
                n = j + n_est
                self.last[h * 2] = n_sel
            self.last[h * 2 + 1] = n_est
            self.attend_gathered(h, q, bias if n_est > 0 else NULL, n, out)
        self.last_layer = layer
        self.last_pos = pos
        return 0
