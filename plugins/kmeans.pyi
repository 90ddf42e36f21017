import numpy as np
from typing_extensions import disjoint_base

from pyllama.attention.dense import DenseAttention
from pyllama.config import ModelConfig

@disjoint_base
class KMeans(DenseAttention):
    clusters: int
    budget: int
    sinks: int
    window: int
    iters: int
    recluster: int
    seed: int
    estimate: bool
    size_bias: bool
    positions: int
    def __init__(
        self,
        clusters: int = 32,
        budget: int = 64,
        sinks: int = 4,
        window: int = 64,
        iters: int = 4,
        recluster: int = 256,
        seed: int = 0,
        estimate: bool = False,
        size_bias: bool = False,
        positions: int = 0,
    ) -> None: ...
    def clustered(self, layer: int) -> bool: ...
    def assignments(self, layer: int, kv_head: int) -> np.ndarray: ...
    def centroids(self, layer: int, kv_head: int) -> np.ndarray: ...
    def mean_values(self, layer: int, kv_head: int) -> np.ndarray: ...
    def cluster_sizes(self, layer: int, kv_head: int) -> np.ndarray: ...
    def selected(self, head: int) -> list[int]: ...
    def estimated(self, head: int) -> int: ...
    def start_from(
        self,
        layer: int,
        keys: np.ndarray,
        values: np.ndarray,
        queries: np.ndarray | None = None,
        queries_pre_rope: np.ndarray | None = None,
    ) -> None: ...
    def planned_bytes(self, config: ModelConfig) -> int: ...
    def owned_bytes(self) -> int: ...
