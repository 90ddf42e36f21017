from typing_extensions import disjoint_base

from pyllama.attention.step import StepAttention
from pyllama.config import ModelConfig

@disjoint_base
class Scissorhands(StepAttention):
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
