"""A plugin's buffers are sized for every position but filled from the front: they are kept in small pages.

numpy asks the kernel for transparent huge pages on large arrays. In a plugin's cache each first touch
then zeroed 2 MiB, and finding free huge pages stalled the kernel: every other 512-position
``Model.logits`` of SmolLM2 spent 0.25 s more in the kernel. ``GatherAttention.own`` advises small
pages for what it keeps (pyllama/attention/gather.pyx); this test reads the kernel's own account of the
cache's memory (``/proc/self/smaps``) after a few positions.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pyllama.model import Model

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")
SMAPS = Path("/proc/self/smaps")
BIG = 16 << 20  # bytes: the 65,536-position cache's keys and values are 40 MiB each


def _anonymous_areas() -> dict[str, dict[str, int]]:
    """Address range -> {"size": bytes, "huge": bytes in transparent huge pages} of each mapping."""
    areas: dict[str, dict[str, int]] = {}
    current = None
    for line in SMAPS.read_text().splitlines():
        head = line.split()
        if "-" in head[0] and len(head) >= 5:
            lo, hi = (int(x, 16) for x in head[0].split("-"))
            current = head[0]
            areas[current] = {"size": hi - lo, "huge": 0}
        elif head[0] == "AnonHugePages:" and current is not None:
            areas[current]["huge"] = int(head[1]) * 1024
    return areas


@pytest.mark.skipif(not SMAPS.exists() or not THP.exists() or "[never]" in THP.read_text(),
                    reason="needs Linux with transparent huge pages (madvise or always)")  # fmt: skip
def test_a_plugin_cache_is_not_in_huge_pages(stories260k, tok512):
    model = Model.load(stories260k, tokenizer=tok512)
    before = set(_anonymous_areas())
    engine = model.engine("causal:positions=65536", 1)
    ids = np.arange(1, 201, dtype=np.int32)
    engine.forward_block(ids, 0)
    new = {k: v for k, v in _anonymous_areas().items() if k not in before and v["size"] >= BIG}
    assert len(new) >= 2, new  # the keys and the values
    assert all(v["huge"] == 0 for v in new.values()), new
