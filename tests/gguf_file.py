"""A small GGUF reader for the numpy references, written from ggml's ``docs/gguf.md``: the header,
the scalar metadata and the tensor infos, with each tensor's data a view of the mapped file.

gguf-py's ``GGUFReader`` builds a numpy view per array element, which takes ~10 s for Gemma 3's
262,144-token vocabulary; the references read no vocabulary, so string arrays are stepped over
(their lengths are read, their bytes are not) and numeric arrays kept as one view. It checks
nothing a test would hit: the files are the shared references and files gguf-py just wrote.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

_SCALARS = {  # GGUF value type -> its struct format (little-endian); numpy's dtype takes the same letters
    0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d",
}  # fmt: skip
STRING, ARRAY, BOOL = 8, 9, 7
ALIGNMENT = 32  # general.alignment's default


@dataclass
class StoredTensor:
    name: str
    tensor_type: GGMLQuantizationType
    shape: list[int]  # ggml order: ne0 (a row's length) first
    data: np.ndarray  # float32 / float16 values, or the raw bytes (rows, row bytes) of a block type


class GGUFFile:
    """``fields``: metadata key -> value (a scalar, a str, a list for a numeric array, None for a string
    array); ``tensors``: name -> ``StoredTensor``."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.data = np.memmap(path, mode="r")
        self._view = memoryview(self.data)
        magic, version, n_tensors, n_kv = struct.unpack_from("<4sIQQ", self._view, 0)
        assert magic == b"GGUF" and version in (2, 3), (magic, version)
        self._at = 24
        self.fields = {}
        for _ in range(n_kv):
            key = self._string()
            self.fields[key] = self._value(self._u32())
        infos = [
            (self._string(), [self._u64() for _ in range(self._u32())], self._u32(), self._u64())
            for _ in range(n_tensors)
        ]
        alignment = self.fields.get("general.alignment", ALIGNMENT)
        start = -(-self._at // alignment) * alignment
        self.tensors = {name: self._tensor(name, ne, raw, start + offset) for name, ne, raw, offset in infos}

    def _read(self, fmt: str):
        (value,) = struct.unpack_from(fmt, self._view, self._at)
        self._at += struct.calcsize(fmt)
        return value

    def _u32(self) -> int:
        return self._read("<I")

    def _u64(self) -> int:
        return self._read("<Q")

    def _string(self) -> str:
        n = self._u64()
        self._at += n
        return bytes(self._view[self._at - n : self._at]).decode("utf-8", errors="replace")

    def _value(self, vtype: int):
        if vtype == STRING:
            return self._string()
        if vtype != ARRAY:
            return self._read(_SCALARS[vtype])
        item, count = self._u32(), self._u64()
        if item == STRING:
            for _ in range(count):  # step over the strings
                self._at += 8 + struct.unpack_from("<Q", self._view, self._at)[0]
            return None
        if item == ARRAY:
            return [self._value(ARRAY) for _ in range(count)]
        dtype = np.dtype(_SCALARS[item])
        values = np.frombuffer(self._view, dtype, count, self._at)
        self._at += count * dtype.itemsize
        return values.tolist()

    def _tensor(self, name: str, ne: list[int], raw_type: int, offset: int) -> StoredTensor:
        ggml_type = GGMLQuantizationType(raw_type)
        block, block_bytes = GGML_QUANT_SIZES[ggml_type]
        rows = int(np.prod(ne[1:]))
        row_bytes = ne[0] // block * block_bytes
        raw = self.data[offset : offset + rows * row_bytes].reshape(rows, row_bytes)
        if ggml_type in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
            dtype = np.float32 if ggml_type == GGMLQuantizationType.F32 else np.float16
            raw = raw.view(dtype)
        return StoredTensor(name, ggml_type, ne, raw if len(ne) > 1 else raw.reshape(-1))
