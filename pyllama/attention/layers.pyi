from typing import Any

import numpy as np
from typing_extensions import disjoint_base

from pyllama.attention.base import Attention

LAYER_POLICIES: tuple[str, ...]

def govern_layers(plugin: Attention, config: Any) -> Attention: ...

@disjoint_base
class LayerSplit(Attention):
    inner: Attention
    local: Attention
    def __init__(self, inner: Attention, windows: tuple[int, ...]) -> None: ...
    @property
    def local_layers(self) -> tuple[int, ...]: ...
    def start_local(self, layer: int, keys: np.ndarray, values: np.ndarray) -> int: ...
    def held_positions(self, layer: int) -> list[np.ndarray] | None: ...
