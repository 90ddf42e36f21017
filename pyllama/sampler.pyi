import numpy as np

class Sampler:
    vocab_size: int
    temperature: float
    topp: float
    rng_state: int
    def __init__(self, vocab_size: int, temperature: float = 0.0, topp: float = 0.9, seed: int = 0) -> None: ...
    def sample(self, logits: np.ndarray) -> int: ...
