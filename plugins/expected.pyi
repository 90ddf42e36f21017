import numpy as np

from pyllama.attention.base import Attention
from pyllama.config import ModelConfig

class Expected(Attention):
    future: int
    epsilon: float
    covariance: bool
    def __init__(
        self,
        ratio: float = 0.5,
        capacity: int = 0,
        sinks: int = 4,
        window: int = 0,
        future: int = 512,
        epsilon: float = 0.0,
        covariance: bool = True,
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
