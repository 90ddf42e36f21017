"""The knobs every KV-cache method shares, with one meaning each (docs/methods.md "The shared knobs").

``ratio``: the share of the rows held at a compression that the compression removes (a compression
over n rows keeps ``n - floor(ratio n + 1e-9)``, which is ``ceil((1 - ratio) n)``; a method that
evicts every step holds that many of the t + 1 positions after position t). ``capacity``: rows kept
per KV head and layer instead (KVCache-Factory's ``max_capacity_prompt``); 0 means "use the ratio".
``window``: the most recent positions, never evicted. ``sinks``: the first positions, never evicted.
``every``: a method that compresses at the event compresses again whenever that many new positions
have arrived. A knob parser fills every default in before a constructor runs, so "ratio and
capacity together" is a capacity beside a ratio other than the default.

:func:`check_budget` refuses the combinations no method can take, in one line that names the
method and the knob.
"""

from __future__ import annotations

import math

from pyllama.attention.spec import Knob
from pyllama.errors import PluginError

__all__ = [
    "CAPACITY",
    "DEFAULT_RATIO",
    "EVERY",
    "RATIO",
    "SHARE_SLACK",
    "check_budget",
    "kept_count",
    "sinks_knob",
    "window_knob",
]

DEFAULT_RATIO = 0.5
# the slack in floor(ratio * n): a ratio written with up to six decimals times n < 10^6 is never that close
# below an integer unless it is one, so this only absorbs the binary rounding of the ratio (0.7 of 10 is 7)
SHARE_SLACK = 1e-9

RATIO = Knob("ratio", float, DEFAULT_RATIO, "share of the held rows a compression removes, in [0, 1)", min=0.0)
CAPACITY = Knob("capacity", int, 0, "rows kept per KV head and layer instead of a ratio (0: use the ratio)", min=0)
EVERY = Knob(
    "every", int, 0, "compress again whenever this many new positions have arrived (0: only at the event)", min=0
)


def window_knob(default: int, also: str = "") -> Knob:
    """``window``: the most recent positions, never evicted (``also``: what else the method does with them)."""
    return Knob("window", int, default, f"most recent positions never evicted{also}", min=0)


def sinks_knob(default: int) -> Knob:
    return Knob("sinks", int, default, "first positions never evicted (attention sinks)", min=0)


def kept_count(n: int, ratio: float) -> int:
    """Rows left when ``ratio`` of ``n`` rows is removed: n - floor(ratio n + 1e-9) = ceil((1 - ratio) n)."""
    return n - math.floor(ratio * n + SHARE_SLACK)


def check_budget(method: str, ratio: float, capacity: int, window: int, sinks: int) -> None:
    """Refuse a ratio outside [0, 1), a ratio beside a capacity, and a capacity below what the window and
    the sinks always keep (``window`` < 0: half the target, H2O's default)."""
    if not 0.0 <= ratio < 1.0:
        raise PluginError(
            f"{method}: ratio={ratio:g} is outside [0, 1) (the share of the held rows removed; 0 keeps everything)"
        )
    if capacity > 0 and ratio != DEFAULT_RATIO:
        raise PluginError(
            f"{method}: ratio={ratio:g} and capacity={capacity} together: give one (capacity keeps "
            "a fixed count per KV head, ratio a share)"
        )
    window = capacity // 2 if window < 0 else window
    if capacity > 0 and capacity < window + sinks:
        raise PluginError(
            f"{method}: capacity={capacity} is smaller than window={window} + sinks={sinks}, which "
            f"are never evicted: give a capacity of at least {window + sinks}"
        )
