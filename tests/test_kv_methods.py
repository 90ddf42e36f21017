"""The KV-cache methods (h2o, tova, scissorhands, snapkv, pyramidkv, adakv, knorm, keydiff, expected,
random) driven alone on random queries, keys and values, against the numpy references of
kv_methods_reference.py: the positions held after every step are the reference's (a difference only at
a score the reference flags within 1e-5 of the boundary, counted), and the output is the shared
routine's bits over the rows attended. Also: blocks, thread counts, ``every``, ``start_from``, the
ledger and the knobs' refusals."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from kv_methods_drive import Agreement, attach, compare_held, drive, per_head, shared_routine_out
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

from pyllama.attention.registry import create_plugin
from pyllama.config import ModelConfig

CONFIG = ModelConfig(dim=32, hidden_dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=16, seq_len=96)
T, EVENT = 60, 40


def random_qkv(seed: int, T: int = T, config: ModelConfig = CONFIG):
    rng = np.random.default_rng(seed)
    L = config.n_layers
    q = (rng.standard_normal((T, L, config.q_dim)) * 1.5).astype(np.float32)
    k = (rng.standard_normal((T, L, config.kv_dim)) * 1.5).astype(np.float32)
    v = rng.standard_normal((T, L, config.kv_dim)).astype(np.float32)
    q_pre = rng.standard_normal((T, L, config.q_dim)).astype(np.float32)
    return q, k, v, q_pre


def reference(method: str, knobs: Knobs, config: ModelConfig = CONFIG, **extra):
    """(q, k, v, q_pre, layer) of one layer -> the reference Trace of ``method``."""
    rope = Rope(config.rope_theta, config.n_rot, config.rope_style)
    scorers = {
        "snapkv": lambda q, k, v, qp, layer: snapkv_scorer(q, k, int(knobs.window), **extra.get("snapkv", {})),
        "knorm": lambda q, k, v, qp, layer: knorm_scorer(k),
        "keydiff": lambda q, k, v, qp, layer: keydiff_scorer(k),
        "expected": lambda q, k, v, qp, layer: expected_scorer(
            qp, k, v, rope, knobs.sinks, **extra.get("expected", {})
        ),
        "random": lambda q, k, v, qp, layer: random_scorer(extra.get("seed", 0), layer),
    }
    table = {
        "adakv": lambda q, k, v, qp, layer: adakv(
            q, k, v, knobs, EVENT, scorers[extra["scorer"]](q, k, v, qp, layer), alpha=extra.get("alpha", 0.2)
        ),
        "expected": lambda q, k, v, qp, layer: expected(q, qp, k, v, knobs, EVENT, rope, **extra),
        "h2o": lambda q, k, v, qp, layer: h2o(q, k, v, knobs),
        "tova": lambda q, k, v, qp, layer: tova(q, k, v, knobs),
        "scissorhands": lambda q, k, v, qp, layer: scissorhands(q, k, v, knobs, **extra),
        "knorm": lambda q, k, v, qp, layer: knorm(q, k, v, knobs, EVENT),
        "keydiff": lambda q, k, v, qp, layer: keydiff(q, k, v, knobs, EVENT),
        "random": lambda q, k, v, qp, layer: random_eviction(q, k, v, knobs, EVENT, layer=layer, **extra),
        "snapkv": lambda q, k, v, qp, layer: snapkv(q, k, v, knobs, EVENT, **extra),
        "pyramidkv": lambda q, k, v, qp, layer: pyramidkv(
            q, k, v, knobs, EVENT, layer=layer, n_layers=CONFIG.n_layers, **extra
        ),
    }
    return table[method]


CASES = [
    ("h2o:ratio=0.5,window=3,sinks=1", "h2o", Knobs(ratio=0.5, window=3, sinks=1), {}),
    ("h2o:capacity=12", "h2o", Knobs(capacity=12, window="half"), {}),
    ("tova:ratio=0.6,window=2", "tova", Knobs(ratio=0.6, window=2), {}),
    ("tova:capacity=9,sinks=2", "tova", Knobs(capacity=9, sinks=2), {}),
    (
        "scissorhands:ratio=0.5,window=3,history=4,sinks=2",
        "scissorhands",
        Knobs(ratio=0.5, window=3, sinks=2),
        {"history": 4},
    ),
    ("scissorhands:capacity=10,window=2", "scissorhands", Knobs(capacity=10, window=2), {"history": 32}),
    ("knorm:ratio=0.5,sinks=1", "knorm", Knobs(ratio=0.5, sinks=1), {}),
    ("knorm:capacity=14,window=3,every=5", "knorm", Knobs(capacity=14, window=3, every=5), {}),
    ("keydiff:ratio=0.4,window=2", "keydiff", Knobs(ratio=0.4, window=2), {}),
    ("keydiff:ratio=0.3,sinks=2,every=4", "keydiff", Knobs(ratio=0.3, sinks=2, every=4), {}),
    ("random:ratio=0.5,seed=9,window=2", "random", Knobs(ratio=0.5, window=2), {"seed": 9}),
    ("random:capacity=12,seed=3,every=6", "random", Knobs(capacity=12, every=6), {"seed": 3}),
    ("snapkv:ratio=0.5,window=4", "snapkv", Knobs(ratio=0.5, window=4), {}),
    ("snapkv:ratio=0.6,window=3,every=5", "snapkv", Knobs(ratio=0.6, window=3, every=5), {}),
    (
        "snapkv:capacity=16,window=4,kernel=3,pool=max,sinks=1",
        "snapkv",
        Knobs(capacity=16, window=4, sinks=1),
        {"kernel": 3, "pool": "max"},
    ),
    ("snapkv:capacity=16,window=5,kernel=1", "snapkv", Knobs(capacity=16, window=5), {"kernel": 1}),
    ("expected:ratio=0.5,future=16", "expected", Knobs(ratio=0.5, sinks=4), {"future": 16}),
    (
        "expected:capacity=15,sinks=2,window=3,every=6,epsilon=0.01",
        "expected",
        Knobs(capacity=15, sinks=2, window=3, every=6),
        {"epsilon": 0.01, "future": 512},
    ),
    ("expected:ratio=0.5,sinks=0,covariance=false", "expected", Knobs(ratio=0.5), {"covariance": False}),
    ("adakv:ratio=0.5,window=4", "adakv", Knobs(ratio=0.5, window=4), {"scorer": "snapkv"}),
    (
        "adakv:scorer=knorm,ratio=0.5,alpha=0.5,every=5",
        "adakv",
        Knobs(ratio=0.5, every=5),
        {"scorer": "knorm", "alpha": 0.5},
    ),
    ("adakv:scorer=keydiff,capacity=14,window=2", "adakv", Knobs(capacity=14, window=2), {"scorer": "keydiff"}),
    (
        "adakv:scorer=expected,ratio=0.6,future=32",
        "adakv",
        Knobs(ratio=0.6, sinks=4),
        {"scorer": "expected", "expected": {"future": 32}},
    ),
    (
        "adakv:scorer=random,ratio=0.5,seed=5,alpha=0",
        "adakv",
        Knobs(ratio=0.5),
        {"scorer": "random", "seed": 5, "alpha": 0.0},
    ),
    ("pyramidkv:ratio=0.5,window=4", "pyramidkv", Knobs(ratio=0.5, window=4), {}),
    ("pyramidkv:capacity=20,window=4,beta=4,every=7", "pyramidkv", Knobs(capacity=20, window=4, every=7), {"beta": 4}),
]


def check_against_reference(spec, method, knobs, extra, seed=0, config=CONFIG):
    q, k, v, q_pre = random_qkv(seed, config=config)
    plugin = attach(create_plugin(spec), config)
    run = drive(plugin, q, k, v, q_pre, event=EVENT if plugin.compresses_at_event else None)
    agreement = Agreement()
    hd, H, G = config.head_dim, config.n_heads, config.n_kv_heads
    for layer in range(config.n_layers):
        ql, kl, vl = per_head(q, layer, H), per_head(k, layer, G), per_head(v, layer, G)
        trace = reference(method, knobs, config, **extra)(ql, kl, vl, per_head(q_pre, layer, H), layer)
        equal = compare_held(run.held, trace, layer, agreement)
        for t in range(min(equal + 1, T)):
            want = shared_routine_out(ql[t], kl, vl, trace.attended[t], config.kv_mul, "run.c")
            np.testing.assert_array_equal(run.out[t, layer].reshape(H, hd), want, err_msg=f"{spec} layer {layer} t {t}")
    return agreement


@pytest.mark.parametrize("spec, method, knobs, extra", CASES, ids=[c[0] for c in CASES])
def test_held_positions_and_outputs_follow_the_reference(spec, method, knobs, extra):
    agreement = check_against_reference(spec, method, knobs, extra)
    # these seeds put no score within 1e-5 of a boundary: every step of every layer is the reference's
    assert agreement.steps == T * CONFIG.n_layers and not agreement.parted_near, agreement


def test_expected_turns_the_pairs_of_the_model_s_layout():
    # the same check on a NEOX model (pairs i, i + n_rot / 2) that rotates half of each head (n_rot 4 of 8)
    neox = dataclasses.replace(CONFIG, rope_style="neox", n_rot=4)
    agreement = check_against_reference(
        "expected:ratio=0.5,sinks=1,future=40", "expected", Knobs(ratio=0.5, sinks=1), {"future": 40}, config=neox
    )
    assert agreement.steps == T * CONFIG.n_layers and not agreement.parted_near, agreement
