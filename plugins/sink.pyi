from pyllama.attention.base import Attention

class Sink(Attention):
    sinks: int
    window: int
    shift: bool
    def __init__(self, sinks: int = 4, window: int = 252, shift: bool = False) -> None: ...
