from typing import Any, ClassVar

import numpy as np
from typing_extensions import disjoint_base

from pyllama.attention.spec import Knob
from pyllama.config import ModelConfig

UNBOUNDED: int

@disjoint_base
class Attention:
    name: ClassVar[str]
    description: ClassVar[str]
    knobs: ClassVar[tuple[Knob, ...]]
    config: ModelConfig | None
    max_positions: int
    n_threads: int
    native: bool
    per_position_order: ClassVar[bool]
    wants_pre_rope_query: ClassVar[bool]
    compresses_at_event: ClassVar[bool]
    holds: ClassVar[str]
    model_windows: ClassVar[bool]
    exact_prefix: int  # a class attribute or a property: the leading positions attended as causal does
    layer_policy: str
    query_before_rope: np.ndarray | None
    def init(self, config: ModelConfig, pool: Any) -> None: ...
    def reset(self) -> None: ...
    def memory_bytes(self) -> int: ...
    def compress(self, pos: int) -> None: ...
    def held_positions(self, layer: int) -> list[np.ndarray] | None: ...
    def snapshot(self) -> Any: ...
    def restore(self, state: Any) -> None: ...
    def attend(self, layer: int, pos: int, q: np.ndarray, k: np.ndarray, v: np.ndarray, out: np.ndarray) -> None: ...
    def attend_block(
        self, layer: int, pos: int, q: np.ndarray, k: np.ndarray, v: np.ndarray, out: np.ndarray
    ) -> None: ...
    def _configure(
        self,
        config: ModelConfig,
        pool: Any,
        rows: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None,
        pre_rope: np.ndarray | None = None,
    ) -> None: ...
