"""The token loop allocates nothing: tracemalloc sees the same peak for 4 positions as for 400.

The measurement runs in a fresh interpreter: tracemalloc traces every thread, and a test suite
leaves helper threads behind (tqdm's monitor, for one) that may allocate while the engine has
released the GIL.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from gguf_reference import write_random_gguf

MEASURE = textwrap.dedent(
    """
    import json, sys, tracemalloc
    import numpy as np
    from pyllama.model import Model
    from pyllama.sampler import Sampler

    model = Model.load(sys.argv[1], threads=2)
    engine = model.engine("causal")
    prompt = np.array([1, 403, 407], dtype=np.int32)
    out = np.zeros(512, dtype=np.int32)
    never = np.array([-1, -2], dtype=np.int32)  # stop ids checked at every step, never sampled
    keep = []
    on_token = (lambda t: keep.append(str(t))) if sys.argv[2] == "leaky" else None

    def loop(sampler, steps):
        engine.reset()
        tracemalloc.start()
        try:
            tracemalloc.reset_peak()
            base = tracemalloc.get_traced_memory()[0]
            engine.generate_into(prompt, steps, sampler, out, on_token, never)
            current, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        return [peak - base, current - base]

    rows = []
    for args in ((512, 0.0, 0.9, 1), (512, 1.0, 0.9, 7), (512, 0.8, 0.0, 3)):
        sampler = Sampler(*args)
        engine.generate_into(prompt, 20, sampler, out, None, never)  # warm-up: first-call caches
        rows.append([loop(sampler, 4), loop(sampler, 400)])
    print(json.dumps(rows))
    """
)


def _measure(path, mode: str) -> list:
    proc = subprocess.run([sys.executable, "-c", MEASURE, str(path), mode], capture_output=True, text=True, check=True)
    return json.loads(proc.stdout)


def test_generation_loop_does_not_allocate(stories260k):
    for short, long in _measure(stories260k, "clean"):
        # the only allocations are the call's own (arguments, the returned tuple): the same for
        # 4 positions as for 400, so nothing is allocated per token
        assert long == short
        assert long[0] < 4096


def test_a_per_token_allocation_would_be_seen(stories260k):
    # the measurement is sharp: a callback that keeps one small object per token shows up
    for short, long in _measure(stories260k, "leaky"):
        assert long[1] - short[1] > 390 * 40


@pytest.mark.parametrize("qtype", ["q4_1", "q4_k", "q4_0", "q5_0"])
def test_generation_loop_does_not_allocate_on_block_quantised_weights(tmp_path, qtype):
    """The activation quantisation of the 4-bit and K-quant products uses the engine's buffers only; Q4_0
    and Q5_0 matrices are packed by the warm-up's first product, once (kernels/qpacked.h)."""
    path = write_random_gguf(tmp_path / "m.gguf", qtype=qtype, dim=256, hidden_dim=512, vocab=512, context=512, seed=2)
    for short, long in _measure(path, "clean"):
        assert long == short
        assert long[0] < 4096


def test_the_buffers_the_kernels_read_start_cache_lines(stories260k):
    """The engine's activations start 64-byte lines (kernels/aligned.py):
    numpy's own large arrays sit 16 bytes past a page, where every 64-byte load spans two lines."""
    from pyllama.kernels.aligned import zeros_aligned

    for shape, dtype in [((3,), np.float32), ((64, 288), np.float32), ((5, 7), np.float64), ((33000,), np.int8)]:
        a = zeros_aligned(shape, dtype)
        assert a.ctypes.data % 64 == 0 and a.shape == shape and a.dtype == dtype and not a.any()
    from pyllama.model import Model

    engine = Model.load(stories260k).engine("causal")
    addresses = engine.activation_addresses()
    assert {"x", "xb", "hb", "att", "q", "logits"} <= addresses.keys()
    assert {name: a % 64 for name, a in addresses.items() if a % 64} == {}
