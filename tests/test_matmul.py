"""The block product ``matmul``: every element bit-identical to ``matvec`` on its position, for every
weight type, awkward sizes, block sizes and thread counts (the parallel path forced)."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from pyllama.checkpoint.weights import QType, Tensor
from pyllama.kernels.matvec import matmul_many_tensors, matmul_tensor, matvec_tensor

BLOCKS = [1, 2, 7, 64]
THREADS = [1, 2, 3]


def _readonly(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a)
    a.flags.writeable = False
    return a


def _tensor(qtype: QType, rows: int, cols: int, seed: int) -> Tensor:
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((rows, cols)).astype(np.float32)
    if qtype == QType.F32:
        return Tensor("w", qtype, rows, cols, _readonly(w))
    if qtype == QType.F16:
        return Tensor("w", qtype, rows, cols, _readonly(w.astype(np.float16)))
    if qtype == QType.Q8_0:
        return Tensor("w", qtype, rows, cols, _readonly(gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q8_0)))
    gs = 32 if cols % 64 else 64
    groups = w.reshape(-1, gs)
    scales = (np.abs(groups).max(axis=1) / 127).astype(np.float32)
    q = np.round(groups / scales[:, None]).astype(np.int8)
    return Tensor("w", qtype, rows, cols, _readonly(q.reshape(-1)), _readonly(scales), gs)


# (rows, cols): float types take any size; the integer types need whole blocks of 32
F_SIZES = [(1, 1), (3, 17), (5, 64), (17, 100), (31, 257), (64, 288), (130, 768), (9, 1377), (6, 2100)]
Q_SIZES = [(1, 32), (3, 64), (17, 96), (31, 288), (130, 544)]
CASES = [(QType.F32, s) for s in F_SIZES] + [(QType.F16, s) for s in F_SIZES]
CASES += [(QType.Q8_0, s) for s in Q_SIZES] + [(QType.Q8_GROUPS, s) for s in Q_SIZES]


@pytest.mark.parametrize(("qtype", "size"), CASES, ids=lambda c: getattr(c, "name", None) or f"{c[0]}x{c[1]}")
def test_matmul_is_matvec_per_position_bit_for_bit(qtype, size, parallel_always):
    rows, cols = size
    t = _tensor(qtype, rows, cols, seed=rows * 1000 + cols)
    rng = np.random.default_rng(cols)
    x = _readonly(rng.standard_normal((max(BLOCKS), cols)).astype(np.float32) * 3)
    expect = np.stack([matvec_tensor(t, x[p], 1) for p in range(x.shape[0])])
    for n_pos in BLOCKS:
        for threads in THREADS:
            got = matmul_tensor(t, _readonly(x[:n_pos]), threads)
            assert got.shape == (n_pos, rows)
            assert np.array_equal(got.view(np.uint32), expect[:n_pos].view(np.uint32)), (n_pos, threads)


@pytest.mark.parametrize("cols", [771, 1376, 2065])
def test_f32_long_rows_and_many_positions_bit_for_bit(cols, parallel_always):
    # rows longer than one chunk of columns (f32dot.h keeps each lane's chain across chunks) and more
    # positions than one group of kept lanes: each element still equals its own single-vector product
    t = _tensor(QType.F32, 11, cols, seed=cols)
    x = _readonly(np.random.default_rng(cols + 1).standard_normal((140, cols)).astype(np.float32))
    expect = np.stack([matvec_tensor(t, x[p], 1) for p in range(x.shape[0])])
    for threads in (1, 2):
        got = matmul_tensor(t, x, threads)
        assert np.array_equal(got.view(np.uint32), expect.view(np.uint32)), threads


def test_matmul_agrees_with_numpy_within_float32_rounding():
    # an independent reference: float64 numpy, error bounded by the summation length (cols * 2^-24 relative)
    t = _tensor(QType.F32, 33, 257, seed=5)
    x = np.random.default_rng(6).standard_normal((9, 257)).astype(np.float32)
    w = t.dequantize().astype(np.float64)
    want = x.astype(np.float64) @ w.T
    bound = 257 * 2.0**-24 * (np.abs(x).astype(np.float64) @ np.abs(w).T)
    assert (np.abs(matmul_tensor(t, x, 2) - want) <= bound).all()


def test_matmul_rejects_mismatched_shapes():
    t = _tensor(QType.F32, 4, 8, seed=1)
    with pytest.raises(ValueError, match="matmul"):
        matmul_tensor(t, np.zeros((3, 9), dtype=np.float32))


@pytest.mark.parametrize(
    "qtypes",
    [[QType.F32] * 3, [QType.Q8_0] * 3, [QType.F32, QType.Q8_0], [QType.F16, QType.F16]],
    ids=lambda ts: "+".join(t.name for t in ts),
)
def test_grouped_products_are_each_matrix_alone_bitwise(qtypes, parallel_always):
    """matmul_many: Q, K and V (or gate and up) in one parallel loop, for one position (decode: the
    four-row float32 groups of every matrix, then each one's last rows % 4 rows; Q8_0's rows) and for
    a block, equal each matrix's own product bit for bit; row counts of 64, 30 and 13 leave 0, 2 and 1
    rows past the last four-row group, so a unit mapped to the wrong matrix or row shows."""
    cols = 288
    tensors = [_tensor(q, rows, cols, seed=rows) for q, rows in zip(qtypes, (64, 30, 13), strict=False)]
    x = _readonly(np.random.default_rng(5).standard_normal((7, cols)).astype(np.float32))
    alone = [np.stack([matvec_tensor(t, x[p], 1) for p in range(7)]) for t in tensors]
    for threads in THREADS:
        for n_pos in (1, 7):
            got = matmul_many_tensors(tensors, x[:n_pos], threads)
            for k, (g, a) in enumerate(zip(got, alone, strict=True)):
                assert np.array_equal(g.view(np.uint32), a[:n_pos].view(np.uint32)), (k, threads, n_pos)
