import numpy as np
from typing_extensions import disjoint_base

from pyllama.attention.base import Attention
from pyllama.attention.spec import Knob
from pyllama.config import ModelConfig

SCORERS: dict[str, tuple[str, tuple[str, ...]]]

OBSERVED_KNOBS: tuple[Knob, ...]
OWN_KNOBS: tuple[str, ...]

@disjoint_base
class AdaKV(Attention):
    inner: Attention
    scorer: str
    alpha: float
    def __init__(
        self,
        scorer: str = "snapkv",
        alpha: float = 0.2,
        ratio: float = 0.5,
        capacity: int = 0,
        window: int = -1,
        sinks: int = -1,
        every: int = 0,
        kernel: int = 5,
        pool: str = "avg",
        future: int = 512,
        epsilon: float = 0.0,
        covariance: bool = True,
        seed: int = 0,
        positions: int = 0,
    ) -> None: ...
    @property  # per instance (its scorer's), where the base declares a class attribute
    def wants_pre_rope_query(self) -> bool: ...  # type: ignore[override]
    def planned_bytes(self, config: ModelConfig) -> int: ...
    def held_positions(self, layer: int) -> list[np.ndarray] | None: ...
    def rows_held_per_head(self, layer: int) -> list[int]: ...
    def start_from(
        self,
        layer: int,
        keys: np.ndarray,
        values: np.ndarray,
        queries: np.ndarray | None = None,
        queries_pre_rope: np.ndarray | None = None,
    ) -> None: ...
