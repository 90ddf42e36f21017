"""A plugin's own code raising: one PluginError naming the plugin and the call, never a traceback.

A plugin is research code; when its ``init``, ``attend`` or ``memory_bytes`` raises, the user needs
to know which plugin, which call and what it said. ``generate``, ``bench`` and ``diff`` all report
it through :func:`plugin_calls`, so the same failure reads the same in every command.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

from pyllama.attention.base import Attention
from pyllama.attention.spec import PluginSpec
from pyllama.errors import PluginError, PyllamaError

__all__ = ["checked_memory_bytes", "plugin_calls", "plugin_failure", "plugin_label"]


def plugin_label(spec: PluginSpec | Attention | str | None) -> str:
    """How a plugin is named in reports and messages: a resolved spec's canonical form, for an
    instance its registry name or class; a string not yet resolved as it was given."""
    if isinstance(spec, PluginSpec):
        return spec.canonical
    if isinstance(spec, Attention):
        name = getattr(type(spec), "name", "")
        return name if name and name != Attention.name else type(spec).__name__
    return "causal" if spec is None else str(spec)


def plugin_failure(label: str, what: str, exc: BaseException) -> PluginError:
    return PluginError(f"attention plugin {label}: {what} failed ({type(exc).__name__}: {exc})")


@contextmanager
def plugin_calls(label: str, what: str) -> Iterator[None]:
    """Turn any exception but a PyllamaError raised inside into a PluginError (chained)."""
    try:
        yield
    except PyllamaError:
        raise
    except Exception as exc:
        raise plugin_failure(label, what, exc) from exc


def checked_memory_bytes(plugin: Attention, label: str) -> int:
    """``plugin.memory_bytes()``, which must be an int >= 0 (the ledger)."""
    with plugin_calls(label, "memory_bytes()"):
        mem = plugin.memory_bytes()
    if isinstance(mem, bool) or not isinstance(mem, (int, np.integer)) or mem < 0:
        raise PluginError(f"attention plugin {label}: memory_bytes() must return an int >= 0, got {mem!r}")
    return int(mem)
