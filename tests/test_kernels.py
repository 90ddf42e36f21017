"""Kernels against float64 numpy over awkward sizes, and their mathematical properties."""

from __future__ import annotations

import numpy as np
import pytest

from pyllama.checkpoint.weights import QType, Tensor
from pyllama.config import ModelConfig
from pyllama.kernels import elementwise, rope
from pyllama.kernels.matvec import matvec_np, matvec_tensor

SIZES = [1, 2, 3, 7, 15, 16, 17, 31, 33, 64, 100, 255, 256, 257]


def _readonly(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a)
    a.flags.writeable = False
    return a


@pytest.mark.parametrize("cols", SIZES)
def test_matvec_f32_matches_float64(cols):
    rng = np.random.default_rng(cols)
    rows = 37
    w = _readonly(rng.standard_normal((rows, cols)).astype(np.float32))
    x = _readonly(rng.standard_normal(cols).astype(np.float32))
    want = w.astype(np.float64) @ x.astype(np.float64)
    got = matvec_np(w, x, 2)
    # float32 dot products of n terms: error bounded by ~n * eps * sum|w_i x_i|
    bound = cols * 6e-8 * (np.abs(w).astype(np.float64) @ np.abs(x).astype(np.float64)) + 1e-30
    assert np.all(np.abs(got - want) <= bound)


def test_matvec_same_result_for_threads_and_memmap(tmp_path):
    rng = np.random.default_rng(5)
    w = rng.standard_normal((513, 129)).astype(np.float32)
    x = rng.standard_normal(129).astype(np.float32)
    path = tmp_path / "w.npy"
    np.save(path, w)
    mapped = np.load(path, mmap_mode="r")
    results = [matvec_np(w, x, 1), matvec_np(w, x, 2), matvec_np(w, x, 3), matvec_np(mapped, x, 2)]
    for r in results[1:]:
        assert np.array_equal(results[0], r)


@pytest.mark.parametrize("shape", [(7, 64), (301, 288), (1376, 512), (33, 172), (9, 2048), (2050, 16)])
def test_matvec_row_value_does_not_depend_on_its_neighbours(shape):
    # rows may be computed several at a time (four weight streams per thread); each row must still
    # get exactly the single-row arithmetic, whatever group it falls in, small or large matrix alike
    rng = np.random.default_rng(shape[0])
    w = rng.standard_normal(shape).astype(np.float32)
    x = rng.standard_normal(shape[1]).astype(np.float32)
    alone = np.concatenate([matvec_np(np.ascontiguousarray(w[i : i + 1]), x, 1) for i in range(shape[0])])
    for threads in (1, 2, 3):
        assert np.array_equal(matvec_np(w, x, threads), alone)
    shifted = matvec_np(np.ascontiguousarray(w[1:]), x, 2)  # every row lands in a different group
    assert np.array_equal(shifted, alone[1:])


