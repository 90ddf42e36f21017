"""The samples a score needs (``pyllama.leaderboard.stability``) against a bootstrap written here.

The reference draws its own bootstrap boards with its own generator and its own Kendall tau-b
(concordant and discordant pairs counted in a loop, ties as Kendall's tau-b counts them), so the
two agree only statistically: each share within a few standard errors of the other's.
"""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest

from pyllama.leaderboard.stability import samples_needed
from pyllama.plots.leaderboard import samples_needed_figure


def tau_b(x: np.ndarray, y: np.ndarray) -> float:
    concordant = discordant = ties_x = ties_y = 0
    for i, j in itertools.combinations(range(len(x)), 2):
        dx, dy = np.sign(x[i] - x[j]), np.sign(y[i] - y[j])
        if dx == 0 and dy == 0:
            continue
        if dx == 0:
            ties_x += 1
        elif dy == 0:
            ties_y += 1
        elif dx == dy:
            concordant += 1
        else:
            discordant += 1
    denominator = np.sqrt((concordant + discordant + ties_x) * (concordant + discordant + ties_y))
    return (concordant - discordant) / denominator if denominator else float("nan")


def table(noise: float, samples: int = 10, seed: int = 1) -> pd.DataFrame:
    """4 methods x 2 ratios on 3 tasks: point means spaced by 1, each sample's score drawn around them
    (logp) and thresholded (score: 0 or 100, as a string match of one reference)."""
    rng = np.random.default_rng(seed)
    rows = []
    for m, method in enumerate(("a", "b", "c", "d")):
        for r, ratio in enumerate((0.5, 0.9)):
            for task in ("niah_single_1", "vt", "fwe"):
                for s in range(samples):
                    logp = -(2 * m + r) + noise * rng.normal()
                    rows.append(dict(model="m", length=1024, method=method, ratio=ratio, task=task, seed=s,
                                     logp=logp, score=100.0 * (logp > -3.5), error=None))  # fmt: skip
    return pd.DataFrame(rows)


def reference_shares(df: pd.DataFrame, score: str, ns: list[int], draws: int, seed: int) -> dict[int, float]:
    rng = np.random.default_rng(seed)
    points = sorted(set(zip(df["method"], df["ratio"], strict=True)))
    tasks = sorted(set(df["task"]))
    cube = {}  # (point, task) -> the scores of its samples, in seed order
    for (method, ratio, task), rows in df.groupby(["method", "ratio", "task"]):
        cube[(method, ratio), task] = rows.sort_values("seed")[score].to_numpy()
    samples = len(next(iter(cube.values())))
    whole = np.array([np.mean([cube[p, t].mean() for t in tasks]) for p in points])
    out = {}
    for n in ns:
        hits = 0
        for _ in range(draws):
            chosen = {t: rng.integers(0, samples, size=n) for t in tasks}  # the same samples for every point
            drawn = np.array([np.mean([cube[p, t][chosen[t]].mean() for t in tasks]) for p in points])
            hits += tau_b(whole, drawn) >= 0.9  # NaN (every point tied) is a miss
        out[n] = hits / draws
    return out


def test_shares_agree_with_an_independent_bootstrap():
    df = table(noise=1.5)
    got = samples_needed(df, draws=600, seed=5)
    for score in ("logp", "score"):
        want = reference_shares(df, score, [1, 3, 10], draws=400, seed=11)
        for n, share in want.items():
            # two estimates of one probability from 600 and 400 draws: standard error of the difference <= 0.032
            assert abs(got.curves[score][n] - share) <= 0.1, (score, n, got.curves[score][n], share)
    assert got.items == 8 and got.tasks == 3 and got.samples == 10


def test_what_each_score_needs_follows_the_shares():
    clean = samples_needed(table(noise=0.0), draws=200)
    assert clean.needed == {"score": 1, "logp": 1}  # no noise: every draw is the board (its ties included)
    noisy = samples_needed(table(noise=3.0, samples=12), draws=300)
    for score, curve in noisy.curves.items():
        n = noisy.needed[score]
        below = [m for m, s in curve.items() if s >= noisy.share]
        assert n == (min(below) if below else None)
    assert noisy.curves["logp"][12] > noisy.curves["logp"][1]  # more samples, steadier rankings
    text = noisy.markdown()
    assert "| samples per task | score | logp |" in text and f"logp: {noisy.needed_text('logp')}" in text


def test_the_figure_draws_each_score_s_shares():
    result = samples_needed(table(noise=2.0), draws=100)
    ax = samples_needed_figure(result).axes[0]
    lines = {line.get_label().split(":")[0]: line for line in ax.get_lines() if ":" in line.get_label()}
    for score, curve in result.curves.items():
        np.testing.assert_array_equal(lines[score].get_ydata(), [curve[n] for n in sorted(curve)])


def test_one_board_at_a_time():
    df = pd.concat([table(1.0), table(1.0).assign(length=2048)])
    with pytest.raises(ValueError, match="2 boards"):
        samples_needed(df)


def test_kendall_tau_b_is_the_pair_count_s_for_every_draw():
    """Every column against the loop above, on values with ties in both rankings (and a column all tied)."""
    from pyllama.leaderboard.stability import kendall_tau_b

    rng = np.random.default_rng(3)
    x = rng.integers(0, 4, 9).astype(float)
    y = rng.integers(0, 4, (9, 50)).astype(float)
    y[:, 0] = 1.0
    got = kendall_tau_b(x, y)
    want = np.array([tau_b(x, y[:, d]) for d in range(y.shape[1])])
    assert np.isnan(got[0]) and np.isnan(want[0])
    np.testing.assert_allclose(got[1:], want[1:], rtol=1e-12)
