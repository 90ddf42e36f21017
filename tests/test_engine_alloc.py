"""The token loop allocates nothing: tracemalloc sees the same peak for 2 tokens as for 400."""

from __future__ import annotations

import tracemalloc

import numpy as np

from pyllama.model import Model
from pyllama.sampler import Sampler


def _loop_allocation(engine, sampler, prompt, out, steps):
    engine.reset()
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        engine.generate_into(prompt, steps, sampler, out, None, False)
        current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak - base, current - base


def test_generation_loop_does_not_allocate(stories260k):
    model = Model.load(stories260k, threads=2)
    engine = model.engine("causal")
    prompt = np.array([1, 403, 407], dtype=np.int32)
    out = np.zeros(512, dtype=np.int32)
    for sampler in (Sampler(512, 0.0, 0.9, 1), Sampler(512, 1.0, 0.9, 7), Sampler(512, 0.8, 0.0, 3)):
        engine.generate_into(prompt, 20, sampler, out, None, False)  # warm-up: first-call caches
        short = _loop_allocation(engine, sampler, prompt, out, 4)
        long = _loop_allocation(engine, sampler, prompt, out, 400)
        # the only allocations are the call's own (arguments, the returned tuple): the same for
        # 4 positions as for 400, so nothing is allocated per token
        assert long == short
        assert long[0] < 4096


def test_a_per_token_allocation_would_be_seen(stories260k):
    # the measurement is sharp: a callback that keeps one small object per token shows up
    model = Model.load(stories260k, threads=2)
    engine = model.engine("causal")
    prompt = np.array([1], dtype=np.int32)
    out = np.zeros(512, dtype=np.int32)
    sampler = Sampler(512, 0.0, 0.9, 1)
    kept = []
    engine.reset()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        engine.generate_into(prompt, 300, sampler, out, lambda t: kept.append(str(t)), False)
        grown = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert grown > 300 * 40
