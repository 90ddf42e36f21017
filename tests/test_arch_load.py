"""Loading the architectures the forward pass does not run yet: ``gemma3``, ``qwen3`` and ``llama``
with Llama 3's ``rope_freqs``. Their ``ModelConfig`` says what llama.cpp derives from the same keys
(``src/llama-model.cpp``, ``src/models/gemma3.cpp`` at 0c1e570), read here independently with
gguf-py where a value comes from the file; their extra tensors are zero-copy views; and anything
that would run them through the engine stops with one line.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from arch_models import llama3_rope_factors
from click.testing import CliRunner
from conftest import shared_file
from gguf import GGUFValueType as VT
from gguf_reference import write_random_gguf

from pyllama.checkpoint import read_checkpoint
from pyllama.checkpoint.gguf import load_gguf
from pyllama.cli import main
from pyllama.config import FFN_GELU_TANH, FFN_SILU, ROPE_NEOX, ROPE_NORMAL, ModelConfig
from pyllama.errors import CheckpointError

DIM, HEADS, LAYERS = 64, 4, 8  # head size 16


def _norms(arch: str, n_layers: int = LAYERS, head_dim: int = DIM // HEADS) -> dict[str, np.ndarray]:
    """The per-layer norm weights qwen3 / gemma3 add to the Llama block."""
    rng = np.random.default_rng(5)
    out = {}
    for i in range(n_layers):
        names = [("attn_q_norm", head_dim), ("attn_k_norm", head_dim)]
        if arch == "gemma3":
            names += [("post_attention_norm", DIM), ("post_ffw_norm", DIM)]
        for name, n in names:
            out[f"blk.{i}.{name}.weight"] = (1 + 0.1 * rng.standard_normal(n)).astype(np.float32)
    return out


def _random(tmp_path, arch: str, extra_kv: dict | None = None, extra_tensors: dict | None = None, **kw):
    tensors = _norms(arch, kw.get("n_layers", LAYERS)) if arch in ("qwen3", "gemma3") else {}
    tensors.update(extra_tensors or {})
    return write_random_gguf(
        tmp_path / f"{arch}.gguf",
        arch=arch,
        dim=DIM,
        n_heads=HEADS,
        n_kv_heads=1,
        n_layers=kw.pop("n_layers", LAYERS),
        tied=True,
        extra_kv=extra_kv,
        extra_tensors=tensors,
        **kw,
    )


def _error(path) -> str:
    with pytest.raises(CheckpointError) as info:
        load_gguf(path)
    message = str(info.value)
    assert "\n" not in message and path.name in message
    return message


# ---- the real files ------------------------------------------------------------------------------


def test_gemma3_270m_config(gemma3):
    parsed = read_checkpoint(gemma3)
    cfg, weights = parsed.config, parsed.weights
    assert (cfg.arch, cfg.dim, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads) == ("gemma3", 640, 18, 4, 1)
    assert (cfg.head_dim, cfg.q_dim, cfg.n_rot, cfg.hidden_dim, cfg.seq_len) == (256, 1024, 256, 2048, 32768)
    # one global layer in six, the last of each six (llama.cpp: layer % 6 < 5 is sliding)
    assert cfg.global_layers == (5, 11, 17)
    assert cfg.layer_windows == tuple(0 if i in (5, 11, 17) else 512 for i in range(18))
    assert cfg.layer_rope_bases == tuple(1e6 if i in (5, 11, 17) else 1e4 for i in range(18))
    assert cfg.rope_theta == 1e6 and cfg.rope_style == ROPE_NEOX and cfg.rope_freq_factors is None
    assert cfg.qk_norm and cfg.post_norms and cfg.ffn_activation == FFN_GELU_TANH
    assert cfg.embedding_scale == float(np.sqrt(np.float32(640))) and cfg.attention_scale == 1 / 16
    assert cfg.shared_classifier and cfg.logit_softcap == 0.0 and not cfg.qkv_bias
    assert np.float32(cfg.norm_eps) == np.float32(1e-6) and cfg.vocab_size == 262144
    reader = gguf.GGUFReader(gemma3)
    stored = {t.name: np.asarray(t.data) for t in reader.tensors}
    layer = weights.layers[11]
    for field, name in (
        ("q_norm", "attn_q_norm"),
        ("k_norm", "attn_k_norm"),
        ("post_attention_norm", "post_attention_norm"),
        ("post_ffn_norm", "post_ffw_norm"),
    ):
        view = getattr(layer, field)
        assert np.array_equal(view, stored[f"blk.11.{name}.weight"])
        assert not view.flags.owndata and not view.flags.writeable  # a view of the map
    assert weights.classifier is weights.token_embedding


def test_tiny_qwen3_config():
    parsed = read_checkpoint(shared_file("arch/tiny-qwen3-q4_k_m.gguf"))
    cfg, layer = parsed.config, parsed.weights.layers[0]
    assert (cfg.arch, cfg.head_dim, cfg.q_dim, cfg.kv_dim, cfg.dim) == ("qwen3", 64, 512, 128, 256)
    assert cfg.qk_norm and not cfg.post_norms and cfg.rope_style == ROPE_NEOX and cfg.ffn_activation == FFN_SILU
    assert cfg.attention_scale == 0.125 and cfg.global_layers == (0, 1, 2, 3) and cfg.shared_classifier
    assert layer.q_norm.shape == (64,) and layer.k_norm.shape == (64,) and layer.post_attention_norm is None
    assert layer.wq.rows == 512 and layer.wo.cols == 512


def test_tiny_llama3rope_factors():
    cfg = read_checkpoint(shared_file("arch/tiny-llama3rope-q4_k_m.gguf")).config
    # the README's values, and convert_hf_to_gguf.py's formula for them
    assert cfg.rope_freq_factors == (1.0,) * 8 + (2.6945300102233887,) + (8.0,) * 7
    assert np.array_equal(np.float32(cfg.rope_freq_factors), llama3_rope_factors(32, 500000.0))
    assert cfg.rope_style == ROPE_NORMAL and cfg.layer_rope_bases == (500000.0,) * 4


@pytest.mark.parametrize("name", ["tiny-qwen3-q4_k_m.gguf", "tiny-llama3rope-q4_k_m.gguf"])
def test_they_run(name):
    """The forward pass computes them (tests/test_arch_forward.py checks its numbers against llama.cpp)."""
    path = shared_file(f"arch/{name}")
    result = CliRunner().invoke(main, ["generate", "-c", str(path), "-i", "Hello", "-n", "6", "-t", "0"])
    assert result.exit_code == 0, result.output


def test_a_forward_the_engine_lacks_stops_with_one_line():
    """Gemma 3 27B's attention scale (n_embd / n_head) is not 1/sqrt(head_dim): refused, not miscomputed."""
    cfg = ModelConfig(
        dim=64,
        hidden_dim=128,
        n_layers=2,
        n_heads=4,
        n_kv_heads=1,
        vocab_size=32,
        seq_len=64,
        head_dim=32,
        arch="gemma3",
        attention_scale=0.125,
    )
    with pytest.raises(CheckpointError, match="attention scale 0.125"):
        cfg.check_forward("x.gguf")


