"""Hostile and unsupported GGUF files: every one is a one-line CheckpointError saying what is wrong.

Broken files are made two ways: headers packed by hand with ``struct`` (to say exactly which bytes are
wrong), and valid files from ``GGUFWriter`` with single fields patched in place (their byte offsets
come from gguf-py's reader).
"""

from __future__ import annotations

import struct

import gguf
import numpy as np
import pytest
from click.testing import CliRunner
from gguf import GGUFValueType as VT
from gguf_reference import write_random_gguf

from pyllama.checkpoint import load_checkpoint
from pyllama.checkpoint.gguf import load_gguf
from pyllama.cli import main
from pyllama.errors import CheckpointError


def _string(s: bytes) -> bytes:
    return struct.pack("<Q", len(s)) + s


def pack_gguf(
    kvs: list[tuple[bytes, int, bytes]],
    tensors: list[bytes] = (),
    version: int = 3,
    n_tensors: int | None = None,
    n_kvs: int | None = None,
) -> bytes:
    """GGUF bytes: header, key/values (key, type id, packed value), tensor infos, nothing after."""
    out = b"GGUF" + struct.pack(
        "<IQQ", version, len(tensors) if n_tensors is None else n_tensors, len(kvs) if n_kvs is None else n_kvs
    )
    for key, vtype, value in kvs:
        out += _string(key) + struct.pack("<I", vtype) + value
    return out + b"".join(tensors)


ARCH_KV = (b"general.architecture", int(VT.STRING), _string(b"llama"))


def _offset(reader: gguf.GGUFReader, part: np.ndarray) -> int:
    """Byte position of a reader part (a view into the file's memmap)."""
    return part.__array_interface__["data"][0] - reader.data.__array_interface__["data"][0]


def _patch(path, offset: int, data: bytes) -> None:
    raw = bytearray(path.read_bytes())
    raw[offset : offset + len(data)] = data
    path.write_bytes(bytes(raw))


def _tensor_parts(path, name: str):
    reader = gguf.GGUFReader(path)
    t = next(t for t in reader.tensors if t.name == name)
    _, _, n_dims, dims, raw_type, offset = t.field.parts
    return {
        k: _offset(reader, p) for k, p in {"n_dims": n_dims, "dims": dims, "type": raw_type, "offset": offset}.items()
    }, reader


@pytest.fixture
def model(tmp_path):
    return write_random_gguf(tmp_path / "model.gguf", qtype="q8_0")


def _error(path) -> str:
    with pytest.raises(CheckpointError) as info:
        load_gguf(path)
    message = str(info.value)
    assert "\n" not in message and path.name in message
    return message


# ---- headers packed by hand ----------------------------------------------------------------------


def test_bad_magic(tmp_path):
    path = tmp_path / "x.gguf"
    path.write_bytes(b"GGML" + bytes(60))
    assert "not a GGUF file" in _error(path) and "b'GGML'" in _error(path)


def test_too_small_for_a_header(tmp_path):
    path = tmp_path / "x.gguf"
    path.write_bytes(b"GGUF\x03\x00")
    assert "too small" in _error(path)


def test_unsupported_version(tmp_path):
    path = tmp_path / "x.gguf"
    path.write_bytes(pack_gguf([ARCH_KV], version=1))
    assert "version 1" in _error(path)


def test_absurd_counts_are_truncation_not_a_hang(tmp_path):
    path = tmp_path / "x.gguf"
    path.write_bytes(pack_gguf([ARCH_KV], n_kvs=1 << 60))
    assert "truncated" in _error(path)
    path.write_bytes(pack_gguf([ARCH_KV], n_tensors=1 << 62))
    assert "truncated" in _error(path)


def test_absurd_array_length(tmp_path):
    path = tmp_path / "x.gguf"
    array = struct.pack("<IQ", int(VT.UINT32), 1 << 60) + struct.pack("<I", 7)
    path.write_bytes(pack_gguf([ARCH_KV, (b"tokenizer.ggml.token_type", int(VT.ARRAY), array)]))
    assert "claims 1,152,921,504,606,846,976 elements" in _error(path)


def test_string_past_the_end(tmp_path):
    path = tmp_path / "x.gguf"
    path.write_bytes(pack_gguf([(b"general.architecture", int(VT.STRING), struct.pack("<Q", 1 << 40) + b"llama")]))
    assert "truncated" in _error(path)


def test_duplicate_key(tmp_path):
    path = tmp_path / "x.gguf"
    path.write_bytes(pack_gguf([ARCH_KV, ARCH_KV]))
    assert "not a readable GGUF file" in _error(path) and "general.architecture" in _error(path)


