from typing_extensions import disjoint_base

from pyllama.attention.event import EventAttention
from pyllama.attention.spec import Knob
from pyllama.config import ModelConfig

OBSERVED_KNOBS: tuple[Knob, ...]

@disjoint_base
class ObservedAttention(EventAttention):
    kernel: int
    pool: str
    def set_observed(self, kernel: int, pool: str) -> None: ...
    def scratch_per_head(self, config: ModelConfig) -> int: ...
    def planned_bytes(self, config: ModelConfig) -> int: ...
