import numpy as np

def attend_head_block(
    q: np.ndarray, keys: np.ndarray, values: np.ndarray, n: int, arithmetic: str = "run.c"
) -> np.ndarray: ...
def attend_head_group(
    q: np.ndarray, keys: np.ndarray, values: np.ndarray, arithmetic: str = "run.c"
) -> tuple[np.ndarray, np.ndarray]: ...
def attend_head_window_block(
    q: np.ndarray, keys: np.ndarray, values: np.ndarray, fixed: int, window: int, arithmetic: str = "run.c"
) -> np.ndarray: ...
