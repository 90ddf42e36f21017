"""GGUF key/value metadata, read in bulk from the mapped file with every length checked.

Owns the metadata section of a GGUF file (ggml's ``docs/gguf.md``: ``kv_count`` entries of key
string, uint32 value type, value; strings are a uint64 byte length and the bytes; arrays are a
uint32 item type, a uint64 count and the items). gguf-py's ``GGUFReader`` parses each array element
into its own numpy view, which costs seconds for a 150,000-token vocabulary; here a numeric array
is one zero-copy view of the map, and a string array is found in one tight pass over its length
prefixes (a table of offsets and lengths), decoded only when asked for.

Every count and length is checked against the bytes left in the file before it is used, so a
corrupt length is a ``MalformedGGUF`` naming the key, never a loop over 2^60 elements or an
``IndexError``. Callers add the file name and turn it into their own ``PyllamaError``.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from typing import BinaryIO

import numpy as np
from gguf import GGUFValueType

from pyllama.checkpoint import strings

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_SCALARS: dict[GGUFValueType, np.dtype] = {  # little-endian: pyllama reads little-endian GGUF only
    GGUFValueType.UINT8: np.dtype("<u1"),
    GGUFValueType.INT8: np.dtype("<i1"),
    GGUFValueType.UINT16: np.dtype("<u2"),
    GGUFValueType.INT16: np.dtype("<i2"),
    GGUFValueType.UINT32: np.dtype("<u4"),
    GGUFValueType.INT32: np.dtype("<i4"),
    GGUFValueType.FLOAT32: np.dtype("<f4"),
    GGUFValueType.UINT64: np.dtype("<u8"),
    GGUFValueType.INT64: np.dtype("<i8"),
    GGUFValueType.FLOAT64: np.dtype("<f8"),
    GGUFValueType.BOOL: np.dtype("u1"),
}
# the fewest bytes one key/value entry takes: key length, type, a one-byte value
_MIN_ENTRY_BYTES = 8 + 4 + 1
_MIN_ITEM_BYTES = {GGUFValueType.STRING: 8, GGUFValueType.ARRAY: 12}
MAX_KEY_BYTES = 1 << 16  # llama.cpp's keys are tens of bytes; a longer one is corrupt


class MalformedGGUF(Exception):
    """The metadata is not what its own lengths say; the message names the key and the byte."""


class StringArray:
    """A GGUF array of strings, left in the map: the byte offset and length of each string."""

    def __init__(self, data: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> None:
        self._data = data
        self.starts = starts  # int64[count]
        self.lengths = lengths  # int64[count]

    def __len__(self) -> int:
        return len(self.starts)

    def raw(self, i: int) -> bytes:
        start = int(self.starts[i])
        return bytes(self._data[start : start + int(self.lengths[i])])

    def decode(self, errors: str = "strict") -> list[str]:
        """Every string as UTF-8 text (``errors`` as in ``bytes.decode``)."""
        return strings.decode(self._data, self.starts, self.lengths, errors)


@dataclass(frozen=True)
class MetaValue:
    """One metadata value. ``value``: int/float/bool for scalars, bytes for a string, a read-only
    numpy view for a numeric array, a ``StringArray``, or a list of ``MetaValue`` for nested arrays."""

    type: GGUFValueType
    item_type: GGUFValueType | None  # arrays only
    value: object
    offset: int  # where the value starts in the file

    @property
    def count(self) -> int:
        """Number of elements of an array (1 for a scalar)."""
        return len(self.value) if isinstance(self.value, (np.ndarray, StringArray, list)) else 1

    # Typed views of ``value``. The caller has checked ``type`` (and ``item_type``) and says which
    # one it expects; a mismatch is a caller's mistake, not a bad file, hence a TypeError.
    def text(self) -> bytes:
        """A string's bytes."""
        if isinstance(self.value, bytes):
            return self.value
        raise self._not("a string")

    def scalar(self) -> int | float:
        """A number or a bool (a bool is an int)."""
        if isinstance(self.value, (int, float)):
            return self.value
        raise self._not("a scalar")

    def numbers(self) -> np.ndarray:
        """A numeric array: a read-only view of the map."""
        if isinstance(self.value, np.ndarray):
            return self.value
        raise self._not("a numeric array")

    def strings(self) -> StringArray:
        """An array of strings."""
        if isinstance(self.value, StringArray):
            return self.value
        raise self._not("an array of strings")

    def _not(self, what: str) -> TypeError:
        return TypeError(f"the metadata value at byte {self.offset:,} is {self.type_name()}, not {what}")

    def type_name(self) -> str:
        """``uint32``, ``string``, ``array of int32`` (for messages)."""
        if self.type != GGUFValueType.ARRAY or self.item_type is None:
            return self.type.name.lower()
        return f"array of {self.item_type.name.lower()}"


