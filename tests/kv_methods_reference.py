"""Independent numpy references for the KV-cache methods of docs/methods.md (h2o, tova, scissorhands,
snapkv, pyramidkv, adakv, knorm, keydiff, expected, quest, random), written from the papers and from how
kvpress (NVIDIA/kvpress, ``kvpress/presses/*.py``) and KVCache-Factory (``pyramidkv/pyramidkv_utils.py``)
compute them, without reading pyllama's plugins.

Each method function runs one layer over a whole sequence: post-RoPE queries ``q`` float32[T, n_heads, hd],
keys and values ``k``, ``v`` float32[T, n_kv_heads, hd] (and pre-RoPE queries for ``expected``), and
returns a :class:`Trace`: for every step t and KV head g, the positions held after step t, the rows query
t attended and its attention output (float64), plus the candidates whose score lay within
``NEAR_THRESHOLD`` of the selection boundary (a float32 implementation may rank those differently).

The protocol, the same for every method:

- Step t appends position t to every KV head's rows; query t attends ``rows_t = held_{t-1} + [t]``
  (query head h reads KV head ``h // (n_heads // n_kv_heads)``), softmax of q.k/sqrt(hd) over those rows.
- Step-evicting methods (h2o, tova, scissorhands) score with the softmax weights of query t over
  ``rows_t`` (what the shared routine leaves readable after attending), then evict down to the target:
  ``held_t`` is a subset of ``rows_t``, at most one position fewer per step.
- Event methods (snapkv, pyramidkv, adakv, knorm, keydiff, expected, random) hold every row until the
  compression event: after query ``context_end`` attended they compress, and with ``every=N`` again after
  ``context_end + N``, ``+ 2N``... Without an event they never compress.
- quest never evicts (``held_t = rows_t``); query t attends the pages it selects.

Ranking: every selection keeps the candidates ranked highest by (score, position). Among equal scores the
older position is evicted first; this is what ``np.lexsort((positions, scores))`` (a stable ascending
sort of the scores over positions in ascending order) gives when its front is evicted. Protected positions
(``sinks`` first positions, the ``window`` most recent) are never candidates; a selection holds
``max(target, protected)`` rows.

Precision: inputs are float32 as the engine holds them; every weight and score here is computed in float64
from them (the engine reads float32 weights from its shared routine, which agree to ~1e-7 relative).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

# the slack in floor(share * n): a share written with up to six decimals times n < 10^6 is never that
# close below an integer unless it is one, so this only absorbs the binary rounding of the share
SHARE_SLACK = 1e-9
# scores within this relative distance of the selection boundary may rank differently in float32
NEAR_THRESHOLD = 1e-5


def floor_share(share: float, n: int) -> int:
    """floor(share * n) for a share given in decimal (0.7 * 10 is 7, not 7.000000000000001 -> 7)."""
    return math.floor(share * n + SHARE_SLACK)


def kept_count(n: int, ratio: float) -> int:
    """Rows left when ``ratio`` of ``n`` is removed: n - floor(ratio n) = ceil((1 - ratio) n)."""
    return n - floor_share(ratio, n)


@dataclass(frozen=True)
class Knobs:
    """The shared knobs. Exactly one of ``ratio`` (share of the held rows a compression removes) and
    ``capacity`` (rows kept per KV head). ``window`` (int, or "half" of the target for h2o) and ``sinks``
    are protected; ``every`` re-compresses an event method every N positions after the event."""

    ratio: float | None = None
    capacity: int | None = None
    window: int | str = 0
    sinks: int = 0
    every: int = 0

    def __post_init__(self) -> None:
        if (self.ratio is None) == (self.capacity is None):
            raise ValueError("give exactly one of ratio and capacity")
        if self.ratio is not None and not 0 <= self.ratio < 1:
            raise ValueError(f"ratio {self.ratio} outside [0, 1)")

    def target(self, n: int) -> int:
        """Rows a selection over ``n`` rows keeps (before the protected ones are counted)."""
        return kept_count(n, self.ratio) if self.ratio is not None else min(n, self.capacity)

    def window_for(self, target: int) -> int:
        return target // 2 if self.window == "half" else int(self.window)


@dataclass
class Trace:
    """held[t][g], attended[t][g], near[t][g]: sorted int64 positions; out: float64[T, n_heads, hd]."""

    out: np.ndarray
    held: list[list[np.ndarray]] = field(default_factory=list)
    attended: list[list[np.ndarray]] = field(default_factory=list)
    near: list[list[np.ndarray]] = field(default_factory=list)

    def record(self, attended: list[np.ndarray], held: list[np.ndarray], near: list[np.ndarray] | None) -> None:
        self.attended.append([a.copy() for a in attended])
        self.held.append([h.copy() for h in held])
        self.near.append(near if near is not None else [_EMPTY] * len(held))


_EMPTY = np.zeros(0, dtype=np.int64)
# a scorer: (t, rows per KV head, protected mask per KV head, event index) -> float64 scores aligned
# with the rows (entries of protected rows are ignored)
Scorer = Callable[[int, list[np.ndarray], list[np.ndarray], int], list[np.ndarray]]


# ---- attention and selection --------------------------------------------------------------------------
def softmax(scores: np.ndarray) -> np.ndarray:
    e = np.exp(scores - scores.max())
    return e / e.sum()


def attend(q_t: np.ndarray, k: np.ndarray, v: np.ndarray, rows: list[np.ndarray]) -> tuple[list, np.ndarray]:
    """Query t's weights (one float64 array per query head, aligned with its KV head's rows) and output."""
    n_heads, hd = q_t.shape
    group = n_heads // k.shape[1]
    weights, out = [], np.empty((n_heads, hd))
    for h in range(n_heads):
        g = h // group
        w = softmax(k[rows[g], g].astype(np.float64) @ q_t[h].astype(np.float64) / math.sqrt(hd))
        weights.append(w)
        out[h] = w @ v[rows[g], g].astype(np.float64)
    return weights, out


def group_mean(per_head: list[np.ndarray], g: int, group: int) -> np.ndarray:
    """The mean over KV head g's query group (heads g*group ... in ascending order)."""
    total = per_head[g * group].copy()
    for h in range(g * group + 1, (g + 1) * group):
        total += per_head[h]
    return total / group


