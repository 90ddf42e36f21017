"""llama2.c checkpoints (``.bin``), memory-mapped, never copied.

Formats (karpathy/llama2.c ``run.c``, ``runq.c`` and ``export.py``):

* version 0, "legacy" (what ``run.c`` reads): 7 x int32 header ``dim, hidden_dim, n_layers,
  n_heads, n_kv_heads, vocab_size, seq_len`` (negative ``vocab_size``: the classifier is stored
  separately, at the end), then float32 tensors with all layers of one kind together: token
  embedding, rms_att, wq, wk, wv, wo, rms_ffn, w1, w2, w3, rms_final, the ``freq_cis_real`` and
  ``freq_cis_imag`` RoPE tables (``seq_len * head_size / 2`` floats each, skipped: RoPE is
  recomputed), then the classifier when unshared.
* version 1: a 256-byte header (uint32 magic ``0x616b3432`` "ak42", int32 version, the 7 ints,
  uint8 shared_classifier), then float32: rms_att, rms_ffn, rms_final, embedding, wq, wk, wv, wo,
  w1, w2, w3, [classifier].
* version 2: same header plus int32 group_size; float32 norms as in version 1, then each matrix
  group (embedding, wq, wk, wv, wo, w1, w2, w3, [classifier]) as, per layer, int8 values followed
  by one float32 scale per ``group_size`` values (symmetric Q8_0-style groups, ``runq.c``).
"""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import BinaryIO

import numpy as np

from pyllama.checkpoint.weights import LayerWeights, QType, Tensor, Weights
from pyllama.config import ModelConfig
from pyllama.errors import CheckpointError

MAGIC = 0x616B3432  # "ak42" as a little-endian uint32
HEADER_V0 = 7 * 4
HEADER_V12 = 256
# Bounds that no real llama2.c model comes near; a header outside them is garbage, not a model.
MAX_DIM = 1 << 16
MAX_LAYERS = 1 << 10
MAX_VOCAB = 1 << 22
MAX_SEQ = 1 << 22


def _fmt(n: int) -> str:
    return f"{n:,}"