class _Cursor:
    """Reads little-endian values from ``data`` (a uint8 view of the file), checking the end first."""

    def __init__(self, data: np.ndarray) -> None:
        self.array = data
        self.view = data.data  # the array's buffer as a memoryview (no copy)
        self.size = int(data.size)

    def need(self, offset: int, n: int, what: str) -> None:
        if n < 0 or offset + n > self.size:
            left = max(self.size - offset, 0)
            raise MalformedGGUF(f"truncated: {what} at byte {offset:,} needs {n:,} bytes, the file has {left:,} left")

    def u32(self, offset: int, what: str) -> int:
        self.need(offset, 4, what)
        return _U32.unpack_from(self.view, offset)[0]

    def u64(self, offset: int, what: str) -> int:
        self.need(offset, 8, what)
        return _U64.unpack_from(self.view, offset)[0]

    def string(self, offset: int, what: str) -> tuple[bytes, int]:
        n = self.u64(offset, what)
        self.need(offset + 8, n, f"{what} of {n:,} bytes")
        return bytes(self.view[offset + 8 : offset + 8 + n]), offset + 8 + n


def _value_type(raw: int, offset: int, key: str) -> GGUFValueType:
    try:
        return GGUFValueType(raw)
    except ValueError:
        raise MalformedGGUF(
            f"not a readable GGUF file: metadata {key} has unknown value type {raw} at byte {offset:,}"
        ) from None


def _strings(cur: _Cursor, offset: int, count: int, key: str) -> tuple[StringArray, int]:
    """The spans of ``count`` length-prefixed strings: one pass in C, each length checked."""
    starts, lengths, end = strings.scan(cur.array, offset, count)
    if end < 0:
        i = -1 - end
        at = int(starts[i])  # where string i's length prefix is
        if at + 8 > cur.size:
            said = "runs past the end of the file"
        else:
            said = f"claims {_U64.unpack_from(cur.view, at)[0]:,} bytes, the file has {cur.size - at - 8:,} left"
        raise MalformedGGUF(f"truncated: metadata {key}: string {i:,} of {count:,} at byte {at:,} {said}")
    return StringArray(cur.array, starts, lengths), end


def _array(cur: _Cursor, offset: int, key: str, depth: int) -> tuple[MetaValue, int]:
    item_type = _value_type(cur.u32(offset, f"metadata {key}: array type"), offset, key)
    count = cur.u64(offset + 4, f"metadata {key}: array length")
    start = offset + 12
    left = cur.size - start
    itemsize = _SCALARS[item_type].itemsize if item_type in _SCALARS else _MIN_ITEM_BYTES[item_type]
    if count * itemsize > left:
        raise MalformedGGUF(
            f"metadata {key}: an array at byte {offset:,} claims {count:,} elements, more than the "
            f"{max(left, 0):,} bytes left in the file can hold: truncated file or corrupt metadata"
        )
    if item_type in _SCALARS:
        dtype = _SCALARS[item_type]
        values = cur.array[start : start + count * dtype.itemsize].view(dtype)
        if item_type == GGUFValueType.BOOL:
            values = values.astype(bool)
        return MetaValue(GGUFValueType.ARRAY, item_type, values, offset), start + count * dtype.itemsize
    if item_type == GGUFValueType.STRING:
        strings, end = _strings(cur, start, count, key)
        return MetaValue(GGUFValueType.ARRAY, item_type, strings, offset), end
    if depth > 8:
        raise MalformedGGUF(f"metadata {key}: arrays nested deeper than 8 levels at byte {offset:,}: corrupt metadata")
    items = []
    for _ in range(count):  # nested arrays: rare and small
        item, start = _value(cur, start, item_type, key, depth + 1)
        items.append(item)
    return MetaValue(GGUFValueType.ARRAY, item_type, items, offset), start


