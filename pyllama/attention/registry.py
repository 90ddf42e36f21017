"""Find attention plugins by name, check them against the contract, and build them from spec strings.

Three sources, looked up in this order:

* **built-ins** — the names in :data:`BUILTINS` (``causal``, ``sliding``, ``sink``, ``kmeans``,
  ``tiered``, ``lattice``, and the standard KV-cache methods of docs/methods.md: ``h2o``, ``tova``,
  ``scissorhands``, ``snapkv``, ``pyramidkv``, ``adakv``, ``knorm``, ``keydiff``, ``expected``,
  ``random``, ``quest``, ``kvquant``;
  ``plugins/``, packaged as ``pyllama.plugins``);
* **installed packages** — the ``pyllama.attention`` entry-point group, e.g. in a ``pyproject.toml``::

      [project.entry-points."pyllama.attention"]
      mycache = "mypkg.cache:MyCache"

* **a local file** — ``path/to/file.py:ClassName`` (optionally ``:args``), imported on demand, or a
  Cython file ``path/to/file.pyx:ClassName``, compiled on first use (:mod:`pyllama.attention.files`);

plus classes registered at run time with :func:`register` (a notebook experiment).

Every class is checked against the contract when it is registered or loaded
(:mod:`pyllama.attention.contract`); a broken plugin fails with one line that names it and the
problem. Spec strings are parsed by :mod:`pyllama.attention.spec`, once: :func:`resolve_spec`
turns one into a :class:`~pyllama.attention.spec.PluginSpec` (class, values, shared options,
canonical spec, origin) at the entry (the CLI, ``Model.generate``/``engine``/``diff``, a study's
cells), and that object travels; :func:`create_plugin` builds from it without parsing again.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

from pyllama.attention.base import Attention
from pyllama.attention.contract import check_plugin_class, plugin_description, plugin_knobs
from pyllama.attention.files import load_file_plugin
from pyllama.attention.spec import BUILT_IN, Knob, PluginSpec, format_spec, parse_args, parse_shared, split_spec
from pyllama.errors import PluginError

__all__ = [
    "BUILTINS",
    "ENTRY_POINT_GROUP",
    "PluginInfo",
    "PluginSpec",
    "check_plugin_class",
    "create_plugin",
    "get_plugin_class",
    "load_file_plugin",
    "plugin_description",
    "plugin_infos",
    "plugin_knobs",
    "plugin_names",
    "register",
    "resolve_attention",
    "resolve_spec",
]

ENTRY_POINT_GROUP = "pyllama.attention"

# name -> "module:Class"; imported only when used
BUILTINS: dict[str, str] = {
    "causal": "pyllama.plugins.causal:Causal",
    "sliding": "pyllama.plugins.sliding:Sliding",
    "sink": "pyllama.plugins.sink:Sink",
    "kmeans": "pyllama.plugins.kmeans:KMeans",
    "tiered": "pyllama.plugins.tiered:Tiered",
    "lattice": "pyllama.plugins.lattice:Lattice",
    "h2o": "pyllama.plugins.h2o:H2O",
    "tova": "pyllama.plugins.tova:TOVA",
    "scissorhands": "pyllama.plugins.scissorhands:Scissorhands",
    "snapkv": "pyllama.plugins.snapkv:SnapKV",
    "pyramidkv": "pyllama.plugins.pyramidkv:PyramidKV",
    "adakv": "pyllama.plugins.adakv:AdaKV",
    "knorm": "pyllama.plugins.knorm:KNorm",
    "keydiff": "pyllama.plugins.keydiff:KeyDiff",
    "expected": "pyllama.plugins.expected:Expected",
    "random": "pyllama.plugins.random:RandomEviction",
    "quest": "pyllama.plugins.quest:Quest",
    "kvquant": "pyllama.plugins.kvquant:KVQuant",
}

_NAME = re.compile(r"^[a-z][a-z0-9_\-]*$")

_registered: dict[str, tuple[type, str]] = {}  # name -> (class, origin), checked
_checked_instances: set[type] = set()


@dataclass
class PluginInfo:
    """What ``pyllama plugins`` shows about one plugin."""

    name: str
    origin: str  # "built-in", "entry point mypkg.cache:MyCache", "registered", "file x.py"
    description: str = ""
    knobs: tuple[Knob, ...] = ()
    error: str | None = None  # set when the plugin cannot be loaded or breaks the contract
    cls: type | None = field(default=None, repr=False)

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "origin": self.origin,
            "description": self.description,
            "knobs": [
                {
                    "name": k.name,
                    "type": k.type_name,
                    "default": None if k.required else k.default,
                    "required": k.required,
                    "min": k.min,
                    "max": k.max,
                    "help": k.help,
                }
                for k in self.knobs
            ],
            "error": self.error,
        }


# ---- lookup -------------------------------------------------------------------------------------
def _entry_points() -> dict[str, metadata.EntryPoint]:
    try:
        eps = metadata.entry_points(group=ENTRY_POINT_GROUP)
    except Exception:  # a broken installed distribution must not break the built-ins
        return {}
    return {ep.name: ep for ep in eps}


def plugin_names() -> list[str]:
    """Every plugin name known without importing anything: built-ins, entry points, registered."""
    names = dict.fromkeys(BUILTINS)
    names.update(dict.fromkeys(_entry_points()))
    names.update(dict.fromkeys(_registered))
    return list(names)


def register(cls: type | None = None, name: str | None = None, *, replace: bool = False):
    """Register an Attention subclass under ``name`` (default: its ``name`` attribute), after checking
    the contract. Usable as a decorator, with or without arguments. Returns the class."""

    def do(klass: type) -> type:
        reg_name = name or getattr(klass, "name", None)
        if not reg_name or reg_name == Attention.name:
            reg_name = klass.__name__.lower() if isinstance(klass, type) else str(klass)
        if not isinstance(reg_name, str) or not _NAME.match(reg_name):
            raise PluginError(f"attention plugin {reg_name!r}: a plugin name is lowercase letters, digits, '_' and '-'")
        check_plugin_class(klass, reg_name)
        if not replace and (reg_name in BUILTINS or reg_name in _registered):
            existing = _registered.get(reg_name, (None,))[0]
            if existing is not klass:
                raise PluginError(
                    f"attention plugin {reg_name!r} exists already ({_origin(reg_name)}); "
                    "pass replace=True to shadow it"
                )
        _registered[reg_name] = (klass, "registered")
        return klass

    if cls is None:
        return do
    return do(cls)


def _origin(name: str) -> str:
    if name in _registered:
        return _registered[name][1]
    if name in BUILTINS:
        return BUILT_IN
    ep = _entry_points().get(name)
    return f"entry point {ep.value}" if ep is not None else "unknown"


def _import_target(target: str, label: str) -> type:
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise PluginError(
            f"attention plugin {label}: cannot import {module_name} ({type(exc).__name__}: {exc})"
        ) from exc
    obj: Any = module  # whatever the target names; check_plugin_class vets it
    for part in attr.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            raise PluginError(f"attention plugin {label}: {module_name} has no {attr!r}")
    return obj


def get_plugin_class(name: str) -> type:
    """The checked class registered under ``name``; PluginError listing what exists when unknown."""
    if name in _registered:
        return _registered[name][0]
    if name in BUILTINS:
        cls = _import_target(BUILTINS[name], name)
        origin = BUILT_IN
    else:
        ep = _entry_points().get(name)
        if ep is None:
            raise PluginError(
                f"unknown attention plugin {name!r}; available: {', '.join(plugin_names())} "
                "(or path/to/file.py:ClassName, file.pyx:ClassName; `pyllama plugins` describes them)"
            )
        try:
            cls = ep.load()
        except Exception as exc:
            raise PluginError(
                f"attention plugin {name} (entry point {ep.value}): cannot load it ({type(exc).__name__}: {exc})"
            ) from exc
        origin = f"entry point {ep.value}"
    check_plugin_class(cls, name if origin == BUILT_IN else f"{name} ({origin})")
    _registered[name] = (cls, origin)
    return cls


# ---- specs --------------------------------------------------------------------------------------
def resolve_spec(spec: str | PluginSpec) -> PluginSpec:
    """The PluginSpec of a spec string, parsed and checked here, once; a PluginSpec is returned as it is."""
    if isinstance(spec, PluginSpec):
        return spec
    if not isinstance(spec, str) or not spec.strip():
        raise PluginError(f"empty attention spec; available: {', '.join(plugin_names())}")
    name, class_name, args = split_spec(spec)
    if class_name is not None:
        cls = load_file_plugin(name, class_name)
        label, origin = f"{name}:{class_name}", f"file {name}"
    else:
        cls = get_plugin_class(name)
        label, origin = name, _origin(name)
    knobs = plugin_knobs(cls)
    args, shared = parse_shared(label, args)
    values = parse_args(label, knobs, args)
    return PluginSpec(label, cls, values, format_spec(label, knobs, values, shared), origin, shared)


def resolve_attention(attention: str | PluginSpec | Attention | None) -> PluginSpec | Attention:
    """What an entry point hands on: a spec string resolved (None: ``causal``), a PluginSpec as it
    is, or an Attention instance checked against the contract (once per class)."""
    if attention is None:
        attention = "causal"
    if isinstance(attention, Attention):
        if type(attention) not in _checked_instances:
            check_plugin_class(type(attention), type(attention).__name__, constructor=False)
            _checked_instances.add(type(attention))
        return attention
    if not isinstance(attention, (str, PluginSpec)):
        raise PluginError(
            f"attention must be a spec string, a PluginSpec or an Attention instance, not {type(attention).__name__}"
        )
    return resolve_spec(attention)


def create_plugin(spec: str | PluginSpec | Attention | None) -> Attention:
    """An Attention instance: built from a PluginSpec (no parsing) or a spec string (resolved first;
    ``None``: exact ``causal``), or the instance itself."""
    resolved = resolve_attention(spec)
    if isinstance(resolved, Attention):
        return resolved
    try:
        plugin = resolved.cls(**resolved.values)
    except PluginError:
        raise
    except (TypeError, ValueError, OverflowError, MemoryError) as exc:
        raise PluginError(f"{resolved.canonical}: {exc}") from exc
    plugin.layer_policy = resolved.shared.get("layers", "all")
    return plugin


def plugin_infos(include_errors: bool = True) -> list[PluginInfo]:
    """Every known plugin with its description and knobs; broken ones carry ``error``."""
    infos = []
    for name in plugin_names():
        try:
            cls = get_plugin_class(name)
        except PluginError as exc:
            if include_errors:
                infos.append(PluginInfo(name, _origin(name), error=str(exc)))
            continue
        infos.append(PluginInfo(name, _origin(name), plugin_description(cls), plugin_knobs(cls), cls=cls))
    return infos


def plugins_markdown() -> str:
    """The README table: one row per plugin, its knobs with types and defaults."""
    lines = ["| plugin | what it keeps | knobs (type, default) |", "| --- | --- | --- |"]
    for info in plugin_infos(include_errors=False):
        knobs = (
            "<br>".join(f"`{k.name}` ({k.describe_range()}, {k.describe_default()}): {k.help}" for k in info.knobs)
            or "—"
        ).replace("|", "\\|")  # a choice's "a|b" inside a table cell
        lines.append(f"| `{info.name}` | {info.description} | {knobs} |")
    return "\n".join(lines)
