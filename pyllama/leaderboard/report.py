"""What a board writes: the table of its rows, the board's means with their intervals, Markdown, figure.

Each row is one method at one ratio on one sample (``unit.py``). A board's point is a method at a
ratio on a model, a length and a set of tasks (one RULER family, or all of them: the average): the
mean of its rows' score, with a 95% percentile bootstrap interval over the samples (resampled
within each task, ``BOOTSTRAP_DRAWS`` draws, seeded), and the mean share of ``causal``'s bytes it
removed at the context's end (the ledger after the event). The two scores: ``score``, RULER's
``string_match_all`` of the greedy answer in percent (RULER's own metric, the default), and
``logp``, the teacher-forced log P(answer) in nats.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from pyllama.diff.probes.ruler_tasks import TASKS
from pyllama.leaderboard.methods import CEILING
from pyllama.sweep.study import plural
from pyllama.sweep.table import CSV, TABLE, RowStore

__all__ = ["COLUMNS", "FIGURE", "MARKDOWN", "SCORES", "board_points", "figure", "frame", "markdown", "write_board"]

MARKDOWN = "leaderboard.md"
FIGURE = "leaderboard.png"
SCORES = {"score": "RULER score (string match, %)", "logp": "log P(answer), teacher-forced (nats)"}
AVERAGE = "average"
BOOTSTRAP_DRAWS = 2000
COLUMNS = (
    "cell",
    "model",
    "task",
    "family",
    "length",
    "seed",
    "method",
    "ratio",
    "spec",
    "way",
    "holds",
    "score",
    "part",
    "logp",
    "loss",
    "max_rank",
    "rank1",
    "greedy",
    "event_bytes",
    "causal_bytes",
    "bytes_removed",
    "tokens",
    "context",
    "record_bytes",
    "error",
    "cpu_seconds",
    "seconds",
    "context_cpu_seconds",
    "context_seconds",
    "worker",
    "threads",
    "pyllama_version",
    "model_sha256",
    "tokenizer",
    "model_path",
)


def frame(rows: list[dict]):
    """The rows as a DataFrame with the columns in ``COLUMNS``' order (and any others after them)."""
    import pandas as pd  # lazy: pandas only for the table

    names = dict.fromkeys(COLUMNS)
    for row in rows:
        names.update(dict.fromkeys(row))
    return pd.DataFrame([{c: row.get(c) for c in names} for row in rows], columns=list(names))


def _interval(groups: list[np.ndarray], rng: np.random.Generator) -> tuple[float, float]:
    """95% percentile bootstrap interval of the mean over every value, each group resampled alone."""
    total = sum(g.size for g in groups)
    sums = np.zeros(BOOTSTRAP_DRAWS)
    for g in groups:
        sums += g[rng.integers(0, g.size, (BOOTSTRAP_DRAWS, g.size))].sum(axis=1)
    lo, hi = np.percentile(sums / total, [2.5, 97.5])
    return float(lo), float(hi)


def board_points(df):
    """One row per (model, length, panel, method, ratio): ``n`` rows, the mean and interval of each
    score, the mean share of causal's bytes removed (``removed``), and ``saves_bytes``. A panel is a
    RULER family or the average over every task; ``causal`` is every method's ratio 0."""
    import pandas as pd

    ok = df[df["error"].isna()] if "error" in df else df
    out = []
    rng = np.random.default_rng(0)
    for (model, length), board in ok.groupby(["model", "length"], sort=False):
        panels = [(f, board[board["family"] == f]) for f in dict.fromkeys(board["family"])]
        for panel, part in [*panels, (AVERAGE, board)]:
            for (method, ratio), cell in part.groupby(["method", "ratio"], sort=False):
                point = {"model": model, "length": length, "panel": panel, "method": method, "ratio": ratio}
                point["n"] = len(cell)
                for score in SCORES:
                    groups = [g[score].to_numpy(dtype=float) for _, g in cell.groupby("task", sort=False)]
                    groups = [g[np.isfinite(g)] for g in groups]
                    groups = [g for g in groups if g.size]
                    values = np.concatenate(groups) if groups else np.zeros(0)
                    point[score] = float(values.mean()) if values.size else float("nan")
                    point[f"{score}_lo"], point[f"{score}_hi"] = _interval(groups, rng) if groups else (np.nan,) * 2
                point["removed"] = float(cell["bytes_removed"].mean())
                point["saves_bytes"] = bool((cell["holds"] != "everything").all() and point["removed"] > 0)
                out.append(point)
    return pd.DataFrame(out)


