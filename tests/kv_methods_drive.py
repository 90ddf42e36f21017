"""Driving the KV-method plugins for the tests: alone on given queries, keys and values (no model), or
inside a model through a recording wrapper; and comparing what they hold, step by step, with the numpy
references of kv_methods_reference.py.

A plugin driven alone is bound to row buffers of its own (``attach``), as the engine binds it to its
activations, so that a plugin that reads the queries before RoPE finds them beside the query it is
handed. ``drive`` feeds every layer position by position or in blocks, with the compression event after
``event`` (and nothing else), and records after each call what every layer holds and its output.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from kv_methods_reference import (
    Knobs,
    Rope,
    adakv,
    expected,
    expected_scorer,
    h2o,
    keydiff,
    keydiff_scorer,
    knorm,
    knorm_scorer,
    pyramidkv,
    random_eviction,
    random_scorer,
    scissorhands,
    snapkv,
    snapkv_scorer,
    tova,
)

from pyllama.attention.base import Attention
from pyllama.attention.head import attend_one_head
from pyllama.engine import Pool


@dataclass
class Run:
    """out: float32[T, L, q_dim]; held[t][l]: per KV head the positions held after layer l attended t."""

    out: np.ndarray
    held: list[list[list[np.ndarray]]] = field(default_factory=list)
    memory: list[int] = field(default_factory=list)


_BUFFERS: dict[int, tuple] = {}


def bound(config, threads: int = 1, max_block: int = 64):
    """Row buffers for a plugin, kept alive here for as long as the test process runs."""
    rows = tuple(
        np.zeros((max_block, width), dtype=np.float32)
        for width in (config.q_dim, config.kv_dim, config.kv_dim, config.q_dim)
    )
    pre_rope = np.zeros((max_block, config.q_dim), dtype=np.float32)
    return rows, pre_rope


def attach(plugin: Attention, config, threads: int = 1, max_block: int = 64) -> Attention:
    """``plugin`` configured on row buffers of its own (``bound``) and initialised."""
    rows, pre_rope = bound(config, threads, max_block)
    pool = Pool(threads)
    plugin._configure(config, pool, rows, pre_rope)
    plugin.init(config, pool)
    _BUFFERS[id(plugin)] = (plugin, rows, pre_rope)
    return plugin


def drive(
    plugin: Attention,
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    q_pre: np.ndarray | None = None,
    event: int | None = None,
    block: int = 0,
    record: bool = True,
    first: int = 0,
) -> Run:
    """Feed positions first .. T - 1 (q, q_pre [T, L, q_dim]; k, v [T, L, kv_dim]) to an attached plugin:
    one at a time (block 0) or in blocks of ``block`` positions ending at the event; compress(event)
    after position ``event``. Records what each layer holds after each position (one at a time)."""
    _, rows, pre_rope = _BUFFERS[id(plugin)]
    bq, bk, bv, bo = rows
    T, L = q.shape[:2]
    run = Run(out=np.zeros(q.shape, dtype=np.float32))
    start = first
    while start < T:
        end = start + 1 if block == 0 else min(start + block, T)
        if event is not None and start <= event < end:
            end = event + 1
        m = end - start
        for layer in range(L):
            bq[:m], bk[:m], bv[:m] = q[start:end, layer], k[start:end, layer], v[start:end, layer]
            if q_pre is not None:
                pre_rope[:m] = q_pre[start:end, layer]
            if block == 0:
                plugin.attend(layer, start, bq[0], bk[0], bv[0], bo[0])
            else:
                plugin.attend_block(layer, start, bq[:m], bk[:m], bv[:m], bo[:m])
            run.out[start:end, layer] = bo[:m]
        if event is not None and end - 1 == event:
            plugin.compress(event)
        if record and m == 1:
            run.held.append([plugin.held_positions(layer) for layer in range(L)])
            run.memory.append(plugin.memory_bytes())
        start = end
    return run


def per_head(x: np.ndarray, layer: int, heads: int) -> np.ndarray:
    """Layer ``layer`` of x [T, L, heads * hd] as [T, heads, hd]."""
    T = x.shape[0]
    return np.ascontiguousarray(x[:, layer].reshape(T, heads, -1))


@dataclass
class Agreement:
    """How a plugin's held sets compared with the reference's: steps equal, and where they first parted,
    whether only positions the reference flags as within 1e-5 of the boundary differed."""

    steps: int = 0
    parted_near: list[tuple[int, int, int]] = field(default_factory=list)  # (layer, t, positions differing)

    def __str__(self) -> str:
        return f"{self.steps} steps equal, {len(self.parted_near)} parted at a near-boundary score"


def compare_held(held: list, trace, layer: int, agreement: Agreement) -> int:
    """The steps of ``layer`` whose held sets equal the reference's (``held[t][layer][g]`` against
    ``trace.held[t][g]``), up to the first that differs; a difference must lie among the positions the
    reference flags near the boundary (then counted), anything else fails."""
    for t, step in enumerate(held):
        for g, positions in enumerate(step[layer]):
            want = trace.held[t][g]
            if positions.tolist() != want.tolist():
                differing = set(positions.tolist()) ^ set(want.tolist())
                near = set(trace.near[t][g].tolist())
                assert differing <= near, (
                    f"layer {layer} step {t} KV head {g}: held {positions.tolist()} but the reference holds "
                    f"{want.tolist()} (near the boundary: {sorted(near)})"
                )
                agreement.parted_near.append((layer, t, len(differing)))
                return t
        agreement.steps += 1
    return len(held)


def shared_routine_out(q_t: np.ndarray, k: np.ndarray, v: np.ndarray, attended: list, kv_mul: int, arithmetic: str):
    """The shared routine's output of every query head of one position over the rows ``attended[g]``
    (k, v [T, n_kv, hd] of one layer; q_t [n_heads, hd])."""
    out = np.zeros(q_t.shape, dtype=np.float32)
    for h in range(q_t.shape[0]):
        g = h // kv_mul
        rows = attended[g]
        out[h] = attend_one_head(q_t[h], k[rows, g], v[rows, g], arithmetic=arithmetic)
    return out


class Recording(Attention):
    """A plugin inside a model, recorded: every layer's queries (after and before RoPE), keys, values and
    output at every position, and what the plugin holds after each call. The inner plugin is bound to
    the engine's own buffers, so it reads the queries before RoPE where the engine keeps them."""

    description = "records an inner plugin's inputs, outputs and held positions (tests)"
    wants_pre_rope_query = True

    def __init__(self, inner: Attention, positions: int) -> None:
        self.inner = inner
        self.positions = positions

    def _configure(self, config, pool, rows=None, pre_rope=None):
        super()._configure(config, pool, rows, pre_rope)
        self.inner._configure(config, pool, rows, pre_rope)
        self.max_positions = self.inner.max_positions

    def init(self, config, pool):
        self.inner.init(config, pool)
        T, L = self.positions, config.n_layers
        self.q = np.zeros((T, L, config.q_dim), dtype=np.float32)
        self.q_pre = np.zeros((T, L, config.q_dim), dtype=np.float32)
        self.k = np.zeros((T, L, config.kv_dim), dtype=np.float32)
        self.v = np.zeros((T, L, config.kv_dim), dtype=np.float32)
        self.out = np.zeros((T, L, config.q_dim), dtype=np.float32)
        self.held = [[None] * L for _ in range(T)]
        self.memory = np.zeros(T, dtype=np.int64)

    def reset(self):
        self.inner.reset()

    def attend(self, layer, pos, q, k, v, out):
        self.q[pos, layer], self.k[pos, layer], self.v[pos, layer] = q, k, v
        self.q_pre[pos, layer] = self.query_before_rope
        self.inner.attend(layer, pos, q, k, v, out)
        self.out[pos, layer] = out
        self.held[pos][layer] = self.inner.held_positions(layer)
        if layer == self.config.n_layers - 1:
            self.memory[pos] = self.inner.memory_bytes()

    def compress(self, pos):
        self.inner.compress(pos)
        for layer in range(self.config.n_layers):
            self.held[pos][layer] = self.inner.held_positions(layer)
        self.memory[pos] = self.inner.memory_bytes()

    def memory_bytes(self):
        return self.inner.memory_bytes()


