"""The leaderboard's figures: kvpress's score-against-compression plot, and the samples a score needs.

``leaderboard_figure`` takes a board's points (``pyllama.leaderboard.report.board_points`` of a
table such as ``pyllama leaderboard``'s ``results.parquet``; ``pyllama.leaderboard.figure(df)`` draws
a table directly): one panel per RULER family and one for the average over every task, one row of panels per score
(RULER's string match, log P(answer)) and per model and length. x is the share of ``causal``'s bytes
a method removed at the context's end, as the ledger measured it (the mean over the panel's
samples); y its mean score with the 95% bootstrap interval (``pyllama.leaderboard.report``). One line
per method, from ``causal`` at 0, which is also drawn across the panel as the ceiling with its
interval. A method that keeps every row (``holds = "everything"``: quest, kmeans) removes no bytes:
it is drawn apart, hollow and dotted at its nominal ratio, and its legend entry says so.

``samples_needed_figure`` draws a ``pyllama.leaderboard.stability`` result: per score, the share of
bootstrap draws of n samples whose ranking of the methods agrees with the whole board's (Kendall's
tau at least the threshold), against n, with the target share and each score's n marked.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from matplotlib.figure import Figure

from pyllama.plots.style import COLOR_REF, legend_below, series_style

if TYPE_CHECKING:
    import pandas as pd

    from pyllama.leaderboard.stability import Stability

__all__ = ["leaderboard_figure", "samples_needed_figure"]

FAMILY_TITLES = {
    "niah": "needle in a haystack",
    "vt": "variable tracking",
    "cwe": "common words",
    "fwe": "frequent words",
    "average": "average over the tasks",
}
NO_BYTES = " (keeps every row: at its nominal ratio)"


def leaderboard_figure(
    points: pd.DataFrame, scores: dict[str, str], ceiling_method: str = "causal", average: str = "average"
) -> Figure:
    """The board of ``points`` (one row per model, length, panel, method and ratio), one row of
    panels per score in ``scores`` (column: axis label); see the module docstring."""
    if points.empty:
        raise ValueError("leaderboard_figure: the table has no row without an error")
    panels = [p for p in ("niah", "vt", "cwe", "fwe") if p in set(points["panel"])] + [average]
    boards = list(dict.fromkeys(zip(points["model"], points["length"], strict=True)))
    rows = [(b, s) for b in boards for s in scores]
    fig = Figure(figsize=(3.2 * len(panels) + 1, 2.8 * len(rows) + 1.2), layout="constrained")
    axes = np.atleast_2d(fig.subplots(len(rows), len(panels), squeeze=False))
    methods = [m for m in dict.fromkeys(points["method"]) if m != ceiling_method]
    for r, ((model, length), score) in enumerate(rows):
        for c, panel in enumerate(panels):
            ax = axes[r, c]
            pts = points[(points["model"] == model) & (points["length"] == length) & (points["panel"] == panel)]
            ceiling = pts[pts["method"] == ceiling_method]
            if len(ceiling):
                top = ceiling.iloc[0]
                ax.axhline(
                    top[score], color=COLOR_REF, ls="--", lw=1.0, label=f"{ceiling_method} (ratio 0, the ceiling)"
                )
                ax.axhspan(top[f"{score}_lo"], top[f"{score}_hi"], color=COLOR_REF, alpha=0.08, lw=0)
            for i, method in enumerate(methods):
                _draw_method(ax, pts[pts["method"] == method].sort_values("ratio"), ceiling, score, method, i)
            ax.set_xlim(-0.02, 1.0)
            ax.grid(alpha=0.3)
            if r == 0 or len(boards) > 1:
                ax.set_title(FAMILY_TITLES.get(panel, panel), fontsize="medium")
            if c == 0:
                ax.set_ylabel(f"{scores[score]}\n{model}, {length:,} tokens", fontsize="small")
    for ax in axes[-1]:  # on the axes, not the figure: the legend goes below them
        ax.set_xlabel("share of causal's bytes removed\nafter the context (the ledger)", fontsize="small")
    legend_below(fig, axes[0, -1], len(methods) + 1)
    fig.suptitle("RULER: score against compression, one line per method (95% bootstrap intervals)")
    return fig


def _draw_method(ax, mine: pd.DataFrame, ceiling: pd.DataFrame, score: str, method: str, index: int) -> None:
    if mine.empty:
        return
    saves = bool(mine["saves_bytes"].all())
    x = (mine["removed"] if saves else mine["ratio"]).to_numpy(dtype=float)
    y = mine[score].to_numpy(dtype=float)
    lo, hi = mine[f"{score}_lo"].to_numpy(dtype=float), mine[f"{score}_hi"].to_numpy(dtype=float)
    if len(ceiling):
        x, y = np.r_[0.0, x], np.r_[ceiling.iloc[0][score], y]
        lo, hi = np.r_[ceiling.iloc[0][f"{score}_lo"], lo], np.r_[ceiling.iloc[0][f"{score}_hi"], hi]
    style = series_style(index)
    if not saves:
        style["ls"] = ":"
    ax.errorbar(
        x,
        y,
        yerr=[y - lo, hi - y],
        marker="o",
        ms=4,
        lw=1.2,
        capsize=2,
        mfc="none" if not saves else style["color"],
        label=method + ("" if saves else NO_BYTES),
        **style,
    )


def samples_needed_figure(result: Stability) -> Figure:
    """Per score, the share of bootstrap draws of n samples per cell whose ranking agrees with the
    whole board's (Kendall's tau >= the threshold) against n; the target share and each score's n."""
    fig = Figure(figsize=(7, 4.2), layout="constrained")
    ax = fig.subplots()
    for i, (score, curve) in enumerate(result.curves.items()):
        style = series_style(i)
        ns = np.array(sorted(curve))
        ax.plot(
            ns, [curve[n] for n in ns], marker="o", ms=3, label=f"{score}: n = {result.needed_text(score)}", **style
        )
        needed = result.needed[score]
        if needed is not None:
            ax.axvline(needed, color=style["color"], lw=0.8, alpha=0.6)
    ax.axhline(result.share, color=COLOR_REF, ls="--", lw=1.0, label=f"target: {result.share:.0%} of draws")
    ax.set_xlabel("samples per task and method (bootstrap draws from the board's)")
    ax.set_ylabel(f"share of draws with Kendall's tau >= {result.tau:g}")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    legend_below(fig, ax, len(result.curves) + 1)
    fig.suptitle(f"Samples to rank {result.items} method-ratio points stably ({result.draws} draws per n)")
    return fig
