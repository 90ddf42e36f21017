"""The bulk metadata reader against gguf-py's ``GGUFReader`` (the independent reference), and on broken files.

Every key of every shared GGUF file must read the same as gguf-py reads it; corrupt lengths inside
the vocabulary arrays must be one-line errors that name the key, through the loader and through the
tokenizer alike.
"""

from __future__ import annotations

import struct
import time

import gguf
import numpy as np
import pytest
from conftest import shared_file
from gguf import GGUFValueType as VT

from pyllama.checkpoint.gguf import load_gguf, open_gguf
from pyllama.checkpoint.gguf_meta import MalformedGGUF, read_metadata, read_metadata_file
from pyllama.errors import CheckpointError, TokenizerError
from pyllama.tokenizer import load_gguf_tokenizer, load_tokenizer

SMALL_GGUFS = ["stories260K-f32.gguf", "stories260K-q8_0.gguf"]  # gguf-py parses these in well under a second
LARGE_GGUFS = [
    "SmolLM2-135M-Instruct.Q4_1.gguf",
    "vocab/ggml-vocab-gpt-2.gguf",
    "vocab/ggml-vocab-llama-spm.gguf",
    "vocab/ggml-vocab-qwen2.gguf",
]
_SCALAR_FORMATS = {VT.UINT8: "B", VT.INT8: "b", VT.UINT16: "H", VT.INT16: "h", VT.UINT32: "I", VT.INT32: "i"}
_SCALAR_FORMATS |= {VT.FLOAT32: "f", VT.UINT64: "Q", VT.INT64: "q", VT.FLOAT64: "d", VT.BOOL: "?"}


def _plain_metadata(data: bytes) -> dict[str, tuple[int, object]]:
    """A second reader, written for the test with struct alone: key -> (value type, value)."""

    def value(offset: int, vtype: int) -> tuple[object, int]:
        if vtype == VT.STRING:
            (n,) = struct.unpack_from("<Q", data, offset)
            return data[offset + 8 : offset + 8 + n], offset + 8 + n
        if vtype == VT.ARRAY:
            item_type, count = struct.unpack_from("<IQ", data, offset)
            offset += 12
            items = []
            for _ in range(count):
                item, offset = value(offset, item_type)
                items.append(item)
            return items, offset
        fmt = "<" + _SCALAR_FORMATS[VT(vtype)]
        return struct.unpack_from(fmt, data, offset)[0], offset + struct.calcsize(fmt)

    (kv_count,) = struct.unpack_from("<Q", data, 16)
    offset, out = 24, {}
    for _ in range(kv_count):
        key, offset = value(offset, VT.STRING)
        (vtype,) = struct.unpack_from("<I", data, offset)
        item, offset = value(offset + 4, vtype)
        out[key.decode()] = (vtype, item)
    return out


def _as_plain(record) -> object:
    """A pyllama record in the plain reader's shape."""
    if record.type != VT.ARRAY:
        return record.value
    if record.item_type == VT.STRING:
        return [record.value.raw(i) for i in range(record.count)]
    if record.item_type == VT.ARRAY:
        return [_as_plain(item) for item in record.value]
    return record.value.tolist()


@pytest.mark.parametrize("name", SMALL_GGUFS + LARGE_GGUFS)
def test_every_key_reads_as_a_plain_struct_reader_reads_it(name):
    path = shared_file(name)
    expected = _plain_metadata(path.read_bytes())
    ours = read_metadata_file(path).metadata
    assert list(ours) == list(expected)
    for key, (vtype, value) in expected.items():
        assert ours[key].type == vtype and _as_plain(ours[key]) == value, key
        if ours[key].item_type == VT.STRING:  # decoding gives the same bytes back
            texts = ours[key].value.decode("surrogateescape")
            assert [t.encode("utf-8", "surrogateescape") for t in texts] == value, key


def _reference_value(field):
    """What gguf-py holds for a field, in the shape of the plain reader."""
    if field.types[0] == VT.ARRAY:
        if len(field.types) > 1 and field.types[1] == VT.STRING:
            return [bytes(field.parts[i]) for i in field.data]
        return [v for i in field.data for v in field.parts[i].tolist()]
    if field.types[0] == VT.STRING:
        return bytes(field.parts[-1])
    return field.parts[-1].tolist()[0]


@pytest.mark.parametrize("name", SMALL_GGUFS)
def test_every_key_reads_as_gguf_py_reads_it(name):
    path = shared_file(name)
    reference = gguf.GGUFReader(path)
    ours = read_metadata_file(path)
    expected = {k: f for k, f in reference.fields.items() if not k.startswith("GGUF.")}
    assert list(ours.metadata) == list(expected)
    assert ours.tensor_count == len(reference.tensors)
    for key, field in expected.items():
        record = ours.metadata[key]
        assert record.type == field.types[0] and _as_plain(record) == _reference_value(field), key


def test_the_loader_keeps_its_parse_for_the_vocabulary():
    """One parse: the model's Weights hold the parsed file, whose records build the tokenizer."""
    path = shared_file("stories260K-f32.gguf")
    _, weights = load_gguf(path)
    tok = load_gguf_tokenizer(weights.source)
    assert tok.encode("Once upon a time") == load_tokenizer(path).encode("Once upon a time")


def _pack(kvs: list[tuple[bytes, int, bytes]]) -> bytes:
    out = b"GGUF" + struct.pack("<IQQ", 3, 0, len(kvs))
    for key, vtype, value in kvs:
        out += struct.pack("<Q", len(key)) + key + struct.pack("<I", vtype) + value
    return out


def _strings(items: list[bytes], lengths: list[int] | None = None) -> bytes:
    lengths = [len(s) for s in items] if lengths is None else lengths
    body = b"".join(struct.pack("<Q", n) + s for n, s in zip(lengths, items, strict=True))
    return struct.pack("<IQ", int(VT.STRING), len(items)) + body


