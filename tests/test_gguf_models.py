"""GGUF models with random weights, written with gguf-py's writer, against the float64 numpy reference.

Tolerances (relative to the largest |logit| of the position):
* F32 and F16: the engine computes in float32 on the same weight values the reference uses (F16
  weights are converted exactly), so the difference is float32 rounding through a few layers of
  dot products of length <= 96: measured below 1e-6; 1e-5 leaves a margin of 10.
* BF16 weights are widened exactly and meet the float32 activation, as F16 does: 1e-5.
* Q8_0, Q4_0, Q4_1, Q5_0, Q5_1: the reference applies llama.cpp's activation quantisation (Q8_0 or Q8_1)
  before each such matmul, so both compute the same integer products; measured below 2e-7. An activation
  that lands within float32 rounding of a .5 boundary can round to the neighbouring integer in one of
  the two (one step of amax/127 in one of 32 values), which moves the logits by up to ~1e-3: 2e-3. With
  4- and 5-bit weights one such flip at the classifier's input measured 4.6e-3 (qwen2 Q5_1, one
  position; all others below 3e-7): 1e-2. The median over positions stays below 1e-6 for every type.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from gguf_reference import NumpyGGUF, write_random_gguf

from pyllama.checkpoint import QType, load_checkpoint
from pyllama.checkpoint.gguf import load_gguf
from pyllama.model import Model

TOLERANCE = {"f32": 1e-5, "f16": 1e-5, "bf16": 1e-5, "q8_0": 2e-3}
TOLERANCE.update(dict.fromkeys(["q4_0", "q4_1", "q5_0", "q5_1"], 1e-2))
TYPICAL = 1e-6  # the median over positions, for every type: flips are rare
TOKENS = [1, 5, 17, 95, 3, 3, 40, 2, 60, 11]
CASES = list(itertools.product(["llama", "qwen2"], ["f32", "f16", "q8_0"], [False, True]))
# the types gguf-py writes beside them (the K-quants and IQ4_NL are checked kernel by kernel only)
CASES += [(arch, qtype, True) for arch in ("llama", "qwen2") for qtype in ("bf16", "q4_0", "q4_1", "q5_0", "q5_1")]


def _model_kwargs(arch: str, gqa: bool) -> dict:
    kw = {"arch": arch, "n_heads": 4, "n_kv_heads": 2 if gqa else 4}
    if arch == "qwen2":
        kw.update(n_rot=8, rope_base=1e6)  # partial NEOX rotation (8 of 16 dims), Qwen's base
    return kw


@pytest.mark.parametrize("arch,qtype,tied", CASES)
def test_random_model_matches_numpy_reference(tmp_path, arch, qtype, tied):
    path = write_random_gguf(tmp_path / "m.gguf", qtype=qtype, tied=tied, seed=7, **_model_kwargs(arch, True))
    cfg, weights = load_checkpoint(path)
    assert cfg.arch == arch and cfg.shared_classifier == tied and cfg.qkv_bias == (arch == "qwen2")
    assert cfg.rope_style == ("neox" if arch == "qwen2" else "normal")
    assert cfg.n_kv_heads == 2 and cfg.kv_mul == 2
    engine = Model(cfg, weights, None, str(path), threads=2).engine("causal")
    ref = NumpyGGUF(path, quantize_activations=qtype not in ("f32", "f16", "bf16"))
    errors = []
    for pos, token in enumerate(TOKENS):
        ours = np.asarray(engine.forward(token, pos), dtype=np.float64)
        expected = ref.forward(token, pos)
        errors.append(np.abs(ours - expected).max() / np.abs(expected).max())
        assert errors[-1] < TOLERANCE[qtype], f"position {pos}: relative error {errors[-1]:.2e}"
    assert np.median(errors) < TYPICAL


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_llama_and_qwen2_without_gqa_and_with_mixed_types(tmp_path, arch):
    """Types vary per tensor inside one file; 1-D tensors may be F16 too."""
    types = {"blk.0.attn_q.weight": "f16", "blk.1.ffn_up.weight": "q8_0", "token_embd.weight": "q8_0"}
    path = write_random_gguf(tmp_path / "m.gguf", qtype="f32", tensor_types=types, seed=3, **_model_kwargs(arch, False))
    cfg, weights = load_checkpoint(path)
    assert cfg.n_kv_heads == cfg.n_heads
    assert weights.layers[0].wq.qtype == QType.F16 and weights.layers[1].w3.qtype == QType.Q8_0
    assert weights.token_embedding.qtype == QType.Q8_0 and weights.classifier.qtype == QType.F32
    engine = Model(cfg, weights, None, str(path), threads=1).engine("causal")
    ref = NumpyGGUF(path, quantize_activations=True)
    for pos, token in enumerate(TOKENS[:6]):
        ours = np.asarray(engine.forward(token, pos), dtype=np.float64)
        expected = ref.forward(token, pos)
        assert np.abs(ours - expected).max() / np.abs(expected).max() < TOLERANCE["q8_0"]


@pytest.mark.parametrize("qtype", ["f16", "q8_0"])
def test_logits_do_not_depend_on_thread_count(tmp_path, qtype):
    path = write_random_gguf(tmp_path / "m.gguf", qtype=qtype, dim=96, hidden_dim=136, n_heads=6, n_kv_heads=3, seed=5)
    cfg, weights = load_checkpoint(path)
    model = Model(cfg, weights, None, str(path))
    runs = []
    for threads in (1, 2):
        engine = model.engine("causal", threads)
        runs.append(np.stack([np.array(engine.forward(t, p)) for p, t in enumerate(TOKENS)]))
    assert np.array_equal(runs[0], runs[1])


def test_weights_are_zero_copy_views_in_their_stored_type(tmp_path):
    path = write_random_gguf(tmp_path / "m.gguf", qtype="q8_0", tensor_types={"blk.0.attn_k.weight": "f16"})
    cfg, weights = load_gguf(path)
    mapped = weights.source.data
    for tensor in weights.tensors():
        assert np.shares_memory(tensor.data, mapped), tensor.name
    assert weights.layers[0].wq.data.dtype == np.uint8 and weights.layers[0].wq.qtype == QType.Q8_0
    assert weights.layers[0].wq.data.nbytes == cfg.q_dim * cfg.dim // 32 * 34
    assert weights.layers[0].wk.data.dtype == np.float16
    assert weights.layers[0].w2.qtype == QType.F32  # rows of 84 values are not whole Q8_0 blocks
    assert np.shares_memory(weights.layers[0].attn_norm, mapped)


def test_metadata_defaults_follow_llama_cpp(tmp_path):
    """No head_count_kv, rope.dimension_count, rope.freq_base or token list: llama.cpp's defaults."""
    path = write_random_gguf(
        tmp_path / "m.gguf", n_heads=4, n_kv_heads=4, with_vocab=False, skip_keys=("head_count_kv",), vocab=77
    )
    cfg, _ = load_gguf(path)
    assert (cfg.n_kv_heads, cfg.head_dim, cfg.n_rot, cfg.rope_theta, cfg.vocab_size) == (4, 16, 16, 10000.0, 77)
    assert cfg.seq_len == 64 and cfg.norm_eps == pytest.approx(1e-5)


