from typing_extensions import disjoint_base

from pyllama.attention.gather import GatherAttention
from pyllama.attention.spec import Knob
from pyllama.config import ModelConfig

POSITIONS: Knob

def padded_row(kv_dim: int) -> int: ...

@disjoint_base
class DenseAttention(GatherAttention):
    positions: int
    row_floats: int
    def dense_bytes(self, config: ModelConfig, rows: int, counters: int, score_rows: int = 0) -> int: ...
