import numpy as np
from typing_extensions import disjoint_base

from pyllama.attention.base import Attention
from pyllama.config import ModelConfig
from pyllama.engine.observer import EngineObserver

@disjoint_base
class DiffCapture(EngineObserver):
    plugin: Attention
    label: str
    def __init__(
        self,
        plugin: Attention,
        config: ModelConfig,
        attention: np.ndarray | None = None,
        hidden: np.ndarray | None = None,
        ledger: np.ndarray | None = None,
        label: str = "",
    ) -> None: ...
    def begin(self, start: int) -> None: ...
    def read_memory(self) -> None: ...
    def memory_bytes(self) -> int: ...
