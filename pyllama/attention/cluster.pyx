"""Seeded k-means over cached key rows, for memories that cluster keys (``kmeans``).

``cluster_rows`` clusters the keys of positions first .. first + m - 1: k-means++ picks
``min(n, m)`` centroids (the first uniformly, then each with probability proportional to its squared
distance D^2 from the nearest centroid so far), then ``iters`` Lloyd steps (assign each key to the
nearest centroid in squared Euclidean distance, move each centroid to the mean of its members). It
also builds each cluster's member list in ascending position order, and with ``cval`` set the mean
value of each cluster. ``add_member`` puts one more position in its nearest non-empty cluster,
whose centroid follows as a running mean. ``rank_clusters`` orders the clusters for a query, as
``kmeans`` chooses them. The random numbers come from a xorshift64* generator
(cluster.pxd) whose state the caller seeds, so a clustering does not depend on the thread count.
"""

from libc.math cimport logf, sqrtf
from libc.string cimport memcpy

from pyllama.kernels.matvec cimport dot_f32


cdef int nearest(const Clusters* cl, const float* x, long long n_valid) noexcept nogil:
    """Nearest centroid of ``x`` among the first ``n_valid`` (only non-empty ones when -1)."""
    cdef long long c
    cdef float d, best_d = 0.0
    cdef int best = -1
    for c in range(cl.n if n_valid < 0 else n_valid):
        if n_valid < 0 and cl.size[c] == 0:
            continue
        # |x - μ|^2 - |x|^2 = |μ|^2 - 2 x·μ: the same order of candidates
        d = cl.cnorm[c] - 2.0 * dot_f32(x, cl.cent + c * cl.dim, cl.dim)
        if best < 0 or d < best_d:
            best = <int>c
            best_d = d
    return best


cdef void seed_centroids(Clusters* cl, ClusterScratch* w, const float* keys, Py_ssize_t stride, long long first,
                         long long m, long long k, uint64_t* state) noexcept nogil:
    """k-means++: the first centroid uniformly, then each with probability proportional to D^2."""
    cdef Py_ssize_t hd = cl.dim
    cdef long long i, c, pick
    cdef const float* x
    cdef float dd
    cdef double total, r, acc
    for i in range(m):
        x = keys + (first + i) * stride
        w.xnorm[i] = dot_f32(x, x, hd)
    pick = <long long>(xorshift64s(state) % <uint64_t>m)
    for c in range(k):
        if c > 0:
            total = 0.0
            for i in range(m):
                total = total + w.dist[i]
            if total > 0.0:
                r = uniform01(state) * total
                acc = 0.0
                pick = m - 1
                for i in range(m):
                    acc = acc + w.dist[i]
                    if acc > r and w.dist[i] > 0.0:
                        pick = i
                        break
            else:
                pick = <long long>(xorshift64s(state) % <uint64_t>m)
        memcpy(cl.cent + c * hd, keys + (first + pick) * stride, hd * sizeof(float))
        cl.cnorm[c] = w.xnorm[pick]
        for i in range(m):
            x = keys + (first + i) * stride
            dd = w.xnorm[i] + cl.cnorm[c] - 2.0 * dot_f32(x, cl.cent + c * hd, hd)
            if dd < 0.0:
                dd = 0.0
            if c == 0 or dd < w.dist[i]:
                w.dist[i] = dd


cdef void cluster_rows(Clusters* cl, ClusterScratch* w, const float* keys, const float* values, Py_ssize_t stride,
                       long long first, long long m, long long iters, uint64_t state) noexcept nogil:
    """Cluster the keys of positions first .. first + m - 1 (row p at keys + p * stride; values alike,
    read only when ``cl.cval`` is set); ``state``: the generator's seed (nonzero)."""
    cdef long long C = cl.n, K = cl.n if cl.n < m else m
    cdef Py_ssize_t hd = cl.dim, d
    cdef long long i, c, _it
    cdef const float* x
    seed_centroids(cl, w, keys, stride, first, m, K, &state)
    # Lloyd: assign, then move each centroid to the mean of its members
    for _it in range(iters):
        for c in range(K):
            w.cnt[c] = 0
            for d in range(hd):
                w.sums[c * hd + d] = 0.0
        for i in range(m):
            x = keys + (first + i) * stride
            c = nearest(cl, x, K)
            cl.assign[first + i] = <int32_t>c
            w.cnt[c] += 1
            for d in range(hd):
                w.sums[c * hd + d] += x[d]
        for c in range(K):
            if w.cnt[c] > 0:
                for d in range(hd):
                    cl.cent[c * hd + d] = <float>(w.sums[c * hd + d] / <double>w.cnt[c])
                cl.cnorm[c] = dot_f32(cl.cent + c * hd, cl.cent + c * hd, hd)
    for c in range(C):
        cl.size[c] = w.cnt[c] if c < K else 0
    if cl.cval != NULL:
        for c in range(K):
            for d in range(hd):
                w.vsums[c * hd + d] = 0.0
        for i in range(m):
            c = cl.assign[first + i]
            x = values + (first + i) * stride
            for d in range(hd):
                w.vsums[c * hd + d] += x[d]
        for c in range(K):
            if w.cnt[c] > 0:
                for d in range(hd):
                    cl.cval[c * hd + d] = <float>(w.vsums[c * hd + d] / <double>w.cnt[c])


cdef void add_member(Clusters* cl, const float* key, const float* value, long long p) noexcept nogil:
    """Position ``p`` joins its nearest non-empty cluster, which moves to the new running mean
    (its mean value too when ``cl.cval`` is set)."""
    cdef Py_ssize_t hd = cl.dim, d
    cdef int c = nearest(cl, key, -1)
    cdef long long n = cl.size[c] + 1
    cdef float fn = <float>n
    cdef float* mu = cl.cent + c * hd
    cdef float* mv
    for d in range(hd):
        mu[d] = mu[d] + (key[d] - mu[d]) / fn
    cl.cnorm[c] = dot_f32(mu, mu, hd)
    if cl.cval != NULL:
        mv = cl.cval + c * hd
        for d in range(hd):
            mv[d] = mv[d] + (value[d] - mv[d]) / fn
    cl.size[c] = n
    cl.assign[p] = c


cdef long long rank_clusters(const Clusters* cl, const float* q, bint size_bias, float* score, int32_t* order,
                             uint8_t* mark) noexcept nogil:
    """The non-empty clusters in descending score for query q (ties: lower index first; an insertion
    sort of a few dozen) in order[0 ..]: q·μ / sqrt(dim), with size_bias + log(size); every mark
    cleared. Returns how many."""
    cdef long long c, a, n = 0
    cdef float inv_scale = 1.0 / sqrtf(<float>cl.dim), s
    for c in range(cl.n):
        mark[c] = 0
        if cl.size[c] == 0:
            continue
        score[c] = dot_f32(q, cl.cent + c * cl.dim, cl.dim) * inv_scale
        if size_bias:
            score[c] = score[c] + logf(<float>cl.size[c])
        s = score[c]
        a = n
        while a > 0 and score[order[a - 1]] < s:
            order[a] = order[a - 1]
            a = a - 1
        order[a] = <int32_t>c
        n = n + 1
    return n
