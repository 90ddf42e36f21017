import numpy as np
from typing_extensions import disjoint_base

from pyllama.attention.gather import GatherAttention
from pyllama.attention.spec import Knob
from pyllama.config import ModelConfig

def sink_window_knobs(sinks: int, window: int, kept: str = "kept") -> tuple[Knob, Knob]: ...

@disjoint_base
class WindowAttention(GatherAttention):
    sinks: int
    window: int
    def window_bytes(
        self,
        config: ModelConfig,
        rows: int,
        counters: int,
        n_shifted: int,
        score_rows: int = 0,
        blocks: bool = False,
    ) -> int: ...
    def held_exact(self) -> np.ndarray: ...
    def start_from(
        self,
        layer: int,
        keys: np.ndarray,
        values: np.ndarray,
        queries: np.ndarray | None = None,
        queries_pre_rope: np.ndarray | None = None,
    ) -> None: ...
