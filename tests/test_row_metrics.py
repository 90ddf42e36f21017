"""The diff's per-position metrics: metrics.py (numpy) against plain formulas, and the compiled
metrics (_metrics.pyx, row_metrics.h) against metrics.py, bit for bit. test_simd_paths runs this
file on every SIMD path the compiled scans are built for."""

from __future__ import annotations

import numpy as np
import pytest

from pyllama.diff import metrics


def test_metrics_against_plain_formulas():
    rng = np.random.default_rng(0)
    la = rng.standard_normal((5, 50)).astype(np.float32) * 4
    lb = la + rng.standard_normal((5, 50)).astype(np.float32) * 0.1
    lb[0] = la[0]
    lpa, lpb = metrics.log_softmax(la), metrics.log_softmax(lb)
    pa = np.exp(la.astype(np.float64))
    pa /= pa.sum(axis=1, keepdims=True)
    pb = np.exp(lb.astype(np.float64))
    pb /= pb.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(lpa, np.log(pa), atol=1e-12)
    kl = metrics.kl_divergence(lpa, lpb)
    np.testing.assert_allclose(kl, (pa * np.log(pa / pb)).sum(axis=1), rtol=1e-9, atol=1e-15)
    assert kl[0] == 0.0 and (kl[1:] > 0).all()
    probs = np.empty_like(lpa)
    metrics.log_softmax(la, out=np.empty_like(lpa), probs=probs)
    np.testing.assert_allclose(probs, pa, rtol=1e-12)
    assert metrics.max_abs_diff(la, lb)[0] == 0.0
    nxt = np.array([3, -1, 0, 49, 7])
    t = metrics.teacher_logprob(lpa, nxt)
    assert np.isnan(t[1]) and t[0] == lpa[0, 3]
    a = np.array([[1.0, 0.0], [0.0, 0.0], [0.0, 0.0]])
    err = metrics.relative_l2(a, np.array([[1.0, 1.0], [0.0, 0.0], [1.0, 0.0]]))
    assert err.tolist() == [1.0, 0.0, np.inf]
    assert metrics.perplexity(np.log(np.array([0.5, 0.25, np.nan]))) == pytest.approx(np.sqrt(8))


def _numpy_exp_is_libm() -> bool:
    """numpy's float64 exp and log are the C library's where numpy has no vector version (AVX2 and
    older): then the compiled metrics, which call the C library, give metrics.py's bits exactly."""
    import math

    x = np.random.default_rng(1).uniform(-80, 5, 4000)
    y = -x[x < 0]
    return [math.exp(v) for v in x] == np.exp(x).tolist() and [math.log(v) for v in y] == np.log(y).tolist()


