"""Weights: read-only views into a memory-mapped model file, one ``Tensor`` per matrix.

Loaders (llama2.c ``.bin``, GGUF) produce ``(ModelConfig, Weights)``; the engine takes raw pointers
from these views once, when it is built. Nothing here copies or converts weight data; the one copy is
a tensor's packed copy for the products (``Tensor.packing``, kernels/qpacked.h), which the kernels make
on the first product that needs it and keep on the tensor, so that every engine of the process shares it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from gguf import GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize

from pyllama.kernels.qtypes import QType  # how a matrix is stored: a row of the type table


@dataclass
class Tensor:
    """One weight matrix of ``rows`` outputs by ``cols`` inputs, as stored in the file."""

    name: str
    qtype: QType
    rows: int
    cols: int
    data: np.ndarray  # the raw bytes as stored: float32/float16 (rows, cols) or uint8/int8 blocks
    scales: np.ndarray | None = None  # Q8_GROUPS: float32[rows * cols // group_size]
    group_size: int = 0
    # the kernels' packed copy of this matrix (pyllama.kernels.qproduct.PackedCopy), made on first use
    packing: object = field(default=None, repr=False, compare=False)

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes + (self.scales.nbytes if self.scales is not None else 0))

    def dequantize(self) -> np.ndarray:
        """float32 (rows, cols) copy: for tests and reference code only, never for the engine."""
        if self.qtype == QType.F32:
            return np.array(self.data, dtype=np.float32).reshape(self.rows, self.cols)
        if self.qtype == QType.F16:
            return np.asarray(self.data).astype(np.float32).reshape(self.rows, self.cols)
        if self.qtype == QType.Q8_GROUPS:
            q = np.asarray(self.data, dtype=np.int8).reshape(-1, self.group_size).astype(np.float32)
            return (q * np.asarray(self.scales)[:, None]).reshape(self.rows, self.cols)
        if self.qtype == QType.Q8_0:
            blocks = np.asarray(self.data, dtype=np.uint8).reshape(-1, 34)
            d = blocks[:, :2].copy().view(np.float16).astype(np.float32)
            q = blocks[:, 2:].view(np.int8).astype(np.float32)
            return (q * d).reshape(self.rows, self.cols)
        if self.qtype.name in GGMLQuantizationType.__members__:  # the ggml block types: gguf-py's dequantizer
            ggml_type = GGMLQuantizationType[self.qtype.name]
            return gguf_dequantize(np.asarray(self.data, dtype=np.uint8).reshape(self.rows, -1), ggml_type)
        raise ValueError(f"unknown qtype {self.qtype}")


@dataclass
class LayerWeights:
    attn_norm: np.ndarray  # float32[dim]
    wq: Tensor  # (n_heads * head_dim, dim)
    wk: Tensor  # (n_kv_heads * head_dim, dim)
    wv: Tensor  # (n_kv_heads * head_dim, dim)
    wo: Tensor  # (dim, n_heads * head_dim)
    ffn_norm: np.ndarray  # float32[dim]
    w1: Tensor  # gate (hidden_dim, dim)
    w2: Tensor  # down (dim, hidden_dim)
    w3: Tensor  # up (hidden_dim, dim)
    bq: np.ndarray | None = None  # qwen2 biases, float32
    bk: np.ndarray | None = None
    bv: np.ndarray | None = None
    q_norm: np.ndarray | None = None  # float32[head_dim]: RMSNorm weight of every query head (qwen3, gemma3)
    k_norm: np.ndarray | None = None  # float32[head_dim]: of every key head
    post_attention_norm: np.ndarray | None = None  # float32[dim]: RMSNorm of Wo's output (gemma3)
    post_ffn_norm: np.ndarray | None = None  # float32[dim]: RMSNorm of W2's output (gemma3)

    def vectors(self) -> list[np.ndarray]:
        """Every norm weight and bias the layer has."""
        return [
            v
            for v in (self.attn_norm, self.ffn_norm, self.bq, self.bk, self.bv, self.q_norm, self.k_norm)
            + (self.post_attention_norm, self.post_ffn_norm)
            if v is not None
        ]


@dataclass
class Weights:
    token_embedding: Tensor  # (vocab_size, dim)
    layers: list[LayerWeights]
    final_norm: np.ndarray  # float32[dim]
    classifier: Tensor  # (vocab_size, dim); the embedding itself when shared
    source: object = None  # keeps the memory map alive
    format: str = ""  # e.g. "llama2.c v0 (legacy float32)"
    file_bytes: int = 0

    def tensors(self) -> list[Tensor]:
        out = [self.token_embedding]
        for layer in self.layers:
            out += [layer.wq, layer.wk, layer.wv, layer.wo, layer.w1, layer.w2, layer.w3]
        if self.classifier is not self.token_embedding:
            out.append(self.classifier)
        return out

    def parameter_count(self) -> int:
        n = sum(t.rows * t.cols for t in self.tensors())
        n += self.final_norm.size + sum(v.size for lw in self.layers for v in lw.vectors())
        return int(n)
