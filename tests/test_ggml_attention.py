"""GGUF files attend and rotate in ggml's arithmetic (pyllama/attention/head.pyx, kernels/rope.pyx).

Cross-checks:

* against llama.cpp: on the tiny Q4_0, Q5_1 and Q3_K_M models, teacher-forced on the references'
  tokens, pyllama's top-2 margins equal llama.cpp's to the references' 6 decimals at every position
  of every run (with run.c's RoPE and attention they parted after 24-67 tokens, at an int8 rounding
  flip);
* against numpy emulations of ggml's order written here: ``ggml_vec_dot_f32``'s 32 lanes and their
  reduction, the soft_max in groups of 8 summed in double, and the rotation with libm's cosf/sinf.

The fused multiply-add fma(a, b, c) of float32 values is emulated as float32(a * b + c) in float64: a * b
is exact there, and the sum rounds twice, which differs from one rounding about once in 2^29
operations; these tests make about 10^5.
"""

from __future__ import annotations

import ctypes
import ctypes.util

import numpy as np
import pytest
from conftest import read_jsonl, shared_file
from test_quant_models import teacher_forced

from pyllama.attention import attend_one_head
from pyllama.attention.head_blocks import attend_head_block, attend_head_group, attend_head_window_block
from pyllama.checkpoint import load_checkpoint
from pyllama.kernels import rope
from pyllama.kernels.elementwise import ggml_exp

F32, F64 = np.float32, np.float64
# the references hold margins rounded to 6 decimals (5e-7), and a margin computed in float64 from float32
# logits of about 10 carries their rounding too (1e-6): measured at most 1.6e-6 where the bits agree
SIX_DECIMALS = 2e-6


def _fma(a, b, c):
    return (F64(a) * F64(b) + F64(c)).astype(F32)


def _reduce32(lanes: np.ndarray) -> np.float32:
    """GGML_F32x8_REDUCE of 32 lanes: accumulators (0+2) + (1+3), halves of 8, two horizontal adds."""
    a = lanes.astype(F32)
    y = (a[0:8] + a[16:24]) + (a[8:16] + a[24:32])
    t = y[0:4] + y[4:8]
    return (t[0] + t[1]) + (t[2] + t[3])


def _ggml_dot(x: np.ndarray, y: np.ndarray) -> np.float32:
    """ggml_vec_dot_f32: 32 lanes over the whole groups of 32, reduced, then the rest in a fused chain."""
    main = x.size // 32 * 32
    lanes = np.zeros(32, F32)
    for i in range(0, main, 32):
        lanes = _fma(x[i : i + 32], y[i : i + 32], lanes)
    s = _reduce32(lanes)
    for i in range(main, x.size):
        s = _fma(x[i], y[i], s)
    return s


