"""A study: what a sweep runs, read from TOML (or a dict), checked entry by entry, expanded to cells.

    models = ["stories260K.bin"]          # paths relative to the study file (or downloaded names)
    tokenizer = "tok512.bin"              # optional: one tokenizer for every model
    reference = "causal:positions=2048"   # side A of every diff (default: causal)
    probes = ["standard", "short.txt"]    # probe names or text files (default: standard)
    seeds = [0, 1]                        # optional: the values of the `seed` knob of plugins that have one
    budgets = [8192, 16384]               # optional: equal-memory sizing, bytes held at the last position

    [[plugins]]
    name = "lattice"                      # a registered name or path/to/file.py:Class
    window = [32, 64, 128]                # a TOML array is an axis of the grid, a scalar is fixed
    base = [2, 8]
    size_by = "window"                    # the knob budgets size (default: window)

Every grid point is written as a spec string (``lattice:window=32,base=2``) and parsed by the plugin
registry, so the study grammar is the spec grammar: an unknown plugin or knob, a bad value, an empty
array or a missing model is refused with one line naming the entry before anything runs.
"""

from __future__ import annotations

import itertools
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyllama.attention.registry import create_plugin, plugin_knobs, resolve_spec
from pyllama.attention.spec import PluginSpec, format_value
from pyllama.diff.probes import is_probe_name
from pyllama.errors import InputError, PyllamaError
from pyllama.outputs import model_inputs, plugin_inputs
from pyllama.sweep.cell import one_line

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

__all__ = ["PluginGrid", "Study", "load_study", "plural"]

TOP_KEYS = ("models", "tokenizer", "reference", "probes", "seeds", "budgets", "plugins")
PLUGIN_KEYS = ("name", "size_by")  # keys of a [[plugins]] table that are not knobs
SCALAR = (bool, int, float, str)
FILE_PLUGIN = re.compile(r"^(.+\.pyx?):([A-Za-z_][A-Za-z0-9_]*)$")  # path/to/file.py:Class


class StudyError(InputError):
    """A study file or dict that cannot be run as given; the message names the entry."""


@dataclass(frozen=True)
class GridPoint:
    """One configuration of one plugin entry: its canonical spec and knob values."""

    entry: int  # index in [[plugins]]
    family: str  # the plugin's name (registry name, or path:Class for a file)
    spec: str  # canonical spec, every knob by name
    knobs: tuple[tuple[str, Any], ...]  # canonical values, in declared order
    size_by: str | None = None  # set when budgets size this point through that knob


@dataclass
class PluginGrid:
    """One ``[[plugins]]`` entry: fixed knobs and the axes of its grid."""

    index: int
    name: str
    fixed: dict[str, Any]
    axes: dict[str, list[Any]]
    size_by: str | None = None
    knob_names: tuple[str, ...] = ()  # the plugin's declared knobs (filled in when the study is checked)

    @property
    def label(self) -> str:
        return f"plugins[{self.index}] ({self.name})"

    def settings(self) -> list[dict[str, Any]]:
        """Every combination of the axes, merged with the fixed knobs (axes in the order written)."""
        names = list(self.axes)
        return [
            dict(self.fixed, **dict(zip(names, combo, strict=True))) for combo in itertools.product(*self.axes.values())
        ]