def test_info_shows_the_per_layer_facts(gemma3):
    result = CliRunner().invoke(main, ["info", str(gemma3)])
    assert result.exit_code == 0, result.output
    facts = dict(line.split(None, 1) for line in result.output.strip().splitlines())
    assert facts["layer_windows"] == "512 (layers 0-4, 6-10, 12-16), global (layers 5, 11, 17)"
    assert facts["layer_rope_bases"] == "10000 (layers 0-4, 6-10, 12-16), 1000000 (layers 5, 11, 17)"
    assert facts["ffn_activation"] == "gelu_tanh" and facts["embedding_scale"] == "25.298222"
    assert facts["qk_norm"] == "True" and facts["attention_scale"] == "0.0625"


# ---- random files: the keys and their defaults ---------------------------------------------------


def test_gemma3_without_a_window_is_global_everywhere(tmp_path):
    cfg = load_gguf(_random(tmp_path, "gemma3"))[0]
    assert cfg.layer_windows == (0,) * LAYERS and cfg.layer_rope_bases == (10000.0,) * LAYERS


@pytest.mark.parametrize(
    "pattern,local",
    [
        (None, [i % 6 < 5 for i in range(LAYERS)]),  # llama.cpp's default for gemma3
        ((3, VT.UINT32), [i % 3 < 2 for i in range(LAYERS)]),
        ((0, VT.UINT32), [True] * LAYERS),  # a period of 0: every layer slides
        ((1, VT.UINT32), [False] * LAYERS),
        (([True, False] * 4, VT.ARRAY), [True, False] * 4),  # one flag per layer
    ],
)
def test_gemma3_sliding_window_pattern(tmp_path, pattern, local):
    kv = {"{arch}.attention.sliding_window": (128, VT.UINT32), "{arch}.rope.freq_base": (1e6, VT.FLOAT32)}
    if pattern is not None:
        kv["{arch}.attention.sliding_window_pattern"] = pattern
    cfg = load_gguf(_random(tmp_path, "gemma3", extra_kv=kv))[0]
    assert cfg.layer_windows == tuple(128 if is_local else 0 for is_local in local)
    assert cfg.layer_rope_bases == tuple(10000.0 if is_local else 1e6 for is_local in local)


