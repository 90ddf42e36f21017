"""held_positions_record and held_positions_figure on stories260K, against the positions each rule
holds by its definition (written here, not read from the plugins)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pyllama import Model
from pyllama.errors import InputError
from pyllama.plots import held_positions_figure, held_positions_record

N = 96


@pytest.fixture(scope="module")
def model(stories260k, tok512):
    return Model.load(stories260k, tokenizer=tok512, threads=1)


@pytest.fixture(scope="module")
def tokens():
    return np.random.default_rng(5).integers(1, 512, N, dtype=np.int32)


def expected(rule) -> np.ndarray:
    out = np.zeros((N, N), dtype=bool)
    for t in range(N):
        out[t, sorted(rule(t))] = True
    return out


def test_causal_sliding_and_sink_hold_their_definitions(model, tokens):
    cases = {
        "causal": lambda t: range(t + 1),
        "sliding:window=16": lambda t: range(max(0, t - 15), t + 1),
        "sink:sinks=4,window=20": lambda t: set(range(min(4, t + 1))) | set(range(max(0, t - 19), t + 1)),
    }
    for spec, rule in cases.items():
        rec = held_positions_record(model, spec, tokens, layer=2, head=0)
        assert rec.held.shape == (N, N)
        np.testing.assert_array_equal(rec.held, expected(rule), err_msg=spec)


def test_h2o_holds_its_stated_count_and_the_event_cuts_snapkv(model, tokens):
    rec = held_positions_record(model, "h2o:ratio=0.5", tokens, layer=1)
    # the rule for step eviction with a ratio: ceil((1 - ratio) (t + 1)) after position t
    want = [math.ceil(0.5 * (t + 1)) for t in range(N)]
    assert rec.counts.tolist() == want
    assert rec.held[-1, -1], "the current position is held"
    snap = held_positions_record(model, "snapkv:ratio=0.5,window=8", tokens, layer=1, compress_at=63)
    assert snap.counts[:63].tolist() == list(range(1, 64)), "exact until the event"
    assert snap.counts[63] <= 32 + 8 and snap.counts[63] < 64, "the event removed about half"
    assert snap.held[63, 56:64].all(), "the observation window is kept"


def test_figure_has_a_panel_per_record_and_marks_the_event(model, tokens):
    recs = [
        held_positions_record(model, "causal", tokens[:40]),
        held_positions_record(model, "knorm:ratio=0.5", tokens[:40], compress_at=30),
    ]
    fig = held_positions_figure(recs)
    panels = [ax for ax in fig.axes if ax.get_visible()]
    assert len(panels) == 2
    assert "40 of 40 held" in panels[0].get_title()
    assert len(panels[1].lines) == 1, "the compression event line"


def test_bad_layer_head_and_event_are_refused(model, tokens):
    with pytest.raises(InputError, match="layer 9"):
        held_positions_record(model, "causal", tokens, layer=9)
    with pytest.raises(InputError, match="KV head 7"):
        held_positions_record(model, "causal", tokens, head=7)
    with pytest.raises(InputError, match="compress_at"):
        held_positions_record(model, "causal", tokens, compress_at=N)
