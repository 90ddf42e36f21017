from pyllama.attention.base import Attention
from pyllama.config import ModelConfig

class Scissorhands(Attention):
    history: int
    def __init__(
        self,
        ratio: float = 0.5,
        capacity: int = 0,
        window: int = 32,
        history: int = 32,
        sinks: int = 0,
        positions: int = 0,
    ) -> None: ...
    def planned_bytes(self, config: ModelConfig) -> int: ...
