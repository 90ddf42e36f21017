import numpy as np
from typing_extensions import disjoint_base

from pyllama.attention.event import EventAttention
from pyllama.config import ModelConfig

@disjoint_base
class RandomEviction(EventAttention):
    seed: int
    def __init__(
        self,
        ratio: float = 0.5,
        capacity: int = 0,
        seed: int = 0,
        window: int = 0,
        sinks: int = 0,
        every: int = 0,
        positions: int = 0,
    ) -> None: ...
    def planned_bytes(self, config: ModelConfig) -> int: ...
    def start_from(
        self,
        layer: int,
        keys: np.ndarray,
        values: np.ndarray,
        queries: np.ndarray | None = None,
        queries_pre_rope: np.ndarray | None = None,
    ) -> None: ...
