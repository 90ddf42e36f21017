"""The checked GGUF reader: gguf-py's ``GGUFReader`` (llama.cpp's own reader: ``np.memmap`` plus
zero-copy views) behind a subclass that turns every short read and implausible size into a
one-line ``CheckpointError`` instead of an ``IndexError``, a reshape error or a loop over a
2^60-element array. The key/value metadata is read by ``gguf_meta`` in bulk (gguf-py makes one
numpy view per array element: seconds for a large vocabulary). Format: ggml's ``docs/gguf.md``.
"""

from __future__ import annotations

from pathlib import Path
from typing import BinaryIO

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader, GGUFValueType
from gguf.gguf_reader import ReaderField

from pyllama.checkpoint.gguf_meta import MalformedGGUF, MetaValue, read_metadata
from pyllama.errors import CheckpointError

GGUF_MAGIC = b"GGUF"
GGML_MAX_DIMS = 4

INTEGER_TYPES = {  # GGUF value types that hold an integer (metadata checks here and in the tokenizer)
    GGUFValueType.UINT8,
    GGUFValueType.INT8,
    GGUFValueType.UINT16,
    GGUFValueType.INT16,
    GGUFValueType.UINT32,
    GGUFValueType.INT32,
    GGUFValueType.UINT64,
    GGUFValueType.INT64,
}

_Malformed = MalformedGGUF  # raised inside the reader; ``open_gguf`` prefixes the file name


class CheckedReader(GGUFReader):
    """``GGUFReader`` with bounds checks on every read, on array lengths and on tensor extents.

    gguf-py slices its memmap without checking the file's end (a short slice then fails somewhere
    later with an unrelated message, or a huge array length loops for ever over empty reads), and
    computes tensor sizes in wrapping uint64. These overrides check first and say what is wrong.

    The metadata is parsed by ``gguf_meta.read_metadata`` into ``self.metadata`` (key -> MetaValue);
    ``self.fields`` holds only gguf-py's own header fields (and ``general.alignment``, which it reads).
    """

    metadata: dict[str, MetaValue]

    def _get(self, offset, dtype, count=1, override_order=None):
        end = int(offset) + np.dtype(dtype).itemsize * int(count)
        if end > self.data.size:
            raise _Malformed(
                f"truncated: a read of {int(count)} x {np.dtype(dtype).name} at byte {int(offset):,} "
                f"needs {end:,} bytes, the file has {self.data.size:,}"
            )
        return super()._get(offset, dtype, count, override_order)

    def _build_fields(self, offs, count):
        self.metadata, end = read_metadata(self.data, int(offs), int(count))
        alignment = self.metadata.get("general.alignment")
        if alignment is not None:  # gguf-py checks its type and value
            value = np.array([alignment.value if alignment.type != GGUFValueType.ARRAY else 0])
            self._push_field(ReaderField(alignment.offset, "general.alignment", [value], [0], [alignment.type]), True)
        return end

    def _get_tensor_info_field(self, orig_offs):
        # check the dimension count before gguf-py reads that many dimensions and misreads the rest
        name_len = int(self._get(orig_offs, np.uint64)[0])
        name = bytes(self._get(orig_offs + 8, np.uint8, min(name_len, 256))).decode("utf-8", errors="replace")
        n_dims = int(self._get(orig_offs + 8 + name_len, np.uint32)[0])
        if not 1 <= n_dims <= GGML_MAX_DIMS:
            raise _Malformed(f"tensor {name} has {n_dims} dimensions (GGUF allows 1 to {GGML_MAX_DIMS})")
        return super()._get_tensor_info_field(orig_offs)

    def _build_tensors(self, start_offs, fields):
        file_size = int(self.data.size)
        for field in fields:
            _, name_data, _, dims, raw_dtype, offset = field.parts
            name = bytes(name_data).decode("utf-8", errors="replace")
            shape = [int(d) for d in dims]
            if any(d <= 0 or d > 1 << 40 for d in shape):
                raise _Malformed(f"tensor {name} has dimensions {shape}: corrupt tensor info")
            try:
                qtype = GGMLQuantizationType(int(raw_dtype[0]))
            except ValueError:
                raise _Malformed(f"tensor {name} has unknown ggml type id {int(raw_dtype[0])}") from None
            block, type_size = GGML_QUANT_SIZES[qtype]
            if shape[0] % block:
                raise _Malformed(
                    f"tensor {name} ({qtype.name}) has rows of {shape[0]} values, "
                    f"not a multiple of the {qtype.name} block of {block}"
                )
            n_elements = int(np.prod(shape, dtype=object))
            n_bytes = n_elements // block * type_size
            start = start_offs + int(offset[0])
            if int(offset[0]) % self.alignment:
                raise _Malformed(
                    f"tensor {name} starts at data offset {int(offset[0]):,}, "
                    f"not a multiple of the alignment {self.alignment}"
                )
            if start + n_bytes > file_size:
                raise _Malformed(
                    f"tensor {name} {shape} ({qtype.name}) ends at byte {start + n_bytes:,} but the file has "
                    f"{file_size:,} bytes: truncated download?"
                )
        super()._build_tensors(start_offs, fields)


def open_gguf(path: Path) -> CheckedReader:
    """Map and parse a GGUF file once: header, metadata (``.metadata``) and tensor infos, all checked.

    For a caller that has not looked at the file yet: its magic is checked first (``read_gguf``
    is the same without that read, for a file ``sniff_checkpoint`` has already looked at)."""
    _check_size(path)
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise CheckpointError(f"{path.name}: not a GGUF file: it starts with {magic!r}, expected {GGUF_MAGIC!r}")
    return read_gguf(path)


def _check_size(path: Path) -> None:
    size = path.stat().st_size
    if size < 24:
        raise CheckpointError(f"{path.name}: {size} bytes is too small for a GGUF header (24 bytes)")


def read_gguf(path: Path, file: BinaryIO | None = None) -> CheckedReader:
    """Map and parse a GGUF file whose first bytes have been checked: header, metadata, tensor infos.
    ``file``: ``path`` already open (``read_checkpoint``), mapped instead of opening it again."""
    name = path.name
    _check_size(path)
    try:
        # gguf-py annotates `path` as a file name, but only hands it to np.memmap, which maps an open file too
        reader = CheckedReader(path if file is None else file, "r")  # type: ignore[arg-type]
    except _Malformed as exc:
        raise CheckpointError(f"{name}: {exc}") from None
    except (ValueError, KeyError, IndexError, OverflowError, UnicodeDecodeError, MemoryError) as exc:
        # what gguf-py raises itself: bad version, duplicate keys or tensors, bad alignment ...
        raise CheckpointError(f"{name}: not a readable GGUF file: {exc}") from None
    if reader.byte_order != "I":
        raise CheckpointError(f"{name}: a big-endian GGUF file; pyllama reads little-endian GGUF only")
    return reader
