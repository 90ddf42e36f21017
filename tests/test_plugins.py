"""Attention plugins: spec strings, the registry and its contract checks, every registered plugin
through one contract test, and sliding/sink/causal against a plain float64 numpy reference."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pyllama.attention import UNBOUNDED, Attention, Knob, attend_one_head, attend_rows, registry
from pyllama.attention.registry import create_plugin, plugin_infos, plugin_names, register, resolve_spec
from pyllama.attention.spec import REQUIRED, parse_args, split_spec
from pyllama.checkpoint import load_checkpoint
from pyllama.config import ROPE_NEOX, ROPE_NORMAL, ModelConfig
from pyllama.engine import Engine, Pool
from pyllama.errors import PluginError, PositionError
from pyllama.kernels.rope import apply as rope_apply
from pyllama.plugins.causal import Causal
from pyllama.plugins.sink import Sink

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "experiments" / "random_evict.py"
EXAMPLE_SPEC = f"{EXAMPLE}:RandomEvict"


@pytest.fixture
def clean_registry(monkeypatch):
    """A registry without run-time registrations or cached entry points, restored afterwards."""
    monkeypatch.setattr(registry, "_registered", {})
    monkeypatch.setattr(registry, "_entry_points", lambda: {})


# ---- spec strings ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "args, expected",
    [
        ("4,252,shift", {"sinks": 4, "window": 252, "shift": True}),
        ("", {"sinks": 4, "window": 252, "shift": False}),
        ("window=8", {"sinks": 4, "window": 8, "shift": False}),
        ("shift,2", {"sinks": 2, "window": 252, "shift": True}),
        (" 1 , window = 3 , shift=false ", {"sinks": 1, "window": 3, "shift": False}),
        ("0,1,yes", {"sinks": 0, "window": 1, "shift": True}),
    ],
)
def test_positional_keyword_and_flag_arguments(args, expected):
    assert parse_args("sink", Sink.knobs, args) == expected


@pytest.mark.parametrize(
    "spec, message",
    [
        ("sliding:0", "sliding: window=0 is below its minimum 1"),
        ("sliding:abc", "sliding: window='abc' is not a valid int"),
        ("sliding:size=3", "sliding: unknown knob 'size'; knobs: window (int >= 1, default 256)"),
        ("sliding:1,2", "sliding: 2 positional arguments (1, 2) but it has 1 knob;"),
        ("sliding:window=1,window=2", "sliding: window is given twice"),
        ("sink:5,window=3,7", "sink: window is given twice"),
        ("sink:4,,2", "sink: empty argument"),
        ("sink:4,252,shift=maybe", "sink: shift='maybe' is not a valid bool"),
        ("causal:positions=-1", "causal: positions=-1 is below its minimum 0"),
        ("nope", "unknown attention plugin 'nope'; available: causal, sliding, sink"),
        ("", "empty attention spec"),
        ("some/file.py", "path/to/file.py:ClassName"),
    ],
)
def test_bad_specs_are_one_clear_line(spec, message):
    with pytest.raises(PluginError) as err:
        create_plugin(spec)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_choice_float_and_required_knobs():
    knobs = (
        Knob("mode", ("exact", "fast"), "exact", "how"),
        Knob("rate", float, 0.5, "a fraction", min=0.0, max=1.0),
        Knob("clusters", int, REQUIRED, "how many", min=1),
    )
    assert parse_args("x", knobs, "fast,0.25,16") == {"mode": "fast", "rate": 0.25, "clusters": 16}
    assert parse_args("x", knobs, "clusters=3") == {"mode": "exact", "rate": 0.5, "clusters": 3}
    with pytest.raises(PluginError, match="mode='slow' is not one of exact, fast"):
        parse_args("x", knobs, "slow,0.1,2")
    with pytest.raises(PluginError, match="rate=1.5 is above its maximum 1"):
        parse_args("x", knobs, "rate=1.5,clusters=2")
    with pytest.raises(PluginError, match="x: missing clusters"):
        parse_args("x", knobs, "fast")


def test_split_spec_and_canonical_form():
    assert split_spec("sink:4,252") == ("sink", None, "4,252")
    assert split_spec("dir/x.py:Cls:budget=3") == ("dir/x.py", "Cls", "budget=3")
    assert split_spec("x.py:Cls") == ("x.py", "Cls", "")
    assert resolve_spec("sink:4,252,shift").canonical == "sink:sinks=4,window=252,shift=true"
    assert resolve_spec("causal").canonical == "causal:positions=0"


# ---- the registry -----------------------------------------------------------------------------------
def test_builtins_are_listed_with_description_and_knobs():
    infos = {i.name: i for i in plugin_infos()}
    for name in ("causal", "sliding", "sink"):
        assert infos[name].error is None and infos[name].origin == "built-in"
        assert infos[name].description and "\n" not in infos[name].description
    assert [k.name for k in infos["sink"].knobs] == ["sinks", "window", "shift"]
    usable = [i for i in infos.values() if i.error is None]
    assert registry.plugins_markdown().count("\n| `") == len(usable)


def test_builtins_are_native_and_bounded_ones_are_unbounded():
    assert create_plugin(None).native and isinstance(create_plugin(None), Causal)
    for spec in ("sliding:8", "sink:2,8", "sink:2,8,shift"):
        plugin = create_plugin(spec)
        assert plugin.native and plugin.max_positions == UNBOUNDED
    assert create_plugin("causal:positions=100").max_positions == 100
    assert create_plugin("causal").max_positions == 0  # the engine fills in the context


def test_file_plugin_and_its_errors(tmp_path):
    plugin = create_plugin(f"{EXAMPLE_SPEC}:budget=5,seed=3")
    assert (plugin.budget, plugin.seed, plugin.native) == (5, 3, False)
    with pytest.raises(PluginError, match="no such file"):
        create_plugin(f"{tmp_path / 'missing.py'}:X")
    with pytest.raises(PluginError, match="has no class 'Nope'; it defines RandomEvict"):
        create_plugin(f"{EXAMPLE}:Nope")
    broken = tmp_path / "broken.py"
    broken.write_text("x = 1 / 0\n")
    with pytest.raises(PluginError, match=r"importing .*broken.py failed \(ZeroDivisionError"):
        create_plugin(f"{broken}:X")
    with pytest.raises(PluginError, match="budget=0 is below its minimum 1"):
        create_plugin(f"{EXAMPLE_SPEC}:budget=0")


class Keep(Attention):
    """A well-formed plugin for the registry tests."""

    description = "attends to the current position only"
    knobs = (Knob("scale", float, 1.0, "multiplies the output"),)

    def __init__(self, scale: float = 1.0):
        self.scale = scale

    def attend(self, layer, pos, q, k, v, out):
        out[:] = np.repeat(v.reshape(-1, self.config.head_dim), self.config.kv_mul, axis=0).ravel() * self.scale

    def memory_bytes(self):
        return 0


class _EntryPoint:
    def __init__(self, name, value, target):
        self.name, self.value, self._target = name, value, target

    def load(self):
        if isinstance(self._target, Exception):
            raise self._target
        return self._target


def test_entry_point_plugins_are_found_and_checked(monkeypatch, clean_registry):
    class NoLedger(Attention):
        description = "forgets to keep its ledger"

        def attend(self, layer, pos, q, k, v, out):
            out[:] = 0

    eps = {
        "keep": _EntryPoint("keep", "pkg.mod:Keep", Keep),
        "noledger": _EntryPoint("noledger", "pkg.mod:NoLedger", NoLedger),
        "gone": _EntryPoint("gone", "pkg.gone:X", ImportError("No module named 'pkg.gone'")),
    }
    monkeypatch.setattr(registry, "_entry_points", lambda: eps)
    assert plugin_names()[:3] == ["causal", "sliding", "sink"] and {"keep", "noledger", "gone"} <= set(plugin_names())
    assert isinstance(create_plugin("keep:scale=2"), Keep)
    with pytest.raises(PluginError) as err:
        create_plugin("noledger")
    assert str(err.value).startswith("attention plugin noledger (entry point pkg.mod:NoLedger): ")
    assert "memory_bytes()" in str(err.value)
    with pytest.raises(PluginError, match=r"gone \(entry point pkg.gone:X\): cannot load it \(ImportError"):
        create_plugin("gone")
    listed = {i.name: i for i in plugin_infos()}
    assert listed["keep"].error is None and "memory_bytes" in listed["noledger"].error


def _contract_violations():
    class NoDoc(Keep):
        __doc__ = None
        description = ""

    class ClassMaxPositions(Keep):
        max_positions = 4096

    class NoAttend(Attention):
        description = "x"

        def memory_bytes(self):
            return 0

    class KnobNotAccepted(Keep):
        knobs = (Knob("window", int, 4, "w"),)

    class KnobsNotKnobs(Keep):
        knobs = ("window",)

    class TwiceKnob(Keep):
        knobs = (Knob("scale", float, 1.0, "a"), Knob("scale", float, 2.0, "b"))

    class BadDefault(Keep):
        knobs = (Knob("scale", float, -1.0, "a", min=0),)

    class PythonOverNative(Causal):
        def attend(self, layer, pos, q, k, v, out):
            pass

    class WrongSignature(Keep):
        def attend(self, layer, q, k, v, out):
            pass

    class RequiredNonKnob(Keep):
        def __init__(self, path, scale=1.0):
            pass

    return [
        (int, "is not a subclass of pyllama.attention.base.Attention"),
        (NoDoc, "has no description"),
        (ClassMaxPositions, "sets `max_positions` as a class attribute"),
        (NoAttend, "does not implement attend(layer, pos, q, k, v, out)"),
        (KnobNotAccepted, "__init__ does not accept the knob 'window'"),
        (KnobsNotKnobs, "`knobs` must be a tuple of pyllama.attention.spec.Knob"),
        (TwiceKnob, "knob 'scale' is declared twice"),
        (BadDefault, "knob 'scale': its default is invalid"),
        (PythonOverNative, "overrides attend() in Python but inherits a native"),
        (WrongSignature, "does not match the contract attend(self, layer, pos, q, k, v, out)"),
        (RequiredNonKnob, "__init__ requires 'path', which is not a knob"),
    ]


@pytest.mark.parametrize("cls, problem", _contract_violations(), ids=lambda x: getattr(x, "__name__", ""))
def test_contract_is_checked_at_registration(cls, problem, clean_registry):
    with pytest.raises(PluginError) as err:
        register(cls, name="broken")
    assert str(err.value).startswith("attention plugin broken: ")
    assert problem in str(err.value) and "\n" not in str(err.value)
    assert "broken" not in plugin_names()


def test_register_a_class_then_use_it(clean_registry, gqa_unshared):
    register(Keep, name="keep")
    assert "keep" in plugin_names()
    with pytest.raises(PluginError, match="exists already"):
        register(Keep, name="sliding")
    config, weights = load_checkpoint(gqa_unshared)
    engine = Engine(config, weights, create_plugin("keep:scale=1"), 1)
    assert np.isfinite(np.asarray(engine.forward(5, 0))).all()


# ---- every plugin through one contract test -----------------------------------------------------------
def _contract_specs() -> list[str]:
    specs = [name for name in plugin_names() if name != "quest"]  # quest's capacity has no default
    specs += ["quest:capacity=16,dense_layers=1,dense_context=false", "quest:capacity=32", "kvquant:k=f32,v=bf16"]
    specs += ["causal:positions=100", "sliding:5", "sink:2,5", "sink:0,7", "sink:2,5,shift", "sink:0,3,shift"]
    specs += [f"{EXAMPLE_SPEC}:budget=6,seed=1", f"{EXAMPLE_SPEC}:budget=1000"]
    return specs


@pytest.mark.parametrize("spec", _contract_specs(), ids=lambda s: s.replace(str(EXAMPLE), "example"))
def test_plugin_contract(spec, gqa_unshared):
    config, weights = load_checkpoint(gqa_unshared)
    plugin = create_plugin(spec)
    assert isinstance(plugin, Attention)
    engine = Engine(config, weights, plugin, 1)
    assert plugin.config is config and plugin.n_threads == 1
    assert engine.max_positions >= 1
    assert engine.max_positions >= config.seq_len or spec.startswith("causal:positions")
    n = min(engine.max_positions, config.seq_len + 16)  # past the context when the plugin can
    tokens = np.random.default_rng(0).integers(3, config.vocab_size, n)

    def run(eng):
        logits, ledger = [], []
        for pos, tok in enumerate(tokens):
            logits.append(np.array(eng.forward(int(tok), pos)))
            mem = eng.attention.memory_bytes()
            assert isinstance(mem, int) and not isinstance(mem, bool) and mem >= 0
            ledger.append(mem)
        return np.array(logits), ledger

    first, ledger = run(engine)
    assert np.isfinite(first).all()
    engine.reset()
    again, ledger_again = run(engine)
    assert np.array_equal(first, again), "reset() must reproduce the sequence bit for bit"
    assert ledger == ledger_again
    # same plugin, more threads: bit-identical (threads split heads and rows only)
    tokens = tokens[:12]
    threaded, _ = run(Engine(config, weights, create_plugin(spec), 2))
    assert np.array_equal(first[:12], threaded)
    # bad arguments are one-line PluginErrors
    cls = resolve_spec(spec).cls
    name = spec.split(":")[0] if not spec.startswith(str(EXAMPLE)) else EXAMPLE_SPEC
    with pytest.raises(PluginError, match="unknown knob"):
        create_plugin(f"{name}:no_such_knob=1")
    for knob in cls.knobs:
        bad = "notanumber" if knob.type in (int, float, bool) else None
        if bad:
            with pytest.raises(PluginError, match=knob.name):
                create_plugin(f"{name}:{knob.name}={bad}")


def test_bounded_plugins_run_far_past_the_context_with_flat_memory(gqa_unshared):
    config, weights = load_checkpoint(gqa_unshared)
    for spec, held in (("sliding:8", 8), ("sink:2,6", 8), ("sink:2,6,shift", 8)):
        engine = Engine(config, weights, create_plugin(spec), 1)
        for pos in range(4 * config.seq_len):
            logits = engine.forward(7, pos)
        assert np.isfinite(np.asarray(logits)).all()
        assert engine.attention.memory_bytes() == 2 * config.n_layers * held * config.kv_dim * 4


def test_causal_past_its_cache_is_an_error(gqa_unshared):
    config, weights = load_checkpoint(gqa_unshared)
    engine = Engine(config, weights, create_plugin("causal"), 1)
    with pytest.raises(PositionError, match="outside what the attention plugin holds"):
        engine.forward(3, config.seq_len)


# ---- a plain float64 numpy reference of the semantics -----------------------------------------------
def _config(style: str) -> ModelConfig:
    return ModelConfig(
        dim=32,
        hidden_dim=64,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        vocab_size=10,
        seq_len=16,
        rope_style=style,
        rope_theta=10000.0,
    )


def _rope64(vec: np.ndarray, pos: int, cfg: ModelConfig) -> np.ndarray:
    """float64 RoPE of whole heads at ``pos``: pairs (2i, 2i+1) or NEOX (i, i + n_rot/2)."""
    out = vec.astype(np.float64).reshape(-1, cfg.head_dim).copy()
    half = cfg.n_rot // 2
    i = np.arange(half)
    angle = pos / cfg.rope_theta ** (2 * i / cfg.n_rot)
    a, b = (2 * i, 2 * i + 1) if cfg.rope_style == ROPE_NORMAL else (i, i + half)
    x, y = out[:, a].copy(), out[:, b].copy()
    out[:, a] = x * np.cos(angle) - y * np.sin(angle)
    out[:, b] = x * np.sin(angle) + y * np.cos(angle)
    return out.ravel()


def _kept(spec: str, pos: int) -> tuple[list[int], bool]:
    """The positions a plugin attends at ``pos`` (ascending) and whether positions are cache indices."""
    name, _, args = spec.partition(":")
    if name == "causal" or ".py" in spec:
        return list(range(pos + 1)), False
    parts = args.split(",")
    if name == "sliding":
        w = int(parts[0])
        return list(range(max(0, pos - w + 1), pos + 1)), False
    s, w = int(parts[0]), int(parts[1])
    window = list(range(max(s, pos - w + 1), pos + 1))
    return list(range(min(s, pos + 1))) + window, "shift" in parts


def _reference(cfg, raw_q, raw_k, v, kept, shift):
    """float64 attention of one position over ``kept`` with RoPE at original or cache positions."""
    n = len(kept)
    qpos = n - 1 if shift else kept[-1]
    q = _rope64(raw_q, qpos, cfg).reshape(cfg.n_heads, cfg.head_dim)
    keys = np.stack([_rope64(raw_k[t], i if shift else t, cfg) for i, t in enumerate(kept)])
    keys = keys.reshape(n, cfg.n_kv_heads, cfg.head_dim)
    vals = v[kept].astype(np.float64).reshape(n, cfg.n_kv_heads, cfg.head_dim)
    out = np.zeros((cfg.n_heads, cfg.head_dim))
    for h in range(cfg.n_heads):
        kh = h // cfg.kv_mul
        s = keys[:, kh] @ q[h] / np.sqrt(cfg.head_dim)
        a = np.exp(s - s.max())
        a /= a.sum()
        out[h] = a @ vals[:, kh]
    return out.ravel()


@pytest.mark.parametrize("style", [ROPE_NORMAL, ROPE_NEOX])
@pytest.mark.parametrize(
    "spec",
    [
        "causal:positions=64",
        "sliding:1",
        "sliding:5",
        "sliding:64",
        "sink:0,5",
        "sink:3,5",
        "sink:3,5,shift",
        "sink:2,1,shift",
        "sink:40,40,shift",
        f"{EXAMPLE_SPEC}:budget=64",
    ],
    ids=lambda s: s.replace(str(EXAMPLE), "example"),
)
def test_semantics_against_numpy_reference(spec, style):
    cfg = _config(style)
    rng = np.random.default_rng(1)
    T = 40
    raw_q = rng.standard_normal((cfg.n_layers, T, cfg.q_dim)).astype(np.float32)
    raw_k = rng.standard_normal((cfg.n_layers, T, cfg.kv_dim)).astype(np.float32)
    v = rng.standard_normal((cfg.n_layers, T, cfg.kv_dim)).astype(np.float32)
    plugin = create_plugin(spec)
    pool = Pool(1)
    plugin._configure(cfg, pool)
    plugin.init(cfg, pool)
    out = np.zeros(cfg.q_dim, dtype=np.float32)
    for pos in range(T):
        kept, shift = _kept(spec, pos)
        for layer in range(cfg.n_layers):
            q = raw_q[layer, pos].copy()
            k = raw_k[layer, pos].copy()
            rope_apply(cfg, q, pos)  # the engine's float32 RoPE at the original position
            rope_apply(cfg, k, pos)
            plugin.attend(layer, pos, q, k, v[layer, pos].copy(), out)
            ref = _reference(cfg, raw_q[layer, pos], raw_k[layer], v[layer], kept, shift)
            np.testing.assert_allclose(out, ref, rtol=1e-4, atol=2e-5, err_msg=f"{spec} position {pos} layer {layer}")
        assert plugin.memory_bytes() == 2 * cfg.n_layers * len(kept) * cfg.kv_dim * 4


def test_random_evict_keeps_its_budget_and_replays_after_reset():
    cfg = _config(ROPE_NORMAL)
    plugin = create_plugin(f"{EXAMPLE_SPEC}:budget=4,seed=5")
    plugin._configure(cfg, Pool(1))
    plugin.init(cfg, Pool(1))
    rng = np.random.default_rng(0)
    qs = rng.standard_normal((20, cfg.q_dim)).astype(np.float32)
    ks = rng.standard_normal((20, cfg.kv_dim)).astype(np.float32)

    def run():
        outs, held = [], []
        for pos in range(20):
            out = np.zeros(cfg.q_dim, dtype=np.float32)
            for layer in range(cfg.n_layers):
                plugin.attend(layer, pos, qs[pos], ks[pos], ks[pos], out)
            outs.append(out)
            held.append(sorted(plugin.slot_pos[0, : plugin.count[0]].tolist()))
        return np.array(outs), held

    first, held = run()
    assert all(len(h) == min(p + 1, 4) for p, h in enumerate(held))
    assert all(h[-1] == p for p, h in enumerate(held))  # the current position is always attended
    assert plugin.memory_bytes() == 2 * cfg.n_layers * 4 * cfg.kv_dim * 4
    plugin.reset()
    again, held_again = run()
    assert np.array_equal(first, again) and held == held_again


# ---- the shared routine for Python plugins -------------------------------------------------------------
def test_attend_rows_is_the_shared_routine_bit_for_bit():
    cfg = _config(ROPE_NORMAL)
    rng = np.random.default_rng(2)
    keys = rng.standard_normal((9, cfg.kv_dim)).astype(np.float32)
    values = rng.standard_normal((9, cfg.kv_dim)).astype(np.float32)
    q = rng.standard_normal(cfg.q_dim).astype(np.float32)
    rows = np.array([0, 3, 4, 8])
    bias = rng.standard_normal(4).astype(np.float32)
    out = np.zeros(cfg.q_dim, dtype=np.float32)
    attend_rows(cfg, q, keys, values, out, rows=rows, bias=bias)
    hd = cfg.head_dim
    for h in range(cfg.n_heads):
        cols = slice((h // cfg.kv_mul) * hd, (h // cfg.kv_mul + 1) * hd)
        expect = attend_one_head(
            q[h * hd : (h + 1) * hd],
            np.ascontiguousarray(keys[rows][:, cols]),
            np.ascontiguousarray(values[rows][:, cols]),
            bias,
        )
        assert np.array_equal(out[h * hd : (h + 1) * hd], expect)
    with pytest.raises(IndexError):
        attend_rows(cfg, q, keys, values, out, rows=[9])
    with pytest.raises(ValueError, match="no rows"):
        attend_rows(cfg, q, keys, values, out, rows=[])


def test_python_plugin_gets_the_engine_buffers_without_copies(gqa_unshared):
    seen = []

    class Spy(Keep):
        def attend(self, layer, pos, q, k, v, out):
            seen.append((q.ctypes.data, out.ctypes.data))
            super().attend(layer, pos, q, k, v, out)

    config, weights = load_checkpoint(gqa_unshared)
    engine = Engine(config, weights, Spy(), 1)
    engine.forward(3, 0)
    engine.forward(4, 1)
    assert len(seen) == 2 * config.n_layers and len(set(seen)) == 1
