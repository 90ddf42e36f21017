"""A plugin spec is resolved once, into a PluginSpec that travels: a diff parses each side's string
once; its report, JSON and record key use the canonical spec; create_plugin builds from a
PluginSpec without parsing; the registry's shared options (none yet) are taken out of a spec before
the plugin's knobs, never reach the constructor, and appear in the canonical spec when set."""

from __future__ import annotations

import dataclasses
import json
import pickle
import shutil

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import shared_file

from pyllama.attention import registry, spec
from pyllama.attention.base import Attention
from pyllama.attention.registry import create_plugin, register, resolve_spec
from pyllama.attention.spec import Knob, PluginSpec
from pyllama.cli import main
from pyllama.diff.side_cache import SideCache, model_fingerprint, probe_fingerprint
from pyllama.errors import PluginError
from pyllama.model import Model
from pyllama.plugins.sink import Sink

SINK = "sink:sinks=4,window=60,shift=false"  # sink:4,60 with every knob by name, in declared order
LAYERS = Knob("layers", ("all", "global"), "all", "the layers the plugin governs")


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Model:
    path = tmp_path_factory.mktemp("model") / "stories260K.bin"  # a copy: records are keyed on the file
    shutil.copyfile(shared_file("stories260K.bin"), path)
    return Model.load(path, tokenizer=shared_file("tok512.bin"), threads=1)


@pytest.fixture
def parses(monkeypatch) -> list[str]:
    """Every spec string the registry parses, in order (its knob parser, counted)."""
    seen: list[str] = []
    parse = registry.parse_args

    def counted(plugin, knobs, args):
        seen.append(f"{plugin}:{args}")
        return parse(plugin, knobs, args)

    monkeypatch.setattr(registry, "parse_args", counted)
    return seen


def _tokens(model: Model) -> np.ndarray:
    return np.asarray(model.tokenize("Once upon a time, there was a little girl named Lily."), dtype=np.int32)


# ---- resolved once ----------------------------------------------------------------------------------
def test_a_diff_parses_each_side_once(model, tmp_path, parses):
    """Side A is a built-in, so it is keyed, recorded, built and labelled: all from one parse."""
    tokens = _tokens(model)
    report = model.diff("causal", "sink:4,60", probe=tokens, cache=tmp_path)
    assert parses == ["causal:", "sink:4,60"]
    parses.clear()
    again = model.diff("causal", "sink:4,60", probe=tokens, cache=tmp_path)  # A replayed from its record
    assert again.replayed == ["A"] and parses == ["causal:", "sink:4,60"]
    assert np.array_equal(report.max_abs_dlogit, again.max_abs_dlogit)


def test_generate_and_logits_parse_the_spec_once(model, parses):
    model.generate("Once", steps=8, temperature=0.0, attention="sink:4,60")
    assert parses == ["sink:4,60"]
    parses.clear()
    model.logits(_tokens(model), attention="sliding:8")
    assert parses == ["sliding:8"]


def test_a_plugin_spec_builds_without_parsing(parses):
    resolved = resolve_spec("sink:4,60")
    parses.clear()
    plugin = create_plugin(resolved)
    assert isinstance(plugin, Sink) and (plugin.sinks, plugin.window, plugin.shift) == (4, 60, False)
    assert create_plugin(resolved) is not plugin  # a new instance each time: each owns its cache
    assert resolve_spec(resolved) is resolved and parses == []


def test_a_plugin_spec_is_a_frozen_value():
    resolved = resolve_spec("sink:4,60")
    assert (resolved.name, resolved.cls, resolved.canonical, resolved.origin) == ("sink", Sink, SINK, "built-in")
    assert dict(resolved.values) == {"sinks": 4, "window": 60, "shift": False}
    assert dict(resolved.shared) == {"layers": "all"}
    assert resolved == resolve_spec(SINK) == resolve_spec("sink:window=60,sinks=4")
    assert len({resolved, resolve_spec(SINK)}) == 1 and str(resolved) == SINK
    assert resolved != resolve_spec("sink:4,61")
    with pytest.raises(dataclasses.FrozenInstanceError):
        resolved.canonical = "sink"  # type: ignore[misc]
    with pytest.raises(TypeError):
        resolved.values["window"] = 8  # type: ignore[index]
    copied = pickle.loads(pickle.dumps(resolved))  # to a worker process, e.g.
    assert copied == resolved and dict(copied.values) == dict(resolved.values) and copied.builtin


def test_origins(tmp_path, monkeypatch):
    monkeypatch.setattr(registry, "_registered", {})
    assert resolve_spec("causal").builtin

    @register(name="keepall")
    class KeepAll(Sink):
        """Keeps what sink keeps."""

    assert resolve_spec("keepall:4,60").origin == "registered" and not resolve_spec("keepall:4,60").builtin
    register(KeepAll, name="sink", replace=True)  # shadows the built-in: no longer one
    assert resolve_spec("sink:4,60").origin == "registered"
    plugin_file = tmp_path / "mine.py"
    plugin_file.write_text("from pyllama.plugins.sink import Sink\nclass Mine(Sink):\n    '''Mine.'''\n")
    resolved = resolve_spec(f"{plugin_file}:Mine:4,60")
    assert resolved.origin == f"file {plugin_file}" and resolved.canonical == f"{plugin_file}:Mine:{SINK[5:]}"


