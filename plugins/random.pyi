from typing_extensions import disjoint_base

from pyllama.attention.event import EventAttention

@disjoint_base
class RandomEviction(EventAttention):
    seed: int
    def __init__(
        self,
        ratio: float = 0.5,
        capacity: int = 0,
        seed: int = 0,
        window: int = 0,
        sinks: int = 0,
        every: int = 0,
        positions: int = 0,
    ) -> None: ...
