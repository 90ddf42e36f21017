"""``h2o``: Heavy-Hitter Oracle, the positions that received the most attention plus a recent window.

Zhang et al., "H2O: Heavy-Hitter Oracle for Efficient Generative Inference of Large Language
Models", NeurIPS 2023 (arXiv:2306.14048). kvpress: ``ObservedAttentionPress`` (once, after the
prompt); KVCache-Factory: ``h2o`` (``H2OKVCluster``, once).

Rule. Per KV head, every held position keeps the total attention it has received: at each step t
where it is held, the mean over the KV head's query group of query t's softmax weight on it (read
from the shared routine's scratch, added in float64, once per step, the current position included).
After position t the KV head keeps ``ceil((1 - ratio)(t + 1))`` rows (or ``capacity``): the recent
``window`` (half the target by default, the paper's split between heavy hitters and recent tokens)
and the ``sinks`` are never evicted, and of the others the lowest total goes, the older first among
equal totals. The original keeps the heavy hitters by ``topk`` after every step: the same rule.

State: the row store's rows plus one float64 total per row (8 bytes, counted by the ledger).
"""

from pyllama.attention.step cimport StepAttention

from pyllama.attention.budget import CAPACITY, RATIO, sinks_knob
from pyllama.attention.dense import POSITIONS
from pyllama.attention.memory import require_memory
from pyllama.attention.spec import Knob, check_knobs
from pyllama.errors import PluginError


def window_of(text) -> int:
    """``half`` (-1: half the target) or a count of recent positions."""
    text = str(text).strip()
    if text == "half":
        return -1
    if text.isdigit():
        return int(text)
    raise PluginError(f"h2o: window={text!r} is neither 'half' nor a number of recent positions >= 0")


cdef class H2O(StepAttention):
    name = "h2o"
    description = "H2O: keep the positions that received the most attention plus a recent window; evicts every step"
    knobs = (
        RATIO,
        CAPACITY,
        Knob("window", str, "half", "recent positions never evicted: a count, or half (half the target)"),
        sinks_knob(0),
        POSITIONS,
    )

    def __init__(self, ratio: float = 0.5, capacity: int = 0, window="half", sinks: int = 0, positions: int = 0):
        window = str(window)
        check_knobs(self, ratio=ratio, capacity=capacity, window=window, sinks=sinks, positions=positions)
        self.set_step_budget(ratio, capacity, window_of(window), sinks, positions)

    def planned_bytes(self, config):
        return self.rows_bytes(config, 8, 0, 0)

    def init(self, config, pool):
        require_memory("h2o", f"positions={self.rows_per_head():,}", self.planned_bytes(config))
        self.init_step(config, 8)

    cdef void step_scores(self, int layer, long long pos, int g, long long n, double* score) noexcept nogil:
        cdef double* total = <double*>self.row_state + self.row_of(layer, g)
        cdef long long r
        self.head_mean(g * self.kv_mul, self.kv_mul, n, score)
        for r in range(n):
            total[r] = total[r] + score[r]
            score[r] = total[r]
