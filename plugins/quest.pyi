import numpy as np
from typing_extensions import disjoint_base

from pyllama.attention.dense import DenseAttention
from pyllama.config import ModelConfig

@disjoint_base
class Quest(DenseAttention):
    capacity: int
    page: int
    dense_layers: int
    dense_context: bool
    context_end: int
    positions: int
    def __init__(
        self, capacity: int, page: int = 16, dense_layers: int = 2, dense_context: bool = True, positions: int = 0
    ) -> None: ...
    def attended(self, kv_head: int) -> np.ndarray: ...
    def planned_bytes(self, config: ModelConfig) -> int: ...
    def owned_bytes(self) -> int: ...
