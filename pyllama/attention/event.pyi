import numpy as np
from typing_extensions import disjoint_base

from pyllama.attention.rows import RowStore
from pyllama.config import ModelConfig

@disjoint_base
class EventAttention(RowStore):
    every: int
    alpha: float
    def set_event_budget(
        self, ratio: float, capacity: int, window: int, sinks: int, every: int, positions: int
    ) -> None: ...
    def event_bytes(self, config: ModelConfig, work_size: int) -> int: ...
    def compress(self, pos: int) -> None: ...
    def start_from(
        self,
        layer: int,
        keys: np.ndarray,
        values: np.ndarray,
        queries: np.ndarray | None = None,
        queries_pre_rope: np.ndarray | None = None,
    ) -> None: ...
