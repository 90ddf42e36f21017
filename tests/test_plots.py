"""The comparison figures of pyllama.plots, on hand-built reports whose values the tests recompute
independently: which lines and points each figure draws, their data, scales, labels and legends."""

from __future__ import annotations

import io

import numpy as np
import pytest
from matplotlib.figure import Figure

from pyllama import plots
from pyllama.diff.report import DiffReport, SegmentInfo

N_LAYERS = 3
KV_BYTES = 2 * N_LAYERS * 16 * 4  # what a dense cache holds per position


def fake_report(b: str, seed: int, lengths=(7, 12), exact: bool = False, zero_memory: bool = False) -> DiffReport:
    """A report of two sequences (so per-position values aggregate over sequences), seeded values."""
    rng = np.random.default_rng(seed)
    segment = np.concatenate([np.full(n, i, dtype=np.int32) for i, n in enumerate(lengths)])
    position = np.concatenate([np.arange(n) for n in lengths]).astype(np.int64)
    total = int(segment.shape[0])
    kl = np.zeros(total) if exact else rng.exponential(0.05, total)
    dlogit = np.zeros(total) if exact else rng.exponential(1.0, total)
    mem_b = rng.integers(1, 50, total) * 64
    if zero_memory:
        mem_b[3] = 0
    return DiffReport(
        a="causal",
        b=b,
        model="models/tiny.bin",
        probe="standard",
        n_layers=N_LAYERS,
        kv_bytes_per_position=KV_BYTES,
        segments=[SegmentInfo(f"seq-{i}", "story", n, n) for i, n in enumerate(lengths)],
        segment=segment,
        position=position,
        token=np.zeros(total, dtype=np.int32),
        next_token=np.zeros(total, dtype=np.int32),
        max_abs_dlogit=dlogit,
        kl=kl,
        top1_a=np.zeros(total, dtype=np.int32),
        top1_b=np.zeros(total, dtype=np.int32),
        logp_a=rng.normal(-2.0, 0.5, total),
        logp_b=rng.normal(-2.0, 0.5, total),
        layer_err=rng.random((total, N_LAYERS)),
        mem_a=(position + 1) * KV_BYTES,
        mem_b=mem_b,
    )


def per_position(report: DiffReport, values: np.ndarray, how) -> tuple[list[int], list[float]]:
    """Aggregate over sequences with a plain loop: the independent reference for the figures."""
    groups: dict[int, list[float]] = {}
    for p, v in zip(report.position.tolist(), values.tolist(), strict=True):
        groups.setdefault(p, []).append(v)
    xs = sorted(groups)
    return xs, [how(groups[p]) for p in xs]


def trailing_mean(xs: list, ys: list, width: int) -> tuple[list, list]:
    return xs[width - 1 :], [sum(ys[i - width + 1 : i + 1]) / width for i in range(width - 1, len(ys))]


def lines_by_label(ax) -> dict:
    return {line.get_label(): line for line in ax.get_lines()}


def legend_texts(fig: Figure) -> list[str]:
    return [t.get_text() for legend in fig.legends for t in legend.get_texts()]


def assert_renders(fig: Figure) -> None:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=40)
    assert buf.getvalue()[:4] == b"\x89PNG"


@pytest.fixture
def reports() -> list[DiffReport]:
    return [fake_report("causal", 0, exact=True), fake_report("sliding:4", 1), fake_report("sink:1,3", 2)]