def protected(rows: np.ndarray, t: int, sinks: int, window: int) -> np.ndarray:
    return (rows < sinks) | (rows > t - window)


def _near(scores: np.ndarray, order: np.ndarray, n_evict: int) -> np.ndarray:
    """Candidates a float32 ranking may put on the other side: evicted ones within NEAR_THRESHOLD of the
    lowest kept score, kept ones within it of the highest evicted score (exact ties included)."""
    mask = np.zeros(len(scores), dtype=bool)
    if 0 < n_evict < len(order):
        evicted_top, kept_bottom = scores[order[n_evict - 1]], scores[order[n_evict]]
        evicted, kept = order[:n_evict], order[n_evict:]
        mask[evicted] = scores[evicted] >= kept_bottom - NEAR_THRESHOLD * abs(kept_bottom)
        mask[kept] = scores[kept] <= evicted_top + NEAR_THRESHOLD * abs(evicted_top)
    return mask


def keep_highest(rows: np.ndarray, scores: np.ndarray, keep: np.ndarray, target: int) -> tuple[np.ndarray, np.ndarray]:
    """The protected rows plus the ``target - protected`` candidates ranked highest by (score, position);
    and the candidates near the boundary (see _near)."""
    positions, cand_scores = rows[~keep], scores[~keep]
    n_keep = min(max(target - int(keep.sum()), 0), len(positions))
    order = np.lexsort((positions, cand_scores))  # eviction order: lowest score first, older first
    n_evict = len(order) - n_keep
    kept = positions[order[n_evict:]]
    near = np.sort(positions[_near(cand_scores, order, n_evict)])
    return np.sort(np.concatenate([rows[keep], kept])), near


