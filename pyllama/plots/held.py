"""Which positions a cache holds as a sequence goes on: one layer and KV head, one panel per plugin.

``held_positions_record`` runs a sequence through a plugin one position at a time and asks its
``held_positions(layer)`` after every position (after the compression event where one falls), so
row t of the record is what the plugin holds once position t has run. ``held_positions_figure``
draws the records side by side: position held (x) against positions run (y). A plugin that keeps
summaries or everything (``holds``: lattice's buckets, kmeans, quest, kvquant) reports the positions
it summarises or keeps, and its panel's title says so.

    recs = [held_positions_record(model, spec, tokens, layer=3, compress_at=400)
            for spec in ("causal", "h2o:ratio=0.5", "snapkv:ratio=0.5")]
    held_positions_figure(recs).savefig("held.png")
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure

from pyllama.attention.guard import plugin_label
from pyllama.attention.registry import resolve_attention
from pyllama.errors import InputError
from pyllama.plots.style import OKABE_ITO

if TYPE_CHECKING:
    from pyllama.model import Model

HOLDS_NOTE = {"rows": "", "summaries": " (summarised)", "everything": " (keeps every row)"}


@dataclass
class HeldRecord:
    """What one plugin held at one layer and KV head: ``held[t, p]`` is True when position p was
    held once position t had run (and the event after ``event``, if any, had compressed)."""

    label: str
    layer: int
    head: int
    held: np.ndarray
    holds: str
    event: int

    @property
    def counts(self) -> np.ndarray:
        """Positions held after each position."""
        return self.held.sum(axis=1)


def held_positions_record(
    model: Model,
    attention: Any,
    tokens: Sequence[int] | np.ndarray,
    layer: int = 0,
    head: int = 0,
    compress_at: int = -1,
    threads: int | None = None,
) -> HeldRecord:
    """Run ``tokens`` from position 0 through ``attention`` (a spec, PluginSpec or instance) on
    ``model`` and record its ``held_positions(layer)[head]`` after every position. ``compress_at``:
    the position after which the compression event runs (-1: none)."""
    ids = np.ascontiguousarray(tokens, dtype=np.int32)
    n = int(ids.size)
    config = model.config
    if not 0 <= layer < config.n_layers:
        raise InputError(f"layer {layer} is outside the model's {config.n_layers} layers")
    if not 0 <= head < config.n_kv_heads:
        raise InputError(f"KV head {head} is outside the model's {config.n_kv_heads} KV heads")
    if n < 1:
        raise InputError("held_positions_record needs at least one token")
    if compress_at >= n:
        raise InputError(f"compress_at {compress_at} is past the sequence's last position {n - 1}")
    resolved = resolve_attention(attention)
    label = plugin_label(resolved)
    engine = model.engine(resolved, threads=threads)
    if n > engine.max_positions:
        raise InputError(f"{n:,} tokens, but {label} holds {engine.max_positions:,} positions")
    plugin = engine.attention
    held = np.zeros((n, n), dtype=bool)
    engine.reset()
    for t in range(n):
        engine.forward_block(ids[t : t + 1], t, classify=False)
        if t == compress_at:
            engine.compress(t)
        per_head = plugin.held_positions(layer)
        if per_head is None:
            raise InputError(f"{label} does not say which positions it holds (its held_positions returns None)")
        held[t, np.asarray(per_head[head], dtype=np.int64)] = True
    return HeldRecord(label, layer, head, held, str(getattr(plugin, "holds", "rows")), compress_at)


def held_positions_figure(records: Sequence[HeldRecord], *, columns: int = 4) -> Figure:
    """One panel per record: position held (x) by positions run (y, downwards), the compression
    event marked, the count held at the end in the title."""
    if not records:
        raise ValueError("held_positions_figure needs at least one record")
    cols = min(columns, len(records))
    rows = -(-len(records) // cols)
    fig = Figure(figsize=(3.2 * cols, 3.2 * rows), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False, sharex=True, sharey=True)
    cmap = ListedColormap(["#ffffff", OKABE_ITO["blue"]])
    for ax, rec in zip(axes.flat, records, strict=False):
        n = rec.held.shape[0]
        ax.imshow(
            rec.held,
            cmap=cmap,
            vmin=0,
            vmax=1,
            interpolation="nearest",
            aspect="auto",
            extent=(-0.5, n - 0.5, n - 0.5, -0.5),
        )
        if rec.event >= 0:
            ax.axhline(rec.event + 0.5, color=OKABE_ITO["vermillion"], lw=0.8, label="compression event")
        ax.set_title(f"{rec.label}{HOLDS_NOTE.get(rec.holds, '')}\n{int(rec.counts[-1]):,} of {n:,} held", fontsize=8)
    for ax in axes.flat[len(records) :]:
        ax.set_visible(False)
    for ax in axes[-1]:
        ax.set_xlabel("position held")
    for ax in axes[:, 0]:
        ax.set_ylabel("positions run")
    first = records[0]
    fig.suptitle(f"positions held, layer {first.layer}, KV head {first.head}", fontsize=9)
    return fig
