"""Large buffers the engine allocates per call are kept in small pages.

A plugin's buffers are sized for every position but filled from the front; ``Model.logits``' output is
filled once.
numpy asks the kernel for transparent huge pages on large arrays. In a plugin's cache each first touch
then zeroed 2 MiB, and finding free huge pages stalled the kernel: every other 512-position
``Model.logits`` of SmolLM2 spent 0.25 s more in the kernel. ``GatherAttention.own`` advises small
pages for what it keeps (pyllama/attention/gather.pyx), ``zeros_small_pages`` maps the output's pages
itself (pyllama/kernels/aligned.py); these tests read the kernel's own account of the memory
(``/proc/self/smaps``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pyllama.kernels.aligned import zeros_small_pages
from pyllama.model import Model

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")
SMAPS = Path("/proc/self/smaps")
BIG = 16 << 20  # bytes: the 65,536-position cache's keys and values are 40 MiB each


def _anonymous_areas() -> dict[str, dict[str, int]]:
    """Address range -> {"size": bytes, "huge": bytes in transparent huge pages, "small": 1 where the
    mapping is advised to take no huge pages (VmFlags ``nh``)} of each mapping."""
    areas: dict[str, dict[str, int]] = {}
    current = None
    for line in SMAPS.read_text().splitlines():
        head = line.split()
        if "-" in head[0] and len(head) >= 5:
            lo, hi = (int(x, 16) for x in head[0].split("-"))
            current = head[0]
            areas[current] = {"size": hi - lo, "huge": 0, "small": 0}
        elif head[0] == "AnonHugePages:" and current is not None:
            areas[current]["huge"] = int(head[1]) * 1024
        elif head[0] == "VmFlags:" and current is not None:
            areas[current]["small"] = int("nh" in head[1:])
    return areas


needs_thp = pytest.mark.skipif(
    not SMAPS.exists() or not THP.exists() or "[never]" in THP.read_text(),
    reason="needs Linux with transparent huge pages (madvise or always)",
)


def _area_of(at: int) -> dict[str, int]:
    """The mapping that holds address ``at``."""
    for span, area in _anonymous_areas().items():
        lo, hi = (int(x, 16) for x in span.split("-"))
        if lo <= at < hi:
            return area
    raise AssertionError(f"no mapping holds {at:#x}")


@needs_thp
def test_a_large_output_is_not_in_huge_pages():
    out = zeros_small_pages((4096, 4096), np.float32)
    out[:] = 1.0
    assert out.flags.writeable and out.ctypes.data % 64 == 0 and float(out.sum()) == 4096 * 4096
    area = _area_of(out.ctypes.data)
    assert area["small"] == 1 and area["huge"] == 0, area


@needs_thp
def test_a_plugin_cache_is_not_in_huge_pages(stories260k, tok512):
    model = Model.load(stories260k, tokenizer=tok512)
    engine = model.engine("causal:positions=65536", 1)
    engine.forward_block(np.arange(1, 201, dtype=np.int32), 0)
    big = [(at, n) for at, n in engine.attention.owned_spans() if n >= BIG]
    assert len(big) >= 2  # the keys and the values
    for at, n in big:
        # the advice covers the buffer's whole pages. (Whether its mapping holds huge pages is not
        # checked here: a buffer carved from the heap shares its mapping with memory others faulted
        # in before; a mapping of its own holds none, as the output's above.)
        for page in range(at + 4096, at + n - 4096, 1 << 20):
            area = _area_of(page)
            assert area["small"] == 1, (hex(page), area)
