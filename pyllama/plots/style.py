"""Shared style of pyllama's figures: the Okabe-Ito palette, line styles, log-axis thresholds, and
small helpers (aggregating a report over sequences, legends below the axes, the context line)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from pyllama.diff.report import DiffReport


# Okabe & Ito (2008), "Color Universal Design"
OKABE_ITO = {
    "orange": "#E69F00",
    "sky_blue": "#56B4E9",
    "green": "#009E73",
    "yellow": "#F0E442",
    "blue": "#0072B2",
    "vermillion": "#D55E00",
    "purple": "#CC79A7",
    "black": "#000000",
}
COLOR_A = OKABE_ITO["blue"]
COLOR_B = OKABE_ITO["vermillion"]
COLOR_REF = OKABE_ITO["black"]
# one colour per plugin in the comparison figures: black (the reference) and yellow (faint on white) last
SERIES_COLORS = tuple(
    OKABE_ITO[c] for c in ("blue", "vermillion", "green", "orange", "sky_blue", "purple", "black", "yellow")
)
SERIES_STYLES = ("-", "--", "-.", ":")  # after every colour is used once, the next style
DLOGIT_LINTHRESH = 1e-6  # symlog axes: exact zeros stay visible, anything above is on a log scale
KL_LINTHRESH = 1e-8


def by_position(report, values: np.ndarray, how: str) -> tuple[np.ndarray, np.ndarray]:
    """(positions, value per position) aggregated over sequences: "max" or "mean"."""
    pos = report.position.astype(np.int64)
    if pos.size == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0)
    n = int(pos.max()) + 1
    count = np.bincount(pos, minlength=n)
    if how == "max":
        out = np.full(n, -np.inf)
        np.maximum.at(out, pos, values)
    else:
        out = np.bincount(pos, weights=values, minlength=n) / np.maximum(count, 1)
    keep = count > 0
    return np.nonzero(keep)[0], out[keep]


def series_style(i: int) -> dict:
    """Colour and line style of the i-th plugin in a comparison figure."""
    n = len(SERIES_COLORS)
    return {"color": SERIES_COLORS[i % n], "ls": SERIES_STYLES[(i // n) % len(SERIES_STYLES)]}


def moving_mean(x: np.ndarray, y: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
    """Trailing mean over ``width`` consecutive points, drawn at the last one (width <= 1: unchanged)."""
    width = min(int(width), y.shape[0])
    if width <= 1:
        return x, y
    return x[width - 1 :], np.convolve(y, np.ones(width) / width, mode="valid")


def check_reports(reports: Sequence[DiffReport]) -> list[DiffReport]:
    reports = list(reports)
    if not reports:
        raise ValueError("the comparison figures need at least one DiffReport")
    return reports


def compare_title(reports: list[DiffReport]) -> str:
    refs = sorted({r.a for r in reports})
    probes = sorted({r.probe for r in reports})
    models = sorted({r.model.rsplit("/", 1)[-1] for r in reports})
    against = refs[0] if len(refs) == 1 else f"{len(refs)} references"
    n = len(reports)
    return (
        f"{n} plugin{'s' if n != 1 else ''} against {against} — "
        f"{', '.join(probes)} probe{'s' if len(probes) != 1 else ''}, {', '.join(models)}"
    )


def context_line(ax: Axes, context: int | None) -> None:
    if context:
        ax.axvline(context, color="grey", ls=":", lw=1.0, label=f"trained context ({context})")


def legend_below(fig: Figure, ax: Axes, n_items: int) -> None:
    handles, labels = ax.get_legend_handles_labels()
    width, height = fig.get_size_inches()
    # as many columns as the longest label allows (small font: ~0.065 in per character), so long
    # plugin specs are never cut at the figure's edge
    longest = max((len(label) for label in labels), default=10)
    fits = max(1, int(width / (0.35 + 0.065 * longest)))
    ncols = min(1 if n_items <= 2 else (2 if n_items <= 6 else 3), fits)
    nrows = -(-len(labels) // ncols)
    if nrows > 3:  # grow the figure for the extra legend rows, so the axes keep their size
        fig.set_size_inches(width, height + 0.2 * (nrows - 3))
    fig.legend(handles, labels, loc="outside lower center", ncols=ncols, fontsize="small", frameon=False)
