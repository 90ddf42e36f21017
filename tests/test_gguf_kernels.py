"""F16 and Q8_0 kernels against numpy over awkward sizes, and bitwise across thread counts.

Error bounds are the textbook ones for float32 summation (Higham): a dot product of n terms summed in
any fixed order with unit roundoff u = 2^-24 is within about n·u·Σ|w_j x_j| of the exact value. The
tests assert that bound with n + 8 (the lane reduction adds a few levels), elementwise. For Q8_0 the
exact value is Σ_blocks d_w·d_x·Σ qw·qx computed in float64 from the same integers (the activation
quantisation is checked on its own, exactly).
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from pyllama.checkpoint.weights import QType, Tensor
from pyllama.kernels.matvec import matvec_tensor
from pyllama.kernels.quant import dequantize_tensor_row, float_to_half_np, half_to_float_np, quantize_q8_0_np

U32 = 2.0**-24
SIZES = [1, 2, 15, 16, 17, 31, 33, 64, 100, 257]
Q8_COLS = [32, 64, 96, 288, 544]  # odd and even block counts (the kernel runs two block chains)
Q8_ROWS = [1, 2, 3, 7, 31, 257]


def _readonly(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a)
    a.flags.writeable = False
    return a


def _q8_0_tensor(w: np.ndarray) -> Tensor:
    data = _readonly(gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q8_0))
    return Tensor("w", QType.Q8_0, w.shape[0], w.shape[1], data)


def q8_0_activation_reference(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ggml's x86 quantize_row_q8_0 in numpy float32 steps: d = fp16(amax / 127), q = rint(x * (127 / amax))."""
    xb = x.astype(np.float32).reshape(-1, 32)
    amax = np.abs(xb).max(axis=1)
    d = (amax / np.float32(127)).astype(np.float16).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(amax > 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    q = np.rint(xb * inv[:, None]).astype(np.int8)
    return q.reshape(-1), d


@pytest.mark.parametrize("rows", [1, 3, 17, 257])
@pytest.mark.parametrize("cols", SIZES)
def test_f16_matvec_within_float32_summation_bound(rows, cols):
    rng = np.random.default_rng(rows * 1000 + cols)
    w16 = _readonly(rng.standard_normal((rows, cols)).astype(np.float16))
    x = _readonly(rng.standard_normal(cols).astype(np.float32))
    out = matvec_tensor(Tensor("w", QType.F16, rows, cols, w16), x, 2)
    w64, x64 = w16.astype(np.float64), x.astype(np.float64)
    bound = (cols + 8) * U32 * (np.abs(w64) @ np.abs(x64))
    assert np.all(np.abs(out - w64 @ x64) <= bound)


def test_f16_conversions_are_exact_and_round_to_nearest_even():
    every = np.arange(1 << 16, dtype=np.uint16)
    ours, ref = half_to_float_np(every), every.view(np.float16).astype(np.float32)
    nan = np.isnan(ref)
    assert np.array_equal(ours[~nan], ref[~nan]) and np.isnan(ours[nan]).all()
    rng = np.random.default_rng(0)
    x = np.concatenate(
        [
            rng.standard_normal(20000).astype(np.float32) * 10.0 ** rng.integers(-9, 6, 20000),
            np.array([65504, 65519.99, 65520, 1e9, -1e9, 2.0**-24, 2.0**-25, 2.0**-26, 0.0, -0.0, np.inf], np.float32),
            # ties between two halves: round to even
            (np.arange(1, 2048, dtype=np.float32) + 0.5) * np.float32(2.0**-10),
        ]
    ).astype(np.float32)
    with np.errstate(over="ignore"):
        expected = x.astype(np.float16).view(np.uint16)
    assert np.array_equal(float_to_half_np(x), expected)


@pytest.mark.parametrize("n", [32, 64, 96, 2048])
def test_q8_0_activation_quantisation_is_llama_cpps(n):
    rng = np.random.default_rng(n)
    x = rng.standard_normal(n).astype(np.float32) * 3
    x[:32] *= 1e-3  # a block of small values
    x[-32:] = 0.0 if n > 32 else x[-32:]  # an all-zero block: scale 0, all q 0, no NaN
    q, d = quantize_q8_0_np(_readonly(x))
    q_ref, d_ref = q8_0_activation_reference(x)
    assert np.array_equal(q, q_ref) and np.array_equal(d, d_ref)
    assert np.abs(q).max() <= 127


def _exact_q8_0(t: Tensor, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(value, error bound): Σ_b d_w d_x Σ qw qx in float64 from the kernel's own integers."""
    blocks = np.asarray(t.data).reshape(t.rows, -1, 34)
    dw = blocks[:, :, :2].copy().view(np.float16)[..., 0].astype(np.float64)
    qw = blocks[:, :, 2:].copy().view(np.int8).astype(np.int64)
    qx, dx = quantize_q8_0_np(x)
    qx = qx.reshape(-1, 32).astype(np.int64)
    block_dots = np.einsum("rbk,bk->rb", qw, qx)  # exact integers
    scale = dw * dx.astype(np.float64)
    value = (scale * block_dots).sum(axis=1)
    magnitude = (np.abs(scale) * np.einsum("rbk,bk->rb", np.abs(qw), np.abs(qx))).sum(axis=1)
    return value, (blocks.shape[1] + 8) * U32 * magnitude * 2


@pytest.mark.parametrize("rows", Q8_ROWS)
@pytest.mark.parametrize("cols", Q8_COLS)
def test_q8_0_matvec_is_the_integer_dot_of_both_quantisations(rows, cols):
    rng = np.random.default_rng(rows * 7 + cols)
    w = rng.standard_normal((rows, cols)).astype(np.float32)
    x = _readonly(rng.standard_normal(cols).astype(np.float32))
    t = _q8_0_tensor(w)
    out = matvec_tensor(t, x, 2)
    value, bound = _exact_q8_0(t, x)
    assert np.all(np.abs(out - value) <= bound)
    # and against the float weights: within what the two 8-bit roundings explain (a few 1/127)
    dense = w.astype(np.float64) @ x.astype(np.float64)
    assert np.all(np.abs(out - dense) <= 0.05 * (np.abs(w) @ np.abs(x)))


def test_q8_0_weights_of_minus_128_are_exact():
    """ggml's format allows qs = -128; the kernel's |w| x sign(w)·x trick must stay exact there."""
    rows, cols = 4, 64
    blocks = np.zeros((rows, cols // 32, 34), dtype=np.uint8)
    blocks[:, :, :2] = np.array([0.5], np.float16).view(np.uint8)
    qs = np.full((rows, cols // 32, 32), -128, dtype=np.int8)
    qs[1] = 127
    qs[2, :, ::2] = -128
    qs[2, :, 1::2] = 1
    blocks[:, :, 2:] = qs.view(np.uint8)
    t = Tensor("w", QType.Q8_0, rows, cols, blocks.reshape(rows, -1))
    x = np.linspace(-3, 2, cols).astype(np.float32)
    value, bound = _exact_q8_0(t, x)
    assert np.all(np.abs(matvec_tensor(t, x, 1) - value) <= bound)


@pytest.mark.parametrize("qtype", [QType.F16, QType.Q8_0])
def test_bitwise_identical_for_any_thread_count(qtype):
    rng = np.random.default_rng(3)
    rows, cols = 1001, 288
    w = rng.standard_normal((rows, cols)).astype(np.float32)
    t = Tensor("w", QType.F16, rows, cols, w.astype(np.float16)) if qtype == QType.F16 else _q8_0_tensor(w)
    x = rng.standard_normal(cols).astype(np.float32)
    one = matvec_tensor(t, x, 1)
    assert np.array_equal(one, matvec_tensor(t, x, 2))
    assert np.array_equal(one, matvec_tensor(t, x, 3))


def test_memmapped_weights(tmp_path):
    rng = np.random.default_rng(4)
    w = rng.standard_normal((40, 96)).astype(np.float32)
    q = gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q8_0)
    path = tmp_path / "w.bin"
    q.tofile(path)
    mapped = np.memmap(path, dtype=np.uint8, mode="r").reshape(q.shape)
    x = rng.standard_normal(96).astype(np.float32)
    a = matvec_tensor(Tensor("w", QType.Q8_0, 40, 96, mapped), x, 2)
    assert np.array_equal(a, matvec_tensor(_q8_0_tensor(w), x, 2))


@pytest.mark.parametrize("qtype", [QType.F16, QType.Q8_0])
def test_dequantize_row_matches_numpy(qtype):
    rng = np.random.default_rng(5)
    w = rng.standard_normal((9, 96)).astype(np.float32)
    t = Tensor("w", QType.F16, 9, 96, w.astype(np.float16)) if qtype == QType.F16 else _q8_0_tensor(w)
    expected = t.dequantize()
    for row in (0, 4, 8):
        assert np.array_equal(dequantize_tensor_row(t, row), expected[row])
