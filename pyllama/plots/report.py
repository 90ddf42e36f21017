"""Figures of one diff report (plugin B against plugin A): divergence, per-layer error, memory,
recall, and the overview ``pyllama diff --plot`` writes."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from matplotlib.colors import LogNorm
from matplotlib.figure import Figure

from pyllama.plots.retrieval import mark_retrieval, retrieval_caption
from pyllama.plots.style import (
    COLOR_A,
    COLOR_B,
    COLOR_REF,
    DLOGIT_LINTHRESH,
    KL_LINTHRESH,
    OKABE_ITO,
    by_position,
)

if TYPE_CHECKING:
    from pyllama.diff.report import DiffReport


def _title(report) -> str:
    title = f"{report.b} vs {report.a} — {report.probe} probe, {report.model.rsplit('/', 1)[-1]}"
    caption = retrieval_caption(report)
    return title if caption is None else f"{title}\n{caption}"


def _draw_dlogit(ax, report) -> None:
    x, y = by_position(report, report.max_abs_dlogit, "max")
    ax.plot(x, y, color=COLOR_B, lw=1.0, label="max over sequences")
    ax.set_yscale("symlog", linthresh=DLOGIT_LINTHRESH)
    ax.set_ylabel("max |Δlogit|")
    ax.set_title("logit difference")
    _mark_first_diff(ax, report)
    mark_retrieval(ax, report)


def _draw_kl(ax, report) -> None:
    x, y = by_position(report, report.kl, "mean")
    _, ymax = by_position(report, report.kl, "max")
    ax.plot(x, ymax, color=OKABE_ITO["orange"], lw=0.8, alpha=0.8, label="max over sequences")
    ax.plot(x, y, color=COLOR_B, lw=1.2, label="mean over sequences")
    ax.set_yscale("symlog", linthresh=KL_LINTHRESH)
    ax.set_ylabel("KL(A ‖ B) [nats]")
    ax.set_title("KL divergence of the next-token distributions")
    mark_retrieval(ax, report)
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
        x, y = by_position(report, report.layer_err[:, layer], "mean")
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
    x, ma = by_position(report, report.mem_a.astype(np.float64), "max")
    _, mb = by_position(report, report.mem_b.astype(np.float64), "max")
    causal = report.causal_bytes_curve(x)
    ax.plot(x, ma / 1024, color=COLOR_A, lw=1.6, label=f"A: {report.a}")
    ax.plot(x, mb / 1024, color=COLOR_B, lw=1.6, ls="-." if np.array_equal(ma, mb) else "-", label=f"B: {report.b}")
    ax.plot(
        x,
        causal / 1024,
        color=COLOR_REF,
        ls=":",
        lw=1.0,
        label="causal (the model's windows)" if report.layer_windows else "dense cache (causal)",
    )
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