def test_rope_base_and_epsilon_are_read(tmp_path):
    path = write_random_gguf(tmp_path / "m.gguf", arch="qwen2", n_rot=8, rope_base=1e6, eps=1e-6)
    cfg, _ = load_gguf(path)
    assert cfg.rope_theta == 1e6 and cfg.n_rot == 8 and cfg.norm_eps == pytest.approx(1e-6)


def test_generate_through_the_model_api(tmp_path):
    path = write_random_gguf(tmp_path / "m.gguf", qtype="q8_0", seed=0)
    cfg, weights = load_checkpoint(path)
    model = Model(cfg, weights, None, str(path), threads=2)
    out = model.generate([1, 5, 9], steps=20, temperature=0.0, ignore_eos=True)
    ref = NumpyGGUF(path, quantize_activations=True)
    ids, token = [], None
    for pos in range(20):
        token = [1, 5, 9][pos] if pos < 3 else token
        logits = ref.forward(token, pos)
        if pos >= 2:
            token = int(np.argmax(logits))
            ids.append(token)
    assert out.ids == ids


@pytest.mark.parametrize("qtype", ["iq4_nl", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k"])
def test_k_quant_and_iq4_nl_models_match_numpy_reference(tmp_path, qtype):
    """Random blocks stored with gguf-py's writer (it cannot quantise these types), every matrix and
    the tied embedding in the type, against the float64 reference with llama.cpp's Q8_0/Q8_K
    activations; the tolerances are those of the other block types above."""
    path = write_random_gguf(tmp_path / "m.gguf", qtype=qtype, tied=True, seed=5, dim=256, hidden_dim=512)
    cfg, weights = load_checkpoint(path)
    assert {t.qtype.name for t in weights.tensors()} == {qtype.upper()}
    engine = Model(cfg, weights, None, str(path), threads=2).engine("causal")
    ref = NumpyGGUF(path, quantize_activations=True)
    errors = []
    for pos, token in enumerate(TOKENS[:6]):
        ours = np.asarray(engine.forward(token, pos), dtype=np.float64)
        expected = ref.forward(token, pos)
        errors.append(np.abs(ours - expected).max() / np.abs(expected).max())
        assert errors[-1] < 1e-2, f"position {pos}: relative error {errors[-1]:.2e}"
    assert np.median(errors) < TYPICAL
