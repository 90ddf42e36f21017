"""``pyllama convert``: random-weight llama2.c checkpoints (made with the shared tool) to GGUF and back."""

from __future__ import annotations

import dataclasses
import struct
import subprocess
import sys

import gguf
import numpy as np
import pytest
from click.testing import CliRunner
from gguf_reference import SHARED_MODELS

from pyllama.checkpoint import QType, load_checkpoint
from pyllama.cli import main
from pyllama.convert import convert_llama2c, vocabulary
from pyllama.errors import InputError, PyllamaError
from pyllama.model import Model

TOOL = SHARED_MODELS.parent / "tools" / "make_llama2c_checkpoint.py"
VOCAB = 300


def make_checkpoint(path, *args: str):
    if not TOOL.exists():
        pytest.skip(f"the shared checkpoint tool is not present ({TOOL})")
    subprocess.run([sys.executable, str(TOOL), "custom", str(path), *args], check=True, capture_output=True)
    return path


def write_tokenizer(path, pieces: list[bytes]) -> None:
    """A llama2.c tokenizer file: int32 max length, then per token float32 score, int32 length, bytes."""
    out = struct.pack("<i", max(len(p) for p in pieces))
    for i, piece in enumerate(pieces):
        out += struct.pack("<fi", -float(i), len(piece)) + piece
    path.write_bytes(out)


PIECES = (
    [b"<unk>", b"\n<s>\n", b"\n</s>\n"]
    + [f"<0x{i:02X}>".encode() for i in range(256)]
    + [b" the", b"a b", b"", b"caf\xc3\xa9"]
    + [f"w{i}".encode() for i in range(VOCAB - 263)]
)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("convert")
    path = make_checkpoint(
        folder / "gqa.bin",
        "--dim",
        "64",
        "--hidden-dim",
        "100",
        "--layers",
        "2",
        "--heads",
        "4",
        "--kv-heads",
        "2",
        "--vocab",
        str(VOCAB),
        "--seq-len",
        "48",
        "--unshared-classifier",
        "--seed",
        "11",
    )
    write_tokenizer(folder / "tokenizer.bin", PIECES)
    return path


@pytest.mark.parametrize("alignment", [32, 64])
@pytest.mark.parametrize("qtype", ["f32", "f16", "q8_0"])
def test_converted_weights(checkpoint, tmp_path, qtype, alignment):
    # tokenizer.bin beside the checkpoint
    out = convert_llama2c(checkpoint, tmp_path / "m.gguf", qtype, alignment=alignment)
    cfg_b, wb = load_checkpoint(checkpoint)
    cfg_g, wg = load_checkpoint(tmp_path / "m.gguf")
    assert (
        cfg_g.dim,
        cfg_g.hidden_dim,
        cfg_g.n_layers,
        cfg_g.n_heads,
        cfg_g.n_kv_heads,
        cfg_g.vocab_size,
        cfg_g.seq_len,
    ) == (64, 100, 2, 4, 2, VOCAB, 48)
    assert not cfg_g.shared_classifier
    for tb, tg in zip(wb.tensors(), wg.tensors(), strict=True):
        assert tg.data.ctypes.data % alignment == 0, f"{tg.name}: written off a {alignment}-byte boundary"
        f32 = tb.dequantize()
        if qtype == "f32" or (qtype == "q8_0" and tb.cols % 32):
            assert tg.qtype == QType.F32 and np.array_equal(tg.data, f32), tg.name
        elif qtype == "f16":
            assert tg.qtype == QType.F16 and np.array_equal(tg.data, f32.astype(np.float16)), tg.name
        else:
            expected = gguf.quants.quantize(f32, gguf.GGMLQuantizationType.Q8_0)
            assert tg.qtype == QType.Q8_0 and np.array_equal(tg.data, expected), tg.name
    assert wg.layers[1].w2.qtype == (QType.F16 if qtype == "f16" else QType.F32)  # rows of 100 values
    assert out["tensor_types"]["F32"] >= 5