def test_matvec_int8_groups_like_runq():
    # llama2.c runq.c: x quantised per group (scale = max|x|/127, round half away from zero),
    # integer dot per group, times both scales — written out independently here
    rng = np.random.default_rng(2)
    rows, cols, gs = 24, 128, 32
    q = rng.integers(-127, 128, size=(rows, cols)).astype(np.int8)
    s = rng.uniform(0.001, 0.02, size=rows * cols // gs).astype(np.float32)
    t = Tensor("w", QType.Q8_GROUPS, rows, cols, q.reshape(-1), s, gs)
    x = rng.standard_normal(cols).astype(np.float32)
    xs = (np.abs(x.reshape(-1, gs)).max(axis=1) / np.float32(127.0)).astype(np.float32)
    xq_f = x.reshape(-1, gs) / xs[:, None]
    xq = (np.sign(xq_f) * np.floor(np.abs(xq_f) + 0.5)).astype(np.int32)
    want = np.zeros(rows)
    for i in range(rows):
        iv = (q[i].reshape(-1, gs).astype(np.int32) * xq).sum(axis=1)
        want[i] = np.sum(iv * s.reshape(rows, -1)[i].astype(np.float64) * xs)
    got = matvec_tensor(t, x, 2)
    assert np.allclose(got, want, rtol=1e-5, atol=1e-5)
    assert np.array_equal(got, matvec_tensor(t, x, 1))


def test_fast_exp_maximum_error():
    # the documented bound in elementwise.pyx: relative error below 3e-7 over [-87, 88]
    x = np.concatenate([np.linspace(-87.0, 88.0, 400_001), np.array([0.0, -1e-8, 1e-8, 0.5, -0.5])])
    x = x.astype(np.float32)
    got = elementwise.exp(x).astype(np.float64)
    want = np.exp(x.astype(np.float64))
    assert np.max(np.abs(got - want) / want) < 3e-7
    assert elementwise.exp(np.array([-100.0, -88.0], dtype=np.float32)).tolist() == [0.0, 0.0]


@pytest.mark.parametrize("n", SIZES)
def test_softmax_sums_to_one_and_is_shift_invariant(n):
    rng = np.random.default_rng(n)
    x = (rng.standard_normal(n) * 5).astype(np.float32)
    a = x.copy()
    elementwise.softmax_(a)
    b = (x + np.float32(3.0)).astype(np.float32)
    elementwise.softmax_(b)
    want = np.exp(x.astype(np.float64) - x.max())
    want /= want.sum()
    assert abs(a.astype(np.float64).sum() - 1.0) < 1e-5
    assert np.allclose(a, want, rtol=1e-5, atol=1e-7)
    assert np.allclose(a, b, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("n", SIZES)
def test_rmsnorm_matches_and_is_scale_invariant(n):
    rng = np.random.default_rng(n)
    x = rng.standard_normal(n).astype(np.float32) + 0.5
    w = rng.standard_normal(n).astype(np.float32)
    out = np.empty(n, np.float32)
    elementwise.rmsnorm_(out, x, w, 0.0)
    x64 = x.astype(np.float64)
    want = w * x64 / np.sqrt(np.mean(x64 * x64))
    assert np.allclose(out, want, rtol=1e-5, atol=1e-6)
    out2 = np.empty(n, np.float32)
    elementwise.rmsnorm_(out2, (x * np.float32(4.0)).astype(np.float32), w, 0.0)
    assert np.allclose(out, out2, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("n", SIZES)
def test_swiglu(n):
    rng = np.random.default_rng(n)
    hb = rng.standard_normal(n).astype(np.float32) * 4
    hb2 = rng.standard_normal(n).astype(np.float32)
    want = hb.astype(np.float64) / (1 + np.exp(-hb.astype(np.float64))) * hb2
    elementwise.swiglu_(hb, hb2)
    assert np.allclose(hb, want, rtol=2e-6, atol=1e-7)


@pytest.mark.parametrize("style", ["normal", "neox"])
def test_rope_matches_numpy_and_rerotation_composes(style):
    cfg = ModelConfig(
        dim=64, hidden_dim=8, n_layers=1, n_heads=4, n_kv_heads=2, vocab_size=8, seq_len=64, rope_style=style
    )
    rng = np.random.default_rng(0)
    vec = rng.standard_normal(2 * cfg.head_dim).astype(np.float32)
    pos = 37
    got = vec.copy()
    rope.apply(cfg, got, pos)
    half = cfg.head_dim // 2
    theta = pos / 10000.0 ** (2 * np.arange(half) / cfg.head_dim)
    heads = vec.astype(np.float64).reshape(2, cfg.head_dim)
    if style == "normal":
        a, b = heads[:, 0::2], heads[:, 1::2]
    else:
        a, b = heads[:, :half], heads[:, half:]
    ra, rb = a * np.cos(theta) - b * np.sin(theta), a * np.sin(theta) + b * np.cos(theta)
    want = np.empty_like(heads)
    if style == "normal":
        want[:, 0::2], want[:, 1::2] = ra, rb
    else:
        want[:, :half], want[:, half:] = ra, rb
    assert np.allclose(got, want.reshape(-1), atol=2e-5)
    # re-rotating by a delta is rotating to pos + delta (up to float rounding)
    moved = got.copy()
    cfg.rerotate(moved, 5)
    direct = vec.copy()
    rope.apply(cfg, direct, pos + 5)
    assert np.allclose(moved, direct, atol=1e-5)
    cfg.rerotate(moved, -5)
    assert np.allclose(moved, got, atol=1e-5)


def test_rope_table_rows_equal_on_the_fly_rows():
    cfg = ModelConfig(dim=48, hidden_dim=8, n_layers=1, n_heads=6, n_kv_heads=6, vocab_size=8, seq_len=16)
    cos_t, sin_t = rope.rope_table(cfg, 300)
    for pos in (0, 1, 17, 299):
        vec = np.zeros(cfg.head_dim, np.float32)
        vec[0::2] = 1.0
        rope.apply(cfg, vec, pos)
        assert np.array_equal(vec[0::2], cos_t[pos]) and np.array_equal(vec[1::2], sin_t[pos])