def test_gemma3_reads_its_own_keys(tmp_path):
    kv = {
        "{arch}.attention.sliding_window": (64, VT.UINT32),
        "{arch}.rope.freq_base_swa": (20000.0, VT.FLOAT32),
        "{arch}.final_logit_softcapping": (30.0, VT.FLOAT32),
    }
    cfg = load_gguf(_random(tmp_path, "gemma3", extra_kv=kv))[0]
    assert set(cfg.layer_rope_bases) == {20000.0, 10000.0} and cfg.logit_softcap == 30.0
    assert cfg.embedding_scale == float(np.sqrt(np.float32(DIM))) and cfg.attention_scale == 0.25


def test_gemma3_27b_scales_attention_by_width_over_heads(tmp_path):
    """llama.cpp's one exception (62 layers): 1/sqrt(n_embd / n_head), not 1/sqrt(key_length)."""
    kv = {"{arch}.attention.key_length": (8, VT.UINT32), "{arch}.attention.value_length": (8, VT.UINT32)}
    norms = _norms("gemma3", 62, head_dim=8)
    path = write_random_gguf(
        tmp_path / "g.gguf", arch="gemma3", dim=DIM, hidden_dim=32, n_heads=HEADS, n_kv_heads=1, n_layers=62,
        vocab=32, tied=True, extra_kv=kv, extra_tensors=norms, head_dim=8,
    )  # fmt: skip
    cfg = load_gguf(path)[0]
    assert cfg.head_dim == 8 and cfg.attention_scale == 0.25  # 1/sqrt(64 / 4), where 1/sqrt(8) would be 0.354


def test_qwen3_needs_its_norms(tmp_path):
    path = _random(tmp_path, "qwen3")
    raw = load_gguf(path)[0]
    assert raw.qk_norm and raw.rope_style == ROPE_NEOX
    path = write_random_gguf(tmp_path / "bare.gguf", arch="qwen3", dim=DIM, n_heads=HEADS, n_kv_heads=1)
    assert "tensor blk.0.attn_q_norm.weight is missing" in _error(path)


def test_rope_freqs_outside_llama_is_refused(tmp_path):
    path = write_random_gguf(
        tmp_path / "m.gguf", arch="qwen2", extra_tensors={"rope_freqs.weight": np.ones(8, np.float32)}
    )
    assert "rope_freqs" in _error(path) and "tensors pyllama would ignore" in _error(path)


@pytest.mark.parametrize("factor", [0.0, np.inf, np.nan, -1.0])
def test_rope_freqs_must_be_finite_and_positive(tmp_path, factor):
    factors = np.ones(8, np.float32)
    factors[3] = factor
    path = write_random_gguf(tmp_path / "m.gguf", extra_tensors={"rope_freqs.weight": factors})
    assert "rope_freqs.weight holds factors that are not finite and positive" in _error(path)


@pytest.mark.parametrize(
    "key,value,words",
    [
        ("{arch}.attention.sliding_window_pattern", ([True] * 3, VT.ARRAY), "has 3 values for 8 layers"),
        ("{arch}.attention.key_length_swa", (16, VT.UINT32), "heads that differ per layer are not supported"),
        ("{arch}.attention.sliding_window_pattern", ([1.5] * 8, VT.ARRAY), "should be an array of bool"),
    ],
)
def test_gemma3_keys_pyllama_cannot_follow(tmp_path, key, value, words):
    kv = {"{arch}.attention.sliding_window": (64, VT.UINT32), key: value}
    assert words in _error(_random(tmp_path, "gemma3", extra_kv=kv))


def test_config_defaults_keep_todays_models_as_they_were():
    cfg = ModelConfig(dim=64, hidden_dim=128, n_layers=3, n_heads=4, n_kv_heads=2, vocab_size=10, seq_len=32)
    assert cfg.layer_windows == (0, 0, 0) and cfg.layer_rope_bases == (10000.0,) * 3
    assert cfg.attention_scale == float(np.float32(1) / np.sqrt(np.float32(16))) and cfg.embedding_scale == 1.0
    cfg.check_forward()  # runs
    with pytest.raises(ValueError, match="layer_windows has 2 values for 3 layers"):
        ModelConfig(dim=64, hidden_dim=128, n_layers=3, n_heads=4, n_kv_heads=2, vocab_size=10, seq_len=32,
                    layer_windows=(0, 512))  # fmt: skip
