import numpy as np

from pyllama.attention.base import Attention

class Lattice(Attention):
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
