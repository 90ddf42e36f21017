"""Figures of a diff report (matplotlib). One function per figure, each returning the Figure.

The x axis is the position in a sequence; a probe has several sequences, so each curve shows, per
position, the worst (max |Δlogit|) or the mean (KL, layer error) over the sequences that reach it.
Colours are the Okabe-Ito palette and the heatmap uses cividis, both readable with colour-vision
deficiencies. Figures are built without pyplot (no GUI backend needed); in a notebook a returned
Figure displays itself once the inline backend is on (``%matplotlib inline``).

One report (plugin B against plugin A): ``divergence_figure``, ``layer_error_figure``,
``memory_figure``, ``recall_figure`` and ``report_figure`` (the overview ``pyllama diff --plot``
writes). Several reports against one reference, one line or point per plugin:
``compare_divergence_figure``, ``compare_memory_figure`` and ``pareto_figure`` (memory against mean
KL); ``study_pareto_figure`` draws the same from a sweep's results table, a front per plugin family.
``nll_figure`` draws per-position negative log-likelihoods of several plugins.

    fig = divergence_figure(report); fig.savefig("divergence.png")
    fig = pareto_figure([m.diff("causal", spec) for spec in ("sliding:64", "sink:4,60", "lattice")])
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from matplotlib.colors import LogNorm
from matplotlib.figure import Figure

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from numpy.typing import ArrayLike

    from pyllama.diff.report import DiffReport

__all__ = [
    "OKABE_ITO",
    "compare_divergence_figure",
    "compare_memory_figure",
    "divergence_figure",
    "layer_error_figure",
    "memory_figure",
    "nll_figure",
    "pareto_figure",
    "pareto_front",
    "recall_figure",
    "report_figure",
    "study_pareto_figure",
]

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


def _by_position(report, values: np.ndarray, how: str) -> tuple[np.ndarray, np.ndarray]:
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


def _title(report) -> str:
    return f"{report.b} vs {report.a} — {report.probe} probe, {report.model.rsplit('/', 1)[-1]}"


def _draw_dlogit(ax, report) -> None:
    x, y = _by_position(report, report.max_abs_dlogit, "max")
    ax.plot(x, y, color=COLOR_B, lw=1.0, label="max over sequences")
    ax.set_yscale("symlog", linthresh=DLOGIT_LINTHRESH)
    ax.set_ylabel("max |Δlogit|")
    ax.set_title("logit difference")
    _mark_first_diff(ax, report)


def _draw_kl(ax, report) -> None:
    x, y = _by_position(report, report.kl, "mean")
    _, ymax = _by_position(report, report.kl, "max")
    ax.plot(x, ymax, color=OKABE_ITO["orange"], lw=0.8, alpha=0.8, label="max over sequences")
    ax.plot(x, y, color=COLOR_B, lw=1.2, label="mean over sequences")
    ax.set_yscale("symlog", linthresh=KL_LINTHRESH)
    ax.set_ylabel("KL(A ‖ B) [nats]")
    ax.set_title("KL divergence of the next-token distributions")
    ax.legend(loc="lower right", fontsize="small", frameon=False)
    _mark_first_diff(ax, report)


def _mark_first_diff(ax, report) -> None:
    fd = report.summary.get("first_diff") if report.n_positions else None
    if fd:
        ax.axvline(fd["position"], color=OKABE_ITO["black"], ls=":", lw=0.8)
        ax.annotate(
            f"first difference: {fd['position']}",
            (fd["position"], 1.0),
            xycoords=("data", "axes fraction"),
            xytext=(3, -12),
            textcoords="offset points",
            fontsize="small",
        )


def _draw_layers(ax, report, fig) -> None:
    L = report.n_layers
    pos = report.position.astype(np.int64)
    n = int(pos.max()) + 1 if pos.size else 1
    grid = np.zeros((L, n))
    for layer in range(L):
        x, y = _by_position(report, report.layer_err[:, layer], "mean")
        grid[layer, x] = y
    positive = grid[np.isfinite(grid) & (grid > 0)]
    if positive.size:
        vmin = max(float(positive.min()), float(positive.max()) * 1e-8)
        shown = np.where(grid > 0, grid, np.nan)
        im = ax.imshow(
            shown,
            aspect="auto",
            origin="lower",
            interpolation="nearest",
            cmap="cividis",
            norm=LogNorm(vmin=vmin, vmax=float(positive.max())),
            extent=(-0.5, n - 0.5, -0.5, L - 0.5),
        )
        ax.set_facecolor("white")
        fig.colorbar(im, ax=ax, label="relative L2 error (white: exact)")
    else:
        ax.text(
            0.5,
            0.5,
            "every layer's attention output is bit-identical",
            ha="center",
            va="center",
            transform=ax.transAxes,
        )
        ax.set_xlim(-0.5, n - 0.5)
        ax.set_ylim(-0.5, L - 0.5)
    ax.set_yticks(range(L))
    ax.set_ylabel("layer")
    ax.set_title("attention output error by layer (mean over sequences)")


def _draw_memory(ax, report) -> None:
    x, ma = _by_position(report, report.mem_a.astype(np.float64), "max")
    _, mb = _by_position(report, report.mem_b.astype(np.float64), "max")
    causal = (x + 1) * report.kv_bytes_per_position
    ax.plot(x, ma / 1024, color=COLOR_A, lw=1.6, label=f"A: {report.a}")
    ax.plot(x, mb / 1024, color=COLOR_B, lw=1.6, ls="-." if np.array_equal(ma, mb) else "-", label=f"B: {report.b}")
    ax.plot(x, causal / 1024, color=COLOR_REF, ls=":", lw=1.0, label="dense cache (causal)")
    ax.set_ylabel("cache held [KiB]")
    ax.set_title("memory_bytes() after each position")
    ax.legend(loc="upper left", fontsize="small", frameon=False)


def _draw_recall(ax, report) -> None:
    rows = [r for r in report.recall if r.mention > 0]
    ax.set_title("recall: probability of the name at each recurrence")
    ax.set_ylabel("P(name) (log scale)")
    if not rows:
        ax.text(0.5, 0.5, "no recall sequences in this probe", ha="center", va="center", transform=ax.transAxes)
        return
    d = np.array([r.distance for r in rows])
    floor = 1e-6  # probabilities below are drawn at the floor
    ax.scatter(d, np.maximum([r.p_a for r in rows], floor), color=COLOR_A, marker="o", s=24, label=f"A: {report.a}")
    ax.scatter(d, np.maximum([r.p_b for r in rows], floor), color=COLOR_B, marker="^", s=24, label=f"B: {report.b}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_ylim(floor / 2, 1.5)
    ax.set_xlabel("distance to the previous mention [tokens]")
    ax.legend(loc="lower left", fontsize="small", frameon=False)


def divergence_figure(report: DiffReport) -> Figure:
    """max |Δlogit| and KL(A‖B) against position."""
    fig = Figure(figsize=(9, 6), layout="constrained")
    ax1, ax2 = fig.subplots(2, 1, sharex=True)
    _draw_dlogit(ax1, report)
    _draw_kl(ax2, report)
    ax2.set_xlabel("position in sequence")
    fig.suptitle(_title(report))
    return fig


def layer_error_figure(report: DiffReport) -> Figure:
    """Heatmap of each layer's relative L2 error of the attention output against position."""
    fig = Figure(figsize=(9, 3.5), layout="constrained")
    ax = fig.subplots()
    _draw_layers(ax, report, fig)
    ax.set_xlabel("position in sequence")
    fig.suptitle(_title(report))
    return fig


