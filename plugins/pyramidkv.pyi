from typing_extensions import disjoint_base

from pyllama.attention.observed import ObservedAttention
from pyllama.attention.spec import Knob

OBSERVED_KNOBS: tuple[Knob, ...]

@disjoint_base
class PyramidKV(ObservedAttention):
    kernel: int
    pool: str
    beta: int
    def __init__(
        self,
        ratio: float = 0.5,
        capacity: int = 0,
        window: int = 64,
        kernel: int = 5,
        pool: str = "avg",
        beta: int = 20,
        sinks: int = 0,
        every: int = 0,
        positions: int = 0,
    ) -> None: ...
