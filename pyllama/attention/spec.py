"""Spec strings and knobs: how a plugin says what it can be configured with, and how
``sink:4,252,shift`` or ``kmeans:clusters=16,budget=64`` becomes constructor arguments.

A plugin class declares its knobs once::

    knobs = (
        Knob("sinks", int, 4, "first positions always kept", min=0),
        Knob("window", int, 252, "most recent positions kept", min=1),
        Knob("shift", bool, False, "re-assign positions inside the cache"),
    )

and that one declaration drives the parser, ``pyllama plugins`` and the README table.

Grammar: ``NAME[:ARG,ARG,...]`` (``path/to/file.py:Class[:ARGS]`` for a local file, ``.pyx`` for Cython). An ARG is

* ``key=value`` — sets the knob ``key``;
* a bare word naming a ``bool`` knob (``shift``) — sets it to true;
* anything else — positional: positionals fill the knobs in declared order.

Values are converted to the knob's type (``int``, ``float``, ``bool`` — true/false/yes/no/on/off/1/0 —,
``str``, or one of a tuple of choices) and checked against ``min``/``max``. Setting a knob twice,
an unknown key or a missing required knob is an error naming the plugin and listing its knobs.

Besides its own knobs, every plugin takes the registry's shared options (:data:`SHARED_OPTIONS`),
by name only. A spec string is resolved once (``registry.resolve_spec``) into a :class:`PluginSpec`:
the class, its constructor values, the shared options and the canonical spec, which names every
knob (``sink:4,60`` is ``sink:sinks=4,window=60,shift=false``) and is what reports, labels and record
keys show.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from pyllama.errors import PluginError

__all__ = [
    "Knob",
    "PluginSpec",
    "REQUIRED",
    "SHARED_OPTIONS",
    "check_knobs",
    "format_spec",
    "parse_args",
    "parse_shared",
    "shared_option",
    "split_spec",
]


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()  # the default of a knob that must be given

_TRUE = {"true", "yes", "on", "1"}
_FALSE = {"false", "no", "off", "0"}
_KNOB_NAME = re.compile(r"^[a-z_][a-z0-9_]*$")
INT_LIMIT = 2**63 - 1  # plugins keep integer knobs in C 64-bit integers: beyond this a knob cannot be held


@dataclass(frozen=True)
class Knob:
    """One configurable argument of a plugin: a constructor keyword of the same name.

    ``type`` is ``int``, ``float``, ``bool``, ``str`` or a tuple of allowed strings (a choice).
    ``default`` is ``REQUIRED`` when the knob must be given. ``help`` is one line.
    """

    name: str
    type: Any
    default: Any = REQUIRED
    help: str = ""
    min: float | None = None
    max: float | None = None

    @property
    def required(self) -> bool:
        return self.default is REQUIRED

    @property
    def type_name(self) -> str:
        if isinstance(self.type, tuple):
            return "|".join(self.type)
        return self.type.__name__

    def describe_range(self) -> str:
        """``int ≥ 1``, ``float in [0, 1]``, ``a|b`` — the type with its bounds."""
        t = self.type_name
        if self.min is not None and self.max is not None:
            return f"{t} in [{_fmt(self.min)}, {_fmt(self.max)}]"
        if self.min is not None:
            return f"{t} >= {_fmt(self.min)}"
        if self.max is not None:
            return f"{t} <= {_fmt(self.max)}"
        return t

    def describe_default(self) -> str:
        if self.required:
            return "required"
        return format_value(self.default)

    def problems(self) -> list[str]:
        """What is wrong with this declaration (empty when it is well formed)."""
        out = []
        if not isinstance(self.name, str) or not _KNOB_NAME.match(self.name):
            out.append(f"knob name {self.name!r} is not a lowercase identifier")
        if isinstance(self.type, tuple):
            if not self.type or not all(isinstance(c, str) for c in self.type):
                out.append(f"knob {self.name!r}: a choice type must be a non-empty tuple of strings")
        elif self.type not in (int, float, bool, str):
            out.append(
                f"knob {self.name!r}: type must be int, float, bool, str or a tuple of choices, not {self.type!r}"
            )
        if not isinstance(self.help, str) or "\n" in self.help:
            out.append(f"knob {self.name!r}: help must be one line of text")
        if not out and not self.required:
            try:
                self.check(self.default, "")
            except PluginError as exc:
                out.append(f"knob {self.name!r}: its default is invalid ({exc})")
        return out

    def parse(self, text: str, plugin: str) -> Any:
        """The value of ``text`` for this knob, converted and checked."""
        text = text.strip()
        try:
            if isinstance(self.type, tuple) or self.type is str:
                value: Any = text
            elif self.type is bool:
                low = text.lower()
                if low in _TRUE:
                    value = True
                elif low in _FALSE:
                    value = False
                else:
                    raise ValueError
            elif self.type is int:
                value = int(text)
            else:
                value = float(text)
        except ValueError:
            raise PluginError(
                f"{plugin}: {self.name}={text!r} is not a valid {self.type_name} ({self.name}: {self.help})"
            ) from None
        return self.check(value, plugin)

    def check(self, value: Any, plugin: str) -> Any:
        """``value`` (a Python value) checked against the type and bounds; returned converted."""
        where = f"{plugin}: " if plugin else ""
        if isinstance(self.type, tuple):
            if value not in self.type:
                raise PluginError(f"{where}{self.name}={value!r} is not one of {', '.join(self.type)}")
            return value
        if self.type is bool:
            if not isinstance(value, bool):
                raise PluginError(f"{where}{self.name}={value!r} is not a bool")
            return value
        if self.type is int:
            if isinstance(value, bool) or not isinstance(value, int):
                raise PluginError(f"{where}{self.name}={value!r} is not an int")
            if not -INT_LIMIT - 1 <= value <= INT_LIMIT:
                raise PluginError(
                    f"{where}{self.name}={value} is beyond the largest integer a knob holds ({INT_LIMIT:,}) "
                    f"({self.name}: {self.help})"
                )
        elif self.type is float:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise PluginError(f"{where}{self.name}={value!r} is not a number")
            value = float(value)
        elif self.type is str:
            if not isinstance(value, str):
                raise PluginError(f"{where}{self.name}={value!r} is not a string")
            return value
        if self.min is not None and value < self.min:
            raise PluginError(
                f"{where}{self.name}={format_value(value)} is below its minimum {_fmt(self.min)} "
                f"({self.name}: {self.help})"
            )
        if self.max is not None and value > self.max:
            raise PluginError(
                f"{where}{self.name}={format_value(value)} is above its maximum {_fmt(self.max)} "
                f"({self.name}: {self.help})"
            )
        return value


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(x)


def format_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


# Options the registry accepts for every plugin, built-in or third-party, whatever its knobs: given by
# name only (``sink:4,60,layers=global``), taken out of the spec before the plugin's knobs are parsed,
# and carried in PluginSpec.shared for the engine, never passed to the plugin's constructor. A plugin
# may not declare a knob of the same name (the contract refuses it). Adding one is adding its Knob
# here; its meaning lives where the engine reads PluginSpec.shared.
SHARED_OPTIONS: tuple[Knob, ...] = (
    Knob(
        "layers",
        ("all", "global"),
        "all",
        "on a model with sliding-window layers: all (the plugin applies its policy within their window, if "
        "it can) or global (the model's own window runs them; the plugin gets the global layers)",
    ),
)

BUILT_IN = "built-in"  # PluginSpec.origin of the plugins in pyllama.plugins


def shared_option(name: str) -> Knob | None:
    """The shared option called ``name``, if there is one."""
    return next((o for o in SHARED_OPTIONS if o.name == name), None)


@dataclass(frozen=True)
class PluginSpec:
    """A spec string resolved once: what builds the plugin (``create_plugin``), names it in reports,
    labels and JSON/CSV (``canonical``) and keys its recorded runs, without parsing the string again.

    ``values`` are the constructor keywords, every knob with its default filled in; ``shared`` the
    registry's shared options (:data:`SHARED_OPTIONS`), defaults filled in; ``origin`` where the class
    came from: ``built-in``, ``registered``, ``entry point module:Class`` or ``file path``. Two specs
    are equal when they name the same class with the same canonical spec.
    """

    name: str  # the registry name, or path/to/file.py:Class
    cls: type
    values: Mapping[str, Any] = field(compare=False)
    canonical: str
    origin: str
    shared: Mapping[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:  # read-only views: the object travels, nobody edits it on the way
        object.__setattr__(self, "values", MappingProxyType(dict(self.values)))
        object.__setattr__(self, "shared", MappingProxyType(dict(self.shared)))

    def __reduce__(self):  # the read-only views do not pickle; the class pickles by reference
        return (type(self), (self.name, self.cls, dict(self.values), self.canonical, self.origin, dict(self.shared)))

    @property
    def builtin(self) -> bool:
        return self.origin == BUILT_IN

    def __str__(self) -> str:
        return self.canonical


def knob_summary(knobs: tuple[Knob, ...]) -> str:
    """``sinks=4, window=252, shift=false`` — for error messages."""
    if not knobs:
        return "it takes no arguments"
    return "knobs: " + ", ".join(f"{k.name} ({k.describe_range()}, default {k.describe_default()})" for k in knobs)


def split_spec(spec: str) -> tuple[str, str | None, str]:
    """``(name, file_class, args)``: ``sink:4,252`` → ``("sink", None, "4,252")``;
    ``dir/x.py:Cls:budget=8`` → ``("dir/x.py", "Cls", "budget=8")`` (``.pyx``: a Cython file)."""
    spec = spec.strip()
    m = re.match(r"^(?P<path>.+?\.pyx?):(?P<cls>[A-Za-z_][A-Za-z0-9_]*)(?::(?P<args>.*))?$", spec)
    if m:
        return m.group("path"), m.group("cls"), m.group("args") or ""
    if spec.endswith((".py", ".pyx")) or ".py:" in spec or ".pyx:" in spec:
        raise PluginError(f"{spec!r}: a plugin in a file is given as path/to/file.py:ClassName[:args] (or .pyx)")
    name, _, args = spec.partition(":")
    return name.strip(), None, args


def parse_shared(plugin: str, args: str) -> tuple[str, dict[str, Any]]:
    """``(args without the shared options, their values)``: the :data:`SHARED_OPTIONS` given by name
    (a bool one also as a bare word) are taken out of ``args``; the others get their defaults."""
    by_name = {k.name: k for k in SHARED_OPTIONS}
    values: dict[str, Any] = {}
    rest: list[str] = []
    for raw in [] if not args.strip() else args.split(","):
        key, eq, value = raw.strip().partition("=")
        option = by_name.get(key.strip())
        if option is None or not (eq or option.type is bool):
            rest.append(raw)  # the plugin's own (or an error parse_args reports)
            continue
        if option.name in values:
            raise PluginError(f"{plugin}: {option.name} is given twice")
        values[option.name] = option.parse(value, plugin) if eq else True
    for option in SHARED_OPTIONS:
        values.setdefault(option.name, option.default)
    return ",".join(rest), values


def parse_args(plugin: str, knobs: tuple[Knob, ...], args: str) -> dict[str, Any]:
    """Constructor keywords for ``args`` (the part of a spec after ``NAME:``), defaults filled in."""
    by_name = {k.name: k for k in knobs}
    values: dict[str, Any] = {}
    positionals: list[str] = []
    items = [] if not args.strip() else args.split(",")
    for raw in items:
        item = raw.strip()
        if not item:
            raise PluginError(f"{plugin}: empty argument in {args!r}; {knob_summary(knobs)}")
        key, eq, value = item.partition("=")
        key = key.strip()
        if eq:
            knob = by_name.get(key)
            if knob is None:
                raise PluginError(f"{plugin}: unknown knob {key!r}; {knob_summary(knobs)}")
            if key in values:
                raise PluginError(f"{plugin}: {key} is given twice")
            values[key] = knob.parse(value, plugin)
        elif key in by_name and by_name[key].type is bool:
            if key in values:
                raise PluginError(f"{plugin}: {key} is given twice")
            values[key] = True
        else:
            positionals.append(item)
    if len(positionals) > len(knobs):
        raise PluginError(
            f"{plugin}: {len(positionals)} positional argument{'' if len(positionals) == 1 else 's'} "
            f"({', '.join(positionals)}) but it has {len(knobs)} knob{'' if len(knobs) == 1 else 's'}; "
            f"{knob_summary(knobs)}"
        )
    for knob, text in zip(knobs, positionals, strict=False):  # fewer positionals than knobs is fine
        if knob.name in values:
            raise PluginError(f"{plugin}: {knob.name} is given twice (positionally as {text!r} and by name)")
        values[knob.name] = knob.parse(text, plugin)
    for knob in knobs:
        if knob.name not in values:
            if knob.required:
                raise PluginError(
                    f"{plugin}: missing {knob.name} ({knob.describe_range()}: {knob.help}); {knob_summary(knobs)}"
                )
            values[knob.name] = knob.default
    return values


def check_knobs(plugin: Any, **values: Any) -> None:
    """Constructor arguments checked against the knobs of ``plugin`` (an instance or class) as a spec
    string's values are: ``Sliding(10**20)`` gets the one-line PluginError of ``sliding:10**20``,
    not an OverflowError. Integer-like values (numpy integers) count as ints."""
    name = getattr(plugin, "name", type(plugin).__name__)
    by_name = {k.name: k for k in getattr(plugin, "knobs", ())}
    for key, value in values.items():
        knob = by_name[key]
        if knob.type is int and not isinstance(value, (bool, int)) and hasattr(value, "__index__"):
            value = value.__index__()
        knob.check(value, name)


def format_spec(
    name: str, knobs: tuple[Knob, ...], values: Mapping[str, Any], shared: Mapping[str, Any] | None = None
) -> str:
    """The canonical spec of a configured plugin: every knob by name, e.g. ``sink:sinks=4,window=252,shift=false``,
    then the shared options that differ from their defaults (so that a new shared option changes no
    existing canonical spec, nor the record keys and result tables made with it)."""
    items = [f"{k.name}={format_value(values[k.name])}" for k in knobs if k.name in values]
    shared = shared or {}
    items += [
        f"{o.name}={format_value(shared[o.name])}" for o in SHARED_OPTIONS if shared.get(o.name, o.default) != o.default
    ]
    return f"{name}:{','.join(items)}" if items else name
