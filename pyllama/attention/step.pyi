from pyllama.attention.rows import RowStore

class StepAttention(RowStore):
    def set_step_budget(self, ratio: float, capacity: int, window: int, sinks: int, positions: int) -> None: ...
