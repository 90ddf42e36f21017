import numpy as np

from pyllama.checkpoint.weights import Tensor

def classify_block(tensor: Tensor, hidden: np.ndarray, out: np.ndarray, n_threads: int = 1) -> None: ...