def memory_figure(report: DiffReport) -> Figure:
    """Each plugin's memory_bytes() against position, with the dense cache for reference."""
    fig = Figure(figsize=(9, 3.5), layout="constrained")
    ax = fig.subplots()
    _draw_memory(ax, report)
    ax.set_xlabel("position in sequence")
    fig.suptitle(_title(report))
    return fig


def recall_figure(report: DiffReport) -> Figure:
    """P(name) at each recurrence against the distance to its previous mention."""
    fig = Figure(figsize=(7, 4), layout="constrained")
    ax = fig.subplots()
    _draw_recall(ax, report)
    fig.suptitle(_title(report))
    return fig


def report_figure(report: DiffReport) -> Figure:
    """The overview `pyllama diff --plot` writes: divergence, KL, per-layer error, memory (and recall)."""
    has_recall = any(r.mention > 0 for r in report.recall)
    fig = Figure(figsize=(12, 11 if has_recall else 9), layout="constrained")
    rows = 3 if has_recall else 2
    axes = fig.subplots(rows, 2)
    _draw_dlogit(axes[0, 0], report)
    _draw_kl(axes[0, 1], report)
    _draw_layers(axes[1, 0], report, fig)
    _draw_memory(axes[1, 1], report)
    for ax in axes[:2].ravel():
        ax.set_xlabel("position in sequence")
    if has_recall:
        gs = axes[2, 0].get_gridspec()
        axes[2, 0].remove()
        axes[2, 1].remove()
        _draw_recall(fig.add_subplot(gs[2, :]), report)
    fig.suptitle(_title(report))
    return fig


