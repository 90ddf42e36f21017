"""The retrieval figures of pyllama.plots on hand-built scores: which cells and points they draw."""

from __future__ import annotations

import io

import numpy as np
import pytest

from pyllama import plots
from pyllama.diff.retrieval_scores import KeyScore, RetrievalRow
from pyllama.plots.retrieval import P_FLOOR, retrieval_plugins


def rows(window: int) -> list[RetrievalRow]:
    """A 3 x 2 needle grid; the plugin retrieves (P = 0.9, rank 1) when the key is within ``window``."""
    out = []
    for n in (1000, 2000):
        for d in (0.0, 0.5, 1.0):
            distance = int((1 - d) * n) + 50
            hit = distance <= window
            score = KeyScore(np.log(0.9) if hit else -40.0, 0.1, (1, 1) if hit else (1, 7))
            out.append(
                RetrievalRow(f"passkey-d{d:g}-n{n}", "passkey", "123", d, n - 3, n, 0, distance, distance, score)
            )
    return out


def test_needle_heatmap_cells_and_marks():
    fig = plots.needle_heatmap_figure({"sink:4,600": rows(600), "causal": rows(10**6)})
    ax_sink, ax_causal = fig.axes[:2]
    grid = ax_sink.images[0].get_array()
    assert grid.shape == (3, 2)
    expected = np.array([[r.a.p if r.a.retrieves else P_FLOOR for r in rows(600)]]).reshape(2, 3).T
    np.testing.assert_allclose(np.asarray(grid), expected)
    # one white dot per retrieved cell
    assert len(ax_sink.lines) == sum(r.a.retrieves for r in rows(600)) == 3
    assert len(ax_causal.lines) == 6
    assert [t.get_text() for t in ax_sink.get_xticklabels()] == ["1,000", "2,000"]
    fig.savefig(io.BytesIO(), format="png")


def test_needle_heatmap_by_retrieval_and_errors():
    fig = plots.needle_heatmap_figure({"x": rows(600)}, value="retrieves")
    assert set(np.unique(np.asarray(fig.axes[0].images[0].get_array()))) == {0.0, 1.0}
    with pytest.raises(ValueError, match="value"):
        plots.needle_heatmap_figure({"x": rows(600)}, value="kl")
    with pytest.raises(ValueError, match="at least one"):
        plots.needle_heatmap_figure({})


def test_key_distance_points():
    fig = plots.key_distance_figure({"sink:4,600": rows(600)}, context=8192)
    ax = fig.axes[0]
    line = ax.lines[0]
    x = np.asarray(line.get_xdata())
    assert list(x) == sorted(r.distance for r in rows(600))
    filled, hollow = ax.lines[1], ax.lines[2]
    assert len(filled.get_xdata()) == 3 and len(hollow.get_xdata()) == 3
    assert max(filled.get_xdata()) <= 600 < min(hollow.get_xdata())
    assert retrieval_plugins({"a": rows(1), "b": rows(2)}) == ["a", "b"]
