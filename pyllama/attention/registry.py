"""Find attention plugins by name, check them against the contract, and build them from spec strings.

Three sources, looked up in this order:

* **built-ins** — the names in :data:`BUILTINS` (``causal``, ``sliding``, ``sink``, ``kmeans``,
  ``tiered``, ``lattice``; ``plugins/``, packaged as ``pyllama.plugins``);
* **installed packages** — the ``pyllama.attention`` entry-point group, e.g. in a ``pyproject.toml``::

      [project.entry-points."pyllama.attention"]
      mycache = "mypkg.cache:MyCache"

* **a local file** — ``path/to/file.py:ClassName`` (optionally ``:args``), imported on demand, or a
  Cython file ``path/to/file.pyx:ClassName``, compiled on first use (:mod:`pyllama.attention.native`);

plus classes registered at run time with :func:`register` (a notebook experiment).

Every class is checked when it is registered (:func:`check_plugin_class`): an ``Attention`` subclass
with a one-line description, well-formed knobs the constructor accepts, an ``attend`` it really
implements (Python override or native Cython fast path), a ``memory_bytes`` ledger, and no class
attribute hiding the per-instance fields the engine reads. A broken plugin fails with one line that
names it and the problem. Spec strings are parsed by :mod:`pyllama.attention.spec`.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import re
import sys
import types
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from pyllama.attention.base import Attention
from pyllama.attention.spec import Knob, format_spec, parse_args, split_spec
from pyllama.errors import PluginError

__all__ = [
    "BUILTINS",
    "ENTRY_POINT_GROUP",
    "PluginInfo",
    "check_plugin_class",
    "create_plugin",
    "get_plugin_class",
    "plugin_infos",
    "plugin_names",
    "register",
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
}

_NAME = re.compile(r"^[a-z][a-z0-9_\-]*$")
_ENGINE_FIELDS = ("config", "max_positions", "n_threads", "native")

_registered: dict[str, tuple[type, str]] = {}  # name -> (class, origin), checked
_file_classes: dict[tuple[str, float, str], type] = {}
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


# ---- the contract -------------------------------------------------------------------------------
def plugin_description(cls: type) -> str:
    """The one-line description: the ``description`` attribute, else the docstring's first line."""
    desc = getattr(cls, "description", "") or ""
    if not desc and cls.__doc__ and cls.__doc__ is not Attention.__doc__:
        desc = cls.__doc__.strip().splitlines()[0].strip()
    return desc


def plugin_knobs(cls: type) -> tuple[Knob, ...]:
    return tuple(getattr(cls, "knobs", ()) or ())


def check_plugin_class(cls: Any, label: str, constructor: bool = True) -> None:
    """Raise PluginError naming ``label`` and the problem unless ``cls`` keeps the attention contract.

    ``constructor=False`` skips what only matters when a spec string builds the plugin (knobs must
    be constructor keywords), for an instance handed over ready-made.
    """

    def fail(problem: str) -> None:
        raise PluginError(f"attention plugin {label}: {problem}")

    if not isinstance(cls, type) or not issubclass(cls, Attention):
        fail(f"{cls!r} is not a subclass of pyllama.attention.base.Attention")
    desc = plugin_description(cls)
    if not desc:
        fail("has no description: set a one-line `description` class attribute (shown by `pyllama plugins`)")
    if "\n" in desc:
        fail("its description must be one line")
    knobs = getattr(cls, "knobs", ())
    if not isinstance(knobs, (tuple, list)) or not all(isinstance(k, Knob) for k in knobs):
        fail("`knobs` must be a tuple of pyllama.attention.spec.Knob")
    names = [k.name for k in knobs]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        fail(f"knob {dup[0]!r} is declared twice")
    for knob in knobs:
        problems = knob.problems()
        if problems:
            fail(problems[0])
    # the constructor must take every knob by keyword (Cython constructors hide their signature)
    try:
        sig = inspect.signature(cls.__init__) if constructor else None
    except (TypeError, ValueError):
        sig = None
    if sig is not None:
        params = list(sig.parameters.values())[1:]
        opaque = any(p.kind in (p.VAR_KEYWORD,) for p in params)
        accepted = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
        if not opaque:
            missing = [n for n in names if n not in accepted]
            if missing:
                fail(f"__init__ does not accept the knob {missing[0]!r} as a keyword argument")
            required = [
                p.name
                for p in params
                if p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name not in names
            ]
            if required:
                fail(f"__init__ requires {required[0]!r}, which is not a knob: declare it in `knobs`")
    # per-instance fields the engine reads at C level must not be hidden by class attributes
    for klass in cls.__mro__:
        if klass is Attention or klass is object:
            continue
        for fname in _ENGINE_FIELDS:
            attr = klass.__dict__.get(fname)
            if attr is not None and not isinstance(attr, (types.GetSetDescriptorType, types.MemberDescriptorType)):
                fail(
                    f"sets `{fname}` as a class attribute, which the engine never sees: assign "
                    f"self.{fname} in __init__ or init instead"
                )
    # attend: a Python override, or a native fast path
    probe = cls.__new__(cls)  # runs __cinit__ only: no allocation, no knobs needed
    python_attend = _overrides(cls, "attend")
    if probe.native and python_attend:
        fail(
            "overrides attend() in Python but inherits a native (Cython) fast path that the engine calls "
            "instead: set self.native = False in __init__ so the engine calls your attend()"
        )
    if not probe.native and not python_attend:
        fail(
            "does not implement attend(layer, pos, q, k, v, out): override it in Python, or write a Cython "
            "class that sets self.native = True in __cinit__ and implements attend_c"
        )
    if not _overrides(cls, "memory_bytes"):
        fail("does not implement memory_bytes() (the ledger: bytes of cache state held right now)")
    for meth, n_args in (("attend", 6), ("init", 2), ("reset", 0), ("memory_bytes", 0)):
        fn = getattr(cls, meth)
        try:
            msig = inspect.signature(fn)
        except (TypeError, ValueError):
            continue
        try:
            msig.bind(probe, *([None] * n_args))
        except TypeError:
            want = {
                "attend": "(self, layer, pos, q, k, v, out)",
                "init": "(self, config, pool)",
                "reset": "(self)",
                "memory_bytes": "(self)",
            }[meth]
            fail(f"{meth}{msig} does not match the contract {meth}{want}")


