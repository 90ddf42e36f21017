import numpy as np
from typing_extensions import disjoint_base

@disjoint_base
class Sampler:
    vocab_size: int
    temperature: float
    topp: float
    rng_state: int
    # the constructor is Cython's __cinit__, which runs in __new__ (it allocates the token table)
    def __new__(cls, vocab_size: int, temperature: float = 0.0, topp: float = 0.9, seed: int = 0) -> Sampler: ...
    def sample(self, logits: np.ndarray) -> int: ...
