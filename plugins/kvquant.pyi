import numpy as np
from typing_extensions import disjoint_base

from pyllama.attention.gather import GatherAttention
from pyllama.config import ModelConfig

CACHE_TYPES: dict[str, tuple[int, int]]

@disjoint_base
class KVQuant(GatherAttention):
    k: str
    v: str
    positions: int
    def __init__(self, k: str = "f16", v: str = "f16", positions: int = 0) -> None: ...
    def planned_bytes(self, config: ModelConfig) -> int: ...
    def owned_bytes(self) -> int: ...
    def stored_rows(self, layer: int) -> tuple[np.ndarray, np.ndarray]: ...
