"""The stored weight types pyllama multiplies: one row per type, which the GGUF loader checks tensors with.

A row says how ggml names the type (its GGUF type id), how many values a block holds, how many bytes a
block takes, and what the activation is quantised to before the row products: the type llama.cpp pairs
with it (its ``vec_dot_type``), except F16 and BF16, whose activation pyllama keeps in float32 (llama.cpp
rounds it to F16 or BF16). Adding a type is adding a row here, an enum value (``QType`` and
``matvec.pxd``) and its kernel.
"""

from __future__ import annotations

from dataclasses import dataclass

from gguf import GGMLQuantizationType as G

from pyllama.checkpoint.weights import QType


@dataclass(frozen=True)
class StoredType:
    qtype: QType
    ggml: G
    block: int  # values per block
    block_bytes: int  # bytes per block
    activation: str  # what x is quantised to before the products


STORED_TYPES = (
    StoredType(QType.F32, G.F32, 1, 4, "F32"),
    StoredType(QType.F16, G.F16, 1, 2, "F32"),
    StoredType(QType.BF16, G.BF16, 1, 2, "F32"),
    StoredType(QType.Q8_0, G.Q8_0, 32, 34, "Q8_0"),
    StoredType(QType.Q4_0, G.Q4_0, 32, 18, "Q8_0"),
    StoredType(QType.Q4_1, G.Q4_1, 32, 20, "Q8_1"),
    StoredType(QType.Q5_0, G.Q5_0, 32, 22, "Q8_0"),
    StoredType(QType.Q5_1, G.Q5_1, 32, 24, "Q8_1"),
    StoredType(QType.IQ4_NL, G.IQ4_NL, 32, 18, "Q8_0"),
    StoredType(QType.Q2_K, G.Q2_K, 256, 84, "Q8_K"),
    StoredType(QType.Q3_K, G.Q3_K, 256, 110, "Q8_K"),
    StoredType(QType.Q4_K, G.Q4_K, 256, 144, "Q8_K"),
    StoredType(QType.Q5_K, G.Q5_K, 256, 176, "Q8_K"),
    StoredType(QType.Q6_K, G.Q6_K, 256, 210, "Q8_K"),
)
BY_GGML = {t.ggml: t for t in STORED_TYPES}
BY_QTYPE = {t.qtype: t for t in STORED_TYPES}