# ---- several reports against one reference ---------------------------------------------------------
def _series(i: int) -> dict:
    """Colour and line style of the i-th plugin in a comparison figure."""
    n = len(SERIES_COLORS)
    return {"color": SERIES_COLORS[i % n], "ls": SERIES_STYLES[(i // n) % len(SERIES_STYLES)]}


def _moving_mean(x: np.ndarray, y: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
    """Trailing mean over ``width`` consecutive points, drawn at the last one (width <= 1: unchanged)."""
    width = min(int(width), y.shape[0])
    if width <= 1:
        return x, y
    return x[width - 1 :], np.convolve(y, np.ones(width) / width, mode="valid")


def _check_reports(reports: Sequence[DiffReport]) -> list[DiffReport]:
    reports = list(reports)
    if not reports:
        raise ValueError("the comparison figures need at least one DiffReport")
    return reports


def _compare_title(reports: list[DiffReport]) -> str:
    refs = sorted({r.a for r in reports})
    probes = sorted({r.probe for r in reports})
    models = sorted({r.model.rsplit("/", 1)[-1] for r in reports})
    against = refs[0] if len(refs) == 1 else f"{len(refs)} references"
    n = len(reports)
    return (
        f"{n} plugin{'s' if n != 1 else ''} against {against} — "
        f"{', '.join(probes)} probe{'s' if len(probes) != 1 else ''}, {', '.join(models)}"
    )


def _context_line(ax: Axes, context: int | None) -> None:
    if context:
        ax.axvline(context, color="grey", ls=":", lw=1.0, label=f"trained context ({context})")


def _legend_below(fig: Figure, ax: Axes, n_items: int) -> None:
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


def compare_divergence_figure(reports: Sequence[DiffReport], *, smooth: int = 1, context: int | None = None) -> Figure:
    """max |Δlogit| (worst over sequences) and KL(A ‖ B) (mean over sequences) against position, one line
    per report (plugin B of each; all against the same plugin A). ``smooth`` > 1 draws a trailing moving
    mean over that many positions; ``context`` marks the trained context with a vertical line."""
    reports = _check_reports(reports)
    fig = Figure(figsize=(10, 7), layout="constrained")
    ax1, ax2 = fig.subplots(2, 1, sharex=True)
    for i, r in enumerate(reports):
        style = _series(i)
        x, y = _by_position(r, r.max_abs_dlogit, "max")
        ax1.plot(*_moving_mean(x, y, smooth), lw=1.0, label=r.b, **style)
        x, y = _by_position(r, r.kl, "mean")
        ax2.plot(*_moving_mean(x, y, smooth), lw=1.0, label=r.b, **style)
    over = f", moving mean over {smooth} positions" if smooth > 1 else ""
    ax1.set_yscale("symlog", linthresh=DLOGIT_LINTHRESH)
    ax1.set_ylabel("max |Δlogit| [logit units]")
    ax1.set_title(f"largest logit difference (worst sequence at each position{over})")
    ax2.set_yscale("symlog", linthresh=KL_LINTHRESH)
    ax2.set_ylabel(f"KL({reports[0].a} ‖ plugin) [nats]")
    ax2.set_title(f"KL divergence of the next-token distributions (mean over sequences{over})")
    ax2.set_xlabel("position in sequence [tokens]")
    for ax in (ax1, ax2):
        _context_line(ax, context)
        ax.grid(alpha=0.3, which="major")
    _legend_below(fig, ax2, len(reports) + bool(context))
    fig.suptitle(_compare_title(reports))
    return fig


def compare_memory_figure(reports: Sequence[DiffReport], *, context: int | None = None) -> Figure:
    """Each report's plugin B ``memory_bytes()`` against position (largest over sequences), with what a
    dense cache of every position holds for reference. Log scale (symmetric log with zero on the axis if
    a plugin ever holds nothing), so flat, logarithmic and linear growth all read at once; the line widths
    and styles differ so that equal curves stay visible."""
    reports = _check_reports(reports)
    fig = Figure(figsize=(10, 5), layout="constrained")
    ax = fig.subplots()
    n = len(reports)
    last = 0
    lowest = np.inf
    for i, r in enumerate(reports):
        x, mem = _by_position(r, r.mem_b.astype(np.float64), "max")
        if x.size:
            last = max(last, int(x[-1]))
            lowest = min(lowest, float(mem.min()))
        ax.plot(
            x,
            mem / 1024,
            color=_series(i)["color"],
            ls=SERIES_STYLES[i % len(SERIES_STYLES)],
            lw=1.2 + 1.6 * (n - 1 - i) / max(n - 1, 1),
            label=r.b,
            zorder=2 + i,
        )
    x = np.arange(last + 1)
    ax.plot(
        x,
        (x + 1) * reports[0].kv_bytes_per_position / 1024,
        color=COLOR_REF,
        ls=":",
        lw=1.0,
        label="dense cache (every position)",
        zorder=1,
    )
    _context_line(ax, context)
    if lowest > 0:
        ax.set_yscale("log")
        ax.set_ylabel("cache held [KiB, log scale]")
    else:  # a plugin that holds nothing at some position: zero stays on the axis
        ax.set_yscale("symlog", linthresh=1.0)
        ax.set_ylim(bottom=0)
        ax.set_ylabel("cache held [KiB, log scale above 1]")
    ax.set_xlabel("position in sequence [tokens]")
    ax.set_title("memory_bytes() after each position (largest over sequences)")
    ax.grid(alpha=0.3, which="major")
    _legend_below(fig, ax, n + 1 + bool(context))
    fig.suptitle(_compare_title(reports))
    return fig


def pareto_front(memory: ArrayLike, kl: ArrayLike) -> np.ndarray:
    """Indices of the points no other point beats on both counts (less or equal memory and lower KL, or
    less memory and equal KL), in order of increasing memory."""
    memory = np.asarray(memory, dtype=np.float64)
    kl = np.asarray(kl, dtype=np.float64)
    order = np.lexsort((kl, memory))  # by memory, ties by KL
    front: list[int] = []
    best = math.inf
    for i in order:
        if kl[i] < best:
            front.append(int(i))
            best = kl[i]
    return np.asarray(front, dtype=np.int64)


def pareto_figure(reports: Sequence[DiffReport]) -> Figure:
    """Mean KL(A ‖ B) over the whole probe against the bytes plugin B holds at the end of the longest
    sequence: one point per report, the Pareto front (nothing has both less memory and lower KL) as a
    grey staircase, and the dense cache's bytes at the same position as a dotted line. KL is on a
    symmetric log scale whose linear part ends a decade below the smallest non-zero KL, so exact
    plugins (KL 0) sit on the bottom edge."""
    reports = _check_reports(reports)
    fig = Figure(figsize=(9, 6), layout="constrained")
    ax = fig.subplots()
    markers = ("o", "s", "D", "^", "v", "P", "X", "<", ">")
    mem = np.array([r.summary.get("bytes_last_b", 0) for r in reports], dtype=np.float64) / 1024
    kl = np.array([r.summary.get("mean_kl", np.nan) for r in reports], dtype=np.float64)
    for i, r in enumerate(reports):
        ax.scatter(
            mem[i],
            kl[i],
            s=55,
            color=_series(i)["color"],
            marker=markers[i % len(markers)],
            label=r.b,
            zorder=3,
            edgecolors="white",
            linewidths=0.5,
        )
    ok = np.isfinite(kl)
    front = np.nonzero(ok)[0][pareto_front(mem[ok], kl[ok])]
    if front.size:
        fx, fy = mem[front], kl[front]
        ax.step(
            np.append(fx, fx[-1] * 1.5),
            np.append(fy, fy[-1]),
            where="post",
            color="grey",
            lw=1.0,
            zorder=2,
            label="Pareto front",
        )
    causal = {int(r.summary["bytes_causal_last"]) for r in reports if "bytes_causal_last" in r.summary}
    if len(causal) == 1:  # all measured at the same position
        ax.axvline(causal.pop() / 1024, color=COLOR_REF, ls=":", lw=1.0, label="dense cache at the same position")
    positive = kl[ok & (kl > 0)]
    linthresh = 10.0 ** math.floor(math.log10(positive.min())) / 10 if positive.size else KL_LINTHRESH
    ax.set_yscale("symlog", linthresh=linthresh)
    ax.set_ylim(bottom=0)
    ax.set_xscale("log")
    last = reports[0].summary.get("last", {})
    where = f"position {last['position']} of {last['sequence']}" if last else "the end"
    ax.set_xlabel(f"memory_bytes() at {where} [KiB, log scale]")
    ax.set_ylabel(f"mean KL({reports[0].a} ‖ plugin) over the probe [nats]")
    ax.set_title("divergence against memory: down and left is better")
    ax.grid(alpha=0.3, which="major")
    _legend_below(fig, ax, len(reports) + 2)
    fig.suptitle(_compare_title(reports))
    return fig


def nll_figure(
    curves: Mapping[str, ArrayLike],
    *,
    context: int | None = None,
    smooth: int = 1,
    title: str = "teacher-forced negative log-likelihood of the next token",
) -> Figure:
    """Per-position NLL of several plugins: ``curves`` maps a label to NLL values indexed by position
    (nats; NaN where a plugin has no value, e.g. past its ``max_positions``). ``smooth`` > 1 draws a
    trailing moving mean over that many computed positions; ``context`` marks the trained context."""
    if not curves:
        raise ValueError("nll_figure needs at least one curve")
    fig = Figure(figsize=(10, 5), layout="constrained")
    ax = fig.subplots()
    for i, (label, values) in enumerate(curves.items()):
        y = np.asarray(values, dtype=np.float64).ravel()
        x = np.arange(y.shape[0])
        keep = np.isfinite(y)
        # the first curve on top: where curves coincide (inside the context) the reference stays visible
        ax.plot(*_moving_mean(x[keep], y[keep], smooth), lw=1.2, label=label, zorder=2 + len(curves) - i, **_series(i))
    _context_line(ax, context)
    over = f", moving mean over {smooth} positions" if smooth > 1 else ""
    ax.set_ylabel(f"NLL [nats{over}]")
    ax.set_xlabel("position in sequence [tokens]")
    ax.set_title(title)
    ax.grid(alpha=0.3, which="major")
    _legend_below(fig, ax, len(curves) + bool(context))
    return fig


def study_pareto_figure(table, *, x: str = "bytes_last_b", y: str = "mean_kl", family: str = "plugin") -> Figure:
    """A sweep's results table (``pyllama.sweep.run``) as memory against divergence: one panel per
    (model, probe), per plugin family its cells as points and its own Pareto front as a staircase.
    ``x``/``y``/``family``: the table's columns to use. Rows with an ``error`` are left out."""
    rows = table[table["error"].isna()] if "error" in table else table
    if len(rows) == 0:
        raise ValueError("study_pareto_figure: the table has no successful rows")
    panels = list(dict.fromkeys(zip(rows["model"], rows["probe"], strict=True)))
    families = list(dict.fromkeys(rows[family]))
    fig = Figure(figsize=(7.5 * len(panels), 5.5), layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, len(panels), squeeze=False)[0])
    markers = ("o", "s", "D", "^", "v", "P", "X", "<", ">")
    for ax, (model, probe) in zip(axes, panels, strict=True):
        panel = rows[(rows["model"] == model) & (rows["probe"] == probe)]
        kl_all = panel[y].to_numpy(dtype=np.float64)
        positive = kl_all[np.isfinite(kl_all) & (kl_all > 0)]
        for i, name in enumerate(families):
            cells = panel[panel[family] == name]
            if len(cells) == 0:
                continue
            mem = cells[x].to_numpy(dtype=np.float64) / 1024
            kl = cells[y].to_numpy(dtype=np.float64)
            color = _series(i)["color"]
            label = name.rsplit("/", 1)[-1]
            ax.scatter(mem, kl, s=40, color=color, marker=markers[i % len(markers)], label=label, zorder=3,
                       edgecolors="white", linewidths=0.5)  # fmt: skip
            ok = np.isfinite(kl)
            front = np.nonzero(ok)[0][pareto_front(mem[ok], kl[ok])]
            if front.size > 1:
                ax.step(mem[front], kl[front], where="post", color=color, lw=1.0, alpha=0.8, zorder=2)
        if (kl_all == 0).any():  # exact cells sit on the bottom edge of a symmetric log scale
            linthresh = 10.0 ** math.floor(math.log10(positive.min())) / 10 if positive.size else KL_LINTHRESH
            ax.set_yscale("symlog", linthresh=linthresh)
            ax.set_ylim(bottom=0)
        else:
            ax.set_yscale("log")
        causal = set(panel["bytes_causal_last"]) if "bytes_causal_last" in panel else set()
        if len(causal) == 1:
            ax.axvline(causal.pop() / 1024, color=COLOR_REF, ls=":", lw=1.0, label="dense cache")
        ax.set_xscale("log")
        ax.set_xlabel(f"{x} [KiB, log scale]")
        ax.set_ylabel(f"{y} [nats]")
        ax.set_title(f"{Path(str(model)).name}, probe {Path(str(probe)).name}", fontsize="medium")
        ax.grid(alpha=0.3, which="major")
    _legend_below(fig, axes[0], len(families) + 1)
    fig.suptitle("memory against divergence: each plugin family's cells and Pareto front")
    return fig
