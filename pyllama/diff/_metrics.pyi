import numpy as np
from typing_extensions import disjoint_base

NUMPY_LOOPS: bool  # numpy's own exp and log loops were found (row_metrics.h uses them)

@disjoint_base
class RowSoftmax:
    finite: np.ndarray  # bool[rows]: the row holds no NaN or Inf
    top1: np.ndarray  # int32[rows]: argmax (first of equals), -1 for a non-finite row
    exps: np.ndarray  # float64[rows, vocab] when keep_exps, else [1, vocab]
    def __init__(self, rows: int, vocab: int, keep_exps: bool = False) -> None: ...
    def compute(self, logits: np.ndarray, n_threads: int = 1) -> None: ...
    def teacher(self, logits: np.ndarray, next_tokens: np.ndarray, logp: np.ndarray, rank: np.ndarray) -> None: ...

def compare(
    a: RowSoftmax,
    b: RowSoftmax,
    la: np.ndarray,
    lb: np.ndarray,
    next_tokens: np.ndarray,
    max_abs: np.ndarray,
    kl: np.ndarray,
    logp_a: np.ndarray,
    logp_b: np.ndarray,
    rank_a: np.ndarray,
    rank_b: np.ndarray,
    n_threads: int = 1,
) -> None: ...
