"""Samples worth their cost: how many samples per cell a score needs to rank the methods stably.

A board ranks its method-ratio points (every method at every ratio above 0) by their mean score over
the tasks and samples. With n samples per task instead of all S, the ranking moves. ``samples_needed``
draws, for each n in 1 .. S, ``draws`` bootstrap boards: per task, n of the board's samples with
replacement, the same samples for every method (the samples are shared, so the comparison is paired,
as on the board itself); each draw's ranking is compared with the whole board's by Kendall's tau-b
(``kendall_tau_b``: ties in either ranking counted as tau-b counts them, every draw at once). A
score needs the smallest n whose tau is at least ``tau`` (0.9) in at least ``share`` (95%) of the
draws; None when no n up to S does (it needs more than the board has). A draw whose points all
tie has no ranking: it counts as a miss.

A teacher-forced log P(answer) is continuous; RULER's string match of the greedy answer is 0 or 1
per reference, so its means tie often and move in steps: the point of the statistic is to say how
many samples each score needs, measured on a real board.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Stability", "kendall_tau_b", "samples_needed"]


@dataclass
class Stability:
    """What ``samples_needed`` found: per score, the share of draws with tau >= ``tau`` for each n
    (``curves``) and the smallest n reaching ``share`` (``needed``; None: more than ``samples``)."""

    curves: dict[str, dict[int, float]]
    needed: dict[str, int | None]
    tau: float
    share: float
    draws: int
    items: int  # the method-ratio points ranked
    tasks: int
    samples: int  # samples per task on the board

    def needed_text(self, score: str) -> str:
        n = self.needed[score]
        return str(n) if n is not None else f"more than {self.samples}"

    def markdown(self) -> str:
        scores = list(self.curves)
        lines = [
            f"Share of {self.draws} bootstrap draws whose ranking of {self.items} method-ratio points agrees "
            f"with the whole board's ({self.tasks} tasks x {self.samples} samples) by Kendall's tau >= "
            f"{self.tau:g}; a score needs the smallest n reaching {self.share:.0%}.",
            "",
            "| samples per task | " + " | ".join(scores) + " |",
            "| ---: |" + " ---: |" * len(scores),
        ]
        for n in sorted(self.curves[scores[0]]):
            lines.append(f"| {n} | " + " | ".join(f"{self.curves[s][n]:.3f}" for s in scores) + " |")
        lines.append("")
        lines.append("Samples needed: " + "; ".join(f"{s}: {self.needed_text(s)}" for s in scores) + ".")
        return "\n".join(lines)


def kendall_tau_b(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Kendall's tau-b between ``x`` [items] and each column of ``y`` [items, draws]: over the pairs
    of items, sum sign(dx) sign(dy) / sqrt(pairs untied in x x pairs untied in y); NaN where either
    has every item tied. (scipy.stats.kendalltau computes the same for one column per call.)"""
    i, j = np.triu_indices(x.shape[0], k=1)
    sx = np.sign(x[i] - x[j])[:, None]
    sy = np.sign(y[i] - y[j])
    with np.errstate(invalid="ignore", divide="ignore"):
        return (sx * sy).sum(axis=0) / np.sqrt((sx * sx).sum() * (sy * sy).sum(axis=0))


def _grid(df, score: str) -> np.ndarray:
    """values[item, task, sample] of ``score``: every method-ratio point, on the samples that every
    point has on every task."""
    table = df.pivot_table(index=["method", "ratio"], columns=["task", "seed"], values=score, aggfunc="first")
    tasks = sorted(set(df["task"]))
    complete = table.notna().all(axis=0)
    seeds = sorted(set.intersection(*({s for (t, s), ok in complete.items() if ok and t == task} for task in tasks)))
    if not seeds:
        raise ValueError("samples_needed: no sample has a row for every method, ratio and task")
    columns = [(t, s) for t in tasks for s in seeds]
    return table[columns].to_numpy(dtype=float).reshape(len(table), len(tasks), len(seeds))


def samples_needed(
    df,
    scores: tuple[str, ...] = ("score", "logp"),
    tau: float = 0.9,
    share: float = 0.95,
    draws: int = 1000,
    seed: int = 0,
) -> Stability:
    """The statistic of the module docstring for a board table ``df`` (one model and length; rows
    with an error and ``causal``'s ratio 0 left out) and each of ``scores``."""
    ok = df[(df["ratio"] > 0) & (df["error"].isna() if "error" in df else True)]
    boards = ok.groupby(["model", "length"]).ngroups
    if boards != 1:
        raise ValueError(f"samples_needed: the table holds {boards} boards (model, length); pass one")
    rng = np.random.default_rng(seed)
    curves: dict[str, dict[int, float]] = {}
    needed: dict[str, int | None] = {}
    shape = (0, 0, 0)
    for score in scores:
        values = _grid(ok, score)  # [items, tasks, samples]
        shape = values.shape
        items, tasks, samples = shape
        whole = values.mean(axis=(1, 2))
        curves[score] = {}
        for n in range(1, samples + 1):
            picks = rng.integers(0, samples, (draws, tasks, n))
            drawn = values[:, np.arange(tasks)[None, :, None], picks].mean(axis=(2, 3))  # [items, draws]
            taus = kendall_tau_b(whole, drawn)
            curves[score][n] = float(np.mean(np.nan_to_num(taus, nan=-1.0) >= tau))
        needed[score] = next((n for n, s in curves[score].items() if s >= share), None)
    return Stability(curves, needed, tau, share, draws, shape[0], shape[1], shape[2])
