"""How a branch starts from a recorded context: the four starts, and which one a plugin takes.

A branch is one method at one ratio on one sample: it must end up, at the context's end, in the
state its run from position 0 would leave (``pyllama.diff.branch.SequenceStart``), then run only
the question and the answer. A method that compresses at the event attends exactly until then (the
contract), so the queries, keys and values its layers computed over the context are ``causal``'s:
the record's. Four ways, cheapest first:

* ``FromRecord`` — a method that compresses at the event and offers ``start_from(layer, keys,
  values, queries, queries_pre_rope)`` (every method on ``attention/event.pyx``) builds its state
  from the record (no attention is computed), then ``compress(T - 1)``. On a model with local
  layers (Gemma 3) the method governs the global layers only (``attention/layers.pyx``); the local
  layers run the model's own window, through which ``causal`` attended them too, so the record's
  rows there are the window's own and it keeps them (``LayerSplit.start_local``: no attention
  either). Every start below fills the local layers so.
* ``ReplayAttention`` — a method that compresses at the event without ``start_from``, takes no
  queries before RoPE (the engine's own buffer holds them) and keeps each layer's state apart (no
  ``per_position_order``): its attention calls over the context are made again with the recorded
  queries, keys and values, layer by layer in blocks (``attend_block``, which the contract makes the
  bits of one position at a time), then ``compress(T - 1)``. It sees exactly the calls of its run
  from position 0, so its state is the same; the cost is its attention over the context, no weight
  read. ``causal`` (exact throughout) branches this way too.
* a prefix — a method that departs from ``causal`` before the event (it evicts or selects from some
  position on) but attends its first ``exact_prefix`` positions as ``causal`` does (the attention
  contract: ``sliding:N`` its N, ``sink`` its sinks and window, ``kmeans`` those and its budget):
  its state after them is built from the record, by its ``start_from`` (those three: their rows
  kept, nothing computed) or by replaying its calls, and the model runs from there on, the event
  included. Its queries, keys and values over the prefix are ``causal``'s, so its state is that of
  its run from position 0; the saving is the prefix's weight reads and attention (at ratio 0.25
  about three quarters of the context).
* none — every other plugin runs from position 0 (``way = "whole"``): one that evicts from position
  0 (h2o, tova and scissorhands with a ratio evict from their fourth position or so) computes other
  queries, keys and values than ``causal`` from its first eviction on, so no record of ``causal``'s
  run holds its inputs.

``Prefilled`` enters, once, an engine that ran the context itself (the record's own ``causal``
engine: its first branch costs nothing), and any later entry through another start.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from pyllama.attention.guard import plugin_calls, plugin_label
from pyllama.attention.layers import LayerSplit

if TYPE_CHECKING:
    from pyllama.attention.base import Attention
    from pyllama.diff.branch import SequenceStart
    from pyllama.engine import Engine
    from pyllama.leaderboard.record import ContextRecord

__all__ = ["FromRecord", "Prefilled", "ReplayAttention", "WAYS", "branch_way", "replay_layer", "start_for"]

WAYS = ("record", "replay", "prefix", "whole")  # how a branch reaches the context's end, cheapest first
REPLAY_BLOCK = 128  # positions per replayed attend_block call (any size gives the same bits)


def _governed(plugin: Attention) -> tuple[Attention, LayerSplit | None]:
    """The plugin that governs the global layers, and the split that runs the model's own window on
    the local layers (None: a model without local layers, or a plugin that handles them):
    ``attention/layers.pyx``."""
    inner = getattr(plugin, "inner", None)
    if isinstance(plugin, LayerSplit) and inner is not None:
        return inner, plugin
    return plugin, None


def _replayable(plugin: Attention) -> bool:
    """Whether ``plugin``'s calls can be made again layer by layer from the record: it takes no
    queries before RoPE (the engine's own buffer holds them) and keeps each layer's state apart."""
    return not getattr(plugin, "wants_pre_rope_query", False) and not getattr(plugin, "per_position_order", False)


def _builds_from_record(plugin: Attention) -> bool:
    """Whether the plugin that governs ``plugin``'s global layers builds its state with ``start_from``."""
    return callable(getattr(_governed(plugin)[0], "start_from", None))


def branch_way(plugin: Attention) -> str:
    """How ``plugin`` (an instance, as the engine runs it: some declare per instance) starts a
    branch: one of ``WAYS``."""
    if not getattr(plugin, "compresses_at_event", False):
        return "prefix" if int(getattr(plugin, "exact_prefix", 0)) > 0 and _replayable(plugin) else "whole"
    if _builds_from_record(plugin):
        return "record"
    return "replay" if _replayable(plugin) else "whole"


class FromRecord:
    """The state after the record's first ``prefix`` positions (None: the whole context) built by the
    plugin's ``start_from`` on every layer; the compression event when that is the whole context."""

    def __init__(self, record: ContextRecord, prefix: int | None = None) -> None:
        self.record = record
        self.position = _prefix_positions(record, prefix)

    def enter(self, engine: Engine) -> None:
        rec, n = self.record, self.position
        method, split = _governed(engine.attention)
        engine.reset()
        with plugin_calls(plugin_label(method), "start_from"):
            for layer in _start_local_layers(split, rec, n):
                method.start_from(  # type: ignore[attr-defined]  # checked by branch_way and start_for
                    layer,
                    rec.keys[layer, :n],
                    rec.values[layer, :n],
                    rec.queries[layer, :n],
                    rec.queries_pre_rope[layer, :n],
                )
        if n == rec.positions:
            engine.compress(n - 1)


def _start_local_layers(split: LayerSplit | None, rec: ContextRecord, n: int) -> list[int]:
    """Fill the model's own window on every local layer of ``split`` with the record's first ``n``
    rows (``LayerSplit.start_local``: no attention), and give the layers left to the start: the global
    ones, or every layer where there is no split."""
    layers = range(rec.keys.shape[0])
    if split is None:
        return list(layers)
    local = split.local_layers
    for layer in local:
        split.start_local(layer, rec.keys[layer, :n], rec.values[layer, :n])
    return [layer for layer in layers if layer not in local]


def _prefix_positions(record: ContextRecord, prefix: int | None) -> int:
    """The positions a start covers: ``prefix`` (None: the whole context), at most the context."""
    if prefix is None:
        return record.positions
    if prefix < 1:
        raise ValueError(f"a start over a prefix of {prefix} positions: expected at least 1")
    return min(int(prefix), record.positions)


def replay_layer(plugin: Attention, rec: ContextRecord, layer: int, n: int) -> None:
    """``plugin``'s attention calls of ``layer`` over positions 0 .. n - 1 made again with the
    recorded rows, in blocks of ``REPLAY_BLOCK`` (the outputs are not kept)."""
    out = np.zeros((min(REPLAY_BLOCK, n), rec.queries.shape[2]), dtype=np.float32)
    for c0 in range(0, n, REPLAY_BLOCK):
        c1 = min(n, c0 + REPLAY_BLOCK)
        plugin.attend_block(
            layer, c0, rec.queries[layer, c0:c1], rec.keys[layer, c0:c1], rec.values[layer, c0:c1], out[: c1 - c0]
        )


class ReplayAttention:
    """The state after the record's first ``prefix`` positions (None: the whole context) reached by
    making their attention calls again with the recorded rows (every layer, in blocks of
    ``REPLAY_BLOCK`` positions); the compression event when that is the whole context."""

    def __init__(self, record: ContextRecord, prefix: int | None = None) -> None:
        self.record = record
        self.position = _prefix_positions(record, prefix)

    def enter(self, engine: Engine) -> None:
        rec, plugin, n = self.record, engine.attention, self.position
        engine.reset()
        with plugin_calls(plugin_label(plugin), "attend_block"):
            for layer in _start_local_layers(_governed(plugin)[1], rec, n):
                replay_layer(plugin, rec, layer, n)
        if n == rec.positions:
            engine.compress(n - 1)


class Prefilled:
    """An engine that ran the context itself (and its event): entered once as it is, then through ``then``."""

    def __init__(self, engine: Engine, then: SequenceStart) -> None:
        self.engine: Engine | None = engine
        self.then = then
        self.position = then.position

    def enter(self, engine: Engine) -> None:
        if engine is self.engine:
            self.engine = None  # its state is used up by the run that follows
            return
        self.then.enter(engine)


def start_for(way: str, record: ContextRecord, plugin: Attention | None = None) -> SequenceStart | None:
    """The start of a branch that reaches the context's end ``way`` (None: from position 0);
    ``prefix`` needs the ``plugin`` instance: its ``exact_prefix`` positions are built from the
    record by its ``start_from`` where it has one, else replayed."""
    if way == "record":
        return FromRecord(record)
    if way == "replay":
        return ReplayAttention(record)
    if way == "prefix":
        if plugin is None:
            raise ValueError("start_for: the prefix start needs the plugin, whose exact_prefix it replays")
        prefix = int(plugin.exact_prefix)
        if _builds_from_record(plugin):
            return FromRecord(record, prefix)
        return ReplayAttention(record, prefix)
    return None
