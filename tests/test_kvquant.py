"""``kvquant:k=TYPE,v=TYPE``: llama.cpp's KV-cache types.

The stored bytes against gguf-py's ``quantize`` (and tests/kvquant_reference.py, which ports
IQ4_NL's reference quantiser) bit for bit; the attention against the shared routine over gguf-py's
``dequantize`` of those bytes; ``k=f32,v=f32`` against ``causal`` bit for bit; the ledger against
the table of docs/methods.md; llama.cpp's own cache bytes (kvquant_llamacpp_smollm2.json, recorded
from llama.cpp's KV cache; see its note) against the plugin's on SmolLM2.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import MODELS, make_checkpoint, shared_file
from gguf import GGMLQuantizationType as G
from gguf import quants
from kvquant_reference import CACHE_TYPES, dequantize_row, quantize_row, roundtrip

from pyllama.attention.head import attend_rows
from pyllama.attention.kvquant import dequantize_row as plugin_dequantize
from pyllama.attention.kvquant import quantize_row as plugin_quantize
from pyllama.config import ModelConfig
from pyllama.engine import Pool
from pyllama.errors import PluginError
from pyllama.model import Model
from pyllama.plugins.kvquant import KVQuant

REPO = Path(__file__).resolve().parents[1]
LLAMACPP = Path(__file__).parent / "kvquant_llamacpp_smollm2.json"
SMOLLM2 = "SmolLM2-135M-Instruct.Q4_1.gguf"
QUANT_MODELS = sorted((MODELS / "quant").glob("*.gguf"))
# a GQA shape with llama.cpp's block size dividing the heads (head_dim 64), two layers
SHAPE = ModelConfig(dim=256, hidden_dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=16, seq_len=64)


def random_rows(type_name: str, seed: int) -> np.ndarray:
    """Rows of 64 values meant to reach every branch of the quantisers: Gaussian at many scales, blocks
    with zeros, a block all zeros, repeated magnitudes of both signs (the first maximum), values on the
    Q8_0 grid's halves (127 * x / amax = k + 0.5) and values beyond float16's range (f16 only)."""
    rng = np.random.default_rng(seed)
    rows = [rng.standard_normal(64) * scale for scale in (1e-6, 1e-2, 1.0, 30.0, 1e3)]
    sparse = rng.standard_normal(64)
    sparse[rng.random(64) < 0.6] = 0.0
    rows += [sparse, np.zeros(64), np.tile([2.0, -2.0, 1.0, -1.0], 16)]
    halves = np.zeros(64)
    halves[0] = 127.0
    halves[1:32] = np.arange(31) + 0.5
    halves[32:] = -halves[:32]
    rows.append(halves)
    if type_name == "f16":
        rows.append(np.array([7e4, -7e4, 65504.0, 65520.0] * 16))
    rows += [rng.standard_normal(64) * rng.uniform(0.01, 100) for _ in range(40)]
    return np.asarray(rows, dtype=np.float32)


def bind(plugin, config=SHAPE, threads=1):
    pool = Pool(threads)
    plugin._configure(config, pool)
    plugin.init(config, pool)
    return plugin


# ---- the stored bytes --------------------------------------------------------------------------------
@pytest.mark.parametrize("type_name", list(CACHE_TYPES))
def test_stored_bytes_are_gguf_py_quantize_bit_for_bit(type_name):
    with np.errstate(over="ignore"):  # f16's rows beyond its range become infinities, as numpy's
        for i, row in enumerate(random_rows(type_name, seed=len(type_name))):
            stored = plugin_quantize(row, type_name)
            assert np.array_equal(stored, quantize_row(row, type_name)), (type_name, i)
            if type_name != "iq4_nl":  # gguf-py has no IQ4_NL quantiser: the reference ports llama.cpp's
                direct = np.ascontiguousarray(quants.quantize(row, CACHE_TYPES[type_name])).view(np.uint8).ravel()
                assert np.array_equal(stored, direct), (type_name, i)
            read = plugin_dequantize(stored, type_name)
            assert read.tobytes() == dequantize_row(stored, type_name).tobytes(), (type_name, i)


def test_iq4_nl_reads_back_as_gguf_py_dequantizes():
    row = np.random.default_rng(5).standard_normal(32 * 64).astype(np.float32)
    stored = plugin_quantize(row, "iq4_nl")
    assert plugin_dequantize(stored, "iq4_nl").tobytes() == quants.dequantize(stored, G.IQ4_NL).ravel().tobytes()


def docs_table() -> dict[str, int]:
    """The kvquant table of docs/methods.md: type -> bytes per 32 values."""
    text = (REPO / "docs" / "methods.md").read_text()
    section = text.split("### kvquant: llama.cpp's cache types", 1)[1].split("###", 1)[0]
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^\| `(\w+)` \| (\d+) \|", section, re.M)}


def test_each_type_holds_the_bytes_of_the_docs_table():
    table = docs_table()
    assert set(table) == set(CACHE_TYPES)
    n = 5
    for type_name, per_32 in table.items():
        assert quantize_row(np.ones(64, np.float32), type_name).size == 2 * per_32
        plugin = bind(KVQuant(type_name, "f32"))
        rng = np.random.default_rng(0)
        for t in range(n):
            for layer in range(SHAPE.n_layers):
                q, k, v = (rng.standard_normal(d).astype(np.float32) for d in (SHAPE.q_dim, SHAPE.kv_dim, SHAPE.kv_dim))
                plugin.attend(layer, t, q, k, v, np.zeros(SHAPE.q_dim, np.float32))
        # keys in the type, values in f32 (128 bytes per 32), every layer, n positions
        assert plugin.memory_bytes() == SHAPE.n_layers * n * (SHAPE.kv_dim // 32) * (per_32 + 128), type_name
        assert [h.tolist() for h in plugin.held_positions(1)] == [list(range(n))] * SHAPE.n_kv_heads


# ---- the attention ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "k_type, v_type",
    [("q8_0", "q8_0"), ("q4_1", "q5_0"), ("iq4_nl", "q5_1"), ("f16", "bf16"), ("q4_0", "f32"), ("f32", "f32")],
)
def test_attention_is_the_shared_routine_over_gguf_py_rows(k_type, v_type):
    T = 40
    rng = np.random.default_rng(1)
    # [layer, position, width]: a layer's rows are contiguous
    q = (rng.standard_normal((SHAPE.n_layers, T, SHAPE.q_dim)) * 2).astype(np.float32)
    k = (rng.standard_normal((SHAPE.n_layers, T, SHAPE.kv_dim)) * 2).astype(np.float32)
    v = rng.standard_normal((SHAPE.n_layers, T, SHAPE.kv_dim)).astype(np.float32)
    plugin, blocked = bind(KVQuant(k_type, v_type)), bind(KVQuant(k_type, v_type))
    for layer in range(SHAPE.n_layers):
        keys = np.stack([roundtrip(k[layer, t], k_type) for t in range(T)])
        values = np.stack([roundtrip(v[layer, t], v_type) for t in range(T)])
        for t in range(T):
            out, want = np.zeros(SHAPE.q_dim, np.float32), np.zeros(SHAPE.q_dim, np.float32)
            plugin.attend(layer, t, q[layer, t], k[layer, t], v[layer, t], out)
            attend_rows(SHAPE, q[layer, t], keys[: t + 1], values[: t + 1], want)
            assert out.tobytes() == want.tobytes(), (layer, t)
        stored_k, stored_v = plugin.stored_rows(layer)
        assert np.array_equal(stored_k, np.stack([quantize_row(k[layer, t], k_type) for t in range(T)]))
        assert np.array_equal(stored_v, np.stack([quantize_row(v[layer, t], v_type) for t in range(T)]))
        # the same positions as blocks of 1, 17 and 22: the bits of one position at a time
        outs = np.zeros((T, SHAPE.q_dim), np.float32)
        for start, stop in ((0, 1), (1, 18), (18, T)):
            blocked.attend_block(
                layer, start, q[layer, start:stop], k[layer, start:stop], v[layer, start:stop], outs[start:stop]
            )
        for t in range(T):
            want = np.zeros(SHAPE.q_dim, np.float32)
            attend_rows(SHAPE, q[layer, t], keys[: t + 1], values[: t + 1], want)
            assert outs[t].tobytes() == want.tobytes(), (layer, t)


def test_the_thread_count_changes_no_bit(tmp_path, parallel_always):
    shape = "--dim 128 --hidden-dim 96 --layers 2 --heads 4 --kv-heads 2 --vocab 64 --seq-len 600 --seed 4"
    path = make_checkpoint(tmp_path / "h32.bin", "custom", *shape.split())
    model = Model.load(path)
    ids = np.random.default_rng(2).integers(0, 64, 560)
    for spec in ("kvquant:k=q4_0,v=q8_0", "kvquant:k=iq4_nl,v=bf16"):
        one, two = model.logits(ids, spec, threads=1), model.logits(ids, spec, threads=2)
        assert one.tobytes() == two.tobytes(), spec


# ---- identities -------------------------------------------------------------------------------------
def test_f32_is_causal_bit_for_bit_on_stories260k():
    model = Model.load(shared_file("stories260K.bin"), tokenizer=shared_file("tok512.bin"), threads=2)
    for blocks in (True, False):
        report = model.diff("causal", "kvquant:k=f32,v=f32", probe="stories", blocks=blocks)
        assert report.summary["exact"] and report.summary["max_abs_dlogit"] == 0.0, report.table()
    # heads of 8 take the float types (the quantised ones are refused, below)
    report = model.diff("causal", "kvquant:k=f16,v=bf16", probe="stories")
    assert 0 < report.summary["max_abs_dlogit"] < 5 and report.summary["bytes_ratio_b"] == 0.5


def smollm2_text(model: Model, n: int) -> list[int]:
    words = (REPO / "docs" / "methods.md").read_text().split()
    return model.tokenize(" ".join(words))[:n]


def test_f32_is_causal_bit_for_bit_on_smollm2():
    model = Model.load(shared_file(SMOLLM2), threads=2)
    for probe in (smollm2_text(model, 160), "passkey:length=200"):  # the passkey has a compression event
        report = model.diff("causal", "kvquant:k=f32,v=f32", probe=probe)
        assert report.summary["exact"] and report.summary["max_abs_dlogit"] == 0.0, report.table()


@pytest.mark.kv_grid
@pytest.mark.parametrize("blocks", [True, False])
@pytest.mark.parametrize("path", [MODELS / SMOLLM2, *QUANT_MODELS], ids=lambda p: getattr(p, "name", p))
def test_f32_is_causal_bit_for_bit_on_every_gguf(path, blocks):
    model = Model.load(shared_file(path.relative_to(MODELS).as_posix()), threads=2)
    report = model.diff(
        "causal",
        "kvquant:k=f32,v=f32",
        probe=smollm2_text(model, 600) if path.name == SMOLLM2 else "stories",
        blocks=blocks,
    )
    assert report.summary["exact"] and report.summary["max_abs_dlogit"] == 0.0, report.table()


# ---- refusals ---------------------------------------------------------------------------------------
def test_a_type_llama_cpp_has_no_cache_for_is_refused_in_one_line():
    model = Model.load(shared_file("stories260K.bin"), tokenizer=shared_file("tok512.bin"))
    for spec, words in (
        ("kvquant:k=q3_k", ("kvquant", "k='q3_k'", "q4_0")),
        ("kvquant:v=int8", ("kvquant", "v=")),
        ("kvquant:k=q8_0", ("kvquant", "k=q8_0", "head_dim of 8", "llama.cpp")),
        ("kvquant:v=iq4_nl", ("kvquant", "v=iq4_nl", "f16")),
    ):
        with pytest.raises(PluginError) as err:
            model.generate("Once", steps=3, attention=spec)
        assert "\n" not in str(err.value) and all(w in str(err.value) for w in words), str(err.value)
    with pytest.raises(PluginError, match="kvquant: k='Q8_0' is not one of"):
        KVQuant("Q8_0")


# ---- llama.cpp ------------------------------------------------------------------------------------------
def test_layer_0_stores_llama_cpp_own_cache_bytes():
    """llama.cpp's KV cache after its first positions (rotation off, see the data's note): at layer 0 the
    rows going in are the same in both engines, and so is every stored byte, K and V, q8_0 and q4_0."""
    data = json.loads(LLAMACPP.read_text())
    model = Model.load(shared_file(SMOLLM2), threads=2)
    ids = np.array(data["cache_ids"], dtype=np.int32)
    for type_name, cache in data["layer0_cache"].items():
        engine = model.engine(f"kvquant:k={type_name},v={type_name}")
        engine.forward_block(ids, 0, np.zeros((len(ids), model.config.vocab_size), np.float32))
        keys, values = engine.attention.stored_rows(0)
        assert keys.tobytes().hex() == "".join(cache["k"]), type_name
        assert values.tobytes().hex() == "".join(cache["v"]), type_name


@pytest.mark.kv_grid
def test_teacher_forced_argmax_agrees_with_llama_cpp(capsys):
    """Every position's argmax against llama.cpp's with the same cache type (docs/methods.md has the
    table and the reasons they differ); the floors are the measured figures, rounded down."""
    data = json.loads(LLAMACPP.read_text())
    model = Model.load(shared_file(SMOLLM2), threads=2)
    ids = np.array(data["ids"], dtype=np.int32)
    floors = {
        "causal": ("f32 fa=off", 0.998),
        "kvquant:k=q8_0,v=q8_0": ("q8_0 fa=on rot=off", 0.99),
        "kvquant:k=q4_0,v=q4_0": ("q4_0 fa=on rot=off", 0.96),
    }
    for spec, (run, floor) in floors.items():
        ours = model.logits(ids, spec).argmax(axis=1)
        agreement = float((ours == np.array(data["argmax"][run])).mean())
        with capsys.disabled():
            print(f"\n{spec} against llama.cpp {run}: argmax agreement {agreement:.4f} over {len(ids)} positions")
        assert agreement >= floor, (spec, agreement)


@pytest.mark.kv_grid
def test_q4_0_holds_at_most_a_fifth_of_causal_on_a_passkey(capsys):
    model = Model.load(shared_file(SMOLLM2), threads=2)
    report = model.diff("causal", "kvquant:k=q4_0,v=q4_0", probe="passkey:length=1500")
    causal, ours = report.summary["bytes_last_a"], report.summary["bytes_last_b"]
    with capsys.disabled():
        print(
            f"\npasskey:length=1500, last position: causal {causal:,} bytes, "
            f"kvquant q4_0 {ours:,} ({ours / causal:.4f})"
        )
    assert ours <= 0.2 * causal and ours * 128 == causal * 18  # 18 bytes per 32 values against float32's 128


def test_the_token_loop_allocates_nothing(tmp_path):
    """test_engine_alloc's measurement (tracemalloc's peak for 4 positions and for 400) with kvquant."""
    from gguf_reference import write_random_gguf
    from test_engine_alloc import MEASURE

    path = write_random_gguf(
        tmp_path / "m.gguf", dim=256, hidden_dim=128, n_heads=4, n_kv_heads=2, vocab=512, context=512, seed=3
    )
    script = MEASURE.replace('model.engine("causal")', "model.engine(sys.argv[3])")
    for spec in ("kvquant:k=q4_0,v=q8_0", "kvquant:k=f32,v=f32"):
        proc = subprocess.run(
            [sys.executable, "-c", script, str(path), "clean", spec], capture_output=True, text=True, check=True
        )
        for short, long in json.loads(proc.stdout):
            assert long == short and long[0] < 4096, spec
