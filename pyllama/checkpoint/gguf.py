"""GGUF model files (llama.cpp's format), memory-mapped, never copied.

The file is read by the checked reader of ``gguf_reader`` (header, metadata and tensor infos,
every size checked); this module turns a parsed file into ``(ModelConfig, Weights)``. The parsed
file's ``metadata`` serves the config here and the vocabulary (``pyllama.tokenizer.gguf_vocab``),
so one parse of a file serves both. Format: ggml's ``docs/gguf.md``; tensor dimensions are in ggml order, ``ne0``
first: a matrix of ``ne = [cols, rows]`` stores row r at ``r * ne0`` (``ne0`` = inputs).

Supported: architectures ``llama`` (RoPE pairs (2i, 2i+1), optionally Llama 3's ``rope_freqs``
factors), ``qwen2`` (NEOX pairs (i, i + n_rot/2) and Q/K/V biases), ``qwen3`` (NEOX, per-head
QK-norm ``attn_q_norm``/``attn_k_norm``) and ``gemma3`` (NEOX, QK-norm, ``post_attention_norm`` and
``post_ffw_norm``), grouped-query attention, tied embeddings (no ``output.weight``), and matrices
stored in any type of ``pyllama.kernels.qtypes`` (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL,
Q2_K-Q6_K; types may differ per tensor, the token embedding included). Hyperparameters are
``gguf_config``'s; the vocabulary size is the embedding's rows, checked against the token list.
Every tensor of the file is used, or the file is refused: a tensor left over is a different model.

Conversions of llama2.c checkpoints need no permutation here: llama.cpp's llama2.c converter copies
wq/wk unchanged, because run.c and GGUF ``llama`` both rotate pairs (2i, 2i+1). (Its Hugging Face
converter does permute Q/K rows, since HF checkpoints rotate halves; the result is again GGUF's
pair layout.)
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import BinaryIO

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, Keys
from gguf.constants import MODEL_TENSOR, TENSOR_NAMES

from pyllama.checkpoint.gguf_config import ARCHITECTURES, SUPPORTED_ARCHS, Architecture, Meta, config_of
from pyllama.checkpoint.gguf_meta import MetaValue
from pyllama.checkpoint.gguf_reader import (  # open_gguf, read_gguf: re-exported, where callers import them
    GGUF_MAGIC,
    INTEGER_TYPES,
    CheckedReader,
    open_gguf,
    read_gguf,
)
from pyllama.checkpoint.weights import LayerWeights, Tensor, Weights
from pyllama.config import ModelConfig
from pyllama.errors import CheckpointError
from pyllama.kernels.qtypes import BY_GGML

__all__ = ["GGUF_MAGIC", "INTEGER_TYPES", "load_gguf", "model_of", "open_gguf", "parse_gguf", "read_gguf"]

MAX_VOCAB = 1 << 24  # no real vocabulary comes near it: a larger one is a corrupt header


def _tensor_name(kind: MODEL_TENSOR, suffix: str = "weight", layer: int | None = None) -> str:
    base = TENSOR_NAMES[kind]
    return f"{base.format(bid=layer) if layer is not None else base}.{suffix}"


class _Tensors:
    """The file's tensors by name; hands each out once, checked against the shape the model needs."""

    def __init__(self, reader: GGUFReader, name: str) -> None:
        self.name = name
        self.by_name = {t.name: t for t in reader.tensors}
        self.used: set[str] = set()

    def get(self, tname: str):
        t = self.by_name.get(tname)
        if t is None:
            raise CheckpointError(f"{self.name}: tensor {tname} is missing")
        self.used.add(tname)
        return t

    def has(self, tname: str) -> bool:
        return tname in self.by_name

    def _check_shape(self, t, expected: list[int]) -> None:
        found = [int(d) for d in t.shape]
        if found != expected:
            raise CheckpointError(
                f"{self.name}: tensor {t.name} has shape {found} (ggml order, ne0 first), "
                f"the model's hyperparameters need {expected}"
            )

    def matrix(self, tname: str, rows: int, cols: int) -> Tensor:
        """A weight matrix of ``rows`` outputs by ``cols`` inputs: GGUF ne = [cols, rows]."""
        t = self.get(tname)
        self._check_shape(t, [cols, rows])
        stored = BY_GGML.get(t.tensor_type)
        if stored is None:
            supported = ", ".join(st.ggml.name for st in BY_GGML.values())
            raise CheckpointError(
                f"{self.name}: tensor {tname} is stored as {t.tensor_type.name}; pyllama multiplies {supported} "
                "matrices (convert the model to one of them, e.g. llama-quantize ... Q4_K_M)"
            )
        if cols % stored.block:
            raise CheckpointError(
                f"{self.name}: tensor {tname} ({stored.ggml.name}) has rows of {cols} values, "
                f"not a multiple of the {stored.ggml.name} block of {stored.block}"
            )
        expected = rows * (cols // stored.block) * stored.block_bytes
        if t.data.nbytes != expected:
            raise CheckpointError(
                f"{self.name}: tensor {tname} ({stored.ggml.name} {rows}x{cols}) holds {t.data.nbytes:,} bytes, "
                f"{stored.ggml.name} blocks of {stored.block} values in {stored.block_bytes} bytes need {expected:,}"
            )
        return Tensor(tname, stored.qtype, rows, cols, t.data.reshape(rows, -1))

    def vector(self, tname: str, n: int) -> np.ndarray:
        """A norm weight or bias as float32[n]: a view when stored as F32, a small copy from F16."""
        t = self.get(tname)
        self._check_shape(t, [n])
        if t.tensor_type == GGMLQuantizationType.F32:
            return t.data.reshape(n)
        if t.tensor_type == GGMLQuantizationType.F16:
            return t.data.reshape(n).astype(np.float32)
        raise CheckpointError(f"{self.name}: vector {tname} is stored as {t.tensor_type.name}; expected F32 or F16")

    def check_all_used(self) -> None:
        unused = [n for n in self.by_name if n not in self.used]
        if unused:
            shown = ", ".join(unused[:6]) + (f" and {len(unused) - 6} more" if len(unused) > 6 else "")
            hint = ""
            if any(n.startswith(TENSOR_NAMES[MODEL_TENSOR.ROPE_FREQS]) for n in unused):
                hint = " (rope_freqs: Llama 3 RoPE frequency factors, which llama.cpp reads for llama only)"
            elif any(n.endswith(".bias") for n in unused):
                hint = " (biases pyllama's Llama block does not have)"
            raise CheckpointError(
                f"{self.name}: tensors pyllama would ignore: {shown}{hint}; refusing to run a different model"
            )


def load_gguf(path: str | os.PathLike) -> tuple[ModelConfig, Weights]:
    """Map a GGUF model and return its config and zero-copy weight views."""
    path = Path(path)
    return model_of(open_gguf(path), path)


def parse_gguf(path: Path, file: BinaryIO | None = None) -> tuple[ModelConfig, Weights, dict[str, MetaValue]]:
    """``load_gguf`` for a file whose first bytes have been read (``read_checkpoint``): no second read
    of its magic; ``file``: the open file, mapped instead of opening it again. Also returns the
    file's key/value records (its vocabulary among them)."""
    reader = read_gguf(path, file)
    return (*model_of(reader, path), reader.metadata)


def _vocab_size(meta: Meta, tensors: _Tensors, arch: str) -> int:
    """The embedding's rows, checked against the token list and ``{arch}.vocab_size``."""
    name = meta.name
    embd_name = _tensor_name(MODEL_TENSOR.TOKEN_EMBD)
    if not tensors.has(embd_name):
        raise CheckpointError(f"{name}: tensor {embd_name} is missing: a vocabulary-only GGUF, not a model?")
    embd_shape = [int(d) for d in tensors.by_name[embd_name].shape]
    if len(embd_shape) != 2:
        raise CheckpointError(f"{name}: tensor {embd_name} has shape {embd_shape}, expected [dim, vocab]")
    vocab_size = embd_shape[1]
    n_tokens = meta.array_length(Keys.Tokenizer.LIST)
    if n_tokens is not None and n_tokens != vocab_size:
        raise CheckpointError(
            f"{name}: the vocabulary lists {n_tokens:,} tokens but {embd_name} has {vocab_size:,} rows"
        )
    declared = meta.integer(f"{arch}.vocab_size", default=vocab_size)
    if declared != vocab_size:
        raise CheckpointError(f"{name}: {arch}.vocab_size={declared:,} but {embd_name} has {vocab_size:,} rows")
    if not 0 < vocab_size <= MAX_VOCAB:
        raise CheckpointError(f"{name}: vocabulary of {vocab_size:,} tokens is implausible: corrupt file")
    return vocab_size


def _layer(tensors: _Tensors, cfg: ModelConfig, spec: Architecture, i: int) -> LayerWeights:
    """Layer ``i``'s views: the Llama block, plus the optional tensors its architecture has."""
    d, h, qd, kvd = cfg.dim, cfg.hidden_dim, cfg.q_dim, cfg.kv_dim

    def tn(kind: MODEL_TENSOR, suffix: str = "weight") -> str:
        return _tensor_name(kind, suffix, i)

    optional: dict[str, np.ndarray] = {}
    for kind, field, n in (
        (MODEL_TENSOR.ATTN_Q, "bq", qd),
        (MODEL_TENSOR.ATTN_K, "bk", kvd),
        (MODEL_TENSOR.ATTN_V, "bv", kvd),
    ):
        # qwen2 requires them (as llama.cpp does); the others may have them
        if spec.biases_required or tensors.has(tn(kind, "bias")):
            optional[field] = tensors.vector(tn(kind, "bias"), n)
    if spec.qk_norm:
        optional["q_norm"] = tensors.vector(tn(MODEL_TENSOR.ATTN_Q_NORM), cfg.head_dim)
        optional["k_norm"] = tensors.vector(tn(MODEL_TENSOR.ATTN_K_NORM), cfg.head_dim)
    if spec.post_norms:
        optional["post_attention_norm"] = tensors.vector(tn(MODEL_TENSOR.ATTN_POST_NORM), d)
        optional["post_ffn_norm"] = tensors.vector(tn(MODEL_TENSOR.FFN_POST_NORM), d)
    return LayerWeights(
        attn_norm=tensors.vector(tn(MODEL_TENSOR.ATTN_NORM), d),
        wq=tensors.matrix(tn(MODEL_TENSOR.ATTN_Q), qd, d),
        wk=tensors.matrix(tn(MODEL_TENSOR.ATTN_K), kvd, d),
        wv=tensors.matrix(tn(MODEL_TENSOR.ATTN_V), kvd, d),
        wo=tensors.matrix(tn(MODEL_TENSOR.ATTN_OUT), d, qd),
        ffn_norm=tensors.vector(tn(MODEL_TENSOR.FFN_NORM), d),
        w1=tensors.matrix(tn(MODEL_TENSOR.FFN_GATE), h, d),
        w2=tensors.matrix(tn(MODEL_TENSOR.FFN_DOWN), d, h),
        w3=tensors.matrix(tn(MODEL_TENSOR.FFN_UP), h, d),
        **optional,
    )


def _rope_freq_factors(tensors: _Tensors, cfg: ModelConfig, spec: Architecture) -> tuple[float, ...] | None:
    """Llama 3's RoPE frequency factors (``rope_freqs.weight``, n_rot / 2 values), if the file has them."""
    rope_freqs = _tensor_name(MODEL_TENSOR.ROPE_FREQS)
    if not (spec.rope_freqs and tensors.has(rope_freqs)):
        return None  # (in another architecture the tensor stays unused, and check_all_used refuses it)
    factors = tensors.vector(rope_freqs, cfg.n_rot // 2)
    if not (np.all(np.isfinite(factors)) and np.all(factors > 0)):
        raise CheckpointError(f"{tensors.name}: {rope_freqs} holds factors that are not finite and positive")
    return tuple(float(f) for f in np.asarray(factors, dtype=np.float32))


def model_of(reader: CheckedReader, path: Path) -> tuple[ModelConfig, Weights]:
    """The config and zero-copy weight views of a parsed GGUF model of a supported architecture."""
    name = path.name
    meta = Meta(reader, name)
    arch = meta.string(Keys.General.ARCHITECTURE)
    if arch is None:
        raise CheckpointError(f"{name}: no general.architecture key: a vocabulary-only GGUF, not a model?")
    if arch not in ARCHITECTURES:
        raise CheckpointError(
            f"{name}: architecture {arch!r} is not supported; pyllama runs "
            f"{', '.join(SUPPORTED_ARCHS[:-1])} and {SUPPORTED_ARCHS[-1]} models"
        )
    spec = ARCHITECTURES[arch]
    tensors = _Tensors(reader, name)
    vocab_size = _vocab_size(meta, tensors, arch)
    cfg = config_of(meta, arch, vocab_size)
    emb = tensors.matrix(_tensor_name(MODEL_TENSOR.TOKEN_EMBD), vocab_size, cfg.dim)
    final_norm = tensors.vector(_tensor_name(MODEL_TENSOR.OUTPUT_NORM), cfg.dim)
    out_name = _tensor_name(MODEL_TENSOR.OUTPUT)
    shared = not tensors.has(out_name)
    cls = emb if shared else tensors.matrix(out_name, vocab_size, cfg.dim)
    layers = [_layer(tensors, cfg, spec, i) for i in range(cfg.n_layers)]
    factors = _rope_freq_factors(tensors, cfg, spec)
    tensors.check_all_used()
    qkv_bias = any(lw.bq is not None for lw in layers)
    cfg = replace(cfg, shared_classifier=shared, qkv_bias=qkv_bias, rope_freq_factors=factors)
    types = sorted({t.tensor_type.name for t in reader.tensors}, key=lambda s: (s != "F32", s))
    version = int(reader.fields["GGUF.version"].contents())
    fmt = f"GGUF v{version} {arch} ({'/'.join(types)})"
    weights = Weights(emb, layers, final_norm, cls, source=reader, format=fmt, file_bytes=path.stat().st_size)
    return cfg, weights