def _start(q: np.ndarray, k: np.ndarray) -> tuple[int, int, int, Trace, list[np.ndarray]]:
    T, n_heads, hd = q.shape
    n_kv = k.shape[1]
    return T, n_kv, n_heads // n_kv, Trace(out=np.zeros((T, n_heads, hd))), [_EMPTY] * n_kv


# ---- methods that evict every step ---------------------------------------------------------------------
def h2o(q: np.ndarray, k: np.ndarray, v: np.ndarray, knobs: Knobs) -> Trace:
    """H2O: per KV head, each held position accumulates the attention it receives (group mean of query
    t's weights, added once per step in float64); keep the recent window plus the highest totals."""
    T, n_kv, group, trace, held = _start(q, k)
    received = np.zeros((n_kv, T))
    for t in range(T):
        rows = [np.append(h, t) for h in held]
        weights, trace.out[t] = attend(q[t], k, v, rows)
        target = knobs.target(t + 1)
        window = knobs.window_for(target)
        held, near = [], []
        for g in range(n_kv):
            received[g, rows[g]] += group_mean(weights, g, group)
            kept, close = keep_highest(
                rows[g], received[g, rows[g]], protected(rows[g], t, knobs.sinks, window), target
            )
            held.append(kept)
            near.append(close)
        trace.record(rows, held, near)
    return trace


def tova(q: np.ndarray, k: np.ndarray, v: np.ndarray, knobs: Knobs) -> Trace:
    """TOVA: one set per layer; evict the position with the lowest weight from query t averaged over all
    the layer's query heads (the current position is a candidate unless protected)."""
    T, n_kv, group, trace, held = _start(q, k)
    n_heads = q.shape[1]
    for t in range(T):
        rows = [np.append(h, t) for h in held]
        weights, trace.out[t] = attend(q[t], k, v, rows)
        score = group_mean(weights, 0, n_heads)  # every head attends the same rows: the layer's mean
        target = knobs.target(t + 1)
        kept, close = keep_highest(rows[0], score, protected(rows[0], t, knobs.sinks, knobs.window_for(target)), target)
        held = [kept] * n_kv
        trace.record(rows, held, [close] * n_kv)
    return trace


def scissorhands(q: np.ndarray, k: np.ndarray, v: np.ndarray, knobs: Knobs, history: int = 32) -> Trace:
    """Scissorhands: a position is unimportant to query j when the group mean of j's weight on it is below
    1/len(rows_j) (uniform attention); evict the position unimportant most often among the last
    ``history`` queries (those that attended it), older first among equal counts."""
    T, n_kv, group, trace, held = _start(q, k)
    past: deque = deque(maxlen=history)  # (rows, unimportant mask, near-the-threshold mask) per KV head
    for t in range(T):
        rows = [np.append(h, t) for h in held]
        weights, trace.out[t] = attend(q[t], k, v, rows)
        means = [group_mean(weights, g, group) for g in range(n_kv)]
        past.append(
            [
                (r, m < 1.0 / len(r), np.abs(m - 1.0 / len(r)) <= NEAR_THRESHOLD / len(r))
                for r, m in zip(rows, means, strict=True)
            ]
        )
        target = knobs.target(t + 1)
        window = knobs.window_for(target)
        held, near = [], []
        for g in range(n_kv):
            count = np.zeros(len(rows[g]))
            flagged_near = np.zeros(len(rows[g]), dtype=bool)
            for step in past:
                past_rows, unimportant, close = step[g]
                at = np.searchsorted(past_rows, rows[g])
                seen = at < len(past_rows)
                seen[seen] = past_rows[at[seen]] == rows[g][seen]
                count[seen] += unimportant[at[seen]]
                flagged_near[seen] |= close[at[seen]]
            keep = protected(rows[g], t, knobs.sinks, window)
            kept, _ = keep_highest(rows[g], -count, keep, target)  # integer counts: exact ties are exact
            held.append(kept)
            near.append(rows[g][flagged_near & ~keep] if len(kept) < len(rows[g]) else _EMPTY)
        trace.record(rows, held, near)
    return trace


