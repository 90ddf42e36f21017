"""The record of a context: ``causal``'s run of positions 0 .. T - 1, kept in memory for its branches.

Every method that compresses at the event attends exactly up to it, so its state there is a function
of what ``causal``'s run of the context computed: per layer, the keys (after RoPE) and values of
every position, and the queries after and before RoPE (what a scorer such as SnapKV or Expected
Attention accumulates from). The engine reports these stages to one observer
(``engine/observer.pyx``: ``STAGE_K``, ``STAGE_V``, ``STAGE_Q``, ``STAGE_Q_PRE_ROPE``); a
``StageCallback`` copies each pass's rows into four float32 arrays ``[n_layers, T, width]``, so that
``keys[layer]`` is the contiguous ``[T, kv_dim]`` block a method's ``start_from(layer, ...)`` reads.

Size: ``T x n_layers x (2 q_dim + 2 kv_dim) x 4`` bytes (``record_bytes``). SmolLM2-135M (30 layers,
q_dim 576, kv_dim 192) at 4,096 tokens: 0.755 GB; at 2,048: 0.377 GB. Gemma 3 270M (18 layers,
q_dim 1,024, kv_dim 256) at 4,096: 0.755 GB. The record lives while one sample's branches run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from pyllama.attention.guard import checked_memory_bytes, plugin_label
from pyllama.engine.observer import StageCallback

if TYPE_CHECKING:
    from pyllama.config import ModelConfig
    from pyllama.engine import Engine

__all__ = ["ContextRecord", "record_bytes"]

RECORDED_STAGES = ("q_pre_rope", "q", "k", "v")


def record_bytes(config: ModelConfig, positions: int) -> int:
    """Bytes of a ContextRecord of ``positions`` positions on a model of ``config``."""
    return 4 * positions * config.n_layers * (2 * config.q_dim + 2 * config.kv_dim)


@dataclass
class ContextRecord:
    """``causal``'s run of a context of ``positions`` positions: per layer, ``keys`` and ``values``
    [n_layers, T, kv_dim], ``queries`` and ``queries_pre_rope`` [n_layers, T, q_dim] (float32), and
    ``causal_bytes``, causal's ledger after the context and its event."""

    keys: np.ndarray
    values: np.ndarray
    queries: np.ndarray
    queries_pre_rope: np.ndarray
    causal_bytes: int

    @property
    def positions(self) -> int:
        return int(self.keys.shape[1])

    @property
    def nbytes(self) -> int:
        return int(self.keys.nbytes + self.values.nbytes + self.queries.nbytes + self.queries_pre_rope.nbytes)

    @classmethod
    def run(cls, engine: Engine, tokens: np.ndarray) -> ContextRecord:
        """Reset ``engine`` (whose plugin attends exactly: ``causal``), run ``tokens`` (the context)
        from position 0 in blocks, recording every layer's queries, keys and values, then the
        compression event after the last position. The engine is left there: its plugin holds the
        context, which the causal branch continues from."""
        config = engine.config
        n = len(tokens)
        shapes = {"q_pre_rope": config.q_dim, "q": config.q_dim, "k": config.kv_dim, "v": config.kv_dim}
        arrays = {stage: np.zeros((config.n_layers, n, width), dtype=np.float32) for stage, width in shapes.items()}

        def keep(stage: str, layer: int, pos: int, rows: np.ndarray) -> None:
            arrays[stage][layer, pos : pos + rows.shape[0]] = rows

        engine.reset()
        engine.set_observer(StageCallback(keep, stages=RECORDED_STAGES))
        try:
            engine.forward_block(np.ascontiguousarray(tokens, dtype=np.int32), 0, classify=False)
        finally:
            engine.set_observer(None)
        engine.compress(n - 1)
        held = checked_memory_bytes(engine.attention, plugin_label(engine.attention))
        return cls(arrays["k"], arrays["v"], arrays["q"], arrays["q_pre_rope"], held)
