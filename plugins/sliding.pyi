from pyllama.attention.base import Attention

class Sliding(Attention):
    window: int
    def __init__(self, window: int = 256) -> None: ...
