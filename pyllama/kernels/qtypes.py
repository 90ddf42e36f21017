"""The weight types pyllama multiplies, as Python sees them: the rows of the C table in ``qtypes.h``.

Each type is written once, as a row of that table (ggml's name and GGUF id, values and bytes per block,
what the activation is quantised to, the kernels); ``pyllama.kernels.qproduct`` compiles it and
``type_rows`` reads it out. Everything here is made from those rows: ``QType`` (a type's name and id,
which ``Tensor.qtype`` holds and the kernels index the table with) and ``STORED_TYPES`` (the types a GGUF
file may store, which the loader checks tensors against). The activation is the type llama.cpp pairs
with the weight type (its ``vec_dot_type``), except for F16 and BF16, whose activation pyllama keeps in
float32 (llama.cpp rounds it to F16 or BF16). Adding a type is adding its row and its kernel file
(``qtypes.h`` says how).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import EnumMeta, IntEnum
from typing import TYPE_CHECKING, NamedTuple

from gguf import GGMLQuantizationType as G

from pyllama.kernels.qproduct import type_rows


class TypeRow(NamedTuple):
    id: int
    name: str | None
    ggml: int  # GGUF type id; -1 for a type GGUF does not have
    block: int  # values per block
    block_bytes: int  # bytes per block
    activation: str | None  # what x is quantised to before the products
    work_div: int  # weights per float32 multiply-add of work, for the thread decisions


TYPE_ROWS = tuple(TypeRow(*row) for row in type_rows())

if TYPE_CHECKING:

    class _QTypeMeta(EnumMeta):
        def __getattr__(cls, name: str) -> QType: ...

    class QType(IntEnum, metaclass=_QTypeMeta):
        """How a matrix is stored: one member per row of the table, named as ggml names the type."""

else:
    QType = IntEnum("QType", [(row.name, row.id) for row in TYPE_ROWS if row.name], module=__name__)
    QType.__doc__ = "How a matrix is stored: one member per row of the table, named as ggml names the type."


@dataclass(frozen=True)
class StoredType:
    qtype: QType
    ggml: G
    block: int  # values per block
    block_bytes: int  # bytes per block
    activation: str  # what x is quantised to before the products


STORED_TYPES = tuple(
    StoredType(QType(row.id), G(row.ggml), row.block, row.block_bytes, row.activation or "")
    for row in TYPE_ROWS
    if row.name and row.ggml >= 0
)
BY_GGML = {t.ggml: t for t in STORED_TYPES}
BY_QTYPE = {t.qtype: t for t in STORED_TYPES}
