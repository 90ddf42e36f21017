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

from pyllama.attention.budget import CAPACITY, EVERY, RATIO, sinks_knob, window_knob
from pyllama.attention.dense import POSITIONS
from pyllama.attention.memory import require_memory
from pyllama.attention.spec import check_knobs


cdef class KeyDiff(EventAttention):
    name = "keydiff"
    description = "KeyDiff: at the event, keep the keys least similar to the mean key direction (again every N)"
    knobs = (RATIO, CAPACITY, window_knob(0), sinks_knob(0), EVERY, POSITIONS)

    def __init__(self, ratio: float = 0.5, capacity: int = 0, window: int = 0, sinks: int = 0, every: int = 0,
                 positions: int = 0):
        check_knobs(self, ratio=ratio, capacity=capacity, window=window, sinks=sinks, every=every,
                    positions=positions)
        self.set_event_budget(ratio, capacity, window, sinks, every, positions)

    def scratch_per_head(self, config):
        return config.head_dim + int(self.max_positions)  # the anchor, the key norms

    def planned_bytes(self, config):
        return self.event_bytes(config, self.scratch_per_head(config))

    def init(self, config, pool):
        require_memory("keydiff", f"positions={int(self.max_positions):,}", self.planned_bytes(config))
        self.init_event(config, self.scratch_per_head(config))

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
