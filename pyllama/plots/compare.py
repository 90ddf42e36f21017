"""Figures of several reports against one reference (one line or point per plugin), of a sweep's
results table, and of per-position negative log-likelihoods."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from matplotlib.figure import Figure

from pyllama.plots.style import (
    COLOR_REF,
    DLOGIT_LINTHRESH,
    KL_LINTHRESH,
    SERIES_STYLES,
    by_position,
    check_reports,
    compare_title,
    context_line,
    legend_below,
    moving_mean,
    series_style,
)

if TYPE_CHECKING:
    from numpy.typing import ArrayLike

    from pyllama.diff.report import DiffReport


def compare_divergence_figure(reports: Sequence[DiffReport], *, smooth: int = 1, context: int | None = None) -> Figure:
    """max |Δlogit| (worst over sequences) and KL(A ‖ B) (mean over sequences) against position, one line
    per report (plugin B of each; all against the same plugin A). ``smooth`` > 1 draws a trailing moving
    mean over that many positions; ``context`` marks the trained context with a vertical line."""
    reports = check_reports(reports)
    fig = Figure(figsize=(10, 7), layout="constrained")
    ax1, ax2 = fig.subplots(2, 1, sharex=True)
    for i, r in enumerate(reports):
        style = series_style(i)
        x, y = by_position(r, r.max_abs_dlogit, "max")
        ax1.plot(*moving_mean(x, y, smooth), lw=1.0, label=r.b, **style)
        x, y = by_position(r, r.kl, "mean")
        ax2.plot(*moving_mean(x, y, smooth), lw=1.0, label=r.b, **style)
    over = f", moving mean over {smooth} positions" if smooth > 1 else ""
    ax1.set_yscale("symlog", linthresh=DLOGIT_LINTHRESH)
    ax1.set_ylabel("max |Δlogit| [logit units]")
    ax1.set_title(f"largest logit difference (worst sequence at each position{over})")
    ax2.set_yscale("symlog", linthresh=KL_LINTHRESH)
    ax2.set_ylabel(f"KL({reports[0].a} ‖ plugin) [nats]")
    ax2.set_title(f"KL divergence of the next-token distributions (mean over sequences{over})")
    ax2.set_xlabel("position in sequence [tokens]")
    for ax in (ax1, ax2):
        context_line(ax, context)
        ax.grid(alpha=0.3, which="major")
    legend_below(fig, ax2, len(reports) + bool(context))
    fig.suptitle(compare_title(reports))
    return fig


def compare_memory_figure(reports: Sequence[DiffReport], *, context: int | None = None) -> Figure:
    """Each report's plugin B ``memory_bytes()`` against position (largest over sequences), with what a
    dense cache of every position holds for reference. Log scale (symmetric log with zero on the axis if
    a plugin ever holds nothing), so flat, logarithmic and linear growth all read at once; the line widths
    and styles differ so that equal curves stay visible."""
    reports = check_reports(reports)
    fig = Figure(figsize=(10, 5), layout="constrained")
    ax = fig.subplots()
    n = len(reports)
    last = 0
    lowest = np.inf
    for i, r in enumerate(reports):
        x, mem = by_position(r, r.mem_b.astype(np.float64), "max")
        if x.size:
            last = max(last, int(x[-1]))
            lowest = min(lowest, float(mem.min()))
        ax.plot(
            x,
            mem / 1024,
            color=series_style(i)["color"],
            ls=SERIES_STYLES[i % len(SERIES_STYLES)],
            lw=1.2 + 1.6 * (n - 1 - i) / max(n - 1, 1),
            label=r.b,
            zorder=2 + i,
        )
    x = np.arange(last + 1)
    ax.plot(
        x,
        reports[0].causal_bytes_curve(x) / 1024,
        color=COLOR_REF,
        ls=":",
        lw=1.0,
        label="causal (the model's windows)" if reports[0].layer_windows else "dense cache (every position)",
        zorder=1,
    )
    context_line(ax, context)
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
    legend_below(fig, ax, n + 1 + bool(context))
    fig.suptitle(compare_title(reports))
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
    reports = check_reports(reports)
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
            color=series_style(i)["color"],
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
    legend_below(fig, ax, len(reports) + 2)
    fig.suptitle(compare_title(reports))
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
        ax.plot(
            *moving_mean(x[keep], y[keep], smooth), lw=1.2, label=label, zorder=2 + len(curves) - i, **series_style(i)
        )
    context_line(ax, context)
    over = f", moving mean over {smooth} positions" if smooth > 1 else ""
    ax.set_ylabel(f"NLL [nats{over}]")
    ax.set_xlabel("position in sequence [tokens]")
    ax.set_title(title)
    ax.grid(alpha=0.3, which="major")
    legend_below(fig, ax, len(curves) + bool(context))
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
            color = series_style(i)["color"]
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
    legend_below(fig, axes[0], len(families) + 1)
    fig.suptitle("memory against divergence: each plugin family's cells and Pareto front")
    return fig
