from collections.abc import Callable, Iterable

import numpy as np

STAGE_NAMES: tuple[str, ...]

class EngineObserver: ...

class StageCallback(EngineObserver):
    callback: Callable[[str, int, int, np.ndarray], None]
    def __init__(
        self,
        callback: Callable[[str, int, int, np.ndarray], None],
        stages: Iterable[str] = ...,
        per_position: bool = False,
    ) -> None: ...
