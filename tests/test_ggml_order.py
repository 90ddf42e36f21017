"""The 32-value block products sum their float parts in the order llama.cpp's AVX2 kernels do.

The integer part of every block product is exact whatever the order (test_quant_kernels.py). The float
part is not: a last-bit difference in one output can flip an int8 rounding of the next activation
quantisation. So each row kernel is checked here, bit for bit, against a numpy emulation of ggml's order
written from its AVX2 code (ggml-cpu/arch/x86/quants.c and repack.cpp):

* vec_dot (Q4_1, Q5_0, Q5_1, Q8_0; Q4_0 and IQ4_NL when the row count is not a multiple of 8): per block
  8 int32 lanes (lane l: elements 4l..4l+3), acc[l] = fma(d_w * d_x, lane, acc[l]) into one accumulator,
  then ``hsum_float_8``: ((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7)); Q4_1/Q5_1 add sum_b fma(m_w, s_x) last.
* IQ4_NL's vec_dot: blocks in pairs into two accumulators, added lane-wise, reduced as above; an odd last
  block added as total + (d_x * d_w) * isum, rounded twice.
* Q4_0 and IQ4_NL with a row count that is a multiple of 8, which llama.cpp repacks into 8-row groups
  (``gemv_q4_0_8x8_q8_0``): per block the whole integer sum, then one chain acc = fma(isum, d_w * d_x, acc).

A float32 fused multiply-add is emulated in float64 (the product of two float32 is exact there; the sum
is rounded twice, to float64 then float32, which differs from one rounding with probability ~2^-29 per
operation: never at these sizes).
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as G
from quant_reference import random_blocks

from pyllama.checkpoint.weights import QType, Tensor
from pyllama.kernels.matvec import matmul_tensor, matvec_tensor
from pyllama.kernels.qproduct import quantize_activation_np

f32 = np.float32
BLOCK_BYTES = {G.Q4_0: 18, G.Q4_1: 20, G.Q5_0: 22, G.Q5_1: 24, G.IQ4_NL: 18, G.Q8_0: 34}
IQ4_NL_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113])


def _fma(a, b, c):
    return (np.asarray(a, np.float64) * np.asarray(b, np.float64) + np.asarray(c, np.float64)).astype(f32)


def _half(blocks: np.ndarray, offset: int) -> np.ndarray:
    return blocks[..., offset : offset + 2].copy().view(np.float16)[..., 0].astype(f32)


def _integer_weights(blocks: np.ndarray, ggml_type: G) -> np.ndarray:
    """(rows, n_blocks, 32) int64 weights of each block, in element order (ggml-common.h)."""
    if ggml_type == G.Q8_0:
        return blocks[..., 2:].view(np.int8).astype(np.int64)
    qs_at = {G.Q4_0: 2, G.Q4_1: 4, G.Q5_0: 6, G.Q5_1: 8, G.IQ4_NL: 2}[ggml_type]
    qs = blocks[..., qs_at : qs_at + 16].astype(np.int64)
    q = np.concatenate([qs & 15, qs >> 4], axis=-1)
    if ggml_type in (G.Q5_0, G.Q5_1):
        qh = blocks[..., qs_at - 4 : qs_at].copy().view(np.uint32)[..., 0].astype(np.int64)
        q |= ((qh[..., None] >> np.arange(32)) & 1) << 4
    if ggml_type == G.IQ4_NL:
        return IQ4_NL_VALUES[q]
    return q - {G.Q4_0: 8, G.Q5_0: 16}.get(ggml_type, 0)


def _hsum8(acc: np.ndarray) -> np.ndarray:
    a = [acc[:, k] for k in range(8)]
    return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]))


def ggml_order(raw: np.ndarray, ggml_type: G, rows: int, cols: int, x: np.ndarray) -> np.ndarray:
    """Row products of the file bytes ``raw`` with ``x`` in llama.cpp's AVX2 order (module docstring)."""
    n_blocks = cols // 32
    blocks = raw.reshape(rows, n_blocks, BLOCK_BYTES[ggml_type])
    with_offset = ggml_type in (G.Q4_1, G.Q5_1)
    xq, xd, xs = quantize_activation_np(x, "Q8_1" if with_offset else "Q8_0")
    products = _integer_weights(blocks, ggml_type) * xq.reshape(n_blocks, 32).astype(np.int64)
    lanes = products.reshape(rows, n_blocks, 8, 4).sum(-1).astype(f32)  # exact: |lane| < 2^24
    d = _half(blocks, 0) * xd  # (rows, n_blocks), one float32 rounding each
    if ggml_type in (G.Q4_0, G.IQ4_NL) and rows % 8 == 0:
        acc = np.zeros(rows, f32)
        for b in range(n_blocks):
            acc = _fma(products[:, b].sum(-1).astype(f32), d[:, b], acc)
        return acc
    if ggml_type == G.IQ4_NL:
        paired = n_blocks - n_blocks % 2
        acc = [np.zeros((rows, 8), f32), np.zeros((rows, 8), f32)]
        for b in range(paired):
            acc[b % 2] = _fma(d[:, b, None], lanes[:, b], acc[b % 2])
        total = _hsum8(acc[0] + acc[1])
        if paired < n_blocks:
            total = total + (xd[-1] * _half(blocks, 0)[:, -1]) * products[:, -1].sum(-1).astype(f32)
        return total
    acc = np.zeros((rows, 8), f32)
    mins = np.zeros(rows, f32)
    for b in range(n_blocks):
        acc = _fma(d[:, b, None], lanes[:, b], acc)
        if with_offset:
            mins = _fma(_half(blocks, 2)[:, b], xs[b], mins)
    return _hsum8(acc) + mins


def _random_raw(rng: np.random.Generator, ggml_type: G, rows: int, cols: int) -> np.ndarray:
    if ggml_type == G.Q8_0:  # quant_reference has no Q8_0 helper: random int8 and sane fp16 scales
        raw = rng.integers(0, 256, size=(rows, cols // 32, 34), dtype=np.uint8)
        raw[..., :2] = (
            (rng.uniform(-0.1, 0.1, (rows, cols // 32)).astype(np.float16)).view(np.uint8).reshape(rows, cols // 32, 2)
        )
        return raw.reshape(rows, -1)
    return random_blocks(rng, ggml_type, rows, cols)


@pytest.mark.parametrize("ggml_type", list(BLOCK_BYTES), ids=lambda t: t.name)
@pytest.mark.parametrize("rows", [7, 8, 24, 37, 64])
@pytest.mark.parametrize("cols", [32, 96, 704])
def test_products_follow_ggml_order_bit_for_bit(ggml_type, rows, cols):
    rng = np.random.default_rng(rows * 1000 + cols)
    raw = np.ascontiguousarray(_random_raw(rng, ggml_type, rows, cols))
    t = Tensor("w", QType[ggml_type.name], rows, cols, raw)
    # six positions: a block takes the four-position tiles (four rows at a time where rows % 4 == 0),
    # then two positions one by one
    x = (rng.standard_normal((6, cols)) * np.array([[0.05], [1.0], [40.0], [0.3], [7.0], [0.01]])).astype(f32)
    want = np.stack([ggml_order(raw, ggml_type, rows, cols, x[p]) for p in range(6)])
    for p in range(6):
        got = matvec_tensor(t, x[p])
        assert np.array_equal(got.view(np.int32), want[p].view(np.int32)), f"{np.sum(got != want[p])} rows differ"
    block = matmul_tensor(t, x, 2)
    assert np.array_equal(block.view(np.int32), want.view(np.int32)), f"{np.sum(block != want)} block elements differ"