@dataclass
class Study:
    models: list[str]
    plugins: list[PluginGrid]
    reference: str = "causal"
    tokenizer: str | None = None
    probes: list[str] = field(default_factory=lambda: ["standard"])
    seeds: list[int] = field(default_factory=list)
    budgets: list[int] = field(default_factory=list)
    source: str = "study"  # the file name, for messages
    base_dir: Path = field(default_factory=Path.cwd)  # relative paths are relative to this
    file: str | None = None  # the study file (None: a dict)

    def fail(self, entry: str, problem: str) -> StudyError:
        return StudyError(f"{self.source}: {entry}: {problem}")

    def path(self, text: str) -> str:
        """A path of the study made absolute against the study's folder; a bare name (no separator)
        that is not a file there stays as given, for the downloaded-name lookup."""
        p = Path(os.path.expanduser(text))
        if p.is_absolute():
            return str(p)
        beside = self.base_dir / p
        if beside.exists() or os.sep in text or (os.altsep and os.altsep in text):
            return str(beside.resolve())
        return text

    def input_files(self) -> list[tuple[str, str]]:
        """What a run of the study reads, named as a message names it: the study file, the models
        and their tokenizer (resolved as the loader resolves them), probe texts and plugin files."""
        files = [("the study file", self.file)] if self.file else []
        tokenizer = self.path(self.tokenizer) if self.tokenizer else None
        for i, name in enumerate(self.models):
            opened = model_inputs(self.path(name), tokenizer)
            files.append((f"the study's models[{i}]", opened["the model"]))
            if "the tokenizer" in opened:
                what = "the study's tokenizer" if tokenizer else f"the tokenizer beside models[{i}]"
                files.append((what, opened["the tokenizer"]))
        for i, probe in enumerate(self.probes):
            path = self.path(probe)
            if not is_probe_name(probe) or Path(path).is_file():
                files.append((f"the study's probes[{i}]", path))
        for grid in self.plugins:
            m = FILE_PLUGIN.match(grid.name)
            if m:
                files.append((f"the plugin file of {grid.label}", self.path(m.group(1))))
        return files + list(plugin_inputs(self.reference).items())

    def grid_points(self) -> list[GridPoint]:
        """Every plugin configuration of the study, validated by the registry's spec parser."""
        points: list[GridPoint] = []
        for grid in self.plugins:
            for values in grid.settings():
                for seed_values in self._seed_settings(grid, values):
                    points.append(self._point(grid, dict(values, **seed_values)))
        return points

    def _seed_settings(self, grid: PluginGrid, values: dict[str, Any]) -> list[dict[str, Any]]:
        """The study's seeds drive the ``seed`` knob of a plugin that has one and does not set it."""
        if not self.seeds or "seed" in values or "seed" not in grid.knob_names:
            return [{}]
        return [{"seed": s} for s in self.seeds]

    def plugin_spec(self, name: str, values: dict[str, Any]) -> str:
        """``name:k=v,...``; a file plugin's path made absolute, so a worker elsewhere finds the same file."""
        m = FILE_PLUGIN.match(name)
        if m:
            name = f"{Path(self.path(m.group(1))).resolve()}:{m.group(2)}"
        args = ",".join(f"{k}={format_value(v)}" for k, v in values.items())
        return f"{name}:{args}" if args else name

    def _point(self, grid: PluginGrid, values: dict[str, Any]) -> GridPoint:
        """The grid point, its plugin constructed once: the constructor's own checks (``tiered``'s
        bits, a knob that must divide another) refuse it here, naming the entry. A point whose knob
        the budgets size is constructed at its sized value instead (``plan``, through the sizer)."""
        spec = self.plugin_spec(grid.name, values)
        size_by = grid.size_by if self.budgets else None
        try:
            resolved = resolve_spec(spec)
        except PyllamaError as exc:
            raise self.fail(grid.label, str(exc)) from None
        if size_by is None:
            self._construct(grid.label, resolved)
        knobs = tuple((k.name, resolved.values[k.name]) for k in plugin_knobs(resolved.cls))
        return GridPoint(grid.index, grid.name, resolved.canonical, knobs, size_by)

    def check_reference(self) -> str:
        """The canonical reference spec; the registry refuses an unknown one, its constructor a bad value."""
        try:
            resolved = resolve_spec(self.reference)
        except PyllamaError as exc:
            raise self.fail("reference", str(exc)) from None
        self._construct("reference", resolved)
        return resolved.canonical

    def _construct(self, entry: str, spec: PluginSpec) -> None:
        """Construct the plugin of ``spec`` once and drop it; what its constructor refuses (or a
        plugin's own bug) is refused now, naming the entry, instead of failing every cell of it."""
        try:
            create_plugin(spec)
        except Exception as exc:
            raise self.fail(entry, one_line(exc)) from exc


def load_study(source: str | os.PathLike | dict) -> Study:
    """A Study from a TOML file or a dict of the same shape; StudyError naming the bad entry."""
    if isinstance(source, dict):
        data, name, base = source, "study", Path.cwd()
    else:
        path = Path(source)
        name, base = path.name, path.resolve().parent
        if not path.is_file():
            raise StudyError(f"{path}: no such study file")
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise StudyError(
                f"{path}: not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset {exc.start}); "
                "a study is a TOML file saved as UTF-8"
            ) from None
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise StudyError(f"{path}: not valid TOML ({exc})") from None
    study = _from_dict(data, name, base)
    if not isinstance(source, dict):
        study.file = str(source)
    return study


def _from_dict(data: dict, name: str, base: Path) -> Study:
    def fail(entry: str, problem: str) -> StudyError:
        return StudyError(f"{name}: {entry}: {problem}")

    unknown = [k for k in data if k not in TOP_KEYS]
    if unknown:
        raise fail(unknown[0], f"unknown entry; a study has {', '.join(TOP_KEYS)}")
    models = _string_list(data, "models", fail, required=True)
    probes = _string_list(data, "probes", fail) or ["standard"]
    tokenizer = data.get("tokenizer")
    if tokenizer is not None and not isinstance(tokenizer, str):
        raise fail("tokenizer", f"expected a path, got {tokenizer!r}")
    reference = data.get("reference", "causal")
    if not isinstance(reference, str) or not reference.strip():
        raise fail("reference", f"expected a plugin spec string, got {reference!r}")
    seeds = _int_list(data, "seeds", fail, minimum=0)
    budgets = _int_list(data, "budgets", fail, minimum=1)
    raw_plugins = data.get("plugins")
    if not isinstance(raw_plugins, list) or not raw_plugins:
        raise fail("plugins", "the grid is empty: add at least one [[plugins]] table with a name")
    grids = [_plugin_grid(i, p, fail) for i, p in enumerate(raw_plugins)]
    study = Study(models, grids, reference, tokenizer, probes, seeds, budgets, name, base)
    for grid in grids:
        _check_size_by(study, grid)
    if seeds and not any("seed" in grid.knob_names for grid in grids):
        raise fail("seeds", "no plugin of the study has a seed knob for them to set")
    return study


