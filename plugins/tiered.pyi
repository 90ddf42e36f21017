import numpy as np
from typing_extensions import disjoint_base

from pyllama.attention.window import WindowAttention
from pyllama.config import ModelConfig

__all__ = ["COLD_CONTEXTS", "Tiered", "dequantize", "pack4", "quantize", "unpack4"]

COLD_CONTEXTS: int

def quantize(x: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]: ...
def dequantize(codes: np.ndarray, scale: np.ndarray, zero: np.ndarray) -> np.ndarray: ...
def pack4(codes: np.ndarray) -> np.ndarray: ...
def unpack4(packed: np.ndarray, m: int) -> np.ndarray: ...

@disjoint_base
class Tiered(WindowAttention):
    sinks: int
    window: int
    warm: int
    bits: int
    group: int
    block: int
    cold_topk: int
    positions: int
    def __init__(
        self,
        sinks: int = 4,
        window: int = 64,
        warm: int = 128,
        bits: int = 4,
        group: int = 32,
        block: int = 32,
        cold_topk: int = 0,
        positions: int = 0,
    ) -> None: ...
    def tiers(self, layer: int) -> dict: ...
    def cold_summaries(self, layer: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]: ...
    def planned_bytes(self, config: ModelConfig) -> int: ...
    def owned_bytes(self) -> int: ...
