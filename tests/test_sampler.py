"""The sampler against an independent Python transcription of llama2.c run.c's sampling."""

from __future__ import annotations

import numpy as np
import pytest

from pyllama.sampler import Sampler

MASK64 = (1 << 64) - 1


def xorshift_f32(state: list[int]) -> np.float32:
    s = state[0]
    s ^= s >> 12
    s ^= (s << 25) & MASK64
    s ^= s >> 27
    state[0] = s
    u32 = ((s * 0x2545F4914F6CDD1D) & MASK64) >> 32
    return np.float32(u32 >> 8) / np.float32(16777216.0)


def reference_sample(logits: np.ndarray, temperature: float, topp: float, state: list[int]) -> int:
    """run.c's sample(), step by step in float32."""
    f = np.float32
    if temperature == 0.0:
        return int(np.argmax(logits))
    x = (logits / f(temperature)).astype(np.float32)
    x = np.exp(x - x.max(), dtype=np.float32)
    total = f(0.0)
    for v in x:
        total = f(total + v)
    probs = (x / total).astype(np.float32)
    coin = xorshift_f32(state)
    if topp <= 0 or topp >= 1:
        cdf = f(0.0)
        for i, p in enumerate(probs):
            cdf = f(cdf + p)
            if coin < cdf:
                return i
        return len(probs) - 1
    cutoff = f(f(1.0) - f(topp)) / f(len(probs) - 1)
    idx = [i for i in range(len(probs)) if probs[i] >= cutoff]
    idx.sort(key=lambda i: -probs[i])  # ties: none in these tests (continuous random logits)
    cum = f(0.0)
    last = len(idx) - 1
    for j, i in enumerate(idx):
        cum = f(cum + probs[i])
        if cum > f(topp):
            last = j
            break
    r = f(coin * cum)
    cdf = f(0.0)
    for j in range(last + 1):
        cdf = f(cdf + probs[idx[j]])
        if r < cdf:
            return idx[j]
    return idx[last]


@pytest.mark.parametrize("temperature,topp", [(0.0, 0.9), (1.0, 0.9), (0.7, 0.0), (1.3, 1.0), (0.5, 0.5)])
def test_sampler_reproduces_run_c_sequence(temperature, topp):
    rng = np.random.default_rng(11)
    seed = 133742
    sampler = Sampler(97, temperature, topp, seed)
    state = [seed]
    for _ in range(200):
        logits = (rng.standard_normal(97) * 3).astype(np.float32)
        want = reference_sample(logits.copy(), temperature, topp, state)
        got = sampler.sample(logits.copy())
        assert got == want


def test_xorshift_state_advances_like_run_c():
    sampler = Sampler(4, 1.0, 0.0, 42)
    state = [42]
    for _ in range(5):
        sampler.sample(np.zeros(4, np.float32))
        xorshift_f32(state)
        assert sampler.rng_state == state[0]


def test_argmax_takes_first_maximum():
    s = Sampler(5, 0.0, 0.9, 1)
    assert s.sample(np.array([0, 3, 1, 3, 2], np.float32)) == 1


def test_bad_logits_length_is_an_error():
    with pytest.raises(ValueError, match="expected 5 logits"):
        Sampler(5).sample(np.zeros(4, np.float32))