def _overrides(cls: type, meth: str) -> bool:
    """True when a class below Attention defines ``meth`` itself."""
    for klass in cls.__mro__:
        if klass is Attention:
            return False
        if meth in klass.__dict__:
            return True
    return False


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
        return "built-in"
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
        origin = "built-in"
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
    check_plugin_class(cls, name if origin == "built-in" else f"{name} ({origin})")
    _registered[name] = (cls, origin)
    return cls


def load_file_plugin(path: str, class_name: str) -> type:
    """The class ``class_name`` of the Python (or Cython) file ``path``, imported once per file version."""
    label = f"{path}:{class_name}"
    file = Path(path).expanduser()
    if not file.is_file():
        raise PluginError(f"attention plugin {label}: no such file {path}")
    file = file.resolve()
    key = (str(file), file.stat().st_mtime, class_name)
    if key in _file_classes:
        return _file_classes[key]
    if file.suffix == ".pyx":
        from pyllama.attention.native import import_pyx

        module = import_pyx(file, label)
    else:
        module = _import_python_file(file, path, label)
    module_name = module.__name__
    cls = getattr(module, class_name, None)
    if cls is None:
        found = [
            n
            for n, v in vars(module).items()
            if isinstance(v, type) and issubclass(v, Attention) and v.__module__ == module_name
        ]
        raise PluginError(
            f"attention plugin {label}: {path} has no class {class_name!r}"
            + (f"; it defines {', '.join(found)}" if found else "; it defines no Attention subclass")
        )
    check_plugin_class(cls, label)
    _file_classes[key] = cls
    return cls


def _import_python_file(file: Path, path: str, label: str) -> types.ModuleType:
    digest = hashlib.sha1(f"{file}:{file.stat().st_mtime}".encode()).hexdigest()[:10]
    module_name = f"pyllama_user_plugin_{re.sub(r'[^0-9a-zA-Z_]', '_', file.stem)}_{digest}"
    spec = importlib.util.spec_from_file_location(module_name, file)
    if spec is None or spec.loader is None:
        raise PluginError(f"attention plugin {label}: {path} cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        sys.modules.pop(module_name, None)
        raise PluginError(f"attention plugin {label}: importing {path} failed ({type(exc).__name__}: {exc})") from exc
    return module


# ---- specs --------------------------------------------------------------------------------------
def resolve_spec(spec: str) -> tuple[type, dict[str, Any], str]:
    """``(class, constructor keywords, canonical spec)`` for a spec string."""
    if not isinstance(spec, str) or not spec.strip():
        raise PluginError(f"empty attention spec; available: {', '.join(plugin_names())}")
    name, class_name, args = split_spec(spec)
    if class_name is not None:
        cls = load_file_plugin(name, class_name)
        label = f"{name}:{class_name}"
    else:
        cls = get_plugin_class(name)
        label = name
    knobs = plugin_knobs(cls)
    values = parse_args(label, knobs, args)
    return cls, values, format_spec(label, knobs, values)


def create_plugin(spec: str | Attention | None) -> Attention:
    """An Attention instance from a spec string (``None``: exact ``causal``), or the instance itself."""
    if spec is None:
        spec = "causal"
    if isinstance(spec, Attention):
        if type(spec) not in _checked_instances:
            check_plugin_class(type(spec), type(spec).__name__, constructor=False)
            _checked_instances.add(type(spec))
        return spec
    if not isinstance(spec, str):
        raise PluginError(f"attention must be a spec string or an Attention instance, not {type(spec).__name__}")
    cls, values, canonical = resolve_spec(spec)
    try:
        return cls(**values)
    except PluginError:
        raise
    except (TypeError, ValueError, OverflowError, MemoryError) as exc:
        raise PluginError(f"{spec}: {exc}") from exc


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
        )
        lines.append(f"| `{info.name}` | {info.description} | {knobs} |")
    return "\n".join(lines)
