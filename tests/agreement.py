"""Agreement with llama.cpp's greedy tokens, teacher-forced: the rule the architecture tests share.

Two correct implementations may pick different tokens where llama.cpp's top-2 margin is a rounding
step wide (an 8-bit rounding of a product's input goes either way), so agreement is asked for at a
rate on the positions whose margin is at least ``NARROW``, and without exception above a wider one.
"""

from __future__ import annotations

import numpy as np

NARROW = 0.02  # nats between llama.cpp's first two tokens: below it, near-ties go either way


def llama_margins(row: dict) -> np.ndarray:
    """llama.cpp's top-1 minus top-2 log-probability at each generated token of a reference run; NaN
    where it printed none (a split UTF-8 character), which counts as narrow."""
    return np.array([np.nan if m is None else m for m in row["top1_minus_top2_logprob"]], float)


def check_agreement(margins: np.ndarray, agree: np.ndarray, rate: float, always_above: float) -> None:
    """At least ``rate`` of the positions with margin >= NARROW agree, and every one with margin >=
    ``always_above``."""
    wide = margins >= NARROW
    assert agree[wide].mean() >= rate, f"{agree[wide].mean():.4f} of {wide.sum()} positions"
    assert agree[margins >= always_above].all(), margins[(margins >= always_above) & ~agree]
