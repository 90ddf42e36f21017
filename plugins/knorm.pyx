"""``knorm``: keep the keys of smallest L2 norm.

Devoto et al., "A Simple and Effective L2 Norm-Based Strategy for KV Cache Compression", EMNLP 2024
(arXiv:2406.11430). kvpress: ``KnormPress``; KVCache-Factory: ``l2norm`` (``L2NormCluster``).

Rule. At a compression, a held row's score is minus the L2 norm of its key (float64); per KV head the
target (``ratio`` of the held rows removed, or ``capacity`` kept) is met by evicting the largest norms,
the older first among equal norms; ``sinks`` and ``window`` are never evicted. KVCache-Factory leaves
layers 0 and 1 uncompressed; kvpress and this plugin compress every layer. Exact until the event
(``compress``), again every ``every`` positions after it.

State: the row store's rows only.
"""

from libc.math cimport sqrt

from pyllama.attention.event cimport EventAttention
from pyllama.attention.rows cimport dot_lanes

from pyllama.attention.event import EVENT_KNOBS


cdef class KNorm(EventAttention):
    name = "knorm"
    description = "KNorm: at the event, keep the keys of smallest L2 norm per KV head (again every N with every)"
    knobs = EVENT_KNOBS  # and the base's constructor

    cdef void event_scores(self, int layer, long long pos, int g, long long n, double* score) noexcept nogil:
        cdef const float* keys = self.keys + self.row_of(layer, g) * self.head_dim
        cdef long long r
        for r in range(n):
            score[r] = -sqrt(dot_lanes(keys + r * self.head_dim, keys + r * self.head_dim, self.head_dim))