TOKENS = b"tokenizer.ggml.tokens"
MODEL_KV = (b"tokenizer.ggml.model", int(VT.STRING), struct.pack("<Q", 4) + b"gpt2")


@pytest.mark.parametrize(
    "value,words",
    [
        (_strings([b"a", b"bb", b"c"], [1, 1 << 40, 1]), "string 1 of 3 at byte"),  # a length past the end
        (_strings([b"a", b"b"], [1, 2**64 - 1]), "claims 18,446,744,073,709,551,615 bytes"),
        (struct.pack("<IQ", int(VT.STRING), 1 << 62) + struct.pack("<Q", 1) + b"a", "claims 4,611,686,018,427,387,904"),
        (struct.pack("<IQ", int(VT.INT32), 1 << 61), "claims 2,305,843,009,213,693,952 elements"),
        (struct.pack("<IQ", 99, 3), "unknown value type 99"),
    ],
)
def test_corrupt_vocabulary_arrays_name_the_key(tmp_path, value, words):
    path = tmp_path / "v.gguf"
    path.write_bytes(_pack([MODEL_KV, (TOKENS, int(VT.ARRAY), value)]))
    with pytest.raises(MalformedGGUF, match=words) as info:
        read_metadata_file(path)
    assert TOKENS.decode() in str(info.value)
    for loader, error in ((load_tokenizer, TokenizerError), (open_gguf, CheckpointError)):
        with pytest.raises(error) as info:
            loader(path)
        message = str(info.value)
        assert "\n" not in message and "v.gguf" in message and TOKENS.decode() in message


def test_a_cut_at_every_byte_of_a_vocabulary_is_an_error_never_a_crash(tmp_path):
    data = _pack([MODEL_KV, (TOKENS, int(VT.ARRAY), _strings([b"hello", b"\xc3\xa9t\xc3\xa9", b""]))])
    for cut in range(len(data)):
        with pytest.raises(MalformedGGUF):
            read_metadata(np.frombuffer(data[:cut], np.uint8), 24, 2)
    records, end = read_metadata(np.frombuffer(data, np.uint8), 24, 2)
    assert end == len(data) and records[TOKENS.decode()].value.decode() == ["hello", "été", ""]
    empty = _pack([(TOKENS, int(VT.ARRAY), _strings([]))])
    assert read_metadata(np.frombuffer(empty, np.uint8), 24, 1)[0][TOKENS.decode()].count == 0


def test_nested_arrays_and_every_scalar_type(tmp_path):
    path = tmp_path / "kv.gguf"
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_array("nested", [[1, 2], [3]])
    writer.add_array("floats", [0.5, -2.0])
    writer.add_bool("flag", True)
    writer.add_float64("f64", 1e-300)
    writer.add_int8("i8", -3)
    writer.add_uint64("u64", 2**64 - 1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    md = read_metadata_file(path).metadata
    assert [item.value.tolist() for item in md["nested"].value] == [[1, 2], [3]]
    assert md["floats"].value.tolist() == [0.5, -2.0]
    assert (md["flag"].value, md["f64"].value, md["i8"].value, md["u64"].value) == (True, 1e-300, -3, 2**64 - 1)


def test_typed_views_give_a_value_of_their_kind_and_refuse_another(tmp_path):
    path = tmp_path / "kv.gguf"
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_uint32("count", 7)
    writer.add_float32("eps", 0.25)
    writer.add_array("scores", [1.5, -2.0])
    writer.add_array("tokens", ["a", "bc"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    md = read_metadata_file(path).metadata
    assert (md["count"].scalar(), md["eps"].scalar(), md["general.architecture"].text()) == (7, 0.25, b"llama")
    assert md["scores"].numbers().tolist() == [1.5, -2.0] and md["tokens"].strings().decode() == ["a", "bc"]
    for view, record, message in [
        ("text", "count", "is uint32, not a string"),
        ("scalar", "tokens", "is array of string, not a scalar"),
        ("numbers", "tokens", "is array of string, not a numeric array"),
        ("strings", "scores", "is array of float32, not an array of strings"),
    ]:
        with pytest.raises(TypeError, match=message):
            getattr(md[record], view)()


def test_large_vocabulary_loads_without_per_element_parsing():
    """A guard, not a benchmark: the 151,936-token qwen2 vocabulary took 18 s with gguf-py's
    per-element parse and takes a few tenths of a second now; 5 s leaves room for a loaded machine."""
    path = shared_file("vocab/ggml-vocab-qwen2.gguf")
    start = time.process_time()
    tok = load_tokenizer(path)
    assert time.process_time() - start < 5.0
    assert tok.vocab_size == 151936 and tok.encode("Hello world") == [9707, 1879]


def test_model_load_parses_a_gguf_file_once(monkeypatch):
    """Model.load: one parse of the file serves config, weights and vocabulary."""
    import pyllama.checkpoint.gguf as gguf_loader
    import pyllama.tokenizer.files as tokenizer_files
    from pyllama.model import Model

    path = shared_file("stories260K-f32.gguf")
    parses = []
    real_read = gguf_loader.read_gguf  # the parse (open_gguf is the same after a check of the magic)
    monkeypatch.setattr(gguf_loader, "read_gguf", lambda p, *rest: parses.append(p) or real_read(p, *rest))

    def refuse(*args, **kwargs):
        raise AssertionError("the vocabulary was read from the file a second time")

    monkeypatch.setattr(tokenizer_files, "read_metadata_file", refuse)
    model = Model.load(path)
    assert len(parses) == 1
    assert model.tokenizer.encode("Once upon a time") == [1, 403, 407, 261, 378]
