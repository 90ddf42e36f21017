from collections.abc import Callable, Iterable

import numpy as np
from typing_extensions import disjoint_base

STAGE_NAMES: tuple[str, ...]

@disjoint_base
class EngineObserver: ...

@disjoint_base
class StageCallback(EngineObserver):
    callback: Callable[[str, int, int, np.ndarray], None]
    def __init__(
        self,
        callback: Callable[[str, int, int, np.ndarray], None],
        stages: Iterable[str] = ...,
        per_position: bool = False,
    ) -> None: ...