def test_compare_divergence_one_line_per_plugin_with_the_reports_values(reports):
    fig = plots.compare_divergence_figure(reports, context=9)
    assert isinstance(fig, Figure)
    ax_dlogit, ax_kl = fig.axes
    for ax, column, how in ((ax_dlogit, "max_abs_dlogit", max), (ax_kl, "kl", lambda v: sum(v) / len(v))):
        lines = lines_by_label(ax)
        assert set(lines) == {r.b for r in reports} | {"trained context (9)"}
        for r in reports:
            xs, ys = per_position(r, getattr(r, column), how)
            np.testing.assert_array_equal(lines[r.b].get_xdata(), xs)
            np.testing.assert_allclose(lines[r.b].get_ydata(), ys, rtol=1e-12)
        assert np.all(np.asarray(lines["trained context (9)"].get_xdata()) == 9)
        assert ax.get_yscale() == "symlog" and ax.get_ylabel() and ax.get_title()
    assert np.all(lines_by_label(ax_kl)["causal"].get_ydata() == 0), "an exact plugin is a line at zero"
    assert "nats" in ax_kl.get_ylabel() and "causal" in ax_kl.get_ylabel()
    assert "position" in ax_kl.get_xlabel()
    assert fig.get_suptitle().startswith("3 plugins against causal")
    assert legend_texts(fig) == ["causal", "sliding:4", "sink:1,3", "trained context (9)"]
    colors = {lines_by_label(ax_kl)[r.b].get_color() for r in reports}
    assert len(colors) == 3 and colors <= set(plots.OKABE_ITO.values())
    assert_renders(fig)


def test_compare_divergence_smooths_with_a_trailing_mean(reports):
    fig = plots.compare_divergence_figure(reports[1:], smooth=4)
    _, ax_kl = fig.axes
    assert "moving mean over 4 positions" in ax_kl.get_title()
    assert len(ax_kl.get_lines()) == 2, "no context line unless asked"
    for r in reports[1:]:
        xs, ys = trailing_mean(*per_position(r, r.kl, lambda v: sum(v) / len(v)), 4)
        line = lines_by_label(ax_kl)[r.b]
        np.testing.assert_array_equal(line.get_xdata(), xs)
        np.testing.assert_allclose(line.get_ydata(), ys, rtol=1e-12)


def test_compare_memory_draws_each_plugin_and_the_dense_cache(reports):
    fig = plots.compare_memory_figure(reports, context=5)
    (ax,) = fig.axes
    lines = lines_by_label(ax)
    assert set(lines) == {r.b for r in reports} | {"dense cache (every position)", "trained context (5)"}
    for r in reports:
        xs, ys = per_position(r, r.mem_b.astype(float), max)
        np.testing.assert_array_equal(lines[r.b].get_xdata(), xs)
        np.testing.assert_allclose(lines[r.b].get_ydata(), np.array(ys) / 1024)
    dense = lines["dense cache (every position)"]
    np.testing.assert_array_equal(dense.get_xdata(), np.arange(12))
    np.testing.assert_allclose(dense.get_ydata(), [(p + 1) * KV_BYTES / 1024 for p in range(12)])
    assert ax.get_yscale() == "log" and "KiB" in ax.get_ylabel() and ax.get_title()
    widths = [lines[r.b].get_linewidth() for r in reports]
    assert widths == sorted(widths, reverse=True) and widths[0] > widths[-1], "equal curves stay visible"
    assert_renders(fig)


def test_compare_memory_keeps_zero_bytes_on_the_axis():
    fig = plots.compare_memory_figure([fake_report("none", 3, lengths=(12,), zero_memory=True)])
    (ax,) = fig.axes
    assert ax.get_yscale() == "symlog" and ax.get_ylim()[0] == 0
    assert min(lines_by_label(ax)["none"].get_ydata()) == 0


@pytest.mark.parametrize(
    "memory, kl, front",
    [
        ([1, 2, 3, 4], [0.5, 0.6, 0.1, 0.1], [0, 2]),  # 1 costs more and is worse; 3 ties 2 on KL with more bytes
        ([4, 3, 2, 1], [0.0, 0.1, 0.2, 0.3], [3, 2, 1, 0]),  # a trade-off all along
        ([1, 1, 2], [0.3, 0.2, 0.2], [1]),  # equal memory: the lower KL; equal KL: the smaller memory
    ],
)
def test_pareto_front(memory, kl, front):
    assert plots.pareto_front(memory, kl).tolist() == front


