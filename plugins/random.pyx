"""``random``: seeded random eviction, the control every KV-cache comparison reports.

No paper: kvpress's baseline (``RandomPress``); KVCache-Factory: none.

Rule. At the e-th compression of layer l, each held row of KV head g at position p draws the score
``splitmix64`` chained over (seed, l, g, e, p): h = splitmix64(seed), then h = splitmix64(h ^ part)
for each part, the top 53 bits as a float64 (exact). Per KV head the target (``ratio`` of the held
rows removed, or ``capacity`` kept) is met by evicting the lowest draws; ``sinks`` and ``window`` are
never evicted. Every compression draws afresh; the draws depend on nothing else (not on the thread
count, nor on the order in which heads are scored). Exact until the event (``compress``).

State: the row store's rows only.
"""

from libc.stdint cimport uint64_t

from pyllama.attention.cluster cimport splitmix64
from pyllama.attention.event cimport EventAttention

from pyllama.attention.budget import CAPACITY, EVERY, RATIO, sinks_knob, window_knob
from pyllama.attention.dense import POSITIONS
from pyllama.attention.spec import Knob, check_knobs


cdef class RandomEviction(EventAttention):
    name = "random"
    description = "random: at the event, evict a seeded random share of each KV head's rows (the control)"
    knobs = (
        RATIO,
        CAPACITY,
        Knob("seed", int, 0, "seed of the draws", min=0, max=2**63 - 1),
        window_knob(0),
        sinks_knob(0),
        EVERY,
        POSITIONS,
    )

    cdef readonly long long seed

    def __init__(self, ratio: float = 0.5, capacity: int = 0, seed: int = 0, window: int = 0, sinks: int = 0,
                 every: int = 0, positions: int = 0):
        check_knobs(self, ratio=ratio, capacity=capacity, seed=seed, window=window, sinks=sinks, every=every,
                    positions=positions)
        self.set_event_budget(ratio, capacity, window, sinks, every, positions)
        self.seed = seed

    cdef void event_scores(self, int layer, long long pos, int g, long long n, double* score) noexcept nogil:
        cdef const long long* held = self.held + self.row_of(layer, g)
        cdef uint64_t head = splitmix64(splitmix64(splitmix64(splitmix64(<uint64_t>self.seed) ^ <uint64_t>layer)
                                                   ^ <uint64_t>g) ^ <uint64_t>self.events[layer])
        cdef long long r
        for r in range(n):
            score[r] = <double>(splitmix64(head ^ <uint64_t>held[r]) >> 11)
