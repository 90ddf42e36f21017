import numpy as np
from typing_extensions import disjoint_base

from pyllama.attention.rows import RowStore
from pyllama.attention.spec import Knob
from pyllama.config import ModelConfig

EVENT_KNOBS: tuple[Knob, ...]

@disjoint_base
class EventAttention(RowStore):
    every: int
    alpha: float
    def __init__(
        self, ratio: float = 0.5, capacity: int = 0, window: int = 0, sinks: int = 0, every: int = 0, positions: int = 0
    ) -> None: ...
    def scratch_per_head(self, config: ModelConfig) -> int: ...
    def planned_bytes(self, config: ModelConfig) -> int: ...
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
