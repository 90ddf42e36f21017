"""The ledger of a model with sliding-window layers counts every layer: stories260K given windows of
16 positions on layers 0, 2 and 4, so that the engine splits it (attention/layers.pyx) and runs the
local layers itself. Retrieval scores and the diff's bytes must read the engine's whole cache, not the
plugin that governs only the global layers."""

from __future__ import annotations

import dataclasses

import pytest

from pyllama import Model
from pyllama.diff.retrieval_scores import score_retrieval

WINDOW = 16


@pytest.fixture(scope="module")
def windowed(stories260k, tok512) -> Model:
    model = Model.load(stories260k, tokenizer=tok512, threads=1)
    n = model.config.n_layers
    windows = tuple(WINDOW if layer % 2 == 0 else 0 for layer in range(n))
    model.config = dataclasses.replace(model.config, layer_windows=windows)
    return model


def causal_bytes(model: Model, positions: int) -> int:
    """causal's cache after ``positions`` positions: the window on a local layer, all on a global one."""
    cfg = model.config
    rows = sum(min(positions, w) if w else positions for w in cfg.layer_windows)
    return rows * 2 * cfg.kv_dim * 4


@pytest.mark.parametrize("spec", ["causal", "sink:sinks=4,window=8,layers=global"])
def test_retrieval_scores_count_the_local_layers(windowed, spec):
    run = score_retrieval(windowed, spec, "passkey:length=256", threads=1)
    n = run.rows[0].length
    cfg = windowed.config
    local = sum(1 for w in cfg.layer_windows if w)
    if spec == "causal":
        assert run.memory[-1] == causal_bytes(windowed, n)
    else:  # the engine's exact window on local layers, sinks + window on the global ones
        assert run.memory[-1] == (local * WINDOW + (cfg.n_layers - local) * 12) * 2 * cfg.kv_dim * 4


def test_diff_bytes_ratio_is_against_causal_with_its_windows(windowed):
    report = windowed.diff("causal", "sliding:window=8", probe="passkey:length=256")
    last = report.n_positions - 1
    n = int(report.position[last]) + 1
    assert report.causal_bytes(n - 1) == causal_bytes(windowed, n)
    assert report.summary["bytes_ratio_a"] == 1.0


def test_equal_memory_budgets_measure_the_whole_cache(windowed):
    import numpy as np

    from pyllama.sweep.budget import BudgetSizer

    tokens = np.arange(1, 101, dtype=np.int32)
    sizer = BudgetSizer(windowed, tokens, reference_positions=100)
    assert sizer.bytes_at_end("causal") == causal_bytes(windowed, 100)