def _string_list(data: dict, key: str, fail, required: bool = False) -> list[str]:
    value = data.get(key)
    if value is None:
        if required:
            raise fail(key, "missing: the study needs at least one")
        return []
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        raise fail(key, f"expected a list of strings, got {value!r}")
    if not value:
        raise fail(key, "is empty: the grid has no cells")
    return value


def _int_list(data: dict, key: str, fail, minimum: int) -> list[int]:
    value = data.get(key, [])
    if isinstance(value, int) and not isinstance(value, bool):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise fail(key, f"expected a list of integers, got {value!r}")
    if key in data and not value:
        raise fail(key, "is empty: the grid has no cells (leave it out instead)")
    bad = [v for v in value if v < minimum]
    if bad:
        raise fail(key, f"{bad[0]} is below {minimum}")
    return value


def _plugin_grid(index: int, raw: Any, fail) -> PluginGrid:
    entry = f"plugins[{index}]"
    if not isinstance(raw, dict):
        raise fail(entry, f"expected a table with a name and knobs, got {raw!r}")
    name = raw.get("name")
    if not isinstance(name, str) or not name.strip():
        raise fail(entry, "has no name (a registered plugin or path/to/file.py:Class)")
    entry = f"{entry} ({name})"
    size_by = raw.get("size_by")
    if size_by is not None and not isinstance(size_by, str):
        raise fail(entry, f"size_by must name a knob, got {size_by!r}")
    fixed: dict[str, Any] = {}
    axes: dict[str, list[Any]] = {}
    for key, value in raw.items():
        if key in PLUGIN_KEYS:
            continue
        if isinstance(value, list):
            if not value:
                raise fail(entry, f"{key} = [] is empty: the grid has no cells")
            if not all(isinstance(v, SCALAR) for v in value):
                raise fail(entry, f"{key}: a knob's values are numbers, booleans or strings, got {value!r}")
            axes[key] = value
        elif isinstance(value, SCALAR):
            fixed[key] = value
        else:
            raise fail(entry, f"{key}: a knob's value is a number, boolean, string or an array of them, got {value!r}")
    return PluginGrid(index, name.strip(), fixed, axes, size_by)


def _check_size_by(study: Study, grid: PluginGrid) -> None:
    """Resolve the plugin once (unknown names fail here) and check the knob budgets would size."""
    try:
        cls = resolve_spec(study.plugin_spec(grid.name, {})).cls
    except PyllamaError as exc:
        raise study.fail(grid.label, str(exc)) from None
    names = [k.name for k in plugin_knobs(cls)]
    grid.knob_names = tuple(names)
    for key in list(grid.fixed) + list(grid.axes):
        if key not in names:
            raise study.fail(grid.label, f"unknown knob {key!r}; {_its_knobs(names)}")
    if not study.budgets:
        if grid.size_by is not None:
            raise study.fail(grid.label, "size_by is set but the study has no budgets")
        return
    if grid.size_by is None:
        grid.size_by = "window" if "window" in names else None
    if grid.size_by is None:
        if not names:
            raise study.fail(grid.label, "budgets need a knob to size, and it has no knobs")
        which = f"= {names[0]!r}" if len(names) == 1 else f"to one of {', '.join(names)}"
        raise study.fail(grid.label, f"budgets need a knob to size: set size_by {which}")
    knob = {k.name: k for k in plugin_knobs(cls)}.get(grid.size_by)
    if knob is None or knob.type is not int:
        raise study.fail(grid.label, f"size_by = {grid.size_by!r} is not an integer knob of {grid.name}")
    if grid.size_by in grid.axes or grid.size_by in grid.fixed:
        raise study.fail(grid.label, f"{grid.size_by} is sized by the budgets: do not also set it")


def _its_knobs(names: list[str]) -> str:
    """``its knobs: a, b``, ``its only knob: a``, ``it has no knobs``."""
    if not names:
        return "it has no knobs"
    return f"its only knob: {names[0]}" if len(names) == 1 else f"its knobs: {', '.join(names)}"


def plural(n: int, noun: str) -> str:
    """``1 cell``, ``2 cells``, ``1,180 positions``: a count and its noun, singular for one."""
    return f"{n:,} {noun}" if n == 1 else f"{n:,} {noun}s"