def _check_header(name: str, dims: tuple[int, ...]) -> None:
    dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab, seq_len = dims
    shown = (
        f"dim={dim}, hidden_dim={hidden_dim}, n_layers={n_layers}, n_heads={n_heads}, "
        f"n_kv_heads={n_kv_heads}, vocab_size={vocab}, seq_len={seq_len}"
    )
    sane = (
        0 < dim <= MAX_DIM
        and 0 < hidden_dim <= 16 * MAX_DIM
        and 0 < n_layers <= MAX_LAYERS
        and 0 < n_heads <= dim
        and 0 < n_kv_heads <= n_heads
        and 0 < abs(vocab) <= MAX_VOCAB
        and 0 < seq_len <= MAX_SEQ
    )
    if not sane:
        raise CheckpointError(
            f"{name}: not a llama2.c checkpoint: its header reads {shown} "
            "(is it a tokenizer, a GGUF or a PyTorch file?)"
        )
    if dim % n_heads:
        raise CheckpointError(f"{name}: dim={dim} is not a multiple of n_heads={n_heads}: corrupt header")
    if n_heads % n_kv_heads:
        raise CheckpointError(f"{name}: n_heads={n_heads} is not a multiple of n_kv_heads={n_kv_heads}: corrupt header")
    if (dim // n_heads) % 2:
        raise CheckpointError(f"{name}: head size {dim // n_heads} is odd; RoPE needs pairs: corrupt header")


def _check_size(name: str, expected: int, actual: int, version: int) -> None:
    if actual < expected:
        raise CheckpointError(
            f"{name}: header implies {_fmt(expected)} bytes, file has {_fmt(actual)}: truncated download?"
        )
    if actual > expected:
        raise CheckpointError(
            f"{name}: header implies {_fmt(expected)} bytes, file has {_fmt(actual)} "
            f"({_fmt(actual - expected)} too many): not a llama2.c version-{version} checkpoint, "
            "or written by a different exporter"
        )


class _Cursor:
    """Walks the mapped file handing out zero-copy views; the layout functions below read like export.py."""

    def __init__(self, buf: np.ndarray, offset: int) -> None:
        self.buf = buf
        self.offset = offset

    def take(self, dtype: type, count: int) -> np.ndarray:
        nbytes = count * np.dtype(dtype).itemsize
        view: np.ndarray = self.buf[self.offset : self.offset + nbytes].view(dtype)
        self.offset += nbytes
        return view

    def f32(self, *shape: int) -> np.ndarray:
        return self.take(np.float32, int(np.prod(shape))).reshape(shape)

    def skip_f32(self, count: int) -> None:
        self.offset += 4 * count


def _f32_tensor(name: str, data: np.ndarray) -> Tensor:
    return Tensor(name, QType.F32, data.shape[0], data.shape[1], data)


def _layered(cur: _Cursor, name: str, n_layers: int, rows: int, cols: int) -> list[Tensor]:
    block = cur.f32(n_layers, rows, cols)
    return [_f32_tensor(f"{name}.{i}", block[i]) for i in range(n_layers)]


def _q8_layered(cur: _Cursor, name: str, n: int, rows: int, cols: int, gs: int) -> list[Tensor]:
    out = []
    for i in range(n):
        q = cur.take(np.int8, rows * cols)
        s = cur.take(np.float32, rows * cols // gs)
        out.append(Tensor(f"{name}.{i}", QType.Q8_GROUPS, rows, cols, q, s, gs))
    return out


def _expected_bytes(cfg: ModelConfig, version: int, group_size: int = 0) -> int:
    d, h, n_l, v = cfg.dim, cfg.hidden_dim, cfg.n_layers, cfg.vocab_size
    matrices = v * d + n_l * (d * cfg.q_dim + 2 * d * cfg.kv_dim + cfg.q_dim * d + 3 * d * h)
    if not cfg.shared_classifier:
        matrices += v * d
    norms = n_l * 2 * d + d
    if version == 0:
        return HEADER_V0 + 4 * (matrices + norms + cfg.seq_len * cfg.head_dim)
    if version == 1:
        return HEADER_V12 + 4 * (matrices + norms)
    return HEADER_V12 + 4 * norms + matrices + 4 * (matrices // group_size)


def load_llama2c(path: str | os.PathLike, file: BinaryIO | None = None) -> tuple[ModelConfig, Weights]:
    """Map a llama2.c checkpoint (version 0, 1 or 2) and return its config and weight views.
    ``file``: ``path`` already open (``read_checkpoint``), mapped instead of opening it again."""
    path = Path(path)
    name = path.name
    size = path.stat().st_size
    if size < HEADER_V0:
        raise CheckpointError(f"{name}: {size} bytes is too small for a llama2.c checkpoint header (28 bytes)")
    buf = np.memmap(path if file is None else file, dtype=np.uint8, mode="r")
    version, dims, shared, group_size, offset = _read_header(name, buf, size)
    _check_header(name, dims)
    dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab, seq_len = dims
    cfg = ModelConfig(
        dim=dim,
        hidden_dim=hidden_dim,
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        vocab_size=abs(vocab),
        seq_len=seq_len,
        shared_classifier=shared,
    )
    if version == 2 and (group_size <= 0 or dim % group_size or hidden_dim % group_size):
        raise CheckpointError(
            f"{name}: version-2 group size {group_size} does not divide both dim={dim} and hidden_dim={hidden_dim}; "
            "the int8 groups would straddle rows (llama2.c's runq.c cannot run this file either): re-export "
            "with a smaller group size"
        )
    _check_size(name, _expected_bytes(cfg, version, group_size), size, version)
    emb, layers, rms_final, cls, fmt = _read_tensors(_Cursor(buf, offset), cfg, version, group_size)
    weights = Weights(emb, layers, rms_final, cls, source=buf, format=fmt, file_bytes=size)
    return cfg, weights


def _read_header(name: str, buf: np.ndarray, size: int) -> tuple[int, tuple[int, ...], bool, int, int]:
    """(version, the 7 header ints, shared classifier, group size or 0, offset of the first tensor)."""
    header = buf.data  # a memoryview of the mapped bytes: struct reads them in place
    (first,) = struct.unpack_from("<I", header, 0)
    if first != MAGIC:  # version 0 has no magic: a negative vocab_size says the classifier is unshared
        dims = struct.unpack_from("<7i", header, 0)
        return 0, dims, dims[5] > 0, 0, HEADER_V0
    if size < HEADER_V12:
        raise CheckpointError(f"{name}: {size} bytes is too small for a version-1/2 header (256 bytes)")
    (version,) = struct.unpack_from("<i", header, 4)
    if version not in (1, 2):
        raise CheckpointError(f"{name}: llama2.c format version {version} is not supported (1 and 2 are)")
    dims = struct.unpack_from("<7i", header, 8)
    group_size = struct.unpack_from("<i", header, 37)[0] if version == 2 else 0
    return version, dims, bool(buf[36]), group_size, HEADER_V12


def _read_tensors(
    cur: _Cursor, cfg: ModelConfig, version: int, group_size: int
) -> tuple[Tensor, list[LayerWeights], np.ndarray, Tensor, str]:
    """The weight views in the file's order (export.py's): (embedding, layers, rms_final, classifier,
    a description of the format)."""
    d, h, L, v, qd, kvd = cfg.dim, cfg.hidden_dim, cfg.n_layers, cfg.vocab_size, cfg.q_dim, cfg.kv_dim
    shared = cfg.shared_classifier
    if version == 0:
        emb = _f32_tensor("token_embedding", cur.f32(v, d))
        rms_att = cur.f32(L, d)
        wq, wk = _layered(cur, "wq", L, qd, d), _layered(cur, "wk", L, kvd, d)
        wv, wo = _layered(cur, "wv", L, kvd, d), _layered(cur, "wo", L, d, qd)
        rms_ffn = cur.f32(L, d)
        w1, w2, w3 = _layered(cur, "w1", L, h, d), _layered(cur, "w2", L, d, h), _layered(cur, "w3", L, h, d)
        rms_final = cur.f32(d)
        cur.skip_f32(cfg.seq_len * cfg.head_dim)  # freq_cis_real + freq_cis_imag: recomputed instead
        cls = emb if shared else _f32_tensor("classifier", cur.f32(v, d))
        fmt = "llama2.c version 0 (legacy, float32)"
    else:
        rms_att, rms_ffn, rms_final = cur.f32(L, d), cur.f32(L, d), cur.f32(d)
        if version == 1:
            emb = _f32_tensor("token_embedding", cur.f32(v, d))
            wq, wk = _layered(cur, "wq", L, qd, d), _layered(cur, "wk", L, kvd, d)
            wv, wo = _layered(cur, "wv", L, kvd, d), _layered(cur, "wo", L, d, qd)
            w1, w2, w3 = _layered(cur, "w1", L, h, d), _layered(cur, "w2", L, d, h), _layered(cur, "w3", L, h, d)
            cls = emb if shared else _f32_tensor("classifier", cur.f32(v, d))
            fmt = "llama2.c version 1 (float32)"
        else:
            gs = group_size
            (emb,) = _q8_layered(cur, "token_embedding", 1, v, d, gs)
            wq, wk = _q8_layered(cur, "wq", L, qd, d, gs), _q8_layered(cur, "wk", L, kvd, d, gs)
            wv, wo = _q8_layered(cur, "wv", L, kvd, d, gs), _q8_layered(cur, "wo", L, d, qd, gs)
            w1, w2 = _q8_layered(cur, "w1", L, h, d, gs), _q8_layered(cur, "w2", L, d, h, gs)
            w3 = _q8_layered(cur, "w3", L, h, d, gs)
            cls = emb if shared else _q8_layered(cur, "classifier", 1, v, d, gs)[0]
            fmt = f"llama2.c version 2 (int8 groups of {gs})"
    layers = [LayerWeights(rms_att[i], wq[i], wk[i], wv[i], wo[i], rms_ffn[i], w1[i], w2[i], w3[i]) for i in range(L)]
    return emb, layers, rms_final, cls, fmt
