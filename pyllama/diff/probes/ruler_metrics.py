"""RULER's scoring (NVIDIA/RULER ``scripts/eval/synthetic/constants.py`` and ``evaluate.py``).

RULER scores a task over its predictions ``preds`` (one greedy answer per sample) and references
``refs`` (one list of strings per sample), case-insensitively by substring:

* ``string_match_all`` = 100 x the mean over samples of (the share of the sample's references
  found in its prediction), rounded to 2 decimals: every synthetic task uses it;
* ``string_match_part`` = 100 x the mean over samples of (1 if any reference is found, else 0),
  rounded to 2 decimals: RULER's QA tasks use it.

A prediction is first cleaned as ``evaluate.py``'s ``postprocess_pred`` does: stripped, every
control character (U+0000 to U+001F) turned into a newline, stripped again. ``match_all`` and
``match_part`` are one sample's terms, in [0, 1].
"""

from __future__ import annotations

import re
from collections.abc import Sequence

__all__ = ["match_all", "match_part", "postprocess", "string_match_all", "string_match_part"]

_CONTROL = re.compile(r"[\x00-\x1f]")


def postprocess(prediction: str) -> str:
    """A greedy answer as RULER's evaluation reads it."""
    return _CONTROL.sub("\n", prediction.strip()).strip()


def match_all(prediction: str, references: Sequence[str]) -> float:
    """The share of ``references`` that ``prediction`` contains, ignoring case."""
    if not references:
        raise ValueError("match_all needs at least one reference")
    text = prediction.lower()
    return sum(1.0 if r.lower() in text else 0.0 for r in references) / len(references)


def match_part(prediction: str, references: Sequence[str]) -> float:
    """1.0 when ``prediction`` contains any of ``references``, ignoring case; else 0.0."""
    if not references:
        raise ValueError("match_part needs at least one reference")
    text = prediction.lower()
    return max(1.0 if r.lower() in text else 0.0 for r in references)


def _score(terms: list[float]) -> float:
    if not terms:
        raise ValueError("RULER's scores need at least one prediction")
    return round(sum(terms) / len(terms) * 100, 2)


def string_match_all(preds: Sequence[str], refs: Sequence[Sequence[str]]) -> float:
    """RULER's ``string_match_all`` over a task's predictions, in percent."""
    return _score([match_all(p, r) for p, r in zip(preds, refs, strict=True)])


def string_match_part(preds: Sequence[str], refs: Sequence[Sequence[str]]) -> float:
    """RULER's ``string_match_part`` over a task's predictions, in percent."""
    return _score([match_part(p, r) for p, r in zip(preds, refs, strict=True)])
