from pyllama.attention.base import Attention
from pyllama.attention.spec import Knob
from pyllama.config import ModelConfig

POSITIONS: Knob

class DenseAttention(Attention):
    positions: int
    def dense_bytes(self, config: ModelConfig, rows: int, counters: int) -> int: ...
    def owned_bytes(self) -> int: ...
