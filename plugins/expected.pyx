"""``expected``: Expected Attention, the attention future queries are expected to give each row.

Devoto, Jeblick, Jégou, "Expected Attention: KV Cache Compression by Estimating Attention from Future
Queries Distribution" (2025, arXiv:2510.00636). kvpress: ``ExpectedAttentionPress``; KVCache-Factory:
none.

Rule. At a compression after position t, per query head: the mean mu and the covariance S (divided by
N) of the pre-RoPE queries of positions ``sinks`` .. t, both turned by the mean rotation R of the
future positions t + 1 .. t + ``future`` (the mean cos and sin of each rotated pair, in the model's pair
layout: ``mu' = R mu``, ``S' = R S R^T``, as kvpress averages the RoPE matrices). For every held
non-sink row, ``z = mu'.k / sqrt(hd) + k^T S' k / (2 hd)``, a softmax over those rows, the mean over the
KV head's query group, then ``(score + epsilon) * ||v||``; ``covariance=false`` drops the second term.
All in float64 (``k^T S' k`` as ``(R^T k)^T S (R^T k)``, the same form). Per KV head the target
(``ratio`` of the held rows removed, or ``capacity`` kept) is met by evicting the lowest scores, the
older first among equals; ``sinks`` and ``window`` are never evicted. The statistics run over every
query since the sinks, so a compression during decoding (``every``) sees the question and the answer
so far. Exact until the event (``compress``).

State: the row store's rows plus, per layer and query head, the running sums of the pre-RoPE queries
(head_dim float64) and of their products q_i q_j, i <= j (head_dim (head_dim + 1) / 2 float64, with
``covariance``), from which mu and S are formed at a compression: counted by the ledger once the layer
has seen a position. The queries are added position by position in order, so ``start_from`` gives the
same bits as running from position 0.
"""

from libc.math cimport cos, exp, pow, sin, sqrt

import numpy as np

from pyllama.attention.event cimport EventAttention
from pyllama.attention.rows cimport dot_lanes, dot_lanes_f64

from pyllama.attention.budget import CAPACITY, EVERY, RATIO, sinks_knob, window_knob
from pyllama.attention.dense import POSITIONS
from pyllama.attention.spec import Knob, check_knobs
from pyllama.config import ROPE_NEOX
from pyllama.errors import PluginError