# ---- methods that compress at the event ----------------------------------------------------------------
def _compresses_at(t: int, context_end: int | None, every: int) -> bool:
    if context_end is None or t < context_end:
        return False
    return t == context_end or (every > 0 and (t - context_end) % every == 0)


Compression = Callable[[int, list[np.ndarray], int], tuple[list[np.ndarray], list[np.ndarray]]]


def run_event(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, knobs: Knobs, context_end: int | None, compress: Compression
) -> Trace:
    T, n_kv, group, trace, held = _start(q, k)
    events = 0
    for t in range(T):
        rows = [np.append(h, t) for h in held]
        _, trace.out[t] = attend(q[t], k, v, rows)
        held, near = rows, None
        if _compresses_at(t, context_end, knobs.every):
            held, near = compress(t, rows, events)
            events += 1
        trace.record(rows, held, near)
    return trace


def per_head(knobs: Knobs, scorer: Scorer, target_of: Callable[[int], int] | None = None) -> Compression:
    """Each KV head keeps its own best rows: the target of its row count (``knobs.target`` by default)."""
    target_of = target_of or knobs.target

    def compress(t: int, rows: list[np.ndarray], event: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
        keep = [protected(r, t, knobs.sinks, knobs.window_for(0)) for r in rows]
        scores = scorer(t, rows, keep, event)
        chosen = [keep_highest(r, s, m, target_of(len(r))) for r, s, m in zip(rows, scores, keep, strict=True)]
        return [c[0] for c in chosen], [c[1] for c in chosen]

    return compress


def pool1d(x: np.ndarray, kernel: int, how: str) -> np.ndarray:
    """torch's avg_pool1d (zero padding counted, divided by kernel) or max_pool1d, stride 1, same length."""
    if len(x) == 0:
        return x
    half = kernel // 2
    padded = np.pad(x, half, constant_values=0.0 if how == "avg" else -np.inf)
    windows = np.lib.stride_tricks.sliding_window_view(padded, kernel)
    return windows.sum(axis=1) / kernel if how == "avg" else windows.max(axis=1)


def snapkv_scorer(q: np.ndarray, k: np.ndarray, window: int, kernel: int = 5, pool: str = "avg") -> Scorer:
    """SnapKV: the observation queries are the last ``window`` positions; query j's softmax is recomputed
    over the rows held at compression that are <= j. A candidate's score: the group mean of the sum over
    observation queries of their weights on it, then pooled over its neighbours among the candidates."""
    n_heads, hd = q.shape[1], q.shape[2]
    group = n_heads // k.shape[1]

    def score(t: int, rows: list[np.ndarray], keep: list[np.ndarray], event: int) -> list[np.ndarray]:
        out = []
        for g, (r, m) in enumerate(zip(rows, keep, strict=True)):
            candidates = r[~m]
            total = np.zeros(len(candidates))
            for h in range(g * group, (g + 1) * group):
                for j in range(max(0, t - window + 1), t + 1):
                    visible = r[r <= j]
                    w = softmax(k[visible, g].astype(np.float64) @ q[j, h].astype(np.float64) / math.sqrt(hd))
                    total += w[np.searchsorted(visible, candidates)]
            full = np.full(len(r), np.nan)
            full[~m] = pool1d(total / group, kernel, pool)
            out.append(full)
        return out

    return score


def knorm_scorer(k: np.ndarray) -> Scorer:
    """KNorm: keep the keys of smallest L2 norm (score = -||k||)."""

    def score(t: int, rows: list[np.ndarray], keep: list[np.ndarray], event: int) -> list[np.ndarray]:
        return [-np.linalg.norm(k[r, g].astype(np.float64), axis=1) for g, r in enumerate(rows)]

    return score


def keydiff_scorer(k: np.ndarray) -> Scorer:
    """KeyDiff: anchor = mean of the held keys normalised to unit length; keep the keys least similar
    (cosine) to it (score = -cos). A zero key has cosine 0."""

    def score(t: int, rows: list[np.ndarray], keep: list[np.ndarray], event: int) -> list[np.ndarray]:
        out = []
        for g, r in enumerate(rows):
            keys = k[r, g].astype(np.float64)
            norms = np.linalg.norm(keys, axis=1)
            unit = np.divide(keys, norms[:, None], out=np.zeros_like(keys), where=norms[:, None] > 0)
            anchor = unit.mean(axis=0)
            denom = norms * np.linalg.norm(anchor)
            out.append(-np.divide(keys @ anchor, denom, out=np.zeros(len(r)), where=denom > 0))
        return out

    return score


@dataclass(frozen=True)
class Rope:
    """The model's RoPE: pair i turns by p * theta^(-2i/n_rot); pairs (2i, 2i+1) "normal" or (i, i +
    n_rot/2) "neox"; dims from n_rot on are not rotated."""

    theta: float
    n_rot: int
    style: str = "normal"

    def pairs(self) -> list[tuple[int, int]]:
        half = self.n_rot // 2
        return [(2 * i, 2 * i + 1) if self.style == "normal" else (i, i + half) for i in range(half)]

    def mean_rotation(self, head_dim: int, first: int, count: int) -> np.ndarray:
        """The mean over positions first .. first+count-1 of the rotation matrices (x' = R x)."""
        freqs = self.theta ** (-2.0 * np.arange(self.n_rot // 2) / self.n_rot)
        angles = np.arange(first, first + count, dtype=np.float64)[:, None] * freqs[None, :]
        cos, sin = np.cos(angles).mean(axis=0), np.sin(angles).mean(axis=0)
        rot = np.eye(head_dim)
        for i, (a, b) in enumerate(self.pairs()):
            rot[a, a], rot[a, b], rot[b, a], rot[b, b] = cos[i], -sin[i], sin[i], cos[i]
        return rot


def expected_scorer(
    q_pre: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    rope: Rope,
    sinks: int,
    future: int = 512,
    epsilon: float = 0.0,
    covariance: bool = True,
) -> Scorer:
    """Expected Attention (kvpress ExpectedAttentionPress): mean and (1/N) covariance of the pre-RoPE
    queries of positions sinks..t per query head, both turned by the mean rotation of positions t+1 ..
    t+future (mu' = R mu, S' = R S R^T); z_p = mu'.k_p/sqrt(hd) + k_p S' k_p / (2 hd); softmax over the
    held non-sink rows; group mean; times ||v_p|| as (s + epsilon) * ||v_p||."""
    n_heads, hd = q_pre.shape[1], q_pre.shape[2]
    group = n_heads // k.shape[1]

    def score(t: int, rows: list[np.ndarray], keep: list[np.ndarray], event: int) -> list[np.ndarray]:
        stats = q_pre[sinks : t + 1].astype(np.float64)  # [N, n_heads, hd]
        if len(stats) == 0:  # every row is a sink: nothing to rank
            return [np.zeros(len(r)) for r in rows]
        mu = stats.mean(axis=0)
        centered = stats - mu
        cov = np.einsum("nhi,nhj->hij", centered, centered) / len(stats)
        rot = rope.mean_rotation(hd, t + 1, future)
        mu_r = mu @ rot.T
        cov_r = rot @ cov @ rot.T
        out = []
        for g, r in enumerate(rows):
            scored = r >= sinks
            keys = k[r[scored], g].astype(np.float64)
            per_head = []
            for h in range(g * group, (g + 1) * group):
                z = keys @ mu_r[h] / math.sqrt(hd)
                if covariance:
                    z = z + np.einsum("pi,ij,pj->p", keys, cov_r[h], keys) / hd / 2
                per_head.append(softmax(z))
            s = group_mean(per_head, 0, group)
            full = np.full(len(r), np.nan)
            full[scored] = (s + epsilon) * np.linalg.norm(v[r[scored], g].astype(np.float64), axis=1)
            out.append(full)
        return out

    return score


_MASK64 = (1 << 64) - 1


def splitmix64(x: int) -> int:
    """One SplitMix64 step (Steele, Lea, Flood 2014): the generator's output for state x."""
    z = (x + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def random_score(seed: int, layer: int, kv_head: int, event: int, position: int) -> float:
    """A position's random score at one compression: 53 hashed bits, exact in float64."""
    h = splitmix64(seed)
    for part in (layer, kv_head, event, position):
        h = splitmix64(h ^ part)
    return float(h >> 11)


def random_scorer(seed: int, layer: int) -> Scorer:
    def score(t: int, rows: list[np.ndarray], keep: list[np.ndarray], event: int) -> list[np.ndarray]:
        return [np.array([random_score(seed, layer, g, event, int(p)) for p in r]) for g, r in enumerate(rows)]

    return score


def snapkv(q, k, v, knobs: Knobs, context_end: int | None, kernel: int = 5, pool: str = "avg") -> Trace:
    return run_event(q, k, v, knobs, context_end, per_head(knobs, snapkv_scorer(q, k, int(knobs.window), kernel, pool)))


def pyramid_target(n: int, capacity: int, window: int, beta: int, layer: int, n_layers: int) -> int:
    """KVCache-Factory's PyramidKV budget (kv-head path) for ``n`` rows and a layer-average ``capacity``:
    window plus a share that decreases linearly from layer 0 to the last, in integer arithmetic."""
    if n < capacity:
        return n
    if capacity <= window:
        return capacity
    min_num = (capacity - window) // beta
    max_num = (capacity - window) * 2 - min_num
    if max_num >= n - window:
        max_num = n - window
        min_num = (capacity - window) * 2 - max_num
    steps = (max_num - min_num) // (n_layers - 1) if n_layers > 1 else 0
    share = capacity - window if n < (capacity - window) * 2 else max_num - layer * steps
    return window + share


def pyramidkv(
    q,
    k,
    v,
    knobs: Knobs,
    context_end: int | None,
    layer: int,
    n_layers: int,
    kernel: int = 5,
    pool: str = "avg",
    beta: int = 20,
) -> Trace:
    """PyramidKV: SnapKV's scores; the layer keeps pyramid_target rows, the capacity being knobs.capacity
    or, with a ratio, kept_count(n, ratio) (so layers average about the ratio)."""
    window = int(knobs.window)

    def target(n: int) -> int:
        return pyramid_target(
            n, knobs.target(n) if knobs.ratio is not None else knobs.capacity, window, beta, layer, n_layers
        )

    return run_event(q, k, v, knobs, context_end, per_head(knobs, snapkv_scorer(q, k, window, kernel, pool), target))


def knorm(q, k, v, knobs: Knobs, context_end: int | None) -> Trace:
    return run_event(q, k, v, knobs, context_end, per_head(knobs, knorm_scorer(k)))


def keydiff(q, k, v, knobs: Knobs, context_end: int | None) -> Trace:
    return run_event(q, k, v, knobs, context_end, per_head(knobs, keydiff_scorer(k)))


def expected(
    q,
    q_pre,
    k,
    v,
    knobs: Knobs,
    context_end: int | None,
    rope: Rope,
    future: int = 512,
    epsilon: float = 0.0,
    covariance: bool = True,
) -> Trace:
    scorer = expected_scorer(q_pre, k, v, rope, knobs.sinks, future, epsilon, covariance)
    return run_event(q, k, v, knobs, context_end, per_head(knobs, scorer))


def random_eviction(q, k, v, knobs: Knobs, context_end: int | None, seed: int = 0, layer: int = 0) -> Trace:
    return run_event(q, k, v, knobs, context_end, per_head(knobs, random_scorer(seed, layer)))


def adakv(q, k, v, knobs: Knobs, context_end: int | None, scorer: Scorer, alpha: float = 0.2) -> Trace:
    """AdaKV (kvpress AdaKVPress): the layer keeps sum over KV heads of target(rows); each head first keeps
    its protected rows and its best rows up to floor(alpha * target) (protected included, as kvpress's
    window counts in its safeguard); the rest compete across heads, evicted by (score, position, head)."""

    def compress(t: int, rows: list[np.ndarray], event: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
        keep = [protected(r, t, knobs.sinks, knobs.window_for(0)) for r in rows]
        scores = scorer(t, rows, keep, event)
        safe = []
        for r, s, m in zip(rows, scores, keep, strict=True):
            kept, _ = keep_highest(r, s, m, floor_share(alpha, knobs.target(len(r))))
            safe.append(np.isin(r, kept))
        heads = np.concatenate([np.full(int((~m).sum()), g) for g, m in enumerate(safe)])
        positions = np.concatenate([r[~m] for r, m in zip(rows, safe, strict=True)])
        pooled = np.concatenate([s[~m] for s, m in zip(scores, safe, strict=True)])
        n_evict = sum(len(r) for r in rows) - sum(knobs.target(len(r)) for r in rows)
        n_evict = min(max(n_evict, 0), len(pooled))
        order = np.lexsort((heads, positions, pooled))
        evicted = np.zeros(len(pooled), dtype=bool)
        evicted[order[:n_evict]] = True
        near_mask = _near(pooled, order, n_evict)
        held = [np.setdiff1d(r, positions[evicted & (heads == g)]) for g, r in enumerate(rows)]
        near = [np.sort(positions[near_mask & (heads == g)]) for g in range(len(rows))]
        return held, near

    return run_event(q, k, v, knobs, context_end, compress)


# ---- quest: selects per query, holds everything --------------------------------------------------------
def quest(
    q, k, v, capacity: int, context_end: int | None = None, page: int = 16, layer: int = 0, dense_layers: int = 2
) -> Trace:
    """Quest: pages of ``page`` positions (from position 0) with per-channel key minima m and maxima M; a
    query's bound on a page is sum_i max(q_i M_i, q_i m_i) (group mean for GQA). With P = capacity // page
    pages allowed, a query whose sequence spans more than P pages attends its own (last) page plus the P - 1
    other pages of highest bound (equal bounds: the older page goes first). Dense up to and including
    ``context_end`` (the prefill, as the paper) and on layers below ``dense_layers``; holds every row."""
    T, n_kv, group, trace, _ = _start(q, k)
    hd = q.shape[2]
    allowed = capacity // page
    for t in range(T):
        rows = [np.arange(t + 1)] * n_kv
        last = t // page
        chosen, near = rows, None
        sparse = layer >= dense_layers and (context_end is None or t > context_end) and last + 1 > allowed
        if sparse:
            chosen, near = [], []
            for g in range(n_kv):
                keys = k[: last * page, g].astype(np.float64).reshape(last, page, hd)
                high, low = keys.max(axis=1), keys.min(axis=1)
                bounds = [
                    np.maximum(q[t, h] * high, q[t, h] * low).sum(axis=1) for h in range(g * group, (g + 1) * group)
                ]
                pages, close = keep_highest(
                    np.arange(last), group_mean(bounds, 0, group), np.zeros(last, bool), allowed - 1
                )
                picked = [np.arange(p * page, (p + 1) * page) for p in pages] + [np.arange(last * page, t + 1)]
                chosen.append(np.concatenate(picked))
                near.append(np.concatenate([np.arange(p * page, (p + 1) * page) for p in close] + [_EMPTY]))
        _, trace.out[t] = attend(q[t], k, v, chosen)
        trace.attended.append([c.copy() for c in chosen])
        trace.held.append([r.copy() for r in rows])
        trace.near.append(near if near is not None else [_EMPTY] * n_kv)
    return trace