# ---- labels and record keys use the canonical spec ----------------------------------------------------
def test_the_report_json_and_record_key_name_the_canonical_spec(model, tmp_path):
    tokens = _tokens(model)
    report = model.diff("sink:4,60", "causal", probe=tokens, cache=tmp_path)
    assert (report.a, report.b) == (SINK, "causal:positions=0")
    out = tmp_path / "report.json"
    report.to_json(out)
    summary = json.loads(out.read_text())["summary"]
    assert (summary["a"], summary["b"]) == (SINK, "causal:positions=0")
    assert report.table().startswith(f"diff {SINK} (A) vs causal:positions=0 (B)")
    # the record of side A is where the report's label keys it
    key = SideCache.key(model_fingerprint(model.path), report.a, repr(model.config), probe_fingerprint([tokens]))
    assert (tmp_path / key / "meta.json").is_file()
    assert [p.name for p in tmp_path.iterdir() if not p.name.startswith(".") and p.is_dir()] == [key]
    # another spelling of the same spec is the same record
    again = model.diff("sink:window=60,sinks=4,shift=false", "causal", probe=tokens, cache=tmp_path)
    assert again.replayed == ["A"] and again.a == SINK


def test_an_instance_is_labelled_by_its_name_and_not_recorded(model, tmp_path):
    tokens = _tokens(model)
    report = model.diff(Sink(4, 60), "causal", probe=tokens, cache=tmp_path)
    assert report.a == "sink" and report.replayed == []
    assert not [p for p in tmp_path.iterdir() if not p.name.startswith(".")]


def test_the_cli_reports_and_writes_the_canonical_spec(tmp_path):
    out = tmp_path / "d.json"
    args = [
        "diff",
        "causal",
        "sink:4,60",
        "-c",
        str(shared_file("stories260K.bin")),
        "-z",
        str(shared_file("tok512.bin")),
    ]
    result = CliRunner().invoke(main, [*args, "-i", "Once upon a time", "--json", str(out), "--no-cache"])
    assert result.exit_code == 0, result.output
    assert f"diff causal:positions=0 (A) vs {SINK} (B)" in result.output
    summary = json.loads(out.read_text())["summary"]
    assert (summary["a"], summary["b"]) == ("causal:positions=0", SINK)


def test_the_cli_refuses_a_bad_spec_before_it_loads_the_model(tmp_path):
    missing = tmp_path / "missing.bin"
    result = CliRunner().invoke(main, ["diff", "causal", "nope", "-c", str(missing)])
    assert result.exit_code == 1
    assert result.output.startswith("error: unknown attention plugin 'nope'"), result.output
    result = CliRunner().invoke(main, ["generate", "-c", str(missing), "--attention", "sink:window=0"])
    assert result.exit_code == 1 and "sink: window=0 is below its minimum" in result.output, result.output


# ---- shared options ------------------------------------------------------------------------------------
def test_a_shared_option_is_parsed_by_the_registry_for_every_plugin(monkeypatch):
    """What issue 37's ``layers=all|global`` takes: one entry in SHARED_OPTIONS."""
    monkeypatch.setattr(spec, "SHARED_OPTIONS", (LAYERS,))
    plain = resolve_spec("sink:4,60")
    assert dict(plain.shared) == {"layers": "all"} and plain.canonical == SINK  # the default: not written
    resolved = resolve_spec("sink:4,60,layers=global")
    assert dict(resolved.values) == {"sinks": 4, "window": 60, "shift": False}
    assert dict(resolved.shared) == {"layers": "global"} and resolved.canonical == f"{SINK},layers=global"
    assert resolve_spec(resolved.canonical) == resolved != plain
    assert resolve_spec("causal:layers=global").canonical == "causal:positions=0,layers=global"
    assert isinstance(create_plugin(resolved), Sink)  # the constructor never sees it
    with pytest.raises(PluginError, match="layers='some' is not one of all, global"):
        resolve_spec("sink:layers=some")
    with pytest.raises(PluginError, match="layers is given twice"):
        resolve_spec("sink:layers=all,layers=global")


def test_a_plugin_may_not_declare_a_shared_option_as_its_knob(monkeypatch):
    monkeypatch.setattr(spec, "SHARED_OPTIONS", (LAYERS,))
    monkeypatch.setattr(registry, "_registered", {})

    class Layered(Attention):
        """Declares a knob the registry owns."""

        knobs = (Knob("layers", int, 1, "how many"),)

        def __init__(self, layers: int = 1) -> None:
            self.layers = layers

        def attend(self, layer, pos, q, k, v, out):
            pass

        def memory_bytes(self) -> int:
            return 0

    with pytest.raises(PluginError, match="knob 'layers' is an option every plugin takes"):
        register(Layered)


def test_the_layers_option_is_shared_and_named_only_when_not_the_default():
    """layers=all|global (issue 37) is every plugin's: at its default it changes no canonical spec
    (nor the record keys and tables made with one), otherwise it is named last; a bad value is refused."""
    assert [o.name for o in spec.SHARED_OPTIONS] == ["layers"]
    assert resolve_spec("sink:4,60").canonical == SINK
    assert resolve_spec("sink:4,60,layers=global").canonical == SINK + ",layers=global"
    assert resolve_spec("sink:4,60,layers=global").shared["layers"] == "global"
    assert create_plugin("sink:4,60,layers=global").layer_policy == "global"
    with pytest.raises(PluginError, match="layers"):
        resolve_spec("sink:layers=some")


def test_a_spec_of_the_wrong_type_is_refused():
    with pytest.raises(PluginError, match="not int"):
        create_plugin(3)  # type: ignore[arg-type]
    assert isinstance(resolve_spec("causal"), PluginSpec)
