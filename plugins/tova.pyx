"""``tova``: Token Omission Via Attention, evict the position the current query attends least.

Oren et al., "Transformers are Multi-State RNNs", EMNLP 2024 (arXiv:2401.06104). kvpress:
``TOVAPress`` (once, after the prompt); KVCache-Factory: none.

Rule. After position t attended, each held position's score is query t's softmax weight on it
averaged over all of the layer's query heads (float64, the heads in ascending order): one score
and one eviction per layer, as the paper, so every KV head holds the same positions. The layer
keeps ``ceil((1 - ratio)(t + 1))`` rows (or ``capacity``); the lowest score goes, the older first
among equal scores. The current position is a candidate (the paper); kvpress always keeps it, which
``window=1`` reproduces. ``sinks`` and ``window`` are never evicted.

State: the row store's rows only.
"""

from pyllama.attention.step cimport StepAttention

from pyllama.attention.budget import CAPACITY, RATIO, sinks_knob, window_knob
from pyllama.attention.dense import POSITIONS
from pyllama.attention.memory import require_memory
from pyllama.attention.spec import check_knobs


cdef class TOVA(StepAttention):
    name = "tova"
    description = "TOVA: evict the position the current query attends least (mean over the layer's heads); every step"
    knobs = (RATIO, CAPACITY, window_knob(0), sinks_knob(0), POSITIONS)

    def __init__(self, ratio: float = 0.5, capacity: int = 0, window: int = 0, sinks: int = 0, positions: int = 0):
        check_knobs(self, ratio=ratio, capacity=capacity, window=window, sinks=sinks, positions=positions)
        self.set_step_budget(ratio, capacity, window, sinks, positions)
        self.one_set = True

    def planned_bytes(self, config):
        return self.rows_bytes(config, 0, 0, 0)

    def init(self, config, pool):
        require_memory("tova", f"positions={self.rows_per_head():,}", self.planned_bytes(config))
        self.init_step(config, 0)

    cdef void step_scores(self, int layer, long long pos, int g, long long n, double* score) noexcept nogil:
        self.head_mean(0, self.n_heads, n, score)
