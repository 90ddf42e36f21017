"""SnapKV's score: the attention the last ``window`` queries give each held row, pooled over neighbours.

Li et al., "SnapKV: LLM Knows What You are Looking for Before Generation" (2024, arXiv:2404.14469);
PyramidKV and AdaKV (with ``scorer=snapkv``) score the same way, so the score lives here and
``plugins/snapkv.pyx``, ``plugins/pyramidkv.pyx`` say what each keeps.

The observation queries of a compression after position t are positions t - window + 1 .. t (the
protected window). Each layer keeps the post-RoPE queries of its last ``window`` positions (``seen``,
a ring of window x q_dim floats per layer, counted by the ledger). At a compression each observation
query's softmax is recomputed in float64 over the rows held then that are at or before it (at the
event: everything before it, exactly what it attended). Per KV head: the sum over the observation
queries of their weights on each candidate (the query heads of the group in ascending order, the
queries in position order), divided by the group size (the mean over the group), then pooled over its
neighbours among the candidates in position order: ``pool=avg`` is torch's ``avg_pool1d`` (zero padding
counted, divided by the kernel), ``pool=max`` its ``max_pool1d``, stride 1, ``kernel`` odd. The
official SnapKV, kvpress and KVCache-Factory all default to average pooling with kernel 5.
"""

from libc.math cimport exp, sqrt
from libc.string cimport memcpy

import numpy as np

from pyllama.attention.rows cimport dot_lanes, is_protected

from pyllama.attention.spec import Knob
from pyllama.errors import PluginError

OBSERVED_KNOBS = (
    Knob("kernel", int, 5, "neighbours pooled, odd (1: no pooling)", min=1),
    Knob("pool", ("avg", "max"), "avg", "pooling of the neighbours' scores: torch's avg_pool1d or max_pool1d"),
)


cdef class ObservedAttention(EventAttention):
    """SnapKV's score on the event base (see the module docstring)."""

    def set_observed(self, kernel, pool):
        if kernel % 2 == 0:
            raise PluginError(f"{type(self).name}: kernel={kernel} is even: the pooling window is centred, give an "
                              "odd kernel (5 is SnapKV's)")
        if self.window < 1:
            raise PluginError(f"{type(self).name}: window={self.window} leaves no observation query: give window >= 1")
        self.kernel, self.pool, self.max_pool = kernel, pool, pool == "max"

    def scratch_per_head(self, config):
        return 3 * int(self.max_positions)  # sums, one query's weights, the candidates' scores

    def planned_bytes(self, config):
        return EventAttention.planned_bytes(self, config) + config.n_layers * int(self.window) * config.q_dim * 4

    def init(self, config, pool):
        EventAttention.init(self, config, pool)
        self.seen = <float*>self.own(np.zeros((config.n_layers, self.window, config.q_dim), dtype=np.float32))

    cdef long long state_bytes_of(self, int layer):
        # the observation queries kept: the last window positions' post-RoPE queries
        return min(self.window, self.length[layer]) * self.n_heads * self.head_dim * 4

    cdef int observe(self, int layer, long long pos, const float* q, const float* q_pre) except -1 nogil:
        cdef Py_ssize_t q_dim = self.n_heads * self.head_dim
        if q == NULL:
            with gil:
                raise PluginError(f"{type(self).name}: start_from needs the queries (its observation window)")
        memcpy(self.seen + (layer * self.window + pos % self.window) * q_dim, q, q_dim * sizeof(float))
        return 0

    cdef void event_scores(self, int layer, long long pos, int g, long long n, double* score) noexcept nogil:
        cdef int hd = self.head_dim, h
        cdef Py_ssize_t q_dim = self.n_heads * hd, P = self.P
        cdef const float* keys = self.keys + self.row_of(layer, g) * hd
        cdef const long long* held = self.held + self.row_of(layer, g)
        cdef double* total = self.work + g * self.work_size
        cdef double* weight = total + P
        cdef double* candidate = weight + P
        cdef const float* query
        cdef long long r, j, visible, c = 0
        cdef double top, norm, scale = sqrt(<double>hd)
        for r in range(n):
            total[r] = 0.0
        for h in range(g * self.kv_mul, (g + 1) * self.kv_mul):
            visible = 0
            for j in range(max(pos - self.window + 1, 0), pos + 1):
                while visible < n and held[visible] <= j:  # the rows held that query j sees
                    visible += 1
                query = self.seen + (layer * self.window + j % self.window) * q_dim + h * hd
                top = -1e308
                for r in range(visible):
                    weight[r] = dot_lanes(query, keys + r * hd, hd) / scale
                    top = max(top, weight[r])
                norm = 0.0
                for r in range(visible):
                    weight[r] = exp(weight[r] - top)
                    norm = norm + weight[r]
                for r in range(visible):
                    total[r] = total[r] + weight[r] / norm
        for r in range(n):
            if not is_protected(held[r], pos, self.sinks, self.window):
                candidate[c] = total[r] / self.kv_mul
                c += 1
        self.pool_candidates(candidate, c, weight)
        c = 0
        for r in range(n):
            if is_protected(held[r], pos, self.sinks, self.window):
                score[r] = 0.0
            else:
                score[r] = weight[c]
                c += 1

    cdef void pool_candidates(self, const double* x, long long n, double* out) noexcept nogil:
        """out[i]: x pooled over i - kernel // 2 .. i + kernel // 2 (avg: zeros outside, / kernel; max)."""
        cdef long long i, d, half = self.kernel // 2
        cdef double acc
        for i in range(n):
            acc = -1e308 if self.max_pool else 0.0
            for d in range(max(i - half, 0), min(i + half + 1, n)):
                acc = max(acc, x[d]) if self.max_pool else acc + x[d]
            out[i] = acc if self.max_pool else acc / self.kernel
