"""The weight-type table (kernels/qtypes.h): every type is one complete row, and Python's types are its rows.

A row is complete when every field is set, its block size and bytes are gguf-py's (``GGML_QUANT_SIZES``,
ggml's layouts stated independently of pyllama), its activation is the one llama.cpp pairs it with
(tests/quant_reference.py; float32 for the float types), and every kernel it names (the units of a
product, the single-vector and block products, the row dequantiser, its activation's quantiser) exists.
A type added with a field or a kernel left out fails here.

The product loop routes by the rows' fields, never by the order of the ids: matrices go into one loop
when their rows share an activation, and only then. The grouping tests take the mixes that this rule
groups (the three float types; llama2.c's int8 groups of one size) and those it must keep apart (Q8_0,
whose block tiles store their activation in their own layout, beside Q4_0; int8 groups of two sizes),
and check each matrix's product against the matrix alone, bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as G
from quant_reference import ACTIVATION, random_blocks

from pyllama.checkpoint.weights import QType, Tensor
from pyllama.kernels.matvec import matmul_many_tensors, matmul_tensor
from pyllama.kernels.qproduct import kernel_addresses
from pyllama.kernels.qtypes import BY_GGML, BY_QTYPE, STORED_TYPES, TYPE_ROWS

KERNELS = {"units", "vec", "mat", "dequantize_row", "quantise"}
ACTIVATIONS = {"F32", "Q8_0", "Q8_1", "Q8_K", "Q8_GROUPS"}
FLOAT_TYPES = {G.F32, G.F16, G.BF16}  # their activation stays float32


def test_every_id_has_a_row_and_qtype_is_the_rows():
    assert [r.id for r in TYPE_ROWS] == list(range(len(TYPE_ROWS)))
    assert all(r.name for r in TYPE_ROWS), [r.id for r in TYPE_ROWS if not r.name]
    assert len({r.name for r in TYPE_ROWS}) == len(TYPE_ROWS)
    assert {q.name: int(q) for q in QType} == {r.name: r.id for r in TYPE_ROWS}


@pytest.mark.parametrize("row", TYPE_ROWS, ids=lambda r: r.name or str(r.id))
def test_every_row_is_complete(row):
    assert row.block > 0 and row.block_bytes > 0 and row.work_div > 0, row
    assert row.activation in ACTIVATIONS, row
    addresses = kernel_addresses(row.id)
    assert set(addresses) == KERNELS
    assert all(addresses.values()), f"{row.name}: kernels not set: {[k for k, v in addresses.items() if not v]}"


@pytest.mark.parametrize("row", [r for r in TYPE_ROWS if r.ggml >= 0], ids=lambda r: r.name)
def test_every_gguf_row_is_gguf_pys_type(row):
    ggml = G(row.ggml)
    assert ggml.name == row.name
    assert GGML_QUANT_SIZES[ggml] == (row.block, row.block_bytes)
    assert row.activation == ("F32" if ggml in FLOAT_TYPES else ACTIVATION[ggml])


def test_the_only_type_gguf_lacks_is_llama2cs_int8_groups():
    assert [r.name for r in TYPE_ROWS if r.ggml < 0] == ["Q8_GROUPS"]
    assert "Q8_GROUPS" not in G.__members__


def test_the_loaders_types_are_the_gguf_rows():
    gguf_rows = [r for r in TYPE_ROWS if r.ggml >= 0]
    assert [(t.qtype, t.ggml, t.block, t.block_bytes, t.activation) for t in STORED_TYPES] == [
        (QType(r.id), G(r.ggml), r.block, r.block_bytes, r.activation) for r in gguf_rows
    ]
    assert set(BY_GGML) == {G(r.ggml) for r in gguf_rows}
    assert set(BY_QTYPE) == set(QType) - {QType.Q8_GROUPS}


def _matrix(rng: np.random.Generator, name: str, rows: int, cols: int, group_size: int = 0) -> Tensor:
    if name == "F32":
        return Tensor("w", QType.F32, rows, cols, rng.standard_normal((rows, cols)).astype(np.float32))
    if name == "F16":
        return Tensor("w", QType.F16, rows, cols, rng.standard_normal((rows, cols)).astype(np.float16))
    if name == "Q8_GROUPS":
        q = rng.integers(-127, 128, rows * cols).astype(np.int8)
        s = rng.uniform(0.001, 0.01, rows * cols // group_size).astype(np.float32)
        return Tensor("w", QType.Q8_GROUPS, rows, cols, q, s, group_size)
    return Tensor("w", QType[name], rows, cols, random_blocks(rng, G[name], rows, cols))


MIXES = [
    [("F32", 0), ("F16", 0), ("BF16", 0)],
    [("Q8_0", 0), ("Q4_0", 0), ("Q8_0", 0)],
    [("Q8_GROUPS", 32), ("Q8_GROUPS", 32)],
    [("Q8_GROUPS", 32), ("Q8_GROUPS", 64)],
]


@pytest.mark.parametrize("mix", MIXES, ids=lambda m: "+".join(f"{n}{g or ''}" for n, g in m))
def test_grouped_products_of_mixed_types_are_each_matrix_alone_bitwise(mix, parallel_always):
    """Row counts of 64, 24 and 40 leave units of every size and a share boundary inside each matrix;
    7 positions are a whole tile of four and three more."""
    rng = np.random.default_rng(len(mix))
    cols = 256
    tensors = [_matrix(rng, name, rows, cols, gs) for (name, gs), rows in zip(mix, (64, 24, 40), strict=False)]
    x = rng.standard_normal((7, cols)).astype(np.float32)
    alone = [matmul_tensor(t, x, 1) for t in tensors]
    for n_threads in (1, 2, 3):
        for n_pos in (1, 7):
            got = matmul_many_tensors(tensors, x[:n_pos], n_threads)
            for k, (g, a) in enumerate(zip(got, alone, strict=True)):
                assert np.array_equal(g.view(np.uint32), a[:n_pos].view(np.uint32)), (k, n_threads, n_pos)
