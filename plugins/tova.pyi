from pyllama.attention.step import StepAttention
from pyllama.config import ModelConfig

class TOVA(StepAttention):
    def __init__(
        self, ratio: float = 0.5, capacity: int = 0, window: int = 0, sinks: int = 0, positions: int = 0
    ) -> None: ...
    def planned_bytes(self, config: ModelConfig) -> int: ...