@pytest.mark.parametrize("vocab", [1, 7, 8, 9, 127, 128, 129, 257, 1000, 32000])
def test_compiled_metrics_give_metrics_py_values(vocab):
    from pyllama.diff._metrics import RowSoftmax, compare
    from pyllama.diff.retrieval_scores import teacher_rank
    from pyllama.kernels.threads import set_serial_below

    rng = np.random.default_rng(vocab)
    m = 8
    la = (rng.standard_normal((m, vocab)) * 9).astype(np.float32)
    lb = la + (rng.standard_normal((m, vocab)) * 0.3).astype(np.float32)
    lb[0] = la[0]
    nxt = rng.integers(0, vocab, m).astype(np.int32)
    nxt[1] = -1
    if vocab > 4:
        la[2, 1], lb[3, 2], lb[4, 0] = np.nan, np.inf, -np.inf
        la[5, :] = la[5, 0]  # every logit tied: the teacher's rank counts the smaller ids only
        lb[6, nxt[6]] = lb[6].max()  # a tie for the top
    with np.errstate(invalid="ignore"):  # the NaN and Inf rows
        lpa, lpb, pa = metrics.log_softmax(la), metrics.log_softmax(lb), np.empty((m, vocab))
        metrics.log_softmax(la, out=np.empty((m, vocab)), probs=pa)
        expect = {
            "max_abs": metrics.max_abs_diff(la, lb),
            "kl": metrics.kl_divergence(lpa, lpb, pa),
            "logp_a": metrics.teacher_logprob(lpa, nxt),
            "logp_b": metrics.teacher_logprob(lpb, nxt),
            "rank_a": teacher_rank(la, nxt),
            "rank_b": teacher_rank(lb, nxt),
        }
    from pyllama.diff._metrics import NUMPY_LOOPS

    exact = NUMPY_LOOPS or _numpy_exp_is_libm()
    previous = set_serial_below(0)  # 2 threads really split the rows
    try:
        for threads in (1, 2):
            sa, sb = RowSoftmax(m + 3, vocab, keep_exps=True), RowSoftmax(m + 3, vocab)
            sa.compute(la, threads)
            sb.compute(lb, threads)
            got = {k: np.full(m, 7.0) for k in ("max_abs", "kl", "logp_a", "logp_b")}
            got.update(rank_a=np.zeros(m, dtype=np.int64), rank_b=np.zeros(m, dtype=np.int64))
            compare(sa, sb, la, lb, nxt, *got.values(), n_threads=threads)
            assert np.array_equal(sa.top1[:m], metrics.top1(la)) and np.array_equal(sb.top1[:m], metrics.top1(lb))
            assert np.array_equal(sa.finite[:m], metrics.finite_rows(la))
            for name, col in expect.items():
                if exact or name in ("max_abs", "rank_a", "rank_b"):
                    assert np.array_equal(got[name], col, equal_nan=True), (name, threads)
                else:  # the C library's exp and log stand in for numpy's: within a few ulp of them
                    np.testing.assert_allclose(got[name], col, rtol=1e-13, atol=1e-15, err_msg=name)
    finally:
        set_serial_below(previous)
    with pytest.raises(ValueError, match="logits are 12 x"):
        RowSoftmax(m, vocab).compute(np.zeros((12, vocab), dtype=np.float32))


@pytest.mark.parametrize("vocab", [5, 16, 17, 40, 1001])
def test_scans_take_the_first_of_equal_values_across_lanes(vocab):
    """The compiled scans keep sixteen lanes apart: the first index of the largest value must win
    however the equal values fall over the lanes (the same lane, a later lane first, the tail),
    and -0.0 equals 0.0, as numpy's argmax has it."""
    from pyllama.diff._metrics import RowSoftmax, compare

    rng = np.random.default_rng(vocab)
    places = [(3, 18), (18, 3 + 32), (2, 2 + 16), (vocab - 1, 0), (vocab // 2, vocab - 1), (0, 1)]
    la = np.array([rng.uniform(-5, 4, vocab) for _ in places], dtype=np.float32)
    lb = la.copy()
    for row, (i, j) in enumerate(places):
        i, j = i % vocab, j % vocab
        la[row, [i, j]] = 1e8  # top-1: the first of the two
        lb[row, [i, j]] = 0.5, 0.0  # max |a - b|: 1e8 at both in float32, but 99,999,999.5 at the first
    la[-1, :] = -0.0
    la[-1, vocab // 3] = 0.0  # a row of zeros of both signs: index 0
    m = len(places)
    sa, sb = RowSoftmax(m, vocab, keep_exps=True), RowSoftmax(m, vocab)
    sa.compute(la)
    sb.compute(lb)
    assert sa.top1[:m].tolist() == la.argmax(axis=1).tolist()
    max_abs = np.zeros(m)
    rest = [np.zeros(m) for _ in range(3)] + [np.zeros(m, dtype=np.int64) for _ in range(2)]
    compare(sa, sb, la, lb, np.zeros(m, dtype=np.int32), max_abs, *rest)
    assert np.array_equal(max_abs, metrics.max_abs_diff(la, lb))
