"""Block-quantised kernels (Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, Q2_K-Q6_K, BF16) against gguf-py.

The reference (tests/quant_reference.py) quantises the activation with numpy written from ggml's
description, dequantises the weights with gguf-py (an implementation independent of pyllama) and
takes a float64 dot product. Three things are checked:

* the activation quantisation (Q8_0, Q8_1, Q8_K) equals the numpy one exactly, int8 for int8;
* the integer part is exact: with every scale 1.0 and an integer activation whose blocks reach 127,
  every product and partial sum is an integer below 2^24, so the float32 result must equal the int64
  sum exactly;
* with random scales, the float part is within (n_blocks + 16) u Σ|w_j x_j| (u = 2^-24): pyllama rounds
  each block's d_w·d_x, each lane or super-block sum it converts, and each of the at most n_blocks
  accumulations and reduction levels once; gguf-py's float32 dequantisation adds at most one rounding
  per weight (Higham's bound for a fixed-order float32 sum).

Random bytes fill every field except the fp16 scales (random finite halves: random bytes would make NaN
and Inf). Products are bitwise equal across thread counts, on read-only memory maps, and between the
block kernel and the one-position kernel.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as G
from quant_reference import ACTIVATION, HALF_FIELDS, QUANTIZERS, random_blocks, reference_product, set_halves

from pyllama.checkpoint.weights import QType, Tensor
from pyllama.kernels.matvec import embedding_row_tensor, matmul_many_tensors, matmul_tensor, matvec_tensor
from pyllama.kernels.qproduct import quantize_activation_np
from pyllama.kernels.qtypes import BY_QTYPE, STORED_TYPES

U = 2.0**-24
BLOCK_TYPES = [G.Q4_0, G.Q4_1, G.Q5_0, G.Q5_1, G.IQ4_NL, G.Q2_K, G.Q3_K, G.Q4_K, G.Q5_K, G.Q6_K]
ROWS = [1, 3, 7, 31, 64, 257]  # 64: Q4_0/IQ4_NL take the 8-row (repacked) order


def _cols(ggml_type: G) -> list[int]:
    block = GGML_QUANT_SIZES[ggml_type][0]
    return [block, 3 * block, 9 * block] if block == 32 else [256, 768, 1280]


def _tensor(raw: np.ndarray, ggml_type: G, rows: int, cols: int) -> Tensor:
    raw = np.ascontiguousarray(raw)
    raw.flags.writeable = False
    return Tensor("w", QType[ggml_type.name], rows, cols, raw)


def test_table_matches_gguf_py():
    for st in STORED_TYPES:
        assert GGML_QUANT_SIZES[st.ggml] == (st.block, st.block_bytes), st
        if st.ggml in ACTIVATION:
            assert st.activation == ACTIVATION[st.ggml]
    assert set(BY_QTYPE) == set(QType) - {QType.Q8_GROUPS}


@pytest.mark.parametrize("kind", ["Q8_0", "Q8_1", "Q8_K"])
def test_activation_quantisation_is_exact(kind):
    rng = np.random.default_rng(7)
    x = (rng.standard_normal(1024) * 3).astype(np.float32)
    x[256:512] = 0.0  # an all-zero block (and super-block)
    x[600] = -50.0  # a negative extreme
    x[800], x[900] = -20.0, 20.0  # a tie of magnitudes: the first one's sign decides (Q8_K's iscale)
    q, d, extra = quantize_activation_np(x, kind)
    rq, rd, rextra = QUANTIZERS[kind](x)
    assert np.array_equal(q, rq) and np.array_equal(d, rd)
    if extra is not None:
        assert np.array_equal(extra, rextra)


@pytest.mark.parametrize("ggml_type", BLOCK_TYPES, ids=lambda t: t.name)
def test_integer_part_is_exact(ggml_type):
    rng = np.random.default_rng(int(ggml_type))
    rows, cols = 5, 512
    raw = random_blocks(rng, ggml_type, rows, cols)
    for offset in HALF_FIELDS[ggml_type]:
        set_halves(raw, ggml_type, offset, np.ones(raw.size // GGML_QUANT_SIZES[ggml_type][1]))
    block = 256 if ACTIVATION[ggml_type] == "Q8_K" else 32
    x = rng.integers(-3, 4, cols).astype(np.float32)
    # each block's first value of largest magnitude is 127 (Q8_0/Q8_1) or -127 (Q8_K): d_x = 1, q_x = x
    x[::block] = -127.0 if block == 256 else 127.0
    w = gguf.quants.dequantize(raw, ggml_type).astype(np.float64).reshape(rows, cols)
    assert np.array_equal(w, np.round(w))
    exact = w.astype(np.int64) @ x.astype(np.int64)
    assert np.all(np.abs(w) @ np.abs(x) < 2**24)  # every partial sum is exact in float32
    out = matvec_tensor(_tensor(raw, ggml_type, rows, cols), x, 1)
    assert np.array_equal(out, exact.astype(np.float32))


@pytest.mark.parametrize("ggml_type", BLOCK_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("rows", ROWS)
def test_products_within_float32_bound(ggml_type, rows):
    rng = np.random.default_rng(rows * 100 + int(ggml_type))
    for cols in _cols(ggml_type):
        raw = random_blocks(rng, ggml_type, rows, cols)
        x = rng.standard_normal(cols).astype(np.float32)
        out = matvec_tensor(_tensor(raw, ggml_type, rows, cols), x, 2)
        ref, magnitude = reference_product(raw, ggml_type, x)
        n_blocks = cols // GGML_QUANT_SIZES[ggml_type][0]
        assert np.all(np.abs(out - ref) <= (n_blocks + 16) * U * magnitude)


@pytest.mark.parametrize("cols", [1, 7, 31, 32, 33, 100, 257])
def test_bf16_within_float32_bound(cols):
    rng = np.random.default_rng(cols)
    rows = 9
    raw = random_blocks(rng, G.BF16, rows, cols)
    x = rng.standard_normal(cols).astype(np.float32)
    out = matvec_tensor(Tensor("w", QType.BF16, rows, cols, raw), x, 1)
    w = gguf.quants.dequantize(raw, G.BF16).astype(np.float64).reshape(rows, cols)
    bound = (cols + 8) * U * (np.abs(w) @ np.abs(x.astype(np.float64)))
    assert np.all(np.abs(out - w @ x.astype(np.float64)) <= bound)


@pytest.mark.parametrize("ggml_type", [*BLOCK_TYPES, G.BF16], ids=lambda t: t.name)
def test_dequantized_rows_match_gguf_py(ggml_type):
    """The embedding lookup: one rounding of the offset types' d*q + m (fmaf) against gguf-py's two."""
    rng = np.random.default_rng(3)
    rows, cols = 4, 512
    raw = random_blocks(rng, ggml_type, rows, cols)
    t = _tensor(raw, ggml_type, rows, cols)
    want = gguf.quants.dequantize(raw, ggml_type).reshape(rows, cols)
    for r in range(rows):
        got = embedding_row_tensor(t, r)
        assert np.all(np.abs(got - want[r]) <= 2 * U * np.abs(want[r]) + 2.0**-40)


@pytest.mark.parametrize("ggml_type", [*BLOCK_TYPES, G.BF16], ids=lambda t: t.name)
@pytest.mark.parametrize("rows", [301, 304])  # 304: Q4_0/IQ4_NL take the 8-row kernel
# above the serial threshold, so the parallel path runs; 544 columns are an odd number of blocks, which
# the AVX-512 kernels take in pairs
@pytest.mark.parametrize("cols", [512, 544])
def test_thread_counts_memmap_and_blocks_are_bitwise_equal(ggml_type, rows, cols, tmp_path):
    rng = np.random.default_rng(11)
    if ggml_type in (G.Q2_K, G.Q3_K, G.Q4_K, G.Q5_K, G.Q6_K) and cols % 256:
        cols = 768  # whole super-blocks of 256
    raw = random_blocks(rng, ggml_type, rows, cols)
    path = tmp_path / "w.bin"
    raw.tofile(path)
    mapped = np.memmap(path, dtype=np.uint8, mode="r").reshape(rows, -1)
    t = Tensor("w", QType[ggml_type.name], rows, cols, mapped)
    # 9 positions: the four-position tiles (Q4_1, Q5_0, Q5_1) twice, then one position alone
    x = rng.standard_normal((9, cols)).astype(np.float32)
    one = np.stack([matvec_tensor(t, x[p], 1) for p in range(9)])
    for n_threads in (1, 2, 3):
        assert np.array_equal(np.stack([matvec_tensor(t, x[p], n_threads) for p in range(9)]), one)
        assert np.array_equal(matmul_tensor(t, x, n_threads), one)
    assert np.array_equal(matvec_tensor(_tensor(raw, ggml_type, rows, cols), x[0], 2), one[0])


# Groups as the engine forms them (Q, K, V; gate and up): one type, mixed types of one activation type
# (a Q4_K_M file's Q4_K and Q6_K), the eight-row Q4_0 kernel beside one-row matrices, and mixes that
# cannot share a loop (Q4_1 takes Q8_1, Q4_0 Q8_0; BF16 keeps float32)
GROUPS = [
    [G.Q4_K, G.Q4_K, G.Q6_K],
    [G.Q4_0, G.Q4_0, G.Q4_0],
    [G.Q4_0, G.Q5_0, G.IQ4_NL],
    [G.Q4_1, G.Q5_1],
    [G.Q4_1, G.Q4_0, G.Q6_K],
    [G.BF16, G.BF16],
    [G.Q2_K, G.Q3_K, G.Q5_K, G.Q6_K],
]


@pytest.mark.parametrize("types", GROUPS, ids=lambda ts: "+".join(t.name for t in ts))
def test_grouped_products_are_each_matrix_alone_bitwise(types, parallel_always):
    """matmul_many (one parallel loop over the rows of every matrix, x quantised once) gives each
    matrix's own product, decode (one position) and block alike, for any thread count; the row
    counts differ so that a unit mapped to the wrong matrix or row shows."""
    rng = np.random.default_rng(len(types))
    cols = 512
    tensors = [
        _tensor(random_blocks(rng, t, rows, cols), t, rows, cols)
        for t, rows in zip(types, (64, 24, 40, 8), strict=False)
    ]
    x = rng.standard_normal((7, cols)).astype(np.float32)
    alone = [matmul_tensor(t, x, 1) for t in tensors]
    for n_threads in (1, 2, 3):
        for n_pos in (1, 7):
            got = matmul_many_tensors(tensors, x[:n_pos], n_threads)
            for k, (g, a) in enumerate(zip(got, alone, strict=True)):
                assert np.array_equal(g.view(np.uint32), a[:n_pos].view(np.uint32)), (k, n_threads, n_pos)
