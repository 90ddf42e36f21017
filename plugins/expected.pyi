from typing_extensions import disjoint_base

from pyllama.attention.event import EventAttention
from pyllama.config import ModelConfig

ROPE_NEOX: str

@disjoint_base
class Expected(EventAttention):
    def scratch_per_head(self, config: ModelConfig) -> int: ...
    def statistics_bytes(self, config: ModelConfig) -> int: ...
    future: int
    epsilon: float
    covariance: bool
    def __init__(
        self,
        ratio: float = 0.5,
        capacity: int = 0,
        sinks: int = 4,
        window: int = 0,
        future: int = 512,
        epsilon: float = 0.0,
        covariance: bool = True,
        every: int = 0,
        positions: int = 0,
    ) -> None: ...
    def planned_bytes(self, config: ModelConfig) -> int: ...
