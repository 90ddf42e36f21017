"""Independent numpy references for the block-quantised kernels: ggml's activation quantisers written
from the format's description, random blocks with sane scales, and llama.cpp's dot products rebuilt in
float64 from gguf-py's dequantizer (an implementation independent of pyllama's kernels)."""

from __future__ import annotations

import gguf
import numpy as np
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as G

# byte offsets of each type's fp16 fields: (scale d, offset m or dmin or None)
HALF_FIELDS = {
    G.Q4_0: (0, None),
    G.Q4_1: (0, 2),
    G.Q5_0: (0, None),
    G.Q5_1: (0, 2),
    G.IQ4_NL: (0, None),
    G.Q8_0: (0, None),
    G.Q2_K: (80, 82),
    G.Q3_K: (108, None),
    G.Q4_K: (0, 2),
    G.Q5_K: (0, 2),
    G.Q6_K: (208, None),
}
ACTIVATION = {
    G.Q4_0: "Q8_0",
    G.Q5_0: "Q8_0",
    G.IQ4_NL: "Q8_0",
    G.Q8_0: "Q8_0",
    G.Q4_1: "Q8_1",
    G.Q5_1: "Q8_1",
    G.Q2_K: "Q8_K",
    G.Q3_K: "Q8_K",
    G.Q4_K: "Q8_K",
    G.Q5_K: "Q8_K",
    G.Q6_K: "Q8_K",
}


def set_halves(raw: np.ndarray, ggml_type: G, offset: int | None, values: np.ndarray) -> None:
    """Write float16 ``values`` (one per block) into the fp16 field at ``offset`` of every block."""
    if offset is None:
        return
    block_bytes = GGML_QUANT_SIZES[ggml_type][1]
    blocks = raw.reshape(-1, block_bytes)
    blocks[:, offset : offset + 2] = values.astype(np.float16).reshape(-1, 1).view(np.uint8)


def random_blocks(rng: np.random.Generator, ggml_type: G, rows: int, cols: int, scale: float = 0.1) -> np.ndarray:
    """Random bytes for every field, except fp16 scales, which are random finite halves of magnitude up to
    ``scale`` (times 2^-6..2^2; random bytes would make NaN and Inf)."""
    if ggml_type == G.BF16:
        return gguf.quants.quantize(rng.standard_normal((rows, cols)).astype(np.float32), G.BF16)
    block, block_bytes = GGML_QUANT_SIZES[ggml_type]
    raw = rng.integers(0, 256, size=(rows, cols // block * block_bytes), dtype=np.uint8)
    n_blocks = rows * cols // block
    for offset in HALF_FIELDS[ggml_type]:
        set_halves(raw, ggml_type, offset, rng.uniform(-scale, scale, n_blocks) * 2.0 ** rng.integers(-6, 3, n_blocks))
    return raw


def quantize_q8_0(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, None]:
    """ggml's x86 quantize_row_q8_0: d = fp16(amax / 127), q = rint(x * (127 / amax))."""
    xb = x.astype(np.float32).reshape(-1, 32)
    amax = np.abs(xb).max(axis=1)
    d = (amax / np.float32(127)).astype(np.float16).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(amax > 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    q = np.rint(xb * inv[:, None]).astype(np.int8)
    return q.reshape(-1), d, None


def quantize_q8_1(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ggml's x86 quantize_row_q8_1: Q8_0's q, d = fp16(amax / 127), s = fp16(amax / 127 * sum(q))."""
    xb = x.astype(np.float32).reshape(-1, 32)
    amax = np.abs(xb).max(axis=1)
    d32 = (amax / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(amax > 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    q = np.rint(xb * inv[:, None]).astype(np.int8)
    s = (d32 * q.astype(np.int32).sum(axis=1).astype(np.float32)).astype(np.float16).astype(np.float32)
    return q.reshape(-1), d32.astype(np.float16).astype(np.float32), s


def quantize_q8_k(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ggml's quantize_row_q8_K_ref: the first value of largest magnitude sets iscale = -127 / max,
    q = min(127, rint(iscale * x)), d = 1 / iscale; bsums are the sums of each 16 q."""
    xb = x.astype(np.float32).reshape(-1, 256)
    vmax = np.take_along_axis(xb, np.abs(xb).argmax(axis=1)[:, None], axis=1)[:, 0]
    with np.errstate(divide="ignore"):
        iscale = np.where(vmax != 0, np.float32(-127) / vmax, np.float32(0)).astype(np.float32)
        d = np.where(vmax != 0, np.float32(1) / iscale, np.float32(0)).astype(np.float32)
    q = np.minimum(np.rint(xb * iscale[:, None]), 127).astype(np.int8)
    bsums = q.reshape(-1, 16).astype(np.int16).sum(axis=1).astype(np.int16)
    return q.reshape(-1), d, bsums


QUANTIZERS = {"Q8_0": quantize_q8_0, "Q8_1": quantize_q8_1, "Q8_K": quantize_q8_k}


def _with_half(raw: np.ndarray, ggml_type: G, offset: int, value: float) -> np.ndarray:
    out = raw.copy()
    n_blocks = out.size // GGML_QUANT_SIZES[ggml_type][1]
    set_halves(out, ggml_type, offset, np.full(n_blocks, value))
    return out


def split_weights(raw: np.ndarray, ggml_type: G) -> tuple[np.ndarray, np.ndarray]:
    """gguf-py's dequantization of a weight matrix split by linearity into its scaled part (offset field
    zeroed) and its offset part (scale field zeroed): each is exact in gguf-py's float32, where the sum
    of the two may round."""
    rows = raw.shape[0]
    d_off, m_off = HALF_FIELDS[ggml_type]
    if m_off is None:
        scaled = gguf.quants.dequantize(raw, ggml_type).astype(np.float64).reshape(rows, -1)
        return scaled, np.zeros_like(scaled)
    scaled = gguf.quants.dequantize(_with_half(raw, ggml_type, m_off, 0.0), ggml_type).astype(np.float64)
    offset = gguf.quants.dequantize(_with_half(raw, ggml_type, d_off, 0.0), ggml_type).astype(np.float64)
    return scaled.reshape(rows, -1), offset.reshape(rows, -1)


def reference_product(
    raw: np.ndarray, ggml_type: G, x: np.ndarray, split: tuple[np.ndarray, np.ndarray] | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """llama.cpp's row products of a weight matrix with ``x`` quantised to its activation type, in
    float64 from gguf-py's dequantization (``split``: ``split_weights(raw, ggml_type)``, computed once
    by a caller that multiplies the same matrix again); also Σ|terms| per row, for rounding bounds.
    For Q4_1/Q5_1 the offset meets the activation's s (llama.cpp's m_w * s_x), not d_x * Σ q_x."""
    act = ACTIVATION[ggml_type]
    q, d, s = QUANTIZERS[act](x)
    block = 256 if act == "Q8_K" else 32
    xdq = q.astype(np.float64) * np.repeat(d.astype(np.float64), block)
    scaled, offset = split if split is not None else split_weights(raw, ggml_type)
    if act == "Q8_1":
        m = offset.reshape(raw.shape[0], -1, 32)[:, :, 0]  # one m per block
        value = scaled @ xdq + m @ s.astype(np.float64)
        magnitude = np.abs(scaled) @ np.abs(xdq) + np.abs(m) @ np.abs(s.astype(np.float64))
        return value, magnitude
    return (scaled + offset) @ xdq, np.abs(scaled) @ np.abs(xdq) + np.abs(offset) @ np.abs(xdq)
