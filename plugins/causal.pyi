from pyllama.attention.base import Attention

class Causal(Attention):
    def __init__(self, positions: int = 0) -> None: ...
