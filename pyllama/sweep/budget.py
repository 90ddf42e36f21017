"""Equal-memory budgets: size a plugin's knob so that it holds at most a given number of bytes at the
last position of a probe, the position where a diff reports ``bytes_last_b``.

The bytes are measured, not predicted: the sized plugin runs the probe's longest sequence through an
engine and reports ``memory_bytes()`` at its end. The knob (``window`` unless the study says
``size_by``) is the largest value whose bytes fit, found by bisection: every built-in holds more (or
as much) when its window grows. A value the plugin's constructor refuses is taken as too small (a
knob that must exceed another), so the search starts from the least value it accepts. A budget below
what the smallest accepted setting holds is refused.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from pyllama.attention.registry import create_plugin, plugin_knobs, resolve_spec
from pyllama.engine import Engine
from pyllama.sweep.cell import one_line
from pyllama.sweep.study import StudyError

__all__ = ["BudgetSizer"]


class BudgetSizer:
    """Bytes at the end of one token sequence, per spec, measured once each."""

    def __init__(self, model, tokens: np.ndarray, reference_positions: int, threads: int = 1) -> None:
        self.model = model
        self.tokens = tokens
        self.reference_positions = reference_positions
        self.threads = threads
        self._bytes: dict[str, int] = {}
        self._refusals: dict[str, Exception | None] = {}

    def refusal(self, spec: str) -> Exception | None:
        """What the plugin's constructor raised for ``spec`` (None: it accepts it), asked once per spec."""
        if spec not in self._refusals:
            try:
                create_plugin(spec)
                self._refusals[spec] = None
            except Exception as exc:  # a knob the constructor refuses, e.g. one that must exceed another
                self._refusals[spec] = exc
        return self._refusals[spec]

    def bytes_at_end(self, spec: str) -> int:
        """``memory_bytes()`` after the last position both the reference and ``spec`` hold."""
        if spec not in self._bytes:
            plugin = create_plugin(spec)
            engine = Engine(self.model.config, self.model.weights, plugin, self.threads)
            n = min(len(self.tokens), engine.max_positions, self.reference_positions)
            # blocks of positions: the same cache (the same bits) as one forward each, much faster
            engine.forward_block(np.ascontiguousarray(self.tokens[:n], dtype=np.int32), 0)
            self._bytes[spec] = int(engine.attention.memory_bytes())  # with the local layers of a split model
        return self._bytes[spec]

    def size(self, spec: str, knob: str, budget: int, where: str) -> tuple[str, dict[str, Any], int]:
        """``(sized canonical spec, its knob values, bytes it holds)``: the largest ``knob`` that fits.
        StudyError prefixed with ``where`` when nothing fits or the plugin refuses every setting."""
        try:
            return self._size(spec, knob, budget, where)
        except StudyError:
            raise
        except Exception as exc:  # the plugin refused a setting (or broke on it): one line naming the entry
            raise StudyError(f"{where}: {one_line(exc)}") from exc

    def _size(self, spec: str, knob: str, budget: int, where: str) -> tuple[str, dict[str, Any], int]:
        decl = {k.name: k for k in plugin_knobs(resolve_spec(spec).cls)}[knob]
        lo = int(decl.min) if decl.min is not None else 0
        hi = max(lo, len(self.tokens))  # past the sequence length a window holds everything already
        if decl.max is not None:
            hi = min(hi, int(decl.max))

        def spec_with(v: int) -> str:
            return resolve_spec(_respec(spec, knob, v)).canonical

        lo = self._least_accepted(lo, hi, spec_with)
        if self.bytes_at_end(spec_with(lo)) > budget:
            raise StudyError(
                f"{where}: budget {budget:,} B is below what {knob}={lo} holds "
                f"({self.bytes_at_end(spec_with(lo)):,} B at position {len(self.tokens) - 1})"
            )
        while lo < hi:  # invariant: lo fits
            mid = (lo + hi + 1) // 2
            if self.bytes_at_end(spec_with(mid)) <= budget:
                lo = mid
            else:
                hi = mid - 1
        sized = spec_with(lo)
        return sized, dict(resolve_spec(sized).values), self.bytes_at_end(sized)

    def _least_accepted(self, lo: int, hi: int, spec_with: Callable[[int], str]) -> int:
        """The least value in ``lo .. hi`` the plugin's constructor accepts. A refusal while searching
        means "too small" (``window (16) must be less than budget (2)``): larger values are tried, by
        bisection; the refusal of the largest, when every value is refused, is the error."""
        refused = self.refusal(spec_with(hi))
        if refused is not None:
            raise refused
        if self.refusal(spec_with(lo)) is None:
            return lo
        while hi - lo > 1:  # invariant: lo refused, hi accepted
            mid = (lo + hi) // 2
            if self.refusal(spec_with(mid)) is None:
                hi = mid
            else:
                lo = mid
        return hi


def _respec(spec: str, knob: str, value: int) -> str:
    """``spec`` with ``knob`` set to ``value`` (a canonical spec names every knob, so it is a replace)."""
    head, sep, args = spec.rpartition(":")
    items = [a for a in args.split(",") if not a.startswith(f"{knob}=")]
    return f"{head}{sep}{','.join([*items, f'{knob}={value}'])}"
