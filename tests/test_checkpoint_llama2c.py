"""llama2.c checkpoints: versions 0/1/2 load to the same model, memory-mapped; bad files are clear errors."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from llama2c_writer import quantize_q80, read_legacy, write_v1, write_v2

from pyllama.checkpoint import QType, load_checkpoint
from pyllama.errors import CheckpointError
from pyllama.model import Model


def test_stories260k_header_and_gqa(stories260k):
    cfg, w = load_checkpoint(stories260k)
    assert (cfg.dim, cfg.hidden_dim, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.vocab_size, cfg.seq_len) == (
        64,
        172,
        5,
        8,
        4,
        512,
        512,
    )
    assert cfg.head_dim == 8 and cfg.kv_dim == 32 and cfg.shared_classifier
    assert w.classifier is w.token_embedding
    assert (w.layers[0].wk.rows, w.layers[0].wk.cols) == (32, 64)
    assert w.parameter_count() == 260_032 - 512 * 4 * 2 + 512 * 4 * 2  # all tensors but the RoPE tables
    assert w.file_bytes == stories260k.stat().st_size


def test_weights_are_views_of_the_mapped_file(stories260k):
    _, w = load_checkpoint(stories260k)
    assert isinstance(w.source, np.memmap)
    for t in w.tensors():
        assert np.shares_memory(t.data, w.source)
        assert not t.data.flags.writeable


def test_version1_gives_identical_logits(stories260k, tmp_path):
    v1 = tmp_path / "v1.bin"
    write_v1(stories260k, v1)
    a, b = Model.load(stories260k), Model.load(v1)
    assert "version 1" in b.weights.format
    for pos, tok in enumerate([1, 403, 407, 261, 378]):
        assert np.array_equal(a.forward(tok, pos), b.forward(tok, pos))


def test_version1_unshared_classifier(gqa_unshared, tmp_path):
    v1 = tmp_path / "v1.bin"
    write_v1(gqa_unshared, v1)
    a, b = Model.load(gqa_unshared), Model.load(v1)
    assert not b.config.shared_classifier
    for pos, tok in enumerate([3, 9, 27]):
        assert np.array_equal(a.forward(tok, pos), b.forward(tok, pos))


def test_version2_int8_groups_close_to_float(stories260k, tmp_path):
    v2 = tmp_path / "v2.bin"
    write_v2(stories260k, v2, group_size=4)  # 4 divides dim 64 and hidden_dim 172
    cfg, w = load_checkpoint(v2)
    assert w.layers[0].wq.qtype == QType.Q8_GROUPS and w.layers[0].wq.group_size == 4
    # the stored int8 values are exactly export.py's quantisation of the float weights
    _, _, t = read_legacy(stories260k)
    q, s = quantize_q80(t["wq"][2], 4)
    assert np.array_equal(np.asarray(w.layers[2].wq.data), q)
    assert np.array_equal(np.asarray(w.layers[2].wq.scales), s)
    # and the model computes nearly the same thing as the float model (int8 weights and activations)
    a, b = Model.load(stories260k), Model.load(v2)
    for pos, tok in enumerate([1, 403, 407, 261, 378, 432, 383]):
        la, lb = a.forward(tok, pos), b.forward(tok, pos)
        assert np.corrcoef(la, lb)[0, 1] > 0.99


# ---- hostile files -------------------------------------------------------------------------------


def _error(path) -> str:
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path)
    msg = str(info.value)
    assert "\n" not in msg
    return msg


def test_truncated_file(stories260k, tmp_path):
    bad = tmp_path / "cut.bin"
    bad.write_bytes(stories260k.read_bytes()[:100_000])
    msg = _error(bad)
    assert "header implies 1,056,540 bytes, file has 100,000" in msg and "truncated" in msg


def test_file_with_extra_bytes(stories260k, tmp_path):
    bad = tmp_path / "long.bin"
    bad.write_bytes(stories260k.read_bytes() + b"\0" * 12)
    assert "12 too many" in _error(bad)


def test_garbage_header(tmp_path):
    bad = tmp_path / "garbage.bin"
    bad.write_bytes(b"this is not a model at all, just some text" * 10)
    assert "not a llama2.c checkpoint" in _error(bad)


def test_tiny_and_empty_files(tmp_path):
    (tmp_path / "empty.bin").write_bytes(b"")
    assert "too small" in _error(tmp_path / "empty.bin")
    assert "no such file" in _error(tmp_path / "missing.bin")
    assert "directory" in _error(tmp_path)


def test_inconsistent_heads(tmp_path):
    bad = tmp_path / "heads.bin"
    bad.write_bytes(struct.pack("<7i", 64, 172, 5, 8, 3, 512, 512) + b"\0" * 64)
    assert "not a multiple of n_kv_heads=3" in _error(bad)
    bad.write_bytes(struct.pack("<7i", 66, 172, 5, 8, 4, 512, 512) + b"\0" * 64)
    assert "dim=66 is not a multiple of n_heads=8" in _error(bad)


def test_version2_group_size_that_straddles_rows(stories260k, tmp_path):
    v2 = tmp_path / "v2.bin"
    write_v2(stories260k, v2, group_size=64)  # export.py allows it; 172-wide rows do not split into 64s
    assert "does not divide both dim=64 and hidden_dim=172" in _error(v2)


def test_unknown_version(tmp_path):
    bad = tmp_path / "v9.bin"
    bad.write_bytes(struct.pack("<Ii", 0x616B3432, 9) + b"\0" * 300)
    assert "version 9 is not supported" in _error(bad)


def test_tokenizer_file_passed_as_model(tok512):
    assert "not a llama2.c checkpoint" in _error(tok512)
