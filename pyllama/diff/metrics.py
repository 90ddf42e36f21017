"""Per-position divergence metrics between two runs' logits, in float64.

Every function takes a block of positions at once (rows = positions) so the harness computes them
with a few numpy calls per block instead of per token.
"""

from __future__ import annotations

import numpy as np


def log_softmax(logits: np.ndarray, out: np.ndarray | None = None, probs: np.ndarray | None = None) -> np.ndarray:
    """float64 log-probabilities of each row of ``logits`` [n, vocab] (max subtracted first).

    ``out`` (float64, same shape) receives them when given; ``probs`` then receives the
    probabilities, which KL needs anyway (one exp per element instead of two).
    """
    x = np.asarray(logits)
    if out is None:
        out = np.empty(x.shape, dtype=np.float64)
    out[...] = x
    out -= out.max(axis=1, keepdims=True)
    e = np.exp(out, out=probs)
    total = e.sum(axis=1, keepdims=True)
    if probs is not None:
        probs /= total
    out -= np.log(total)
    return out


def max_abs_diff(la: np.ndarray, lb: np.ndarray, scratch: np.ndarray | None = None) -> np.ndarray:
    """max |a - b| per row, in float64 (exact: the difference of two float32 values is exact in float64).

    The element is located with float32 arithmetic (``scratch``: a float32 buffer like ``la``), then
    its difference is taken in float64; 0 exactly when the rows are bit-identical.
    """
    d = np.subtract(la, lb, out=scratch)
    np.abs(d, out=d)
    rows = np.arange(la.shape[0])
    at = d.argmax(axis=1)
    return np.abs(la[rows, at].astype(np.float64) - lb[rows, at].astype(np.float64))


def kl_divergence(
    lpa: np.ndarray, lpb: np.ndarray, pa: np.ndarray | None = None, scratch: np.ndarray | None = None
) -> np.ndarray:
    """KL(P_a ‖ P_b) per row in nats, from float64 log-probabilities; exactly 0 when the rows are equal.

    ``pa``: the probabilities exp(lpa) if already at hand; ``scratch``: a float64 buffer of the same
    shape to work in. Tiny negative values from rounding are clipped to 0 (KL is non-negative).
    """
    if pa is None:
        pa = np.exp(lpa)
    d = np.subtract(lpa, lpb, out=scratch)
    d *= pa
    return np.maximum(d.sum(axis=1), 0.0)


def teacher_logprob(lp: np.ndarray, next_tokens: np.ndarray) -> np.ndarray:
    """log P(next token) per row; NaN where there is no next token (``next_tokens`` < 0)."""
    out = np.full(lp.shape[0], np.nan)
    ok = next_tokens >= 0
    out[ok] = lp[np.nonzero(ok)[0], next_tokens[ok]]
    return out


def relative_l2(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """‖b - a‖ / ‖a‖ over the last axis, float64; 0 where both are zero, inf where only a is."""
    a64 = a.astype(np.float64)
    num = np.sqrt(((b.astype(np.float64) - a64) ** 2).sum(axis=-1))
    den = np.sqrt((a64**2).sum(axis=-1))
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(den > 0, num / np.where(den > 0, den, 1.0), np.where(num > 0, np.inf, 0.0))
    return out


def perplexity(logp: np.ndarray) -> float:
    """exp(-mean log P(teacher token)) over the finite entries; NaN when there are none."""
    v = logp[np.isfinite(logp)]
    return float(np.exp(-v.mean())) if v.size else float("nan")