def markdown(df) -> str:
    """The board as Markdown: per model and length, a table per score (methods x ratios, the
    average over the tasks), each cell the mean, its interval and the share of bytes removed."""
    points = board_points(df)
    lines = []
    for (model, length), pts in points[points["panel"] == AVERAGE].groupby(["model", "length"], sort=False):
        tasks = sorted(set(df[(df["model"] == model) & (df["length"] == length)]["task"]), key=list(TASKS).index)
        n = (
            int(pts[pts["method"] == CEILING]["n"].max()) // max(1, len(tasks))
            if (pts["method"] == CEILING).any()
            else 0
        )
        ratios = sorted(r for r in set(pts["ratio"]) if r > 0)
        lines.append(f"### {model}, {length:,} tokens: {plural(len(tasks), 'RULER task')}, {plural(n, 'sample')} each")
        lines.append("")
        ceiling = pts[pts["method"] == CEILING]
        for score, title in SCORES.items():
            lines.append(
                f"{title}: mean [95% bootstrap interval]; in parentheses the share of causal's bytes "
                "removed after the context (ledger). `causal` is every method's ratio 0."
            )
            lines.append("")
            lines.append("| method | " + " | ".join(f"ratio {r:g}" for r in ratios) + " |")
            lines.append("| --- |" + " ---: |" * len(ratios))
            if len(ceiling):
                c = ceiling.iloc[0]
                lines.append(f"| causal | {_cell(c, score, removed=False)} |" + " |" * (len(ratios) - 1))
            for method in dict.fromkeys(pts["method"]):
                if method == CEILING:
                    continue
                mine = pts[pts["method"] == method].set_index("ratio")
                cells = [_cell(mine.loc[r], score) if r in mine.index else "" for r in ratios]
                mark = "" if mine["saves_bytes"].all() else " (keeps every row)"
                lines.append(f"| {method}{mark} | " + " | ".join(cells) + " |")
            lines.append("")
    return "\n".join(lines)


def _cell(point, score: str, removed: bool = True) -> str:
    digits = 1 if score == "score" else 2
    text = f"{point[score]:.{digits}f} [{point[f'{score}_lo']:.{digits}f}, {point[f'{score}_hi']:.{digits}f}]"
    return f"{text} ({_share(point['removed'])})" if removed else text


def _share(x: float) -> str:
    """A share in whole percents, or to a tenth where that would show a share that is not 0 as 0%
    (kmeans' centroids add 0.3% to Gemma 3's bytes: "-0%" would read as nothing added)."""
    text = f"{x:.0%}"
    return f"{x:.1%}" if x != 0 and text in ("0%", "-0%") else text


def write_board(store: RowStore, keys: list[str], out: str | os.PathLike):
    """Write the table of ``keys`` (board order) as Parquet and CSV, the Markdown board and its
    figure into ``out``; the table as a DataFrame."""
    df = frame([store.rows[k] for k in keys if k in store.rows])
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    df.to_parquet(folder / TABLE, index=False)
    df.to_csv(folder / CSV, index=False)
    done = df[df["error"].isna()] if len(df) else df
    if len(done):
        (folder / MARKDOWN).write_text(markdown(done), encoding="utf-8")
        figure(done).savefig(folder / FIGURE, dpi=120)
    return df


def figure(df):
    """The board's figure (``pyllama.plots.leaderboard_figure``) of a table's rows without an error."""
    from pyllama.plots.leaderboard import leaderboard_figure  # lazy: matplotlib only when drawing

    ok = df[df["error"].isna()] if "error" in df else df
    return leaderboard_figure(board_points(ok), SCORES, CEILING, AVERAGE)
