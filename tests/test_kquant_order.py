"""The float order of the K-quant row products, emulated in numpy, bit for bit.

pyllama's K-quant products follow the order of the kernels llama.cpp runs on AVX2 (documented in
pyllama/kernels/kquants.h). This test writes that order out independently: the integer weights come
from gguf-py (dequantised with d = 1 and dmin = 0, each value is the exact integer scale * q; with
d = 0 and dmin = 1, minus the integer min), the activation from the numpy Q8_K quantiser of
quant_reference.py, and the lanes, fused multiply-adds and reductions are numpy float32 operations.

The fused multiply-add fma(a, b, c) of float32 values is emulated as float32(a * b + c) in float64:
a * b is exact there (24 + 24 bits), and the sum rounds twice (to float64, then to float32). The
double rounding differs from one rounding only when the float64 sum lands exactly on a float32 tie,
about once in 2^29 operations; this test makes about 10^5, so a spurious failure has odds near 1e-4.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as G
from quant_reference import HALF_FIELDS, QUANTIZERS, random_blocks, set_halves

from pyllama.checkpoint.weights import QType, Tensor
from pyllama.kernels.matvec import matmul_tensor, matvec_tensor

F32 = np.float32
BLOCK_BYTES = {G.Q2_K: 84, G.Q3_K: 110, G.Q4_K: 144, G.Q5_K: 176, G.Q6_K: 210}


def _fma(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    return (a.astype(np.float64) * b.astype(np.float64) + c.astype(np.float64)).astype(F32)


def _with(raw: np.ndarray, t: G, d: float, dmin: float | None) -> np.ndarray:
    out = raw.copy()
    n = out.size // BLOCK_BYTES[t]
    d_off, m_off = HALF_FIELDS[t]
    set_halves(out, t, d_off, np.full(n, d))
    if m_off is not None:
        set_halves(out, t, m_off, np.full(n, dmin))
    return out


def _halves(raw: np.ndarray, t: G, offset: int | None, rows: int) -> np.ndarray:
    if offset is None:
        return np.zeros((rows, raw.shape[1] // BLOCK_BYTES[t]), F32)
    blocks = raw.reshape(rows, -1, BLOCK_BYTES[t])
    return blocks[:, :, offset : offset + 2].copy().view(np.float16)[..., 0].astype(F32)


def _hsum8(a: np.ndarray) -> np.ndarray:
    """ggml's hsum_float_8 over the last axis: ((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7))."""
    return ((a[..., 0] + a[..., 4]) + (a[..., 2] + a[..., 6])) + ((a[..., 1] + a[..., 5]) + (a[..., 3] + a[..., 7]))


def emulated_products(raw: np.ndarray, t: G, x: np.ndarray) -> np.ndarray:
    rows, cols = raw.shape[0], x.shape[0]
    nb = cols // 256
    ints = gguf.quants.dequantize(_with(raw, t, 1.0, 0.0), t).reshape(rows, nb, 256).astype(np.int64)
    mins = -gguf.quants.dequantize(_with(raw, t, 0.0, 1.0), t).reshape(rows, nb, 256).astype(np.int64)
    d_w, dmin_w = _halves(raw, t, HALF_FIELDS[t][0], rows), _halves(raw, t, HALF_FIELDS[t][1], rows)
    q, d_x, bsums = QUANTIZERS["Q8_K"](x)
    q = q.astype(np.int64).reshape(nb, 256)
    bs = bsums.astype(np.int64).reshape(nb, 16)
    if t == G.Q6_K:  # ggml multiplies the unsigned codes, then subtracts 32 * Σ sc * q_x per lane pair
        sc = raw.reshape(rows, nb, 210)[:, :, 192:208].view(np.int8).astype(np.int64)
        ints = ints + 32 * np.repeat(sc, 16, axis=2)
    # lane l of run c holds elements 32c + 4l .. 32c + 4l + 3; the lanes sum over the 8 runs
    lanes = (ints * q).reshape(rows, nb, 8, 8, 4).sum(axis=(2, 4))
    if t == G.Q6_K:
        lanes -= 32 * (bs[None, :, 0::2] * sc[:, :, 0::2] + bs[None, :, 1::2] * sc[:, :, 1::2])
    dd = d_x[None, :] * d_w
    ndmin = -d_x[None, :] * dmin_w
    acc, acc_m, summs = np.zeros((rows, 8), F32), np.zeros((rows, 4), F32), np.zeros(rows, F32)
    for b in range(nb):
        if t == G.Q2_K:
            m16 = mins[:, b, ::16]
            ml = m16[:, 0::2] * bs[None, b, 0::2] + m16[:, 1::2] * bs[None, b, 1::2]
            acc = _fma(ndmin[:, b, None], ml.astype(F32), acc)
        elif t in (G.Q4_K, G.Q5_K):
            m32 = mins[:, b, ::32]
            s32 = bs[b, 0::2] + bs[b, 1::2]
            ml = m32[:, 0::2] * s32[None, 0::2] + m32[:, 1::2] * s32[None, 1::2]
            if t == G.Q4_K:
                acc_m = _fma(ndmin[:, b, None], ml.astype(F32), acc_m)
            else:
                summs = _fma(ndmin[:, b], ml.sum(axis=1).astype(F32), summs)
        acc = _fma(dd[:, b, None], lanes[:, b].astype(F32), acc)
    total = _hsum8(acc)
    if t == G.Q4_K:
        return total + ((acc_m[:, 0] + acc_m[:, 2]) + (acc_m[:, 1] + acc_m[:, 3]))
    return total + summs if t == G.Q5_K else total


@pytest.mark.parametrize("ggml_type", [G.Q2_K, G.Q3_K, G.Q4_K, G.Q5_K, G.Q6_K])
@pytest.mark.parametrize("rows", [7, 16])
def test_products_follow_llama_cpp_float_order_bitwise(ggml_type, rows):
    rng = np.random.default_rng(13 + rows)
    for cols in (256, 1280):
        raw = np.ascontiguousarray(random_blocks(rng, ggml_type, rows, cols))
        tensor = Tensor("w", QType[ggml_type.name], rows, cols, raw)
        for scale in (0.01, 3.0):
            x = (rng.standard_normal(cols) * scale).astype(F32)
            want = emulated_products(raw, ggml_type, x)
            got = matvec_tensor(tensor, x)
            assert np.array_equal(got.view(np.int32), want.view(np.int32)), (ggml_type, rows, cols)
            # five positions: the four-position tile, then one alone; each its own activation, so a
            # position taken for another shows
            xs = np.stack([x, x * F32(0.5), -x, rng.standard_normal(cols).astype(F32), x * F32(4.0)])
            block = matmul_tensor(tensor, xs)
            for p in range(len(xs)):
                want_p = want if p == 0 else emulated_products(raw, ggml_type, xs[p])
                assert np.array_equal(block[p].view(np.int32), want_p.view(np.int32)), (ggml_type, rows, cols, p)
