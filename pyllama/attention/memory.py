"""Knob values are bounded by what the machine can hold.

A plugin's knobs size its cache (``causal:positions=N``, ``sliding:N``, ``sink:s,w`` ...). Before
``init`` allocates anything, a built-in adds up the bytes its buffers will take, from the model's
shapes and its knobs, in Python integers (no overflow), and :func:`require_memory` refuses a total
beyond the machine's physical memory with one line naming the bytes needed: not an OverflowError,
a "negative dimensions" ValueError or a MemoryError traceback from deep inside numpy.
"""

from __future__ import annotations

import os

from pyllama.errors import PluginError

__all__ = ["gather_bytes", "physical_memory_bytes", "require_memory"]

POINTER_BYTES = 8  # the row tables hold one uintp per row (64-bit platforms)


def physical_memory_bytes() -> int | None:
    """The machine's physical memory, or None where the OS does not say."""
    try:
        pages, page = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None
    return pages * page if pages > 0 and page > 0 else None


def gather_bytes(config, rows: int, counters: int = 0, score_rows: int = 0) -> int:
    """What GatherAttention.init_gather allocates: per head, two pointer tables for ``rows`` rows and
    float32 scores for max(rows, score_rows) and 32 lanes of head_dim floats (llama.cpp's weighted sum,
    head.pyx); and ``counters`` int64 counters per layer."""
    per_head = int(rows) * 2 * POINTER_BYTES + max(int(rows), int(score_rows)) * 4 + 32 * int(config.head_dim) * 4
    return int(config.n_heads) * per_head + int(counters) * int(config.n_layers) * 8


def _human(n: int) -> str:
    for unit, size in (("EiB", 1 << 60), ("PiB", 1 << 50), ("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n / 1024:.3g} KiB"


def require_memory(plugin: str, settings: str, nbytes: int, available: int | None = None) -> None:
    """Raise PluginError unless ``nbytes`` (what ``plugin`` with ``settings`` allocates) fits in memory."""
    total = physical_memory_bytes() if available is None else available
    if total is not None and nbytes > total:
        raise PluginError(
            f"{plugin}: {settings} needs {nbytes:,} bytes ({_human(nbytes)}) of cache for this model, more "
            f"than the {total:,} bytes ({_human(total)}) of memory this machine has: choose smaller values"
        )
