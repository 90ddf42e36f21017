from typing_extensions import disjoint_base

from pyllama.attention.rows import RowStore

UNBOUNDED: int

@disjoint_base
class StepAttention(RowStore):
    def set_step_budget(self, ratio: float, capacity: int, window: int, sinks: int, positions: int) -> None: ...
