"""``scissorhands``: evict the position whose attention was below average most often, recently.

Liu et al., "Scissorhands: Exploiting the Persistence of Importance Hypothesis for LLM KV Cache
Compression at Test Time", NeurIPS 2023 (arXiv:2305.17118). kvpress: none; KVCache-Factory:
``Scissorhands`` (``pyramidkv/scissorhands.py``).

Rule. Query j marks a position of KV head g unimportant when the mean over g's query group of its
softmax weight on it (float64) is strictly below ``1 / len(rows_j)``, the uniform weight. A held
position's count is the number of the last ``history`` queries (those that attended it) that
marked it. After position t the KV head keeps ``ceil((1 - ratio)(t + 1))`` rows (or ``capacity``):
the ``window`` most recent and the ``sinks`` are never evicted, and of the others the highest count
goes, the older first among equal counts. The paper drops m positions at once when the cache reaches
its budget; evicting one per step holds the knobs' count exactly.

State: the row store's rows plus each row's marks of the last ``history`` (<= 64) queries, one bit
each in 8 bytes per row (counted by the ledger).
"""

from libc.stdint cimport uint64_t

from pyllama.attention.step cimport StepAttention

from pyllama.attention.budget import CAPACITY, RATIO, sinks_knob, window_knob
from pyllama.attention.dense import POSITIONS
from pyllama.attention.memory import require_memory
from pyllama.attention.spec import Knob, check_knobs


cdef inline int popcount64(uint64_t x) noexcept nogil:
    cdef int n = 0
    while x:
        x = x & (x - 1)
        n += 1
    return n


cdef class Scissorhands(StepAttention):
    name = "scissorhands"
    description = "Scissorhands: evict the position most often below uniform attention over a history; every step"
    knobs = (
        RATIO,
        CAPACITY,
        window_knob(32),
        Knob("history", int, 32, "queries whose marks count (the persistence window)", min=1, max=64),
        sinks_knob(0),
        POSITIONS,
    )

    cdef readonly long long history
    cdef uint64_t recent   # the bits of the last ``history`` marks

    def __init__(self, ratio: float = 0.5, capacity: int = 0, window: int = 32, history: int = 32, sinks: int = 0,
                 positions: int = 0):
        check_knobs(self, ratio=ratio, capacity=capacity, window=window, history=history, sinks=sinks,
                    positions=positions)
        self.set_step_budget(ratio, capacity, window, sinks, positions)
        self.history = history
        self.recent = (<uint64_t>1 << history) - 1 if history < 64 else ~(<uint64_t>0)

    def planned_bytes(self, config):
        return self.rows_bytes(config, 8, 0, 0)

    def init(self, config, pool):
        require_memory("scissorhands", f"positions={self.rows_per_head():,}", self.planned_bytes(config))
        self.init_step(config, 8)

    cdef void step_scores(self, int layer, long long pos, int g, long long n, double* score) noexcept nogil:
        cdef uint64_t* marks = <uint64_t*>self.row_state + self.row_of(layer, g)
        cdef double uniform = 1.0 / n
        cdef long long r
        self.head_mean(g * self.kv_mul, self.kv_mul, n, score)
        for r in range(n):
            marks[r] = (marks[r] << 1) | (score[r] < uniform)
            score[r] = -popcount64(marks[r] & self.recent)
