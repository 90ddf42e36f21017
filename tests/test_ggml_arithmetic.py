"""GGUF files run with ggml's arithmetic between the products, llama2.c checkpoints with run.c's.

A one-ulp difference in a normalised row can flip one int8 rounding when the next product quantises
it, and such flips compound over layers. So the GGUF path reproduces ggml's rmsnorm (squares summed
in double, ``(x * scale) * w``), SiLU (``x / (1 + e^-x)`` with ggml's own exp on groups of 8), RoPE
and attention (tests/test_ggml_attention.py):

* the row kernels equal numpy emulations of those formulas written here, bit for bit;
* on SmolLM2 (Q4_1), every tensor of ``pyllama trace`` in all 30 layers equals llama-eval-callback's
  sums to float32 rounding, where run.c's arithmetic already differs at the first product (a rounding
  flip of the activation quantisation in layer 0's Q projection). With ggml's rmsnorm and SiLU but
  run.c's RoPE and attention, the first flip came in layer 18.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import shared_file

from pyllama.errors import InputError
from pyllama.kernels.elementwise import ggml_exp, rmsnorm_, swiglu_
from pyllama.model import Model
from pyllama.trace import _corners, parse_evalcb_log, summarize, trace_prompt

SMOLLM2 = "SmolLM2-135M-Instruct.Q4_1.gguf"
HELLO_WORLD_SMOLLM2 = [19556, 905]  # "Hello world" as llama.cpp tokenises it for SmolLM2 (no BOS)
# float32 rounding of the corner sums the log holds (measured at most 1.7e-6 of their L1 norm, in every layer)
ROUNDING_OF_L1 = 1e-5


def _numpy_rmsnorm_ggml(x: np.ndarray, w: np.ndarray, eps: np.float32) -> np.ndarray:
    f = np.float32
    squares = (x * x).astype(np.float64)  # each square rounded to float, then summed in double
    total = 0.0
    for s in squares:  # in index order, as ggml's loop
        total += float(s)
    mean = f(total / x.size)
    scale = f(1.0) / np.sqrt(f(mean + eps))
    return (x * scale).astype(f) * w


def _numpy_rmsnorm_runc(x: np.ndarray, w: np.ndarray, eps: np.float32) -> np.ndarray:
    f = np.float32
    ss = f(0.0)
    for v in x:
        ss = f(ss + f(v * v))
    ss = f(f(ss / f(x.size)) + eps)
    ss = f(1.0) / np.sqrt(ss)
    return w * (ss * x)


@pytest.mark.parametrize("n", [7, 64, 576, 1000])
def test_rmsnorm_arithmetics_equal_their_formulas(n):
    rng = np.random.default_rng(n)
    x = rng.standard_normal(n).astype(np.float32) * np.float32(3.0)
    w = rng.standard_normal(n).astype(np.float32)
    eps = np.float32(1e-5)
    for arithmetic, reference in (("ggml", _numpy_rmsnorm_ggml), ("run.c", _numpy_rmsnorm_runc)):
        out = np.empty(n, dtype=np.float32)
        rmsnorm_(out, x, w, float(eps), arithmetic)
        assert np.array_equal(out, reference(x, w, eps)), arithmetic


def test_ggml_exp_is_accurate_and_silu_uses_it_on_groups_of_eight():
    x = np.linspace(-80, 80, 100_003, dtype=np.float32)
    rel = np.abs(ggml_exp(x).astype(np.float64) / np.exp(x.astype(np.float64)) - 1)
    assert rel.max() < 4e-7  # ggml's polynomial is within a few ulp of e^x (2^-24 = 6e-8)
    assert ggml_exp(np.array([-200.0, 0.0], np.float32)).tolist() == [0.0, 1.0]
    rng = np.random.default_rng(0)
    gate = rng.standard_normal(13).astype(np.float32) * np.float32(4)
    up = rng.standard_normal(13).astype(np.float32)
    hb = gate.copy()
    swiglu_(hb, up, "ggml")
    f = np.float32
    e = np.concatenate([ggml_exp(-gate[:8]), np.exp(-gate[8:])])  # the tail of 5 uses libm's expf
    expected = (gate / (f(1) + e)).astype(f) * up
    assert np.allclose(hb, expected, rtol=2e-7, atol=0)  # numpy's exp is not libm's: ulp-close
    assert np.array_equal(hb[:8], expected[:8])


def test_ggml_exp_in_groups_of_eight_equals_the_scalar_form_bit_for_bit():
    # SiLU runs ggml's exp 8 lanes at a time where the CPU has AVX2 (ggml_math.h's pyllama_ggml_v_expf);
    # ggml_exp runs the scalar form one value at a time. Every lane must be the scalar's bits, the two
    # rare branches (|n| > 126: results near the float range's ends; |n| > 192: 0 or inf) included.
    f = np.float32
    signs = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40, -1e-40]
    edges = [88.72, 88.73, 89.0, -87.3, -87.4, -103.9, -104.0, -150.0, 87.34, -87.34, 127.0, -127.0, 133.0, -133.0]
    specials = signs + edges + [200.0, -200.0]
    x = np.concatenate([np.linspace(-200, 200, 40_000, dtype=f), np.array(specials, f)])
    x = np.concatenate([x, np.zeros(-x.size % 8, f)])  # whole groups: no libm tail
    hb = x.copy()
    swiglu_(hb, np.ones_like(x), "ggml")
    with np.errstate(all="ignore"):
        expected = (x / (f(1) + ggml_exp(f(0) - x))).astype(f)
    assert np.array_equal(hb.view(np.uint32)[~np.isnan(x)], expected.view(np.uint32)[~np.isnan(x)])
    assert np.isnan(hb[np.isnan(x)]).all()


def test_unknown_arithmetic_is_refused():
    with pytest.raises(InputError, match="arithmetic"):
        Model.load(shared_file("stories260K.bin"), arithmetic="fast")


def test_formats_choose_their_programs_arithmetic():
    assert Model.load(shared_file("stories260K.bin")).config.arithmetic == "run.c"
    assert Model.load(shared_file("stories260K-f32.gguf")).config.arithmetic == "ggml"


def _worst_by_layer(arithmetic: str | None) -> dict[int, float]:
    log = parse_evalcb_log(shared_file("evalcb-smollm2-hello_world.log"))
    trace = trace_prompt(Model.load(shared_file(SMOLLM2), arithmetic=arithmetic), HELLO_WORLD_SMOLLM2)
    worst: dict[int, float] = {}
    for row, tensor in zip(summarize(trace, log), trace.tensors, strict=True):
        assert row.reference is not None, row.name
        l1 = float(np.abs(_corners(tensor.data.reshape(log.entries[row.name].ne[::-1]), 3)).sum())
        suffix = row.name.rpartition("-")[2]
        layer = int(suffix) if suffix.isdigit() else (-1 if row.name == "inp_embd" else 30)  # 30: result_*
        worst[layer] = max(worst.get(layer, 0.0), row.abs_diff / l1)
    return worst


def test_smollm2_trace_equals_llama_cpp_in_every_layer():
    worst = _worst_by_layer(None)
    assert sorted(worst) == list(range(-1, 31))
    assert max(worst.values()) <= ROUNDING_OF_L1, worst
    # the same file with run.c's rmsnorm and SiLU: layer 0 already holds a flip
    assert _worst_by_layer("run.c")[0] > 100 * ROUNDING_OF_L1
