from collections.abc import Sequence

import numpy as np

from pyllama.config import ModelConfig

def attend_one_head(
    q: np.ndarray, keys: np.ndarray, values: np.ndarray, bias: np.ndarray | None = None, arithmetic: str = "run.c"
) -> np.ndarray: ...
def attend_head_block(
    q: np.ndarray, keys: np.ndarray, values: np.ndarray, n: int, arithmetic: str = "run.c"
) -> np.ndarray: ...
def attend_head_group(
    q: np.ndarray, keys: np.ndarray, values: np.ndarray, arithmetic: str = "run.c"
) -> tuple[np.ndarray, np.ndarray]: ...
def attend_head_window_block(
    q: np.ndarray, keys: np.ndarray, values: np.ndarray, fixed: int, window: int, arithmetic: str = "run.c"
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
