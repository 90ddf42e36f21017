"""A small event method for the compress-once-branch-many tests: ``compress`` and ``start_from``.

``MeanQueryPress`` attends exactly (an inner ``causal``, the engine's own bits) until the compression
event. It also keeps every key and value, and running float64 sums of each layer's queries after
and before RoPE (in position order, one row at a time). At ``compress(pos)`` each layer keeps, per KV
head, the ``window`` most recent positions and, of the others, those whose keys score highest
against the two summed queries of the head's group (``k . (sum q + sum q_pre)``; ties to the later
position), ``n - floor(ratio n)`` rows in all; from then on it attends those rows in float64 numpy.
``start_from`` builds the state of the first T positions from a recorded causal run: the same rows,
and the same sums added in the same order, so a branch gives the bits of the run from position 0.

``MeanQueryPress`` (``test-branch-press``) has ``start_from``; ``MeanQueryReplay``
(``test-replay-press``) has neither it nor the queries before RoPE, so its branches replay its
attention over the record. The tests register both, so that the tests which parametrize over every
registered method of a kind cover them beside the built-in methods.
"""

from __future__ import annotations

import math

import numpy as np

from pyllama.attention.base import Attention
from pyllama.attention.spec import Knob
from pyllama.errors import InputError, PositionError
from pyllama.plugins.causal import Causal

NAME = "test-branch-press"
REPLAY_NAME = "test-replay-press"


