from typing_extensions import disjoint_base

from pyllama.attention.window import WindowAttention
from pyllama.config import ModelConfig

@disjoint_base
class Sink(WindowAttention):
    sinks: int
    window: int
    shift: bool
    def __init__(self, sinks: int = 4, window: int = 252, shift: bool = False) -> None: ...
    def planned_bytes(self, config: ModelConfig) -> int: ...
    def owned_bytes(self) -> int: ...