def test_f32_conversion_gives_the_same_logits(checkpoint, tmp_path):
    convert_llama2c(checkpoint, tmp_path / "m.gguf", "f32")
    a = Model(*load_checkpoint(checkpoint), threads=2).engine("causal")
    config, weights = load_checkpoint(tmp_path / "m.gguf")
    # the same arithmetic as the .bin: a GGUF file gets ggml's rmsnorm/SiLU by default
    b = Model(dataclasses.replace(config, arithmetic="run.c"), weights, threads=2).engine("causal")
    for pos, token in enumerate([1, 290, 7, 33, 299, 0, 5]):
        assert np.array_equal(a.forward(token, pos), b.forward(token, pos))


def test_vocabulary_follows_the_llama2c_converter(checkpoint, tmp_path):
    convert_llama2c(checkpoint, tmp_path / "m.gguf")
    r = gguf.GGUFReader(tmp_path / "m.gguf")
    tokens = r.fields["tokenizer.ggml.tokens"].contents()
    types = r.fields["tokenizer.ggml.token_type"].contents()
    assert tokens[:4] == ["<unk>", "<s>", "</s>", "<0x00>"] and types[:4] == [2, 3, 3, 6]
    assert tokens[259:263] == ["\u2581the", "a\u2581b", "", "café"] and types[259:263] == [1, 1, 3, 1]
    assert r.fields["tokenizer.ggml.scores"].contents()[:3] == [0.0, -1.0, -2.0]
    assert r.fields["tokenizer.ggml.model"].contents() == "llama"
    assert r.fields["general.architecture"].contents() == "llama"
    assert "llama.rope.freq_base" not in r.fields  # as the converter: readers default to 10000
    assert vocabulary([b"x y"])[0] == [b"<unk>"]


def test_errors(checkpoint, tmp_path):
    lone = tmp_path / "lone.bin"
    lone.write_bytes(checkpoint.read_bytes())
    with pytest.raises(PyllamaError, match="no tokenizer.bin beside it"):
        convert_llama2c(lone, tmp_path / "x.gguf")
    small = tmp_path / "small.bin"
    write_tokenizer(small, PIECES[:100])
    with pytest.raises(PyllamaError, match="vocabulary of 300"):
        convert_llama2c(checkpoint, tmp_path / "x.gguf", tokenizer=small)
    convert_llama2c(checkpoint, tmp_path / "m.gguf")
    with pytest.raises(PyllamaError, match="already a GGUF file"):
        convert_llama2c(tmp_path / "m.gguf", tmp_path / "y.gguf")
    assert not (tmp_path / "x.gguf").exists()
    result = CliRunner().invoke(main, ["convert", str(checkpoint), str(tmp_path / "z.gguf"), "--type", "q4_0"])
    assert result.exit_code == 2 and "q4_0" in result.output


def test_cli(checkpoint, tmp_path):
    result = CliRunner().invoke(main, ["convert", str(checkpoint), str(tmp_path / "q.gguf"), "--type", "q8_0"])
    assert result.exit_code == 0, result.output
    assert "Q8_0" in result.output and (tmp_path / "q.gguf").exists()


def test_default_alignment_writes_no_alignment_key_and_64_writes_it(checkpoint, tmp_path):
    """The default is GGUF's own (32, no key: llama-quantize, which pads its output at 32 whatever its
    input says, then writes a file that loads); 64 is written as general.alignment."""
    for alignment, want in ((32, None), (64, 64)):
        path = tmp_path / f"a{alignment}.gguf"
        convert_llama2c(checkpoint, path, "q8_0", alignment=alignment)
        reader = gguf.GGUFReader(path)
        field = reader.fields.get("general.alignment")
        got = None if field is None else int(field.parts[field.data[0]][0])
        assert got == want and reader.alignment == alignment
    with pytest.raises(InputError, match="--alignment"):
        convert_llama2c(checkpoint, tmp_path / "bad.gguf", "f32", alignment=48)