class MeanQuery(Attention):
    """The policy (see the module docstring); ``MeanQueryPress`` and ``MeanQueryReplay`` are the methods."""

    description = "exact until the event, then the keys closest to the mean queries (a test method)"
    knobs = (
        Knob("ratio", float, 0.5, "share of the held rows the compression removes, in [0, 1)", min=0.0),
        Knob("window", int, 4, "most recent positions always kept", min=0),
    )
    compresses_at_event = True

    def __init__(self, ratio: float = 0.5, window: int = 4) -> None:
        if not 0 <= ratio < 1:
            raise InputError(f"{self.name}: ratio {ratio} is out of range: valid is 0 <= x < 1")
        self.ratio, self.window = ratio, window
        self.inner = Causal()

    def init(self, config, pool) -> None:
        self.inner._configure(config, pool)
        self.inner.init(config, pool)
        self.max_positions = self.inner.max_positions
        L, P = config.n_layers, self.max_positions
        self.hd, self.kv_mul = config.head_dim, config.n_heads // config.n_kv_heads
        self.keys = np.zeros((L, P, config.kv_dim), dtype=np.float32)
        self.values = np.zeros((L, P, config.kv_dim), dtype=np.float32)
        self.sum_q = np.zeros((L, config.q_dim))
        self.sum_pre = np.zeros((L, config.q_dim))
        self.reset()

    def reset(self) -> None:
        self.inner.reset()
        L, G = self.config.n_layers, self.config.n_kv_heads
        self.length = [0] * L
        self.held: list[list[np.ndarray] | None] = [None] * L  # None: exact (no compression yet)
        self.sum_q[:] = 0
        self.sum_pre[:] = 0
        self.groups = G

    def memory_bytes(self) -> int:
        rows = sum(
            self.length[layer] * self.groups if held is None else sum(h.size for h in held)
            for layer, held in enumerate(self.held)
        )
        return rows * 2 * self.hd * 4 + self.sum_q.nbytes + self.sum_pre.nbytes

    def held_positions(self, layer):
        if self.held[layer] is None:
            return [np.arange(self.length[layer], dtype=np.int64) for _ in range(self.groups)]
        return [h.copy() for h in self.held[layer]]

    # ---- attending ---------------------------------------------------------------------------------
    def _keep(self, layer: int, pos: int, q, k, v, q_pre) -> None:
        if pos != self.length[layer]:
            raise PositionError(f"{self.name}: layer {layer} got position {pos} after {self.length[layer]}")
        n = k.shape[0]
        self.keys[layer, pos : pos + n] = k
        self.values[layer, pos : pos + n] = v
        for i in range(n):  # one row at a time, in order: the sums' bits do not depend on the blocks
            self.sum_q[layer] += q[i]
            self.sum_pre[layer] += q_pre[i]
        self.length[layer] = pos + n
        if self.held[layer] is not None:
            for g in range(self.groups):
                self.held[layer][g] = np.append(self.held[layer][g], np.arange(pos, pos + n))

    def attend(self, layer, pos, q, k, v, out):
        self.attend_block(layer, pos, q[None], k[None], v[None], out[None])

    def attend_block(self, layer, pos, q, k, v, out):
        pre = np.atleast_2d(self.query_before_rope) if self.wants_pre_rope_query else np.zeros_like(q)
        if self.held[layer] is None:
            self._keep(layer, pos, q, k, v, pre)
            self.inner.attend_block(layer, pos, q, k, v, out)
            return
        for i in range(q.shape[0]):
            self._keep(layer, pos + i, q[i : i + 1], k[i : i + 1], v[i : i + 1], pre[i : i + 1])
            self._attend_held(layer, q[i], out[i])

    def _attend_held(self, layer: int, q: np.ndarray, out: np.ndarray) -> None:
        hd = self.hd
        for h in range(self.config.n_heads):
            g = h // self.kv_mul
            rows = self.held[layer][g]
            keys = self.keys[layer, rows, g * hd : (g + 1) * hd].astype(np.float64)
            scores = keys @ q[h * hd : (h + 1) * hd].astype(np.float64) / math.sqrt(hd)
            w = np.exp(scores - scores.max())
            out[h * hd : (h + 1) * hd] = (w / w.sum()) @ self.values[layer, rows, g * hd : (g + 1) * hd]

    # ---- the event ---------------------------------------------------------------------------------
    def compress(self, pos):
        hd, n = self.hd, pos + 1
        for layer in range(self.config.n_layers):
            if self.length[layer] != n:
                raise PositionError(f"{self.name}: compress({pos}) but layer {layer} attended {self.length[layer]}")
            held = self.held[layer] or [np.arange(n) for _ in range(self.groups)]
            kept = []
            for g, rows in enumerate(held):
                heads = slice(g * self.kv_mul * hd, (g + 1) * self.kv_mul * hd)
                mean = (self.sum_q[layer, heads] + self.sum_pre[layer, heads]).reshape(self.kv_mul, hd).sum(axis=0)
                score = self.keys[layer, rows, g * hd : (g + 1) * hd].astype(np.float64) @ mean
                target = rows.size - math.floor(self.ratio * rows.size + 1e-9)
                recent = rows >= n - self.window
                order = np.lexsort((rows, score))[::-1]  # highest score first, the later position on a tie
                chosen = set(rows[recent].tolist())
                for r in rows[order]:
                    if len(chosen) >= target:
                        break
                    chosen.add(int(r))
                kept.append(np.array(sorted(chosen), dtype=np.int64))
            self.held[layer] = kept


class MeanQueryPress(MeanQuery):
    """The method with ``start_from``: it also sums the queries before RoPE (the engine hands them)."""

    name = NAME
    wants_pre_rope_query = True

    def start_from(self, layer, keys, values, queries=None, queries_pre_rope=None):
        if self.length[layer] != 0:
            raise PositionError(f"{NAME}: start_from on layer {layer}, which attended {self.length[layer]} already")
        if queries is None or queries_pre_rope is None:
            raise InputError(f"{NAME}: start_from needs the queries after and before RoPE")
        self._keep(layer, 0, queries, keys, values, queries_pre_rope)


class MeanQueryReplay(MeanQuery):
    """The method without ``start_from`` nor queries before RoPE (their sum stays 0): a branch replays
    its attention over the record."""

    name = REPLAY_NAME