def test_unknown_value_type(tmp_path):
    path = tmp_path / "x.gguf"
    path.write_bytes(pack_gguf([ARCH_KV, (b"x", 99, b"\x00" * 8)]))
    assert "not a readable GGUF file" in _error(path)


def test_vocabulary_only_file(tmp_path):
    path = tmp_path / "x.gguf"
    path.write_bytes(pack_gguf([ARCH_KV]))
    assert "vocabulary-only" in _error(path)


# ---- valid files, then one field broken ----------------------------------------------------------


@pytest.mark.parametrize("keep", [30, 200, 2000, -40])
def test_truncated_file(model, keep):
    raw = model.read_bytes()
    model.write_bytes(raw[:keep] if keep > 0 else raw[:keep])
    message = _error(model)
    assert "truncated" in message


@pytest.mark.parametrize("qtype", ["q4_k", "q6_k", "q5_1"])
def test_truncated_block_tensor(tmp_path, qtype):
    """The last tensor of a file of K-quant or 5-bit blocks cut short: refused, naming it."""
    path = write_random_gguf(tmp_path / "m.gguf", qtype=qtype, dim=256, hidden_dim=512)
    last = gguf.GGUFReader(path).tensors[-1].name
    path.write_bytes(path.read_bytes()[:-100])
    message = _error(path)
    assert f"tensor {last}" in message and "truncated download?" in message


def test_tensor_past_the_end(model):
    parts, reader = _tensor_parts(model, "blk.1.ffn_down.weight")
    del reader
    _patch(model, parts["offset"], struct.pack("<Q", 1 << 30))
    message = _error(model)
    assert "tensor blk.1.ffn_down.weight" in message and "truncated download?" in message


def test_misaligned_tensor(model):
    parts, reader = _tensor_parts(model, "blk.0.attn_q.weight")
    offset = int(next(t for t in reader.tensors if t.name == "blk.0.attn_q.weight").field.parts[5][0])
    del reader
    _patch(model, parts["offset"], struct.pack("<Q", offset + 4))
    assert "not a multiple of the alignment 32" in _error(model)


def test_absurd_dimensions(model):
    parts, reader = _tensor_parts(model, "blk.0.attn_q.weight")
    del reader
    _patch(model, parts["dims"], struct.pack("<Q", (1 << 50) * 32))
    assert "tensor blk.0.attn_q.weight has dimensions" in _error(model)


def test_too_many_dimensions(model):
    parts, reader = _tensor_parts(model, "output_norm.weight")
    del reader
    _patch(model, parts["n_dims"], struct.pack("<I", 9))
    assert "9 dimensions" in _error(model)


def test_unknown_tensor_type_id(model):
    parts, reader = _tensor_parts(model, "blk.0.ffn_up.weight")
    del reader
    _patch(model, parts["type"], struct.pack("<I", 77))
    assert "unknown ggml type id 77" in _error(model)


def test_block_type_with_partial_rows(model):
    parts, reader = _tensor_parts(model, "blk.0.ffn_down.weight")  # F32 rows of 84 values
    del reader
    _patch(model, parts["type"], struct.pack("<I", int(gguf.GGMLQuantizationType.Q8_0)))
    assert "not a multiple of the Q8_0 block of 32" in _error(model)


# ---- well-formed files that pyllama cannot run ---------------------------------------------------


@pytest.mark.parametrize(("written", "patched"), [("f32", "I32"), ("f16", "I16")])
def test_unsupported_tensor_type(tmp_path, written, patched):
    """A well-formed matrix of a type no kernel multiplies (an integer tensor of the same byte size)."""
    name = "blk.1.attn_v.weight"
    path = write_random_gguf(tmp_path / "m.gguf", tensor_types={name: written})
    parts, reader = _tensor_parts(path, name)
    del reader
    _patch(path, parts["type"], struct.pack("<I", int(gguf.GGMLQuantizationType[patched])))
    message = _error(path)
    assert f"{name} is stored as {patched}" in message and "F32, F16, BF16, Q8_0, Q4_0" in message


def test_row_not_a_multiple_of_a_k_quant_block(model):
    """A 64-value row relabelled Q4_K (256-value blocks): refused before any byte is read as blocks."""
    parts, reader = _tensor_parts(model, "blk.0.attn_q.weight")
    del reader
    _patch(model, parts["type"], struct.pack("<I", int(gguf.GGMLQuantizationType.Q4_K)))
    assert "blk.0.attn_q.weight (Q4_K) has rows of 64 values, not a multiple of the Q4_K block of 256" in _error(model)


@pytest.mark.parametrize("arch", ["gpt2", "phi3", "mamba"])
def test_unsupported_architecture(tmp_path, arch):
    path = write_random_gguf(tmp_path / "m.gguf", arch=arch)
    assert f"architecture {arch!r} is not supported; pyllama runs llama, qwen2, qwen3 and gemma3 models" in _error(path)


