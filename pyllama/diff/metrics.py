"""Per-position divergence metrics between two runs' logits, in float64.

Every function takes a block of positions at once (rows = positions) so the harness computes them
with a few numpy calls per block instead of per token.

A row holding NaN or Inf is a difference, never agreement, and never left out: its max |Δlogit|,
KL and layer error are +inf, its top-1 is -1 (agrees with nothing) and its teacher log-probability
-inf, so a plugin that writes NaN gets an infinite perplexity, not a better one.
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
    out = np.abs(la[rows, at].astype(np.float64) - lb[rows, at].astype(np.float64))
    out[~(finite_rows(la) & finite_rows(lb))] = np.inf
    return out


def finite_rows(x: np.ndarray) -> np.ndarray:
    """True for each row (all axes but the first) holding no NaN or Inf."""
    return np.isfinite(x).reshape(x.shape[0], -1).all(axis=1)


def top1(logits: np.ndarray) -> np.ndarray:
    """The argmax of each row; -1 for a row with NaN or Inf (it agrees with nothing)."""
    out = logits.argmax(axis=1).astype(np.int32)
    out[~finite_rows(logits)] = -1
    return out


def nonfinite_layer(first_bad_layer: np.ndarray, finite_logits: np.ndarray, n_layers: int) -> np.ndarray:
    """Per row: the first layer whose output held NaN/Inf (the engine's ``nonfinite_layer``), else
    ``n_layers`` when only the logits did (final norm or classifier; ``finite_logits``: the rows'
    ``finite_rows``), else -1 (all finite)."""
    out = np.where(finite_logits, -1, n_layers).astype(np.int32)
    return np.where(first_bad_layer >= 0, first_bad_layer, out).astype(np.int32)


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
    out = np.maximum(d.sum(axis=1), 0.0)
    out[~(finite_rows(lpa) & finite_rows(lpb))] = np.inf  # a NaN sum would otherwise read as "no divergence"
    return out


def teacher_logprob(lp: np.ndarray, next_tokens: np.ndarray) -> np.ndarray:
    """log P(next token) per row; NaN where there is no next token (``next_tokens`` < 0), -inf where
    the row holds NaN or Inf (nothing was predicted)."""
    out = np.full(lp.shape[0], np.nan)
    ok = next_tokens >= 0
    out[ok] = lp[np.nonzero(ok)[0], next_tokens[ok]]
    out[ok & ~finite_rows(lp)] = -np.inf
    return out


def relative_l2(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """‖b - a‖ / ‖a‖ over the last axis, float64; 0 where both are zero, inf where only a is."""
    a64 = a.astype(np.float64)
    num = np.sqrt(((b.astype(np.float64) - a64) ** 2).sum(axis=-1))
    den = np.sqrt((a64**2).sum(axis=-1))
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(den > 0, num / np.where(den > 0, den, 1.0), np.where(num > 0, np.inf, 0.0))
    out[~(np.isfinite(a).all(axis=-1) & np.isfinite(b).all(axis=-1))] = np.inf  # NaN compares false: be explicit
    return out


def perplexity(logp: np.ndarray) -> float:
    """exp(-mean log P(teacher token)) over the positions that have a teacher token (NaN marks the
    end of a sequence); +inf when one of them is -inf (a non-finite row); NaN when there are none."""
    v = logp[~np.isnan(logp)]
    return float(np.exp(-v.mean())) if v.size else float("nan")
