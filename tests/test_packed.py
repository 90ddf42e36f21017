"""The packed copies of Q4_0, Q5_0, Q4_K, Q5_K and Q6_K matrices (kernels/qpacked.h): the file's bits.

A product through the packed copy (the default) and one that reads the memory-mapped blocks
(``packed=False``, or ``PYLLAMA_REPACK=off``) must agree bit for bit, for one position and for blocks of
positions (the tiles and the positions left over), at any thread count, on row counts that leave the
last group of 16 part-empty. Which order that is, is pinned against numpy in test_ggml_order.py; here the
copy itself: made on the first product only, once per tensor (every engine shares it), from a read-only
map without writing to it, and never where the opt-out is set.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as G
from gguf_reference import write_random_gguf
from quant_reference import random_blocks

from pyllama.checkpoint import load_checkpoint
from pyllama.checkpoint.weights import QType, Tensor
from pyllama.kernels.matvec import matmul_many_tensors, matmul_tensor, matvec_tensor, packing_of
from pyllama.model import Model

F32 = np.float32
# (values per block, bytes of 16 rows' blocks in the packed copy)
GROUP_BLOCKS = {
    G.Q4_0: (32, 16 * 18),
    G.Q5_0: (32, 16 * 22),
    G.Q4_K: (256, 2368),
    G.Q5_K: (256, 2880),
    G.Q6_K: (256, 16 * 274),  # its 6-bit codes one to a byte
}


def _tensor(ggml_type: G, rows: int, cols: int, seed: int) -> Tensor:
    raw = np.ascontiguousarray(random_blocks(np.random.default_rng(seed), ggml_type, rows, cols))
    return Tensor("w", QType[ggml_type.name], rows, cols, raw)


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return np.array_equal(a.view(np.int32), b.view(np.int32))


@pytest.mark.parametrize(
    ("ggml_type", "rows"),
    [(G.Q4_0, 8), (G.Q4_0, 40), (G.Q4_0, 64), (G.Q5_0, 1), (G.Q5_0, 17), (G.Q5_0, 33), (G.Q5_0, 48)]
    + [(t, rows) for t in (G.Q4_K, G.Q5_K, G.Q6_K) for rows in (1, 7, 24, 33)],
)
@pytest.mark.parametrize("blocks", [1, 5])
def test_packed_products_equal_the_mapped_ones_bit_for_bit(ggml_type, rows, blocks):
    _check_packed_against_mapped(ggml_type, rows, blocks)


@pytest.mark.parametrize("ggml_type", [G.Q4_K, G.Q5_K])
def test_wide_k_quant_blocks_run_on_the_group_blocks_bit_for_bit(ggml_type):
    """A block product expands a Q4_K / Q5_K group's codes to bytes on the stack up to 16 super-blocks
    (4,096 columns); a wider matrix's runs its tile on the packed group blocks: the same bits either way."""
    _check_packed_against_mapped(ggml_type, 24, 17)


def _check_packed_against_mapped(ggml_type: G, rows: int, blocks: int) -> None:
    block, group_block_bytes = GROUP_BLOCKS[ggml_type]
    cols = block * blocks
    t = _tensor(ggml_type, rows, cols, rows * 100 + cols)
    rng = np.random.default_rng(cols)
    xs = (rng.standard_normal((11, cols)) * rng.uniform(0.01, 30.0, (11, 1))).astype(F32)
    mapped_one = matvec_tensor(t, xs[0], packed=False)
    mapped_block = matmul_tensor(t, xs, packed=False)
    assert packing_of(t) is not None and not packing_of(t).ready  # nothing packed by the mapped products
    for threads in (1, 2, 3):
        assert _same(matvec_tensor(t, xs[0], threads), mapped_one)
        for n_pos in (2, 3, 8, 11):  # tiles of 8 (Q4_0) or 2 (Q5_0), and the positions left over
            assert _same(matmul_tensor(t, xs[:n_pos], threads), mapped_block[:n_pos]), (threads, n_pos)
    copy = packing_of(t)
    assert copy.ready and copy.nbytes == -(-rows // 16) * blocks * group_block_bytes


def test_grouped_products_mix_packed_and_mapped_matrices():
    """Q, K, V-like products in one loop: a packed Q4_0, a Q4_0 of 7 rows (llama.cpp and pyllama keep those
    on the file's layout) and a packed Q5_0 share one activation."""
    tensors = [_tensor(G.Q4_0, 48, 96, 1), _tensor(G.Q4_0, 7, 96, 2), _tensor(G.Q5_0, 24, 96, 3)]
    x = np.random.default_rng(4).standard_normal((5, 96)).astype(F32)
    want = [matmul_tensor(t, x, packed=False) for t in tensors]
    for threads in (1, 2):
        for got, w in zip(matmul_many_tensors(tensors, x, threads), want, strict=True):
            assert _same(got, w)
        for got, w in zip(matmul_many_tensors(tensors, x[:1], threads), want, strict=True):
            assert _same(got, w[:1])
    assert packing_of(tensors[1]) is None
    assert packing_of(tensors[0]).ready and packing_of(tensors[2]).ready


def test_a_read_only_map_is_packed_without_being_written(tmp_path):
    t = _tensor(G.Q5_0, 40, 128, 5)
    path = tmp_path / "blocks.bin"
    t.data.tofile(path)
    mapped = np.memmap(path, dtype=np.uint8, mode="r", shape=t.data.shape)
    on_map = Tensor("w", t.qtype, t.rows, t.cols, mapped)
    x = np.random.default_rng(6).standard_normal((3, 128)).astype(F32)
    assert _same(matmul_tensor(on_map, x), matmul_tensor(t, x, packed=False))
    assert packing_of(on_map).ready
    assert path.read_bytes() == t.data.tobytes()


def test_the_opt_out_keeps_every_product_on_the_map(monkeypatch):
    monkeypatch.setenv("PYLLAMA_REPACK", "off")
    t = _tensor(G.Q4_0, 32, 64, 7)
    x = np.random.default_rng(8).standard_normal(64).astype(F32)
    assert _same(matvec_tensor(t, x), matvec_tensor(t, x, packed=False))
    assert t.packing is None


def test_engines_of_one_model_share_one_copy_made_on_first_use(tmp_path):
    path = write_random_gguf(tmp_path / "m.gguf", dim=64, hidden_dim=96, vocab=96, qtype="q5_0")
    cfg, weights = load_checkpoint(path)
    first = Model(cfg, weights, None, str(path), threads=2)
    second = Model(cfg, weights, None, str(path), threads=1)
    w1 = weights.layers[0].w1
    assert w1.qtype == QType.Q5_0
    assert not packing_of(w1).ready  # loading packs nothing
    logits = first.forward(3, 0)
    copy = packing_of(w1)
    assert copy.ready and copy.copy is not None
    kept = copy.copy
    assert _same(second.forward(3, 0), logits)
    assert packing_of(w1).copy is kept  # the second engine took the first one's copy
