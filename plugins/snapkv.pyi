from pyllama.attention.observed import ObservedAttention
from pyllama.attention.spec import Knob

OBSERVED_KNOBS: tuple[Knob, ...]

class SnapKV(ObservedAttention):
    kernel: int
    pool: str
    def __init__(
        self,
        ratio: float = 0.5,
        capacity: int = 0,
        window: int = 64,
        kernel: int = 5,
        pool: str = "avg",
        sinks: int = 0,
        every: int = 0,
        positions: int = 0,
    ) -> None: ...
