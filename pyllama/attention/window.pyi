import numpy as np

from pyllama.attention.base import Attention
from pyllama.attention.spec import Knob
from pyllama.config import ModelConfig

def sink_window_knobs(sinks: int, window: int, kept: str = "kept") -> tuple[Knob, Knob]: ...

class WindowAttention(Attention):
    sinks: int
    window: int
    def window_bytes(self, config: ModelConfig, rows: int, counters: int, n_shifted: int) -> int: ...
    def held_exact(self) -> np.ndarray: ...
    def owned_bytes(self) -> int: ...
