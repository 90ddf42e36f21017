from collections.abc import Callable

import numpy as np
from typing_extensions import disjoint_base

from pyllama.attention.base import Attention
from pyllama.attention.pool import Pool as Pool
from pyllama.checkpoint.weights import Weights
from pyllama.config import ModelConfig
from pyllama.engine.observer import EngineObserver
from pyllama.sampler import Sampler

ROW_BUFFERS: tuple[str, ...]

@disjoint_base
class Engine:
    config: ModelConfig
    weights: Weights
    attention: Attention
    logits_view: np.ndarray
    observer: EngineObserver | None
    max_block: int
    per_position: bool
    def __init__(
        self, config: ModelConfig, weights: Weights, attention: Attention, n_threads: int = 1, max_block: int = 128
    ) -> None: ...
    @property
    def n_threads(self) -> int: ...
    @property
    def nonfinite_layer(self) -> int: ...  # -1, or the first layer whose output held NaN/Inf in the last forward
    @property
    def nonfinite_stage(self) -> int: ...
    @property
    def nonfinite_position(self) -> int: ...
    def block_buffer_bytes(self) -> int: ...
    def activation_addresses(self) -> dict[str, int]: ...
    def set_observer(self, observer: EngineObserver | None = None) -> None: ...
    def forward_block(
        self, tokens: np.ndarray, pos: int, logits: np.ndarray | None = None, classify: bool = True
    ) -> np.ndarray: ...
    @property
    def max_positions(self) -> int: ...
    @property
    def block_nonfinite_layers(self) -> np.ndarray: ...
    def reset(self) -> None: ...
    def forward(self, token: int, pos: int) -> np.ndarray: ...
    def generate_into(
        self,
        prompt: np.ndarray,
        steps: int,
        sampler: Sampler,
        out: np.ndarray,
        on_token: Callable[[int], None] | None = None,
        stop_ids: np.ndarray | None = None,
        stop_in_prompt: bool = False,
        compress_at: int = -1,
    ) -> tuple[int, int, float, int, float]: ...
    def compress(self, pos: int) -> None: ...
