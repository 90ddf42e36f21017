import numpy as np
from typing_extensions import disjoint_base

from pyllama.attention.window import WindowAttention
from pyllama.config import ModelConfig

@disjoint_base
class Lattice(WindowAttention):
    sinks: int
    window: int
    base: int
    levels: int
    shift: bool
    def __init__(
        self, sinks: int = 4, window: int = 64, base: int = 8, levels: int = 0, shift: bool = False
    ) -> None: ...
    def bucket_sizes(self, layer: int, kv_head: int = 0) -> list[int]: ...
    def staged(self, layer: int) -> int: ...
    def buckets(self, layer: int, kv_head: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]: ...
    def planned_bytes(self, config: ModelConfig) -> int: ...
    def owned_bytes(self) -> int: ...
