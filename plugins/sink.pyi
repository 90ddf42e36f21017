from pyllama.attention.base import Attention
from pyllama.config import ModelConfig

class Sink(Attention):
    sinks: int
    window: int
    shift: bool
    def __init__(self, sinks: int = 4, window: int = 252, shift: bool = False) -> None: ...
    def planned_bytes(self, config: ModelConfig) -> int: ...
    def owned_bytes(self) -> int: ...
