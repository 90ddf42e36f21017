"""GGUF model files (llama.cpp's format), memory-mapped, never copied.

The file is read by the checked reader of ``gguf_reader`` (header, metadata and tensor infos,
every size checked); this module turns a parsed file into ``(ModelConfig, Weights)``. The parsed
file's ``metadata`` serves the config here and the vocabulary (``pyllama.tokenizer.gguf_vocab``),
so one parse of a file serves both. Format: ggml's ``docs/gguf.md``; tensor dimensions are in ggml order, ``ne0``
first: a matrix of ``ne = [cols, rows]`` stores row r at ``r * ne0`` (``ne0`` = inputs).

Supported: architectures ``llama`` (RoPE pairs (2i, 2i+1)) and ``qwen2`` (NEOX pairs (i, i + n_rot/2)
and Q/K/V biases), grouped-query attention, tied embeddings (no ``output.weight``), and matrices
stored in any type of ``pyllama.kernels.qtypes`` (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL,
Q2_K-Q6_K; types may differ per tensor, the token embedding included). Hyperparameters come from the
``{arch}.*`` keys with llama.cpp's defaults: ``head_count_kv`` = ``head_count``, ``key_length`` =
``embedding_length / head_count``, ``rope.dimension_count`` = head size, ``rope.freq_base`` = 10000;
the vocabulary size is the token list's length (or the embedding's rows when there is no list).

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
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, Keys
from gguf.constants import MODEL_TENSOR, TENSOR_NAMES

from pyllama.checkpoint.gguf_meta import MetaValue
from pyllama.checkpoint.gguf_reader import (  # open_gguf, read_gguf: re-exported, where callers import them
    GGUF_MAGIC,
    INTEGER_TYPES,
    CheckedReader,
    open_gguf,
    read_gguf,
)
from pyllama.checkpoint.weights import LayerWeights, Tensor, Weights
from pyllama.config import ARITH_GGML, ROPE_NEOX, ROPE_NORMAL, ModelConfig
from pyllama.errors import CheckpointError
from pyllama.kernels.qtypes import BY_GGML

__all__ = ["GGUF_MAGIC", "INTEGER_TYPES", "load_gguf", "model_of", "open_gguf", "parse_gguf", "read_gguf"]

ROPE_STYLES = {"llama": ROPE_NORMAL, "qwen2": ROPE_NEOX}
SUPPORTED_ARCHS = tuple(ROPE_STYLES)
ROPE_SCALE_LINEAR = "{arch}.rope.scale_linear"  # the old name of rope.scaling.factor
# Bounds no real model comes near; a header outside them is corrupt, not a model.
MAX_DIM = 1 << 20
MAX_LAYERS = 1 << 12
MAX_VOCAB = 1 << 24
MAX_CONTEXT = 1 << 26

_FLOAT_TYPES = {GGUFValueType.FLOAT32, GGUFValueType.FLOAT64}


def _tensor_name(kind: MODEL_TENSOR, suffix: str = "weight", layer: int | None = None) -> str:
    base = TENSOR_NAMES[kind]
    return f"{base.format(bid=layer) if layer is not None else base}.{suffix}"


class _Meta:
    """Typed access to the key/value metadata, with errors that name the file and the key."""

    def __init__(self, reader: CheckedReader, name: str) -> None:
        self.records = reader.metadata
        self.name = name

    def has(self, key: str) -> bool:
        return key in self.records

    def _wrong(self, key: str, kind: str, record: MetaValue) -> CheckpointError:
        return CheckpointError(f"{self.name}: metadata {key} should be {kind}, found {record.type_name()}")

    def string(self, key: str, default: str | None = None) -> str | None:
        record = self.records.get(key)
        if record is None:
            return default
        if record.type != GGUFValueType.STRING:
            raise self._wrong(key, "a string", record)
        try:
            return record.value.decode("utf-8")  # type: ignore[attr-defined]
        except UnicodeDecodeError:
            raise CheckpointError(f"{self.name}: metadata {key} is not valid UTF-8") from None

    def integer(self, key: str, default: int | None = None, per_layer: int = 0) -> int:
        """An integer key; ``per_layer`` > 0 also accepts llama.cpp's one-value-per-layer arrays
        when every layer has the same value (pyllama has one shape for all layers)."""
        record = self.records.get(key)
        if record is None:
            if default is None:
                raise CheckpointError(f"{self.name}: metadata key {key} is missing (llama.cpp requires it too)")
            return default
        if record.type == GGUFValueType.ARRAY and per_layer and record.item_type in INTEGER_TYPES:
            values = [int(v) for v in record.value]  # type: ignore[attr-defined]
            if len(values) != per_layer or len(set(values)) != 1:
                raise CheckpointError(
                    f"{self.name}: {key} varies per layer ({values[:8]}{' ...' if len(values) > 8 else ''}); "
                    "pyllama supports models whose layers all have the same shape"
                )
            return values[0]
        if record.type not in INTEGER_TYPES:
            raise self._wrong(key, "an integer", record)
        return int(record.value)  # type: ignore[call-overload]

    def number(self, key: str, default: float | None = None) -> float:
        record = self.records.get(key)
        if record is None:
            if default is None:
                raise CheckpointError(f"{self.name}: metadata key {key} is missing (llama.cpp requires it too)")
            return default
        if record.type not in _FLOAT_TYPES | INTEGER_TYPES:
            raise self._wrong(key, "a number", record)
        return float(record.value)  # type: ignore[arg-type]

    def array_length(self, key: str) -> int | None:
        record = self.records.get(key)
        if record is None:
            return None
        if record.type != GGUFValueType.ARRAY:
            raise self._wrong(key, "an array", record)
        return record.count


def _config(meta: _Meta, arch: str, vocab_size: int) -> ModelConfig:
    name = meta.name

    def key(template: str) -> str:
        return template.format(arch=arch)

    n_layers = meta.integer(key(Keys.LLM.BLOCK_COUNT))
    dim = meta.integer(key(Keys.LLM.EMBEDDING_LENGTH))
    n_heads = meta.integer(key(Keys.Attention.HEAD_COUNT), per_layer=n_layers)
    hidden_dim = meta.integer(key(Keys.LLM.FEED_FORWARD_LENGTH), per_layer=n_layers)
    seq_len = meta.integer(key(Keys.LLM.CONTEXT_LENGTH))
    shown = f"block_count={n_layers}, embedding_length={dim}, head_count={n_heads}, feed_forward_length={hidden_dim}"
    if not (
        0 < n_layers <= MAX_LAYERS
        and 0 < dim <= MAX_DIM
        and 0 < n_heads <= dim
        and 0 < hidden_dim <= 16 * MAX_DIM
        and 0 < seq_len <= MAX_CONTEXT
    ):
        raise CheckpointError(f"{name}: implausible hyperparameters ({shown}, context_length={seq_len}): corrupt file")
    n_kv_heads = meta.integer(key(Keys.Attention.HEAD_COUNT_KV), default=n_heads, per_layer=n_layers)
    if not 0 < n_kv_heads <= n_heads or n_heads % n_kv_heads:
        raise CheckpointError(
            f"{name}: head_count={n_heads} is not a multiple of head_count_kv={n_kv_heads}: "
            "grouped-query attention needs whole groups"
        )
    if dim % n_heads and not meta.has(key(Keys.Attention.KEY_LENGTH)):
        raise CheckpointError(f"{name}: embedding_length={dim} is not a multiple of head_count={n_heads}")
    head_dim = meta.integer(key(Keys.Attention.KEY_LENGTH), default=dim // n_heads)
    value_dim = meta.integer(key(Keys.Attention.VALUE_LENGTH), default=dim // n_heads)
    if value_dim != head_dim:
        raise CheckpointError(
            f"{name}: key_length={head_dim} differs from value_length={value_dim}; pyllama needs equal head sizes"
        )
    if not 0 < head_dim <= MAX_DIM or head_dim % 2:
        raise CheckpointError(f"{name}: head size {head_dim} is not a positive even number; RoPE needs pairs")
    n_rot = meta.integer(key(Keys.Rope.DIMENSION_COUNT), default=head_dim)
    if arch == "llama" and n_rot != head_dim:
        # llama.cpp refuses this too ("invalid n_rot")
        raise CheckpointError(
            f"{name}: rope.dimension_count={n_rot} but the head size is {head_dim}; llama rotates whole heads"
        )
    if not 0 < n_rot <= head_dim or n_rot % 2:
        raise CheckpointError(f"{name}: rope.dimension_count={n_rot} must be even and at most the head size {head_dim}")
    rope_theta = meta.number(key(Keys.Rope.FREQ_BASE), default=10000.0)
    if not rope_theta > 0:
        raise CheckpointError(f"{name}: rope.freq_base={rope_theta} must be positive")
    scaling = meta.string(key(Keys.Rope.SCALING_TYPE), default="none")
    factor = meta.number(key(Keys.Rope.SCALING_FACTOR), default=0.0)
    if factor == 0.0:
        factor = meta.number(key(ROPE_SCALE_LINEAR), default=0.0)
    if scaling not in ("none", "linear") or factor not in (0.0, 1.0):
        raise CheckpointError(
            f"{name}: RoPE scaling (type {scaling}, factor {factor:g}) is not supported; "
            "pyllama runs models with plain RoPE"
        )
    experts = meta.integer(key(Keys.LLM.EXPERT_COUNT), default=0)
    if experts:
        raise CheckpointError(f"{name}: a mixture-of-experts model ({experts} experts); pyllama runs dense models only")
    norm_eps = meta.number(key(Keys.Attention.LAYERNORM_RMS_EPS))
    if not 0 < norm_eps < 1:
        raise CheckpointError(f"{name}: layer_norm_rms_epsilon={norm_eps} is not a small positive number")
    return ModelConfig(
        dim=dim,
        hidden_dim=hidden_dim,
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        vocab_size=vocab_size,
        seq_len=seq_len,
        head_dim=head_dim,
        n_rot=n_rot,
        rope_theta=rope_theta,
        rope_style=ROPE_STYLES[arch],
        norm_eps=norm_eps,
        arch=arch,
        arithmetic=ARITH_GGML,  # match llama.cpp, which computes what people run these files with
    )


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
                hint = " (rope_freqs: Llama 3.1-style RoPE frequency scaling, not supported)"
            elif any(n.endswith(".bias") for n in unused):
                hint = " (biases pyllama's Llama block does not have)"
            raise CheckpointError(
                f"{self.name}: tensors pyllama would ignore: {shown}{hint}; refusing to run a different model"
            )


def load_gguf(path: str | os.PathLike) -> tuple[ModelConfig, Weights]:
    """Map a GGUF ``llama`` or ``qwen2`` model and return its config and zero-copy weight views."""
    path = Path(path)
    return model_of(open_gguf(path), path)


def parse_gguf(path: Path, file: BinaryIO | None = None) -> tuple[ModelConfig, Weights]:
    """``load_gguf`` for a file whose first bytes have been read (``read_checkpoint``): no second read
    of its magic; ``file``: the open file, mapped instead of opening it again."""
    return model_of(read_gguf(path, file), path)


def model_of(reader: CheckedReader, path: Path) -> tuple[ModelConfig, Weights]:
    """The config and zero-copy weight views of a parsed GGUF ``llama`` or ``qwen2`` model."""
    name = path.name
    meta = _Meta(reader, name)
    arch = meta.string(Keys.General.ARCHITECTURE)
    if arch is None:
        raise CheckpointError(f"{name}: no general.architecture key: a vocabulary-only GGUF, not a model?")
    if arch not in SUPPORTED_ARCHS:
        raise CheckpointError(
            f"{name}: architecture {arch!r} is not supported; pyllama runs {' and '.join(SUPPORTED_ARCHS)} models"
        )
    tensors = _Tensors(reader, name)
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
    cfg = _config(meta, arch, vocab_size)

    d, h, qd, kvd = cfg.dim, cfg.hidden_dim, cfg.q_dim, cfg.kv_dim
    emb = tensors.matrix(embd_name, vocab_size, d)
    final_norm = tensors.vector(_tensor_name(MODEL_TENSOR.OUTPUT_NORM), d)
    out_name = _tensor_name(MODEL_TENSOR.OUTPUT)
    shared = not tensors.has(out_name)
    cls = emb if shared else tensors.matrix(out_name, vocab_size, d)
    layers = []
    for i in range(cfg.n_layers):

        def tn(kind: MODEL_TENSOR, suffix: str = "weight", layer: int = i) -> str:
            return _tensor_name(kind, suffix, layer)

        biases = {}
        for kind, key, n in (
            (MODEL_TENSOR.ATTN_Q, "bq", qd),
            (MODEL_TENSOR.ATTN_K, "bk", kvd),
            (MODEL_TENSOR.ATTN_V, "bv", kvd),
        ):
            # qwen2 requires them (as llama.cpp does); llama may have them
            if arch == "qwen2" or tensors.has(tn(kind, "bias")):
                biases[key] = tensors.vector(tn(kind, "bias"), n)
        layers.append(
            LayerWeights(
                attn_norm=tensors.vector(tn(MODEL_TENSOR.ATTN_NORM), d),
                wq=tensors.matrix(tn(MODEL_TENSOR.ATTN_Q), qd, d),
                wk=tensors.matrix(tn(MODEL_TENSOR.ATTN_K), kvd, d),
                wv=tensors.matrix(tn(MODEL_TENSOR.ATTN_V), kvd, d),
                wo=tensors.matrix(tn(MODEL_TENSOR.ATTN_OUT), d, qd),
                ffn_norm=tensors.vector(tn(MODEL_TENSOR.FFN_NORM), d),
                w1=tensors.matrix(tn(MODEL_TENSOR.FFN_GATE), h, d),
                w2=tensors.matrix(tn(MODEL_TENSOR.FFN_DOWN), d, h),
                w3=tensors.matrix(tn(MODEL_TENSOR.FFN_UP), h, d),
                **biases,
            )
        )
    tensors.check_all_used()
    qkv_bias = any(lw.bq is not None for lw in layers)
    cfg = replace(cfg, shared_classifier=shared, qkv_bias=qkv_bias)
    types = sorted({t.tensor_type.name for t in reader.tensors}, key=lambda s: (s != "F32", s))
    version = int(reader.fields["GGUF.version"].contents())
    fmt = f"GGUF v{version} {arch} ({'/'.join(types)})"
    weights = Weights(emb, layers, final_norm, cls, source=reader, format=fmt, file_bytes=path.stat().st_size)
    return cfg, weights
