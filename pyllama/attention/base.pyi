from typing import Any, ClassVar

import numpy as np

from pyllama.attention.spec import Knob
from pyllama.config import ModelConfig

UNBOUNDED: int

class Attention:
    name: ClassVar[str]
    description: ClassVar[str]
    knobs: ClassVar[tuple[Knob, ...]]
    config: ModelConfig | None
    max_positions: int
    n_threads: int
    native: bool
    per_position_order: ClassVar[bool]
    def init(self, config: ModelConfig, pool: Any) -> None: ...
    def reset(self) -> None: ...
    def memory_bytes(self) -> int: ...
    def attend(self, layer: int, pos: int, q: np.ndarray, k: np.ndarray, v: np.ndarray, out: np.ndarray) -> None: ...
    def attend_block(
        self, layer: int, pos: int, q: np.ndarray, k: np.ndarray, v: np.ndarray, out: np.ndarray
    ) -> None: ...
    def _configure(
        self,
        config: ModelConfig,
        pool: Any,
        q: np.ndarray | None = None,
        k: np.ndarray | None = None,
        v: np.ndarray | None = None,
        out: np.ndarray | None = None,
        block: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None,
    ) -> None: ...