def reference_trace(method: str, knobs: Knobs, extra: dict, config, event: int | None, q, k, v, q_pre, layer: int):
    """The reference Trace of ``method`` for one layer (q, q_pre [T, n_heads, hd], k, v [T, n_kv, hd]).
    ``extra``: the method's own arguments (adakv: ``scorer`` and its arguments under the scorer's name)."""
    extra = dict(extra)
    rope = Rope(config.rope_theta, config.n_rot, config.rope_style)
    if method == "adakv":
        name, alpha = extra.pop("scorer"), extra.pop("alpha", 0.2)
        scorer = {
            "snapkv": lambda: snapkv_scorer(q, k, int(knobs.window), **extra.get("snapkv", {})),
            "knorm": lambda: knorm_scorer(k),
            "keydiff": lambda: keydiff_scorer(k),
            "expected": lambda: expected_scorer(q_pre, k, v, rope, knobs.sinks, **extra.get("expected", {})),
            "random": lambda: random_scorer(extra.get("seed", 0), layer),
        }[name]()
        return adakv(q, k, v, knobs, event, scorer, alpha=alpha)
    table = {
        "h2o": lambda: h2o(q, k, v, knobs),
        "tova": lambda: tova(q, k, v, knobs),
        "scissorhands": lambda: scissorhands(q, k, v, knobs, **extra),
        "snapkv": lambda: snapkv(q, k, v, knobs, event, **extra),
        "pyramidkv": lambda: pyramidkv(q, k, v, knobs, event, layer=layer, n_layers=config.n_layers, **extra),
        "knorm": lambda: knorm(q, k, v, knobs, event),
        "keydiff": lambda: keydiff(q, k, v, knobs, event),
        "expected": lambda: expected(q, q_pre, k, v, knobs, event, rope, **extra),
        "random": lambda: random_eviction(q, k, v, knobs, event, layer=layer, **extra),
    }
    return table[method]()


def check_layers(held, out, q, k, v, q_pre, config, case, event, arithmetic: str, every_out: int = 1) -> Agreement:
    """Every layer of a run (held[t][layer], out [T, L, q_dim] from inputs q, k, v, q_pre [T, L, dim])
    against the reference of ``case`` = (method, knobs, extra): held sets (compare_held) and, at every
    ``every_out``-th step up to the first that parts, the output is the shared routine's bits over the
    rows the reference attends."""
    method, knobs, extra = case
    agreement = Agreement()
    H, G, T = config.n_heads, config.n_kv_heads, q.shape[0]
    for layer in range(config.n_layers):
        ql, kl, vl, pl = per_head(q, layer, H), per_head(k, layer, G), per_head(v, layer, G), per_head(q_pre, layer, H)
        trace = reference_trace(method, knobs, extra, config, event, ql, kl, vl, pl, layer)
        equal = compare_held(held, trace, layer, agreement)
        for t in [*range(0, min(equal + 1, T), every_out), min(equal, T - 1)]:
            want = shared_routine_out(ql[t], kl, vl, trace.attended[t], config.kv_mul, arithmetic)
            np.testing.assert_array_equal(out[t, layer].reshape(H, -1), want, err_msg=f"{method} layer {layer} t {t}")
    return agreement
