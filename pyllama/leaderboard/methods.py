"""A method at a compression ratio, as a plugin spec: one function for every method.

``ratio`` is the share of the context's positions that compression removes at the context's end
(kvpress's compression ratio; the baselines' shared knob). A method with a ``ratio`` knob takes it
as it is (``snapkv:ratio=0.5``). A method without one is mapped to the knob that decides what it
holds there, so that it keeps the same share of the context's positions: ``sliding`` its window,
``sink`` its window after its sinks, ``kmeans`` and ``quest`` the positions a query attends (they
keep every row: they save compute, not bytes). ``kvquant`` (a cache type, not a share of
positions) and the policies without a budget of positions (``tiered``, ``lattice``) take no ratio.
The positions kept of a context of ``T`` are ``T - floor(ratio T)``, as the event methods count
them. Ratio 0 is ``causal`` for every method: the ceiling.

A method is a registry name, optionally with fixed knobs (``adakv:scorer=expected``); the knob the
ratio sets is never one of them. ``pyllama leaderboard`` measures what each spec really holds (the
ledger after the event), which the figure plots; the nominal ratio stays in the table.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from pyllama.attention.registry import plugin_knobs, plugin_names, resolve_spec
from pyllama.attention.spec import PluginSpec, format_value, split_spec
from pyllama.errors import InputError, PluginError, PyllamaError

__all__ = [
    "CEILING",
    "HELD_SHARE_KNOBS",
    "check_method",
    "check_ratio",
    "kept_positions",
    "method_spec",
    "ratio_methods",
    "saves_bytes",
]

CEILING = "causal"  # ratio 0 of every method, drawn as the ceiling
PROBE_CONTEXT = 1024  # the context a method is checked against before any sample exists


def kept_positions(ratio: float, context: int) -> int:
    """Positions of a context of ``context`` positions that a compression at ``ratio`` keeps."""
    return max(1, context - math.floor(ratio * context + 1e-9))


def _sliding(kept: int, values: dict) -> dict:
    return {"window": kept}


def _sink(kept: int, values: dict) -> dict:
    return {"window": max(1, kept - int(values["sinks"]))}


def _kmeans(kept: int, values: dict) -> dict:
    return {"budget": max(0, kept - int(values["sinks"]) - int(values["window"]))}


def _quest(kept: int, values: dict) -> dict:
    return {"capacity": kept}


# method -> (the knobs the ratio sets, their values for a number of positions kept and the method's other values)
HELD_SHARE_KNOBS: dict[str, tuple[tuple[str, ...], Callable[[int, dict], dict]]] = {
    "sliding": (("window",), _sliding),
    "sink": (("window",), _sink),
    "kmeans": (("budget",), _kmeans),
    "quest": (("capacity",), _quest),
}


def _resolve(method: str) -> PluginSpec:
    """The method's spec as given; a knob the ratio sets that has no default (quest's capacity) is
    given a placeholder, which ``method_spec`` replaces."""
    try:
        return resolve_spec(method)
    except PluginError:
        name, file_class, given = split_spec(method)
        if file_class is not None or name not in HELD_SHARE_KNOBS:
            raise
        placeholders = [f"{knob}=1" for knob in HELD_SHARE_KNOBS[name][0]]
        return resolve_spec(f"{name}:{','.join(filter(None, [given, *placeholders]))}")


def check_ratio(value: float, name: str = "ratio") -> float:
    """A compression ratio: a number in [0, 1)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise InputError(f"{name} {value!r} is out of range: valid is 0 <= x < 1 (the share of the context removed)")
    return float(value)


def _takes_ratio(spec: PluginSpec) -> tuple[str, ...]:
    """The knobs a ratio sets on this method (empty: it has no way to take one)."""
    if "ratio" in {k.name for k in plugin_knobs(spec.cls)}:
        return ("ratio",)
    return HELD_SHARE_KNOBS[spec.name][0] if spec.name in HELD_SHARE_KNOBS else ()


def _ratio_knobs(spec: PluginSpec) -> tuple[str, ...]:
    """The knobs a ratio sets on this method; PluginError when it has no way to take one."""
    knobs = _takes_ratio(spec)
    if not knobs:
        raise PluginError(
            f"method {spec.name}: no ratio knob and no mapping of a ratio to its knobs; "
            f"methods with a ratio: {', '.join(ratio_methods())}"
        )
    return knobs


def check_method(method: str) -> str:
    """The method as given, checked: a known plugin that takes a ratio (its own knob or a mapping),
    with valid fixed knobs, none of them one the ratio sets, and not ``causal`` (the ceiling)."""
    if not isinstance(method, str) or not method.strip():
        raise InputError(f"method {method!r}: expected a plugin name such as snapkv or sink")
    method = method.strip()
    try:
        spec = _resolve(method)
    except PluginError as exc:
        raise PluginError(f"method {method}: {exc}") from None
    if spec.name == CEILING:
        raise InputError(f"method {method}: causal is the ceiling, every board has it at ratio 0; leave it out")
    given = [part.strip() for part in split_spec(method)[2].split(",") if part.strip()]
    if any("=" not in part for part in given):
        raise InputError(f"method {method}: give its fixed knobs by name (name:knob=value,...)")
    for knob in _ratio_knobs(spec):
        if any(part.split("=")[0].strip() == knob for part in given):
            raise InputError(f"method {method}: the ratio sets {knob}; leave it out of the method")
    method_spec(method, 0.5, PROBE_CONTEXT)  # a value its constructor refuses is refused now
    return method


def method_spec(method: str, ratio: float, context: int) -> str:
    """The canonical spec of ``method`` at ``ratio`` for a context of ``context`` positions
    (``causal`` at ratio 0)."""
    ratio = check_ratio(ratio)
    if ratio == 0:
        return resolve_spec(CEILING).canonical
    spec = _resolve(method)
    knobs = _ratio_knobs(spec)
    if knobs == ("ratio",):
        values = {"ratio": ratio}
    else:
        values = HELD_SHARE_KNOBS[spec.name][1](kept_positions(ratio, context), dict(spec.values))
    given = split_spec(method)[2]
    args = ",".join([*filter(None, [given]), *(f"{k}={format_value(v)}" for k, v in values.items())])
    try:
        return resolve_spec(f"{spec.name}:{args}").canonical
    except PyllamaError as exc:
        raise InputError(f"method {method} at ratio {ratio:g}: {exc}") from None


def ratio_methods() -> list[str]:
    """Every registered plugin that takes a ratio (a knob of its own or a mapping), ``causal`` aside."""
    out = []
    for name in plugin_names():
        if name == CEILING:
            continue
        try:
            if _takes_ratio(_resolve(name)):
                out.append(name)
        except PyllamaError:  # a plugin that cannot be loaded, or has a required knob
            continue
    return out


def saves_bytes(spec: str) -> bool:
    """Whether a method's compression removes rows it holds (False: it keeps every position and
    chooses per query, ``holds = "everything"``: quest, kmeans)."""
    return getattr(resolve_spec(spec).cls, "holds", "rows") != "everything"
