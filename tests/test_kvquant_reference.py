"""The kvquant reference (kvquant_reference.py): llama.cpp's cache types round-tripped on blocks whose
result follows by hand from each format's rule, the row sizes, and where llama.cpp's x86 Q8_0 writer
parts from the reference quantiser."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as G
from gguf import quants
from kvquant_reference import CACHE_TYPES, dequantize_row, q8_0_x86_row, quantize_row, roundtrip, row_bytes


def block(*head: float) -> np.ndarray:
    """A 32-value block starting with ``head``, zeros after."""
    out = np.zeros(32, dtype=np.float32)
    out[: len(head)] = head
    return out


def test_row_bytes_of_each_cache_type():
    sizes = {t: row_bytes(t, 64) for t in CACHE_TYPES}
    assert sizes == {
        "f32": 256,
        "f16": 128,
        "bf16": 128,
        "q8_0": 68,
        "q4_0": 36,
        "q4_1": 40,
        "iq4_nl": 36,
        "q5_0": 44,
        "q5_1": 48,
    }
    for t in CACHE_TYPES:
        assert quantize_row(np.ones(64, np.float32), t).size == sizes[t]
    with pytest.raises(ValueError, match="q4_0: a row of 48 values"):
        row_bytes("q4_0", 48)


def test_float_types():
    x = np.random.default_rng(0).standard_normal(64).astype(np.float32)
    assert roundtrip(x, "f32").tobytes() == x.tobytes()
    assert roundtrip(x, "f16").tobytes() == x.astype(np.float16).astype(np.float32).tobytes()
    # bf16 keeps 7 mantissa bits, rounding to nearest even: 1 + 2^-8 is a tie (-> 1), 1 + 3 * 2^-8 too (-> 1 + 2^-6)
    ties = np.array([1 + 2.0**-8, 1 + 3 * 2.0**-8, 1 + 2.0**-8 + 2.0**-12] + [0.0] * 29, dtype=np.float32)
    assert roundtrip(ties, "bf16")[:3].tolist() == [1.0, 1 + 2.0**-6, 1 + 2.0**-7]


@pytest.mark.parametrize(
    "type_name, values, expected",
    [
        # amax 127: d = 1, q = roundf(x) (halves away from zero)
        ("q8_0", (127, 2.5, -2.5, 1, 0.4), (127, 3, -3, 1, 0)),
        # the largest |x| is -8: d = -8 / -8 = 1, q = trunc(x + 8.5) clipped to 15, value q - 8
        ("q4_0", (-8, 7, 0.4, 0.6, -3.5), (-8, 7, 0, 1, -3)),
        # min 0, max 15: d = 1, m = 0, q = trunc(x + 0.5)
        ("q4_1", (0, 15, 7.5, 7.49), (0, 15, 8, 7)),
        # the largest |x| is -16: d = 1, q = trunc(x + 16.5) clipped to 31, value q - 16
        ("q5_0", (-16, 15.6, 0.5, -0.5), (-16, 15, 1, 0)),
        # min 0, max 31: d = 1, m = 0
        ("q5_1", (0, 31, 15.5, 15.49), (0, 31, 16, 15)),
        # values on IQ4_NL's grid with max -127: d0 = 1 picks them exactly, d = sum(x^2 q x) / sum(x^2 q q)
        # = 1; a zero takes the level nearest 0, which is 1
        ("iq4_nl", (-127, 113, 25, 1, 0), (-127, 113, 25, 1, 1)),
    ],
)
def test_blocks_computed_by_hand(type_name, values, expected):
    got = roundtrip(block(*values), type_name)
    assert got[: len(expected)].tolist() == list(expected)


def test_iq4_nl_refits_the_scale_after_choosing_levels():
    # -127 and 100 at d0 = 1: levels -127 and 89 (100 is below the midpoint 101 of 89 and 113); then
    # d = (127^4 + 100^2 * 89 * 100) / (127^4 + 100^2 * 89^2) = 349144641 / 339354641, stored as float16
    d = float(np.float16(349144641 / 339354641))
    got = roundtrip(block(-127, 100), "iq4_nl")
    assert got[:3].tolist() == pytest.approx([-127 * d, 89 * d, 1 * d], rel=1e-6)
    raw = quantize_row(block(-127, 100), "iq4_nl")
    assert raw[:2].view(np.float16)[0] == np.float16(d) and raw[2] == 0 | (8 << 4) and raw[3] == 14 | (8 << 4)
    assert quantize_row(block(-127, 101), "iq4_nl")[3] & 0xF == 15  # 101 is 89 and 113's midpoint: the upper


def test_iq4_nl_bytes_read_back_through_gguf_py():
    x = np.random.default_rng(1).standard_normal(32 * 50).astype(np.float32)
    raw = quantize_row(x, "iq4_nl")
    assert np.array_equal(dequantize_row(raw, "iq4_nl"), quants.dequantize(raw, G.IQ4_NL).reshape(-1))
    rms = {t: float(np.sqrt(np.mean((roundtrip(x, t) - x) ** 2))) for t in ("q4_0", "iq4_nl", "q5_0")}
    assert rms["q5_0"] < rms["iq4_nl"] < rms["q4_0"]  # the non-linear grid beats Q4_0's on Gaussian rows


def test_the_x86_q8_0_writer_rounds_halves_to_even():
    x = block(127, 2.5, -2.5, 1, 0.4)
    assert dequantize_row(q8_0_x86_row(x), "q8_0")[:5].tolist() == [127, 2, -2, 1, 0]
    rng = np.random.default_rng(2)
    y = rng.standard_normal(32 * 20000).astype(np.float32)
    reference, x86 = quantize_row(y, "q8_0").reshape(-1, 34), q8_0_x86_row(y).reshape(-1, 34)
    assert np.array_equal(reference[:, :2], x86[:, :2])  # the same float16 scales
    differ = np.argwhere(reference[:, 2:] != x86[:, 2:])
    assert len(differ) < 10  # measured 2 of 640,000 values on this seed
    for b, j in differ:  # only where x * 127 / amax lands within a float32 step of a half
        amax = np.abs(y[32 * b : 32 * b + 32]).max()
        scaled = abs(float(y[32 * b + j]) * 127.0 / float(amax))
        assert abs(scaled - np.floor(scaled) - 0.5) < 1e-5
