"""Two engines in two Python threads reaching the same tensor's pending packed copy at once (a diff's two
sides run concurrently): one makes it, the other waits, and both read the finished copy."""

from __future__ import annotations

import threading

import numpy as np
from conftest import shared_file

from pyllama import Model

TINY_Q4_K_M = "quant/tiny-llama-q4_k_m.gguf"


def _run(engine, ids: np.ndarray, results: list, i: int) -> None:
    results[i] = engine.forward_block(ids, 0).copy()


def test_two_threads_share_one_packed_copy_made_once():
    ids = np.arange(1, 97, dtype=np.int32)
    expect = Model.load(shared_file(TINY_Q4_K_M), threads=1).engine("causal").forward_block(ids, 0).copy()
    for _ in range(12):
        model = Model.load(shared_file(TINY_Q4_K_M), threads=1)  # fresh tensors: every copy pending
        engines = [model.engine("causal", threads=1) for _ in range(4)]
        results: list[np.ndarray | None] = [None] * len(engines)
        threads = [threading.Thread(target=_run, args=(e, ids, results, i)) for i, e in enumerate(engines)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for got in results:
            assert got is not None
            np.testing.assert_array_equal(got, expect)
