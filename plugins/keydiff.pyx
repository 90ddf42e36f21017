"""``keydiff``: keep the keys least similar to the mean key direction.

Park et al., "KeyDiff: Key Similarity-Based KV Cache Eviction for Long-Context LLM Inference in
Resource-Constrained Environments" (2025, arXiv:2504.15364). kvpress: ``KeyDiffPress``;
KVCache-Factory: none.

Rule. At a compression, per KV head, the anchor is the mean over all its held keys of ``k / ||k||``;
a held row's score is minus the cosine between its key and the anchor (float64; a zero key, or a zero
anchor, scores 0). The target (``ratio`` of the held rows removed, or ``capacity`` kept) is met by
evicting the keys most like the anchor, the older first among equal scores; ``sinks`` and ``window``
are never evicted. The paper compresses block by block as the prompt arrives; ``every=N`` is that
schedule. Exact until the event (``compress``).

State: the row store's rows only.
"""

from libc.math cimport sqrt

from pyllama.attention.event cimport EventAttention
from pyllama.attention.rows cimport dot_lanes

from pyllama.attention.event import EVENT_KNOBS


cdef class KeyDiff(EventAttention):
    name = "keydiff"
    description = "KeyDiff: at the event, keep the keys least similar to the mean key direction (again every N)"
    knobs = EVENT_KNOBS  # and the base's constructor

    def scratch_per_head(self, config):
        return config.head_dim + int(self.max_positions)  # the anchor, the key norms

    cdef void event_scores(self, int layer, long long pos, int g, long long n, double* score) noexcept nogil:
        cdef int i, hd = self.head_dim
        cdef long long r
        cdef const float* keys = self.keys + self.row_of(layer, g) * hd
        cdef const float* key
        cdef double* anchor = self.work + g * self.work_size
        cdef double* norms = anchor + hd
        cdef double total, anchor_norm = 0.0
        for i in range(hd):
            anchor[i] = 0.0
        for r in range(n):
            key = keys + r * hd
            norms[r] = sqrt(dot_lanes(key, key, hd))
            if norms[r] > 0:
                for i in range(hd):
                    anchor[i] = anchor[i] + key[i] / norms[r]
        for i in range(hd):
            anchor[i] = anchor[i] / n
            anchor_norm = anchor_norm + anchor[i] * anchor[i]
        anchor_norm = sqrt(anchor_norm)
        for r in range(n):
            key = keys + r * hd
            total = 0.0
            for i in range(hd):
                total = total + key[i] * anchor[i]
            score[r] = -total / (norms[r] * anchor_norm) if norms[r] * anchor_norm > 0 else 0.0
