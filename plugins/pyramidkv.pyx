"""``pyramidkv``: SnapKV's scores with budgets that decrease linearly with depth.

Cai et al., "PyramidKV: Dynamic KV Cache Compression based on Pyramidal Information Funneling"
(2024, arXiv:2406.02069). kvpress: ``PyramidKVPress``; KVCache-Factory: ``pyramidkv``
(``PyramidKVCluster``).

Rule. SnapKV's score (``pyllama.attention.observed``: the observation window's attention, pooled),
and KVCache-Factory's budget for layer l of L, with n rows held, C the capacity (or, with a ratio,
``ceil((1 - ratio) n)``, so that the layers average about the ratio) and w the window: no
compression if n < C; C if C <= w; else ``min = (C - w) // beta``, ``max = 2(C - w) - min``; if
``max >= n - w`` then ``max = n - w``, ``min = 2(C - w) - max``; ``steps = (max - min) // (L - 1)``;
the layer keeps ``w + (C - w)`` if ``n < 2(C - w)``, else ``w + max - l * steps``. Deeper layers keep
fewer. Per KV head the lowest pooled scores go; the window and ``sinks`` are never evicted. Exact
until the event (``compress``), again every ``every`` positions after it.

State: the row store's rows plus each layer's last ``window`` post-RoPE queries (counted).
"""

from pyllama.attention.observed cimport ObservedAttention
from pyllama.attention.rows cimport kept_of

from pyllama.attention.budget import CAPACITY, EVERY, RATIO, sinks_knob, window_knob
from pyllama.attention.dense import POSITIONS
from pyllama.attention.observed import OBSERVED_KNOBS
from pyllama.attention.spec import Knob, check_knobs


cdef inline long long pyramid_target(long long n, long long capacity, long long window, long long beta, int layer,
                                     int n_layers) noexcept nogil:
    """KVCache-Factory's PyramidKV budget of layer ``layer`` (integers, as its PyramidKVCluster)."""
    cdef long long min_num, max_num, steps = 0, share
    if n < capacity:
        return n
    if capacity <= window:
        return capacity
    min_num = (capacity - window) // beta
    max_num = (capacity - window) * 2 - min_num
    if max_num >= n - window:
        max_num = n - window
        min_num = (capacity - window) * 2 - max_num
    if n_layers > 1:
        steps = (max_num - min_num) // (n_layers - 1)
    share = capacity - window if n < (capacity - window) * 2 else max_num - layer * steps
    return window + share


cdef class PyramidKV(ObservedAttention):
    name = "pyramidkv"
    description = "PyramidKV: SnapKV's scores, budgets decreasing linearly with depth (at the event, again every N)"
    knobs = (RATIO, CAPACITY, window_knob(64, ", and the observation queries"), *OBSERVED_KNOBS,
             Knob("beta", int, 20, "the last layer's share of the budget beyond the window: 1 / beta of it", min=1),
             sinks_knob(0), EVERY, POSITIONS)

    cdef readonly long long beta

    def __init__(self, ratio: float = 0.5, capacity: int = 0, window: int = 64, kernel: int = 5, pool: str = "avg",
                 beta: int = 20, sinks: int = 0, every: int = 0, positions: int = 0):
        check_knobs(self, ratio=ratio, capacity=capacity, window=window, kernel=kernel, pool=pool, beta=beta,
                    sinks=sinks, every=every, positions=positions)
        self.set_event_budget(ratio, capacity, window, sinks, every, positions)
        self.set_observed(kernel, pool)
        self.beta = beta

    cdef long long event_target(self, int layer, long long n) noexcept nogil:
        cdef long long capacity = self.capacity if self.capacity > 0 else kept_of(n, self.ratio, 0)
        return pyramid_target(n, capacity, self.window, self.beta, layer, self.n_layers)