def test_missing_tensor(tmp_path):
    path = write_random_gguf(tmp_path / "m.gguf", skip_tensors=("blk.1.ffn_up.weight",))
    assert "tensor blk.1.ffn_up.weight is missing" in _error(path)


def test_qwen2_requires_its_biases(tmp_path):
    path = write_random_gguf(tmp_path / "m.gguf", arch="qwen2", skip_tensors=("blk.0.attn_k.bias",))
    assert "tensor blk.0.attn_k.bias is missing" in _error(path)


def test_tensors_pyllama_would_ignore(tmp_path):
    path = write_random_gguf(tmp_path / "m.gguf", extra_tensors={"blk.1.post_ffw_norm.weight": np.ones(64, np.float32)})
    assert "tensors pyllama would ignore: blk.1.post_ffw_norm.weight" in _error(path)
    path = write_random_gguf(tmp_path / "b.gguf", extra_tensors={"blk.0.attn_output.bias": np.ones(64, np.float32)})
    assert "blk.0.attn_output.bias" in _error(path)


def test_missing_required_key(tmp_path):
    path = write_random_gguf(tmp_path / "m.gguf", skip_keys=("context_length",))
    assert "metadata key llama.context_length is missing" in _error(path)


def test_key_of_the_wrong_type(tmp_path):
    path = write_random_gguf(
        tmp_path / "m.gguf", skip_keys=("context_length",), extra_kv={"{arch}.context_length": ("long", VT.STRING)}
    )
    assert "llama.context_length should be an integer, found string" in _error(path)


def test_shapes_that_disagree_with_the_metadata(tmp_path):
    path = write_random_gguf(
        tmp_path / "m.gguf",
        n_kv_heads=2,
        skip_keys=("head_count_kv",),
        extra_kv={"{arch}.attention.head_count_kv": (1, VT.UINT32)},
    )
    message = _error(path)
    assert "blk.0.attn_k.weight has shape [64, 32]" in message and "need [64, 16]" in message


def test_heads_not_in_whole_groups(tmp_path):
    path = write_random_gguf(
        tmp_path / "m.gguf", skip_keys=("head_count_kv",), extra_kv={"{arch}.attention.head_count_kv": (3, VT.UINT32)}
    )
    assert "head_count=4 is not a multiple of head_count_kv=3" in _error(path)


def test_vocabulary_and_embedding_disagree(tmp_path):
    path = write_random_gguf(
        tmp_path / "m.gguf", with_vocab=False, extra_kv={"tokenizer.ggml.tokens": (["a", "b", "c"], VT.ARRAY)}
    )
    assert "the vocabulary lists 3 tokens but token_embd.weight has 96 rows" in _error(path)


@pytest.mark.parametrize(
    "key,value,words",
    [
        ("{arch}.expert_count", (8, VT.UINT32), "mixture-of-experts"),
        ("{arch}.rope.scaling.factor", (4.0, VT.FLOAT32), "RoPE scaling"),
    ],
)
def test_model_features_pyllama_does_not_have(tmp_path, key, value, words):
    path = write_random_gguf(tmp_path / "m.gguf", extra_kv={key: value})
    assert words in _error(path)


def test_llama_rotates_whole_heads(tmp_path):
    path = write_random_gguf(tmp_path / "m.gguf", n_rot=8)
    assert "rope.dimension_count=8 but the head size is 16" in _error(path)


def test_random_corruption_gives_checkpoint_errors_only(model):
    """Random byte flips and truncations: the file loads or raises CheckpointError, nothing else."""
    raw = model.read_bytes()
    header_end = gguf.GGUFReader(model).data_offset
    rng = np.random.default_rng(0)
    for trial in range(150):
        data = bytearray(raw)
        for _ in range(int(rng.integers(1, 4))):
            data[int(rng.integers(0, header_end))] = int(rng.integers(0, 256))
        if trial % 5 == 0:
            data = data[: int(rng.integers(0, len(data)))]
        model.write_bytes(bytes(data))
        try:
            load_gguf(model)
        except CheckpointError:
            pass


def test_cli_prints_one_line(model):
    raw = model.read_bytes()
    model.write_bytes(raw[: len(raw) // 2])
    result = CliRunner().invoke(main, ["info", str(model)])
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: model.gguf:") and "truncated" in lines[0]


def test_load_checkpoint_dispatches_on_the_magic(model, tmp_path):
    renamed = tmp_path / "model.bin"
    renamed.write_bytes(model.read_bytes())
    cfg, weights = load_checkpoint(renamed)
    assert weights.format.startswith("GGUF v3 llama")
