"""Figures of the retrieval probes: the needle heatmap (depth x haystack length, one panel per plugin)
and the key's probability against its distance from the answer; and what a diff's per-position
figures show of a retrieval probe (``mark_retrieval``, ``retrieval_caption``): where the needle and
the answer are, and P(key) on each side.

Both take the scored plugins as a list of ``DiffReport`` (its side B; ``sides="ab"`` draws A too),
``RetrievalRun`` (``pyllama.diff.retrieval_scores.score_retrieval``), or a mapping of a label to a
list of ``RetrievalRow`` with its scores on side ``a``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from matplotlib.colors import LogNorm, Normalize
from matplotlib.figure import Figure

from pyllama.plots.style import OKABE_ITO, legend_below, series_style

if TYPE_CHECKING:
    from pyllama.diff.retrieval_scores import KeyScore, RetrievalRow

P_FLOOR = 1e-8  # the colour scale's floor: a key the plugin gives less than this is drawn as this
NEEDLE_COLOR = OKABE_ITO["green"]
ANSWER_COLOR = OKABE_ITO["sky_blue"]


def _scored(results: Any, sides: str = "b") -> list[tuple[str, list[tuple[RetrievalRow, KeyScore]]]]:
    """(label, [(row, that plugin's score)]) per plugin, passkey rows only."""
    out: list[tuple[str, list[tuple[RetrievalRow, KeyScore]]]] = []
    if isinstance(results, Mapping):
        items = [(label, [(r, r.a) for r in rows]) for label, rows in results.items()]
    else:
        items = []
        for res in results:
            if hasattr(res, "retrieval"):  # a DiffReport
                for side in sides:
                    items.append((getattr(res, side), [(r, getattr(r, side)) for r in res.retrieval]))
            else:  # a RetrievalRun
                items.append((res.spec, [(r, r.a) for r in res.rows]))
    for label, pairs in items:
        pairs = [(r, s) for r, s in pairs if r.kind == "passkey" and s is not None]
        if pairs and label not in [lab for lab, _ in out]:
            out.append((label, pairs))
    if not out:
        raise ValueError("the retrieval figures need at least one plugin scored on passkey or needle sequences")
    return out


def _depth(row: RetrievalRow) -> float:
    """Where a passkey row's needle is (every passkey sequence has a depth)."""
    if row.depth is None:
        raise ValueError(f"retrieval row {row.segment} has no needle depth to place it on the grid")
    return row.depth


def needle_heatmap_figure(results: Any, *, value: str = "p", sides: str = "b", columns: int = 4) -> Figure:
    """One panel per plugin: the needle grid, depth (rows) x sequence length (columns), coloured by
    P(key) teacher-forced (``value="p"``, log scale) or by retrieval (``value="retrieves"``: 1 where
    every key token is rank 1). A cell where the plugin retrieves the key is marked with a dot."""
    if value not in ("p", "retrieves"):
        raise ValueError(f"value must be 'p' or 'retrieves', got {value!r}")
    plugins = _scored(results, sides)
    depths = sorted({_depth(r) for _, pairs in plugins for r, _ in pairs})
    lengths = sorted({r.requested for _, pairs in plugins for r, _ in pairs})
    ncols = min(columns, len(plugins))
    nrows = -(-len(plugins) // ncols)
    fig = Figure(figsize=(1.2 + 2.6 * ncols, 0.9 + (0.35 * len(depths) + 1.0) * nrows), layout="constrained")
    axes = np.atleast_1d(fig.subplots(nrows, ncols, squeeze=False)).ravel()
    norm = LogNorm(vmin=P_FLOOR, vmax=1.0) if value == "p" else Normalize(vmin=0.0, vmax=1.0)
    image = None
    for ax, (label, pairs) in zip(axes, plugins, strict=False):
        grid = np.full((len(depths), len(lengths)), np.nan)
        for r, s in pairs:
            i, j = depths.index(_depth(r)), lengths.index(r.requested)
            grid[i, j] = max(s.p, P_FLOOR) if value == "p" else float(s.retrieves)
            if s.retrieves:
                ax.plot(j, i, "o", color="white", ms=4, mec="black", mew=0.6)
        image = ax.imshow(grid, cmap="cividis", norm=norm, aspect="auto", origin="upper")
        ax.set_xticks(range(len(lengths)), [f"{n:,}" for n in lengths], fontsize="small")
        ax.set_yticks(range(len(depths)), [f"{d:g}" for d in depths], fontsize="small")
        ax.set_title(_wrap(label), fontsize="small")
        ax.set_xlabel("tokens in the sequence", fontsize="small")
        ax.set_ylabel("needle depth", fontsize="small")
    for ax in axes[len(plugins) :]:
        ax.set_visible(False)
    what = "P(key), teacher-forced" if value == "p" else "retrieves (every key token rank 1)"
    assert image is not None  # _scored returns at least one plugin, so one panel was drawn
    fig.colorbar(image, ax=axes[: len(plugins)].tolist(), shrink=0.8, label=what)
    fig.suptitle(f"needle grid: {what}; dot = retrieves")
    return fig


def key_distance_figure(results: Any, *, sides: str = "b", context: int | None = None) -> Figure:
    """P(key) teacher-forced against the distance from the needle to the answer (tokens), one line
    per plugin over every passkey sequence it scored; filled markers where it retrieves the key."""
    plugins = _scored(results, sides)
    fig = Figure(figsize=(9, 5), layout="constrained")
    ax = fig.subplots()
    for i, (label, pairs) in enumerate(plugins):
        pairs = sorted(pairs, key=lambda rs: rs[0].distance)
        x = np.array([r.distance for r, _ in pairs])
        y = np.array([max(s.p, P_FLOOR) for _, s in pairs])
        hit = np.array([s.retrieves for _, s in pairs])
        style = series_style(i)
        ax.plot(x, y, lw=1.0, label=label, **style)
        ax.plot(x[hit], y[hit], "o", color=style["color"], ms=5)
        ax.plot(x[~hit], y[~hit], "o", color=style["color"], ms=5, mfc="white")
    if context:
        ax.axvline(context, color="grey", ls=":", lw=1.0, label=f"trained context ({context})")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_ylim(P_FLOOR / 2, 2.0)
    ax.set_xlabel("distance from the needle to the answer (tokens, log)")
    ax.set_ylabel("P(key), teacher-forced (log)")
    ax.set_title("key probability against distance; filled = retrieves (every key token rank 1)")
    ax.grid(alpha=0.3, which="both")
    legend_below(fig, ax, len(plugins))
    return fig


def mark_retrieval(ax, report) -> None:
    """On an axis against position: each retrieval sequence's needle (a dashed line at the key's
    first token in the haystack; the first copy's for ``copy``) and answer (the span of the scored
    tokens after the question). Nothing for a probe without retrieval sequences."""
    for i, r in enumerate(report.retrieval):
        score = r.a if r.a is not None else r.b
        n = len(score.ranks) if score is not None else 1
        first = i == 0  # one legend entry each
        ax.axvline(r.needle, color=NEEDLE_COLOR, ls="--", lw=0.9, label="needle" if first else "_nolegend_")
        ax.axvspan(
            r.answer - 0.5, r.answer + n - 0.5, color=ANSWER_COLOR, alpha=0.3, lw=0,
            label="answer" if first else "_nolegend_",
        )  # fmt: skip


def retrieval_caption(report) -> str | None:
    """P(key) teacher-forced on each side (and whether each retrieves the key), for a figure's title:
    the values of a single passkey sequence, else the keys retrieved and the mean log10 P(key)."""
    rows = [r for r in report.retrieval if r.kind == "passkey" and r.a is not None and r.b is not None]
    if not rows:
        return None
    if len(rows) == 1:
        a, b = rows[0].a, rows[0].b
        said = {True: "retrieved", False: "not retrieved"}
        return f"P(key): A {a.p:.3g}, B {b.p:.3g} (A {said[a.retrieves]}, B {said[b.retrieves]})"

    def mean_log10(side: str) -> float:
        return float(np.mean([getattr(r, side).logp for r in rows])) / np.log(10)

    hits = {side: sum(getattr(r, side).retrieves for r in rows) for side in "ab"}
    return (
        f"keys retrieved: A {hits['a']}/{len(rows)}, B {hits['b']}/{len(rows)}; "
        f"mean log10 P(key): A {mean_log10('a'):.3g}, B {mean_log10('b'):.3g}"
    )


def _wrap(spec: str, width: int = 34) -> str:
    """A long spec on several lines, broken after commas, so neighbouring panel titles never overlap."""
    lines = [""]
    for part in spec.split(","):
        piece = part if not lines[-1] else "," + part
        if lines[-1] and len(lines[-1]) + len(piece) > width:
            lines[-1] += ","
            lines.append(part)
        else:
            lines[-1] += piece
    return "\n".join(lines)


def retrieval_plugins(results: Sequence[Any], sides: str = "b") -> list[str]:
    """The plugin labels the figures draw, in order (for tests and legends)."""
    return [label for label, _ in _scored(results, sides)]