def _ggml_weights(q: np.ndarray, keys: np.ndarray) -> np.ndarray:
    n, hd = keys.shape
    scale = F32(1) / np.sqrt(F32(hd))
    scores = np.array([_ggml_dot(k, q) * scale for k in keys], F32)
    shifted = scores - scores.max()
    padded = np.zeros((n + 7) // 8 * 8, F32)  # llama.cpp's padding cells: e^-inf = 0
    padded[:n] = ggml_exp(shifted)
    total = 0.0
    for g in padded.reshape(-1, 8):
        total += float(((g[0] + g[4]) + (g[2] + g[6])) + ((g[1] + g[5]) + (g[3] + g[7])))
    return padded[:n] * F32(1.0 / total)


def _ggml_attention(q: np.ndarray, keys: np.ndarray, values: np.ndarray) -> np.ndarray:
    n, hd = keys.shape
    weights = _ggml_weights(q, keys)
    lanes = np.zeros((32, hd), F32)
    for t in range(n):
        lanes[t % 32] = _fma(values[t], weights[t], lanes[t % 32])
    return np.array([_reduce32(lanes[:, i]) for i in range(hd)], F32)


# head sizes: multiples of 32, and 44 / 48 / 80, whose scores end in fused chains past the last 32
SIZES = [(1, 32), (7, 32), (8, 64), (33, 64), (100, 32), (300, 64), (45, 96), (17, 128), (40, 48), (19, 80), (24, 44)]


@pytest.mark.parametrize(("n", "hd"), SIZES)
def test_attention_follows_ggml_order_bitwise(n, hd):
    rng = np.random.default_rng(n + hd)
    q = (rng.standard_normal(hd) * 2).astype(F32)
    keys = rng.standard_normal((n, hd)).astype(F32)
    values = rng.standard_normal((n, hd)).astype(F32)
    got = attend_one_head(q, keys, values, arithmetic="ggml")
    assert np.array_equal(got, _ggml_attention(q, keys, values))
    # and it is attention: float64 softmax-weighted values, within float32 rounding
    s = keys.astype(F64) @ q / np.sqrt(hd)
    a = np.exp(s - s.max())
    assert np.allclose(got, (a / a.sum()) @ values, rtol=0, atol=2e-6)


# a block's queries (n, m, head size): query j attends rows 0 .. n + j - 1. Groups of 4 queries share
# their value rows (ggml_attend_group.h), so m covers whole and partial groups, and head sizes cover
# whole vectors of 8 and 16 columns, a scalar remainder (44, 8) and more than one chunk (64, 80)
BLOCKS = [(1, 1, 32), (1, 16, 48), (30, 5, 64), (7, 3, 8), (40, 13, 44), (33, 4, 80), (64, 9, 32), (2, 7, 24)]


@pytest.mark.parametrize(("n", "m", "hd"), BLOCKS)
def test_block_of_queries_follows_ggml_order_bitwise(n, m, hd):
    rng = np.random.default_rng(n * m + hd)
    q = (rng.standard_normal((m, hd)) * 2).astype(F32)
    keys = rng.standard_normal((n + m - 1, hd)).astype(F32)
    values = rng.standard_normal((n + m - 1, hd)).astype(F32)
    got = attend_head_block(q, keys, values, n, arithmetic="ggml")
    for j in range(m):
        assert np.array_equal(got[j], _ggml_attention(q[j], keys[: n + j], values[: n + j])), j
    # run.c's arithmetic: the block gives each query the bits of the single-query routine
    got = attend_head_block(q, keys, values, n, arithmetic="run.c")
    for j in range(m):
        assert np.array_equal(got[j], attend_one_head(q[j], keys[: n + j], values[: n + j])), j


# a window moving a row per query after fixed rows (sliding and sink past their first eviction): (fixed,
# window, m, hd); m below 4 scores row by row, from 4 on in tiles shared by the queries
WINDOWS = [(0, 1, 5, 32), (4, 30, 16, 64), (0, 40, 3, 48), (2, 33, 7, 8), (3, 12, 16, 44), (1, 64, 4, 80)]


@pytest.mark.parametrize(("fixed", "window", "m", "hd"), WINDOWS)
def test_moving_window_block_follows_ggml_order_bitwise(fixed, window, m, hd):
    rng = np.random.default_rng(fixed * 1000 + window * m + hd)
    q = (rng.standard_normal((m, hd)) * 2).astype(F32)
    keys = rng.standard_normal((fixed + window + m - 1, hd)).astype(F32)
    values = rng.standard_normal((fixed + window + m - 1, hd)).astype(F32)
    rows = [np.r_[0:fixed, fixed + j : fixed + j + window] for j in range(m)]  # query j's rows, in order
    got = attend_head_window_block(q, keys, values, fixed, window, arithmetic="ggml")
    for j in range(m):
        assert np.array_equal(got[j], _ggml_attention(q[j], keys[rows[j]], values[rows[j]])), j
    got = attend_head_window_block(q, keys, values, fixed, window, arithmetic="run.c")
    for j in range(m):
        assert np.array_equal(got[j], attend_one_head(q[j], keys[rows[j]], values[rows[j]])), j


# the query heads of one position sharing a KV head (n rows, g heads, head size): every head over the
# same rows, scored 64 rows at a time for all heads and summed four heads at a time (a method's step,
# causal's decode); n covers partial tiles of 8, 32 and 64 rows, g partial and several groups of four
HEADS = [(1, 3, 64), (63, 2, 64), (64, 3, 64), (130, 9, 64), (33, 4, 48), (200, 5, 44), (7, 1, 32), (97, 2, 80)]


@pytest.mark.parametrize(("n", "g", "hd"), HEADS)
def test_heads_sharing_a_kv_head_follow_ggml_order_bitwise(n, g, hd):
    rng = np.random.default_rng(n * g + hd)
    q = (rng.standard_normal((g, hd)) * 2).astype(F32)
    keys = rng.standard_normal((n, hd)).astype(F32)
    values = rng.standard_normal((n, hd)).astype(F32)
    got, weights = attend_head_group(q, keys, values, arithmetic="ggml")
    for j in range(g):
        assert np.array_equal(got[j], _ggml_attention(q[j], keys, values)), j
        assert np.array_equal(weights[j], _ggml_weights(q[j], keys)), j
    got, weights = attend_head_group(q, keys, values, arithmetic="run.c")
    for j in range(g):
        assert np.array_equal(got[j], attend_one_head(q[j], keys, values)), j
    # and they are the softmax of the scores: weights below 1 in float32 (steps of 6e-8 there) from
    # ggml's exp, whose error is a few ulps
    s = keys.astype(F64) @ q.T.astype(F64) / np.sqrt(hd)
    a = np.exp(s - s.max(axis=0))
    assert np.allclose(weights, (a / a.sum(axis=0)).T, rtol=0, atol=1e-6)


def _libm():
    lib = ctypes.CDLL(ctypes.util.find_library("m"))
    for name in ("cosf", "sinf"):
        getattr(lib, name).restype = ctypes.c_float
        getattr(lib, name).argtypes = [ctypes.c_float]
    lib.powf.restype = ctypes.c_float
    lib.powf.argtypes = [ctypes.c_float, ctypes.c_float]
    return lib


@pytest.mark.parametrize("name", ["quant/tiny-llama-q4_0.gguf", "SmolLM2-135M-Instruct.Q4_1.gguf"])
def test_rope_follows_ggml_bitwise(name):
    cfg, _ = load_checkpoint(shared_file(name))
    assert cfg.arithmetic == "ggml" and cfg.rope_style == "normal"
    libm = _libm()
    rng = np.random.default_rng(3)
    half = cfg.n_rot // 2
    step = libm.powf(F32(cfg.rope_theta), F32(-2.0) / F32(cfg.n_rot))
    for pos in (0, 1, 5, 77, 4000):
        x = rng.standard_normal(cfg.head_dim * 3).astype(F32)
        got = x.copy()
        rope.apply(cfg, got, pos)
        expected = x.reshape(3, cfg.head_dim).copy()
        theta = F32(pos)
        for i in range(half):
            c, s = F32(libm.cosf(theta)), F32(libm.sinf(theta))
            x0, x1 = expected[:, 2 * i].copy(), expected[:, 2 * i + 1].copy()
            expected[:, 2 * i] = _fma(x0, c, -(x1 * s))
            expected[:, 2 * i + 1] = _fma(x0, s, x1 * c)
            theta = F32(theta * F32(step))
        assert np.array_equal(got, expected.reshape(-1)), pos


@pytest.mark.parametrize("name", ["tiny-llama-q4_0.gguf", "tiny-llama-q5_1.gguf", "tiny-llama-q3_k_m.gguf"])
def test_margins_equal_llama_cpp_to_six_decimals(name):
    runs = [r for r in read_jsonl("quant/reference-quant.jsonl") if r["model"] == name and r["ignore_eos"]]
    runs = [r for r in runs if len(r["top1_minus_top2_logprob"]) == len(r["ids"])]  # see test_quant_models
    assert len(runs) >= 3
    agree, theirs, ours = teacher_forced(shared_file(f"quant/{name}"), runs)
    assert agree.all()
    assert np.abs(ours - theirs).max() <= SIX_DECIMALS