cdef class Expected(EventAttention):
    name = "expected"
    description = "Expected Attention: at the event, keep the rows future queries should attend (again every N)"
    knobs = (
        RATIO,
        CAPACITY,
        sinks_knob(4),
        window_knob(0),
        Knob("future", int, 512, "future positions whose mean rotation turns the query statistics", min=1),
        Knob("epsilon", float, 0.0, "added to the expected attention before it multiplies the value norm", min=0.0),
        Knob("covariance", bool, True, "include the queries' covariance (the second-order term)"),
        EVERY,
        POSITIONS,
    )
    wants_pre_rope_query = True

    cdef readonly long long future
    cdef readonly double epsilon
    cdef readonly bint covariance
    cdef int tri, n_pairs, neox
    cdef double theta
    cdef double* sums        # [n_layers, n_heads, head_dim] the sum of the pre-RoPE queries since the sinks
    cdef double* products    # [n_layers, n_heads, tri] the sum of their products q_i q_j, i <= j (covariance)
    cdef double* turn        # [2, n_pairs] mean cos and sin of the future positions (one compression's)

    def __init__(self, ratio: float = 0.5, capacity: int = 0, sinks: int = 4, window: int = 0, future: int = 512,
                 epsilon: float = 0.0, covariance: bool = True, every: int = 0, positions: int = 0):
        check_knobs(self, ratio=ratio, capacity=capacity, sinks=sinks, window=window, future=future, epsilon=epsilon,
                    covariance=covariance, every=every, positions=positions)
        self.set_event_budget(ratio, capacity, window, sinks, every, positions)
        self.future, self.epsilon, self.covariance = future, epsilon, covariance

    def scratch_per_head(self, config):
        # per KV head: a turned key and S times it, the group's means and covariances, their z per row
        hd, group = config.head_dim, config.kv_mul
        return 2 * hd + group * (hd + hd * hd) + group * int(self.max_positions)

    def statistics_bytes(self, config):
        hd = config.head_dim
        return config.n_heads * 8 * (hd + (hd * (hd + 1) // 2 if self.covariance else 0))

    def planned_bytes(self, config):
        statistics = config.n_layers * self.statistics_bytes(config) + config.n_rot * 8  # and the mean turn
        return EventAttention.planned_bytes(self, config) + statistics

    def init(self, config, pool):
        EventAttention.init(self, config, pool)
        hd = config.head_dim
        self.tri = hd * (hd + 1) // 2
        self.n_pairs = config.n_rot // 2
        self.neox = config.rope_style == ROPE_NEOX
        self.theta = config.rope_theta
        L, H = config.n_layers, config.n_heads
        self.sums = <double*>self.own(np.zeros((L, H, hd), dtype=np.float64))
        self.products = <double*>self.own(np.zeros((L, H, self.tri if self.covariance else 1), dtype=np.float64))
        self.turn = <double*>self.own(np.zeros(2 * max(self.n_pairs, 1), dtype=np.float64))

    def reset(self):
        super().reset()
        if self._owned:
            np.asarray(<double[:self.n_layers * self.n_heads * self.head_dim]>self.sums)[:] = 0.0
            if self.covariance:
                np.asarray(<double[:self.n_layers * self.n_heads * self.tri]>self.products)[:] = 0.0

    cdef long long state_bytes_of(self, int layer):
        # the running sums of the queries (and of their products) once the layer has seen a position
        if self.length[layer] == 0:
            return 0
        return self.n_heads * 8 * (self.head_dim + (self.tri if self.covariance else 0))

    cdef int observe(self, int layer, long long pos, const float* q, const float* q_pre) except -1 nogil:
        cdef int h, i, j, hd = self.head_dim
        cdef double* total
        cdef double* product
        cdef const float* x
        if pos < self.sinks:
            return 0
        if q_pre == NULL:
            with gil:
                raise PluginError("expected: no queries before RoPE were given (the engine gives them to a plugin that "
                                  "declares wants_pre_rope_query; start_from needs queries_pre_rope)")
        for h in range(self.n_heads):
            x = q_pre + h * hd
            total = self.sums + (layer * self.n_heads + h) * hd
            for i in range(hd):
                total[i] = total[i] + x[i]
            if self.covariance:
                product = self.products + (layer * self.n_heads + h) * self.tri
                for i in range(hd):
                    for j in range(i, hd):
                        product[0] = product[0] + <double>x[i] * x[j]
                        product += 1
        return 0

    cdef int prepare(self, int layer, long long pos) except -1 nogil:
        """The mean cos and sin of each pair's angle over positions pos + 1 .. pos + future."""
        cdef int i
        cdef long long p
        cdef double freq, c, s
        for i in range(self.n_pairs):
            freq = pow(self.theta, -2.0 * i / (2 * self.n_pairs))
            c = 0.0
            s = 0.0
            for p in range(pos + 1, pos + 1 + self.future):
                c = c + cos(p * freq)
                s = s + sin(p * freq)
            self.turn[i] = c / self.future
            self.turn[self.n_pairs + i] = s / self.future
        return 0

    cdef void event_scores(self, int layer, long long pos, int g, long long n, double* score) noexcept nogil:
        cdef int hd = self.head_dim, group = self.kv_mul, a
        cdef long long N = self.length[layer] - self.sinks, r
        cdef double* key = self.work + g * self.work_size         # a row's key turned by R^T
        cdef double* turned = key + hd                            # S times it
        cdef double* mean = turned + hd                           # [group, hd]
        cdef double* cov = mean + group * hd                      # [group, hd, hd] S
        cdef double* z = cov + group * hd * hd                    # [group, P]
        if N <= 0:  # every row is a sink: nothing to rank
            for r in range(n):
                score[r] = 0.0
            return
        self.statistics(layer, g, N, mean, cov)
        for r in range(n):
            if self.held[self.row_of(layer, g) + r] < self.sinks:
                continue
            self.turned_key(self.keys + (self.row_of(layer, g) + r) * hd, key)
            for a in range(group):
                z[a * self.P + r] = self.exponent(mean + a * hd, cov + a * hd * hd, key, turned)
        self.expected_weights(layer, g, n, z, score)

    cdef void statistics(self, int layer, int g, long long N, double* mean, double* cov) noexcept nogil:
        """The group's query means and (1/N) covariances S = sum q q^T / N - mu mu^T (full, symmetric)."""
        cdef int hd = self.head_dim, a, i, j, h
        cdef const double* product
        cdef double* c
        for a in range(self.kv_mul):
            h = g * self.kv_mul + a
            for i in range(hd):
                mean[a * hd + i] = self.sums[(layer * self.n_heads + h) * hd + i] / N
            if not self.covariance:
                continue
            product = self.products + (layer * self.n_heads + h) * self.tri
            c = cov + a * hd * hd
            for i in range(hd):
                for j in range(i, hd):
                    c[i * hd + j] = product[0] / N - mean[a * hd + i] * mean[a * hd + j]
                    c[j * hd + i] = c[i * hd + j]
                    product += 1

    cdef void turned_key(self, const float* k, double* out) noexcept nogil:
        """R^T k: each rotated pair (a, b) turned back by the mean rotation; the other dims as they are."""
        cdef int i, x, y
        cdef double c, s
        for i in range(self.head_dim):
            out[i] = k[i]
        for i in range(self.n_pairs):
            x = i if self.neox else 2 * i
            y = i + self.n_pairs if self.neox else 2 * i + 1
            c, s = self.turn[i], self.turn[self.n_pairs + i]
            out[x] = c * k[x] + s * k[y]
            out[y] = -s * k[x] + c * k[y]

    cdef double exponent(self, const double* mean, const double* cov, const double* key,
                         double* turned) noexcept nogil:
        """mu'.k / sqrt(hd) + k^T S' k / hd / 2, with key = R^T k (turned: scratch for S key)."""
        cdef int hd = self.head_dim, i, j
        cdef double linear = dot_lanes_f64(mean, key, hd) / sqrt(<double>hd)
        cdef const double* row
        if not self.covariance:
            return linear
        for i in range(hd):
            turned[i] = 0.0
        for j in range(hd):  # S key, a column at a time (each element its own sum: vectors across i)
            row = cov + j * hd
            for i in range(hd):
                turned[i] = turned[i] + row[i] * key[j]
        return linear + dot_lanes_f64(key, turned, hd) / hd / 2

    cdef void expected_weights(self, int layer, int g, long long n, const double* z, double* score) noexcept nogil:
        """Per query head the softmax of z over the non-sink rows, their group mean, times the value norm."""
        cdef const long long* held = self.held + self.row_of(layer, g)
        cdef const float* value
        cdef long long r
        cdef int a, group = self.kv_mul
        cdef double top, norm
        for r in range(n):
            score[r] = 0.0
        for a in range(group):
            top = -1e308
            for r in range(n):
                if held[r] >= self.sinks:
                    top = max(top, z[a * self.P + r])
            norm = 0.0
            for r in range(n):
                if held[r] >= self.sinks:
                    norm = norm + exp(z[a * self.P + r] - top)
            for r in range(n):
                if held[r] >= self.sinks:
                    score[r] = score[r] + exp(z[a * self.P + r] - top) / norm
        for r in range(n):
            if held[r] < self.sinks:
                continue
            value = self.values + (self.row_of(layer, g) + r) * self.head_dim
            score[r] = (score[r] / group + self.epsilon) * sqrt(dot_lanes(value, value, self.head_dim))
