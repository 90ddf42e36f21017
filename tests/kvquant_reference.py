"""llama.cpp's KV-cache types as a row round trip (quantise, then dequantise), the reference for
``kvquant:k=TYPE,v=TYPE``.

A row (one position's key or value of one KV head, or all heads at once: blocks never straddle a head
when head_dim is a multiple of 32) is quantised block by block exactly as gguf-py's
``gguf.quants.quantize`` writes it, which is llama.cpp's ``quantize_row_*_ref`` (ggml-quants.c), and read
back with ``gguf.quants.dequantize``. gguf-py has no IQ4_NL quantiser, so ``_quantize_iq4_nl`` ports
``quantize_row_iq4_nl_ref`` (``quantize_row_iq4_nl_impl`` with no importance weights and ntry = -1): one
pass at d = max / -127, then d = sum(w q x) / sum(w q q) with w = x^2, in float32 in the C order.

llama.cpp's CPU backend writes its cache with each type's ``from_float``: the reference quantiser for
every type here except Q8_0, whose x86 version (``ggml-cpu/arch/x86/quants.c``) takes id = 127 / amax and
rounds half to even where the reference takes id = 1 / (amax / 127) and rounds half away from zero.
``q8_0_x86_row`` is that writer, for comparisons with llama.cpp's own cache; the two differ only on
elements whose scaled value lands on (or one float32 step from) a half.
"""

from __future__ import annotations

import numpy as np
from gguf import GGML_QUANT_SIZES, quants
from gguf import GGMLQuantizationType as G

CACHE_TYPES = {
    "f32": G.F32,
    "f16": G.F16,
    "bf16": G.BF16,
    "q8_0": G.Q8_0,
    "q4_0": G.Q4_0,
    "q4_1": G.Q4_1,
    "iq4_nl": G.IQ4_NL,
    "q5_0": G.Q5_0,
    "q5_1": G.Q5_1,
}
IQ4_NL_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=np.int8)
# best_index_int8: x takes level j once 2x reaches val[j-1] + val[j] (exact integers in float32)
_IQ4_NL_MIDPOINTS2 = (IQ4_NL_VALUES[:-1].astype(np.int32) + IQ4_NL_VALUES[1:]).astype(np.float32)
_GROUP_MAX_EPS = np.float32(1e-15)


def row_bytes(type_name: str, n: int) -> int:
    """Bytes of one row of ``n`` values; n must fill whole blocks."""
    block, size = GGML_QUANT_SIZES[CACHE_TYPES[type_name]]
    if n % block:
        raise ValueError(f"{type_name}: a row of {n} values does not fill blocks of {block}")
    return n // block * size


def _quantize_iq4_nl_block(x: np.ndarray) -> bytes:
    x = x.astype(np.float32)
    ax = np.abs(x)
    first = int(np.argmax(ax))  # the C loop keeps the first strict maximum
    amax, xmax = ax[first], x[first]
    levels = np.zeros(32, dtype=np.int64)
    d = np.float32(0.0)
    if amax >= _GROUP_MAX_EPS:
        d0 = np.float32(xmax / np.float32(IQ4_NL_VALUES[0]))
        inv = np.float32(np.float32(1.0) / d0)
        scaled = (inv * x).astype(np.float32)
        levels = np.searchsorted(_IQ4_NL_MIDPOINTS2, (scaled + scaled).astype(np.float32), side="right")
        sumqx, sumq2 = np.float32(0.0), np.float32(0.0)
        for xj, lj in zip(x, levels, strict=True):  # float32, j ascending, (w*q)*x as the C expression
            q = np.float32(IQ4_NL_VALUES[lj])
            wq = np.float32(np.float32(xj * xj) * q)
            sumqx = np.float32(sumqx + np.float32(wq * xj))
            sumq2 = np.float32(sumq2 + np.float32(wq * q))
        d = np.float32(sumqx / sumq2) if sumq2 > 0 else np.float32(0.0)
    packed = (levels[:16] | (levels[16:] << 4)).astype(np.uint8)
    return np.float16(d).tobytes() + packed.tobytes()


def _quantize_iq4_nl(row: np.ndarray) -> np.ndarray:
    blocks = row.astype(np.float32).reshape(-1, 32)
    return np.frombuffer(b"".join(_quantize_iq4_nl_block(b) for b in blocks), dtype=np.uint8).copy()


def quantize_row(row: np.ndarray, type_name: str) -> np.ndarray:
    """The row's bytes (uint8) as the cache stores them."""
    row = np.ascontiguousarray(row, dtype=np.float32)
    row_bytes(type_name, row.size)
    qtype = CACHE_TYPES[type_name]
    if qtype == G.IQ4_NL:
        return _quantize_iq4_nl(row)
    return np.ascontiguousarray(quants.quantize(row, qtype)).view(np.uint8).reshape(-1)


def dequantize_row(raw: np.ndarray, type_name: str) -> np.ndarray:
    qtype = CACHE_TYPES[type_name]
    return np.asarray(quants.dequantize(np.ascontiguousarray(raw, dtype=np.uint8), qtype), dtype=np.float32).reshape(-1)


def roundtrip(row: np.ndarray, type_name: str) -> np.ndarray:
    """float32 values the attention reads back after the row was stored as ``type_name``."""
    return dequantize_row(quantize_row(row, type_name), type_name)


def q8_0_x86_row(row: np.ndarray) -> np.ndarray:
    """llama.cpp's x86 ``quantize_row_q8_0`` (AVX/AVX2): d = amax / 127, id = 127 / amax, round half to even."""
    blocks = np.ascontiguousarray(row, dtype=np.float32).reshape(-1, 32)
    out = bytearray()
    for b in blocks:
        amax = np.float32(np.abs(b).max())
        d = np.float32(amax / np.float32(127.0))
        inv = np.float32(np.float32(127.0) / amax) if amax != 0 else np.float32(0.0)
        qs = np.rint((b * inv).astype(np.float32)).astype(np.int8)
        out += np.float16(d).tobytes() + qs.tobytes()
    return np.frombuffer(bytes(out), dtype=np.uint8).copy()
