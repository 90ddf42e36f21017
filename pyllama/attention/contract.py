"""The attention contract, checked: what a class must be to be used as an attention plugin.

:func:`check_plugin_class` runs when a class is registered or loaded (:mod:`pyllama.attention.registry`)
and for an instance handed over ready-made: an ``Attention`` subclass with a one-line description,
well-formed knobs the constructor accepts, an ``attend`` it really implements (Python override or
native Cython fast path), a ``memory_bytes`` ledger, and no class attribute hiding the
per-instance fields the engine reads. A broken plugin fails with one line that names it and the
problem.
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Callable
from typing import Any

from pyllama.attention.base import Attention
from pyllama.attention.spec import Knob, shared_option
from pyllama.errors import PluginError

__all__ = ["check_plugin_class", "plugin_description", "plugin_knobs"]

_ENGINE_FIELDS = ("config", "max_positions", "n_threads", "native")
HOLDS = ("rows", "summaries", "everything")  # what held_positions lists (base.pyx)


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
    for name in names:
        option = shared_option(name)
        if option is not None:
            fail(f"knob {name!r} is an option every plugin takes ({option.help}): rename the knob")
    if constructor:
        _check_constructor(cls, names, fail)
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
    holds = getattr(cls, "holds", "rows")
    if holds not in HOLDS:
        fail(f"`holds` must be one of {', '.join(map(repr, HOLDS))}, got {holds!r}")
    if not _overrides(cls, "memory_bytes"):
        fail("does not implement memory_bytes() (the ledger: bytes of cache state held right now)")
    _check_signatures(cls, probe, fail)


def _check_constructor(cls: type[Attention], names: list[str], fail: Callable[[str], None]) -> None:
    """The constructor must take every knob by keyword (Cython constructors hide their signature)."""
    try:
        sig = inspect.signature(cls.__init__)
    except (TypeError, ValueError):
        return
    params = list(sig.parameters.values())[1:]
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return
    accepted = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
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


def _check_signatures(cls: type, probe: Any, fail: Callable[[str], None]) -> None:
    """attend, init, reset and memory_bytes take the contract's arguments (when Python can tell)."""
    for meth, n_args in (
        ("attend", 6),
        ("init", 2),
        ("reset", 0),
        ("memory_bytes", 0),
        ("compress", 1),
        ("held_positions", 1),
    ):
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
                "compress": "(self, pos)",
                "held_positions": "(self, layer)",
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