def test_pareto_figure_one_point_per_report_and_the_front():
    reports = [
        fake_report("causal", 0, exact=True),
        fake_report("a", 1),
        fake_report("b", 2),
        fake_report("c", 4),
    ]
    fig = plots.pareto_figure(reports)
    (ax,) = fig.axes
    points = {c.get_label(): c.get_offsets()[0].tolist() for c in ax.collections}
    assert list(points) == [r.b for r in reports]
    mem, kl = [], []
    for r in reports:
        last_row = np.nonzero(r.segment == 1)[0][-1]  # the longest sequence's last position
        mem.append(int(r.mem_b[last_row]) / 1024)
        kl.append(sum(r.kl.tolist()) / r.n_positions)
        np.testing.assert_allclose(points[r.b], [mem[-1], kl[-1]], rtol=1e-12)
    assert points["causal"][1] == 0
    front = [
        i
        for i in range(len(reports))
        if not any(
            (mem[j] <= mem[i] and kl[j] < kl[i]) or (mem[j] < mem[i] and kl[j] <= kl[i]) for j in range(len(reports))
        )
    ]
    front.sort(key=lambda i: mem[i])
    stair = lines_by_label(ax)["Pareto front"]
    np.testing.assert_allclose(stair.get_xdata()[:-1], [mem[i] for i in front])
    np.testing.assert_allclose(stair.get_ydata()[:-1], [kl[i] for i in front])
    dense = lines_by_label(ax)["dense cache at the same position"]
    assert np.all(np.asarray(dense.get_xdata()) == 12 * KV_BYTES / 1024)
    assert ax.get_xscale() == "log" and ax.get_yscale() == "symlog" and ax.get_ylim()[0] == 0
    assert "KiB" in ax.get_xlabel() and "position 11 of seq-1" in ax.get_xlabel() and "nats" in ax.get_ylabel()
    assert set(legend_texts(fig)) == {r.b for r in reports} | {"Pareto front", "dense cache at the same position"}
    assert_renders(fig)


def test_nll_figure_draws_each_curve_and_drops_missing_positions():
    causal = np.array([2.0, 1.0, 3.0, 2.0, np.nan, np.nan])  # stops at its max_positions
    sink = np.array([2.0, 1.5, 2.5, 2.0, 1.0, 4.0])
    fig = plots.nll_figure({"causal": causal, "sink": sink}, context=4)
    (ax,) = fig.axes
    lines = lines_by_label(ax)
    assert set(lines) == {"causal", "sink", "trained context (4)"}
    np.testing.assert_array_equal(lines["causal"].get_xdata(), [0, 1, 2, 3])
    np.testing.assert_array_equal(lines["causal"].get_ydata(), [2.0, 1.0, 3.0, 2.0])
    np.testing.assert_array_equal(lines["sink"].get_ydata(), sink)
    assert "nats" in ax.get_ylabel() and "position" in ax.get_xlabel() and ax.get_title()
    assert legend_texts(fig) == ["causal", "sink", "trained context (4)"]

    smooth = plots.nll_figure({"sink": sink}, smooth=3)
    line = lines_by_label(smooth.axes[0])["sink"]
    xs, ys = trailing_mean(list(range(6)), sink.tolist(), 3)
    np.testing.assert_array_equal(line.get_xdata(), xs)
    np.testing.assert_allclose(line.get_ydata(), ys)
    assert "moving mean over 3 positions" in smooth.axes[0].get_ylabel()
    assert_renders(fig)


def test_comparison_figures_need_data():
    for make in (plots.compare_divergence_figure, plots.compare_memory_figure, plots.pareto_figure):
        with pytest.raises(ValueError, match="at least one DiffReport"):
            make([])
    with pytest.raises(ValueError, match="at least one curve"):
        plots.nll_figure({})


def test_causal_bytes_count_the_models_own_windows():
    """On a model with sliding-window layers causal holds each local layer's window only: the
    report's causal curve (and its bytes ratios) count that, not every position on every layer."""
    import dataclasses

    plain = fake_report("sink:4,8", 1)
    windowed = dataclasses.replace(plain, layer_windows=(4, 0, 4))
    per_layer = KV_BYTES // N_LAYERS
    for pos in (0, 3, 4, 11):
        assert plain.causal_bytes(pos) == (pos + 1) * KV_BYTES
        assert windowed.causal_bytes(pos) == per_layer * (2 * min(pos + 1, 4) + (pos + 1))
    x = np.arange(12)
    assert windowed.causal_bytes_curve(x).tolist() == [windowed.causal_bytes(p) for p in range(12)]
