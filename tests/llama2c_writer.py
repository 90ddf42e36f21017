"""Writers for llama2.c's versioned formats (export.py's version1_export / version2_export), for tests.

They take the tensors of a legacy checkpoint read with plain numpy, so loader tests can check that
versions 0, 1 and 2 of the same weights load to the same model.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

MAGIC = 0x616B3432


def read_legacy(path: Path) -> tuple[tuple[int, ...], bool, dict[str, np.ndarray]]:
    raw = Path(path).read_bytes()
    dims = struct.unpack_from("<7i", raw, 0)
    dim, hidden, n_l, n_h, n_kv, vocab, seq = dims
    shared, vocab = vocab > 0, abs(vocab)
    hs = dim // n_h
    data = np.frombuffer(raw, dtype="<f4", offset=28)
    shapes = [
        ("emb", (vocab, dim)),
        ("rms_att", (n_l, dim)),
        ("wq", (n_l, dim, dim)),
        ("wk", (n_l, n_kv * hs, dim)),
        ("wv", (n_l, n_kv * hs, dim)),
        ("wo", (n_l, dim, dim)),
        ("rms_ffn", (n_l, dim)),
        ("w1", (n_l, hidden, dim)),
        ("w2", (n_l, dim, hidden)),
        ("w3", (n_l, hidden, dim)),
        ("rms_final", (dim,)),
        ("freqs", (seq * hs,)),
    ] + ([] if shared else [("cls", (vocab, dim))])
    out, off = {}, 0
    for name, shape in shapes:
        n = int(np.prod(shape))
        out[name] = data[off : off + n].reshape(shape)
        off += n
    return (dim, hidden, n_l, n_h, n_kv, vocab, seq), shared, out


def _header(version: int, dims, shared: bool, group_size: int | None = None) -> bytes:
    h = struct.pack("<Ii", MAGIC, version) + struct.pack("<7i", *dims) + struct.pack("<B", int(shared))
    if group_size is not None:
        h += struct.pack("<i", group_size)
    return h + b"\0" * (256 - len(h))


def write_v1(src: Path, dst: Path) -> None:
    dims, shared, t = read_legacy(src)
    parts = [_header(1, dims, shared), t["rms_att"], t["rms_ffn"], t["rms_final"], t["emb"]]
    parts += [t[k] for k in ("wq", "wk", "wv", "wo", "w1", "w2", "w3")]
    if not shared:
        parts.append(t["cls"])
    Path(dst).write_bytes(b"".join(p if isinstance(p, bytes) else p.astype("<f4").tobytes() for p in parts))


def quantize_q80(w: np.ndarray, gs: int) -> tuple[np.ndarray, np.ndarray]:
    """export.py's quantize_q80: scale = max|w| / 127 per group, round half to even (torch.round)."""
    g = w.astype(np.float32).reshape(-1, gs)
    scale = (np.abs(g).max(axis=1) / np.float32(127.0)).astype(np.float32)
    q = np.round(g / scale[:, None]).astype(np.int8)
    return q.reshape(-1), scale


def write_v2(src: Path, dst: Path, group_size: int = 64) -> None:
    dims, shared, t = read_legacy(src)
    while dims[0] % group_size:
        group_size //= 2
    out = [_header(2, dims, shared, group_size)]
    out += [t[k].astype("<f4").tobytes() for k in ("rms_att", "rms_ffn", "rms_final")]
    mats = [t["emb"][None]] + [t[k] for k in ("wq", "wk", "wv", "wo", "w1", "w2", "w3")]
    if not shared:
        mats.append(t["cls"][None])
    for stack in mats:
        for layer in stack:
            q, s = quantize_q80(layer, group_size)
            out += [q.tobytes(), s.astype("<f4").tobytes()]
    Path(dst).write_bytes(b"".join(out))
