from collections.abc import Sequence

import numpy as np

from pyllama.config import ModelConfig

def attend_one_head(
    q: np.ndarray, keys: np.ndarray, values: np.ndarray, bias: np.ndarray | None = None, arithmetic: str = "run.c"
) -> np.ndarray: ...
def attend_rows(
    config: ModelConfig,
    q: np.ndarray,
    keys: np.ndarray,
    values: np.ndarray,
    out: np.ndarray,
    rows: Sequence[int] | np.ndarray | None = None,
    bias: np.ndarray | None = None,
) -> None: ...
