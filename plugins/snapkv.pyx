"""``snapkv``: keep the positions the last context queries attend, with their neighbours.

Li et al., "SnapKV: LLM Knows What You are Looking for Before Generation", NeurIPS 2024
(arXiv:2404.14469). kvpress: ``SnapKVPress``; KVCache-Factory: ``snapkv`` (``SnapKVCluster``).

Rule. At a compression after position t, the observation queries are the last ``window`` positions
(t - window + 1 .. t, never evicted). A held row's score is the sum over the observation queries of
their softmax weights on it (recomputed in float64 over the rows held that each query sees), the
mean over the KV head's query group, pooled over its neighbours among the candidates (``pool=avg``,
``kernel=5``: torch's ``avg_pool1d``; ``pool=max``: ``max_pool1d``). Per KV head the target
(``ratio`` of the held rows removed, or ``capacity`` kept) is met by evicting the lowest pooled
scores, the older first among equals; ``sinks`` are never evicted either. kvpress averages the
observation weights instead of summing them and pools before the group mean, which ranks the same
for average pooling. Exact until the event (``compress``), again every ``every`` positions after it.
The score is ``pyllama.attention.observed``'s, shared with ``pyramidkv`` and ``adakv``.

State: the row store's rows plus each layer's last ``window`` post-RoPE queries (window x q_dim x 4
bytes per layer, counted by the ledger).
"""

from pyllama.attention.observed cimport ObservedAttention

from pyllama.attention.budget import CAPACITY, EVERY, RATIO, sinks_knob, window_knob
from pyllama.attention.dense import POSITIONS
from pyllama.attention.observed import OBSERVED_KNOBS
from pyllama.attention.spec import check_knobs


cdef class SnapKV(ObservedAttention):
    name = "snapkv"
    description = "SnapKV: at the event, keep what the last window queries attend, pooled (again every N)"
    knobs = (RATIO, CAPACITY, window_knob(64, ", and the observation queries"), *OBSERVED_KNOBS, sinks_knob(0),
             EVERY, POSITIONS)

    def __init__(self, ratio: float = 0.5, capacity: int = 0, window: int = 64, kernel: int = 5, pool: str = "avg",
                 sinks: int = 0, every: int = 0, positions: int = 0):
        check_knobs(self, ratio=ratio, capacity=capacity, window=window, kernel=kernel, pool=pool, sinks=sinks,
                    every=every, positions=positions)
        self.set_event_budget(ratio, capacity, window, sinks, every, positions)
        self.set_observed(kernel, pool)
