"""Exactness as a feature: plugins in a degenerate setting reproduce causal bit for bit (max |Δlogit|
exactly 0) over the whole standard probe on stories260K, through the diff harness.

The probe's longest sequence is the long run (4x the 512-position context), so the reference is
``causal:positions=2048`` wherever the other side can hold that much: every position of the probe is
compared. Native pairs run their two engines concurrently (threads=2, one each: the threshold under
which a diff runs on one thread is lowered for these tests).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pyllama.model import Model

MODELS = Path(__file__).resolve().parents[1].parent / "shared" / "models"
EXAMPLE = Path(__file__).resolve().parents[1] / "experiments" / "random_evict.py"


@pytest.fixture(autouse=True)
def concurrent_sides(monkeypatch):
    from pyllama.diff import harness

    monkeypatch.setattr(harness, "DIFF_THREADS_FROM", 0)


@pytest.fixture(scope="module")
def model() -> Model:
    for name in ("stories260K.bin", "tok512.bin"):
        if not (MODELS / name).exists():
            pytest.skip(f"{name} is not in shared/models beside the repository (needed for this test)")
    return Model.load(MODELS / "stories260K.bin", tokenizer=MODELS / "tok512.bin", threads=2)


@pytest.fixture(scope="module")
def probe(model):
    from pyllama.diff.probes import load_probe

    p = load_probe("standard", model.tokenizer, model.config.seq_len)
    assert p.max_length == 4 * model.config.seq_len == 2048
    return p


def _exact(report, probe, whole: bool = True) -> None:
    assert report.exact, report.table()
    assert report.summary["max_abs_dlogit"] == 0.0 and report.summary["max_kl"] == 0.0
    assert report.summary["top1_agreement"] == 1.0 and report.summary["first_diff"] is None
    assert (report.layer_err == 0).all()
    if whole:
        assert report.n_positions == probe.n_positions and not report.notes


def test_causal_vs_causal(model, probe):
    r = model.diff("causal", "causal", probe=probe)
    _exact(r, probe, whole=False)  # each holds the context: the long run is compared up to 512
    assert r.n_positions == probe.n_positions - (2048 - 512)


def test_sliding_window_at_least_the_probe_is_causal(model, probe):
    _exact(model.diff("causal:positions=2048", f"sliding:{probe.max_length}", probe=probe), probe)


@pytest.mark.parametrize("shift", ["", ",shift"])
def test_sinks_plus_window_at_least_the_probe_is_causal(model, probe, shift):
    _exact(model.diff("causal:positions=2048", f"sink:4,{probe.max_length - 4}{shift}", probe=probe), probe)


@pytest.mark.parametrize("w", [1, 7, 64])
def test_sink_without_sinks_is_sliding(model, probe, w):
    _exact(model.diff(f"sliding:{w}", f"sink:0,{w}", probe=probe), probe)


def test_python_example_keeping_everything_is_causal(model, probe):
    spec = f"{EXAMPLE}:RandomEvict:budget={probe.max_length},seed=3"
    _exact(model.diff("causal:positions=2048", spec, probe=probe), probe)
