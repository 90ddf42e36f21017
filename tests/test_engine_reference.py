"""The engine's logits against the independent float64 numpy forward pass (tests/numpy_reference.py)."""

from __future__ import annotations

import numpy as np
import pytest
from numpy_reference import NumpyLlama

from pyllama.model import Model

# Tolerance, relative to the largest |logit|: the engine computes in float32 (unit roundoff 6e-8)
# with dot products of up to a few hundred terms in blocked order, through a handful of layers,
# and its attention softmax/SiLU use an exp with 2.5e-7 relative error. Accumulated float32
# rounding over these steps is of order 1e-6 relative; 2e-5 leaves margin while still catching
# any real mistake (a wrong RoPE pair, head mapping or norm changes logits by O(1)).
REL_TOL = 2e-5


def _compare(path, tokens):
    model = Model.load(path, threads=2)
    ref = NumpyLlama(path)
    worst = 0.0
    for pos, token in enumerate(tokens):
        got = model.forward(token, pos).astype(np.float64)
        want = ref.forward(token, pos)
        worst = max(worst, np.abs(got - want).max() / np.abs(want).max())
    return worst


def test_stories260k_matches_numpy_float64(stories260k):
    rng = np.random.default_rng(0)
    tokens = [1] + rng.integers(3, 512, size=47).tolist()
    assert _compare(stories260k, tokens) < REL_TOL


def test_random_gqa_unshared_classifier_matches_numpy_float64(gqa_unshared):
    model = Model.load(gqa_unshared)
    assert not model.config.shared_classifier
    assert (model.config.n_heads, model.config.n_kv_heads) == (6, 2)
    rng = np.random.default_rng(1)
    tokens = rng.integers(0, 300, size=40).tolist()
    assert _compare(gqa_unshared, tokens) < REL_TOL


def test_reference_detects_a_wrong_model(stories260k, gqa_unshared):
    # the comparison is sharp: a different model's logits are far outside the tolerance
    model = Model.load(stories260k)
    ref = NumpyLlama(stories260k)
    got = model.forward(1, 0).astype(np.float64)
    want = ref.forward(300, 0)
    assert np.abs(got - want).max() / np.abs(want).max() > 100 * REL_TOL


@pytest.mark.parametrize("threads", [1, 2])
def test_logits_identical_for_any_thread_count(gqa_unshared, stories260k, threads):
    for path in (gqa_unshared, stories260k):
        one = Model.load(path, threads=1)
        many = Model.load(path, threads=threads + 1)
        for pos, token in enumerate([1, 7, 42, 3, 99, 250, 11, 17]):
            a = one.forward(token, pos)
            b = many.forward(token, pos)
            assert np.array_equal(a, b), f"{path.name}: logits differ between 1 and {threads + 1} threads at {pos}"
