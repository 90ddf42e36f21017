"""The valid ranges of the run options (sampling, steps, seed, threads), checked in one place.

The CLI's click callbacks and the Python API call the same checks, so a value is refused with the
same one-line ``InputError`` stating the range wherever it comes from (run.c clamps such values in
silence; pyllama says what it will not do). The core never imports click: ``pyllama/cli/shared.py`` wraps these.
"""

from __future__ import annotations

import math
import os
from typing import NoReturn, TypeGuard

from pyllama.errors import InputError

SEED_MAX = 2**64 - 1  # the sampler's state is an unsigned 64-bit integer (run.c's unsigned long long)
THREADS_PER_CPU = 4  # more threads than this per usable CPU only wait for each other: a typo, not a setting

__all__ = [
    "SEED_MAX",
    "check_compress_at",
    "check_seed",
    "check_steps",
    "check_temperature",
    "check_threads",
    "check_topp",
    "max_threads",
]


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def max_threads() -> int:
    return THREADS_PER_CPU * usable_cpus()


def _fail(name: str, value: object, valid: str, why: str = "") -> NoReturn:
    what = f"{name} {value!r}" if name else repr(value)  # no name: click's message names the option
    raise InputError(f"{what} is out of range: valid is {valid}{why}")


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_temperature(value: float, name: str = "temperature") -> float:
    """0 = greedy; otherwise softmax(logits / T). Finite and >= 0."""
    if not _is_number(value) or not math.isfinite(value) or value < 0:
        _fail(name, value, "x >= 0, finite", " (0 = greedy argmax)")
    return float(value)


def check_topp(value: float, name: str = "topp") -> float:
    """Top-p threshold: 0 <= x <= 1 (0 or 1: the full distribution, as run.c samples it)."""
    if not _is_number(value) or not (0.0 <= value <= 1.0):  # NaN fails both comparisons
        _fail(name, value, "0 <= x <= 1", " (0 or 1 samples from the full distribution)")
    return float(value)


def check_steps(value: int, name: str = "steps") -> int:
    """Positions to run, prompt included: x >= 0 (0 = the model's context)."""
    if not _is_int(value) or value < 0:
        _fail(name, value, "x >= 0", " (0 = the model's context)")
    return int(value)


def check_seed(value: int | None, name: str = "seed") -> int | None:
    """None or 0: from the clock (run.c); otherwise 0 <= x <= 2**64 - 1."""
    if value is None:
        return None
    if not _is_int(value) or not 0 <= value <= SEED_MAX:
        _fail(name, value, f"0 <= x <= {SEED_MAX}", " (0 = from the clock)")
    return int(value)


def check_threads(value: int | None, name: str = "threads", allow_default: bool = True) -> int | None:
    """None (or 0 where ``allow_default``): every usable CPU; otherwise 1 <= x <= 4 x the usable CPUs."""
    if value is None or (allow_default and value == 0 and _is_int(value)):
        return value
    top = max_threads()
    if not _is_int(value) or not 1 <= value <= top:
        _fail(name, value, f"1 <= x <= {top}", f" ({THREADS_PER_CPU} x the {usable_cpus()} usable CPUs)")
    return int(value)


def check_compress_at(value: int | str | None, name: str = "compress_at") -> int | str:
    """Where the plugin's compression event comes: ``"context"`` (after the context: a prompt's last
    position, a probe's haystack), ``"none"`` (never; None too) or a position x >= 0."""
    if value is None or value == "none":
        return "none"
    if value == "context":
        return "context"
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if not _is_int(value) or value < 0:
        _fail(name, value, 'a position x >= 0, "context" or "none"', " (where the compression event comes)")
    return int(value)


def compress_position(where: int | str, context_end: int) -> int:
    """The position after which the compression event comes (-1: none), for a context whose last
    position is ``context_end``."""
    if where == "none":
        return -1
    return context_end if where == "context" else int(where)