def _value(cur: _Cursor, offset: int, vtype: GGUFValueType, key: str, depth: int = 0) -> tuple[MetaValue, int]:
    if vtype == GGUFValueType.STRING:
        text, end = cur.string(offset, f"metadata {key}: a string")
        return MetaValue(vtype, None, text, offset), end
    if vtype == GGUFValueType.ARRAY:
        return _array(cur, offset, key, depth)
    dtype = _SCALARS[vtype]
    cur.need(offset, dtype.itemsize, f"metadata {key}: a {vtype.name.lower()}")
    value = cur.array[offset : offset + dtype.itemsize].view(dtype)[0].item()
    if vtype == GGUFValueType.BOOL:
        value = bool(value)
    return MetaValue(vtype, None, value, offset), offset + dtype.itemsize


def read_metadata(data: np.ndarray, offset: int, kv_count: int) -> tuple[dict[str, MetaValue], int]:
    """Parse ``kv_count`` key/value entries of ``data`` (uint8, the mapped file) from ``offset``.

    Returns the entries by key, in file order, and the offset just past them.
    """
    cur = _Cursor(data)
    if kv_count * _MIN_ENTRY_BYTES > cur.size - offset:
        raise MalformedGGUF(
            f"truncated: the header claims {kv_count:,} metadata entries, more than the "
            f"{cur.size - offset:,} bytes after it can hold"
        )
    records: dict[str, MetaValue] = {}
    for _ in range(kv_count):
        entry = offset
        key_len = cur.u64(offset, "a metadata key")
        if key_len > MAX_KEY_BYTES:
            cur.need(offset + 8, key_len, f"a metadata key of {key_len:,} bytes")
            raise MalformedGGUF(f"a metadata key of {key_len:,} bytes at byte {offset:,}: corrupt metadata")
        raw_key, offset = cur.string(offset, "a metadata key")
        key = raw_key.decode("utf-8", errors="replace")
        vtype = _value_type(cur.u32(offset, f"metadata {key}: value type"), offset, key)
        value, offset = _value(cur, offset + 4, vtype, key)
        if key in records:
            raise MalformedGGUF(f"not a readable GGUF file: duplicate metadata key {key} at byte {entry:,}")
        records[key] = value
    return records, offset


SUPPORTED_VERSIONS = (2, 3)  # as gguf-py's reader (version 1 had 32-bit lengths)
HEADER_BYTES = 24  # magic, uint32 version, uint64 tensor count, uint64 metadata count


@dataclass
class MetadataFile:
    """The header and metadata of a mapped GGUF file, without its tensor infos (for a vocabulary)."""

    data: np.ndarray  # the whole file, mapped read-only
    version: int
    tensor_count: int
    metadata: dict[str, MetaValue]


def read_metadata_file(path: str | os.PathLike[str], file: BinaryIO | None = None) -> MetadataFile:
    """Map ``path`` and parse its header and metadata; ``MalformedGGUF`` when they are broken.
    ``file``: ``path`` already open, mapped instead of opening it again."""
    data = np.memmap(path if file is None else file, mode="r") if os.path.getsize(path) else np.zeros(0, np.uint8)
    if data.size < HEADER_BYTES:
        raise MalformedGGUF(f"{data.size} bytes is too small for a GGUF header ({HEADER_BYTES} bytes)")
    if bytes(data[:4]) != b"GGUF":
        raise MalformedGGUF(f"not a GGUF file: it starts with {bytes(data[:4])!r}, expected b'GGUF'")
    version, tensor_count, kv_count = struct.unpack_from("<IQQ", data.data, 4)
    if version & 0xFFFF == 0:
        raise MalformedGGUF("a big-endian GGUF file; pyllama reads little-endian GGUF only")
    if version not in SUPPORTED_VERSIONS:
        raise MalformedGGUF(
            f"GGUF version {version}; pyllama reads versions {' and '.join(map(str, SUPPORTED_VERSIONS))}"
        )
    metadata, _ = read_metadata(data, HEADER_BYTES, kv_count)
    return MetadataFile(data, version, tensor_count, metadata)
