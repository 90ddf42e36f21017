"""What a cell will cost, from measured figures, for ``--dry-run``.

A diff runs every compared position through two engines, and a decode step streams every weight
matrix once (``bench.bytes_per_token``), so a cell costs ``2 × positions × bytes per token`` of weight
traffic and ``positions × seconds per compared position``. The positions are counted from the
tokenised probe and the positions each plugin holds. The seconds per compared position are timed on
this machine by a short diff of the study's reference against itself on each model: both engines and
the metrics, as a cell runs them (a loaded machine shows up in them). It is measured at the start of
a sequence, so cells whose plugins' attention grows with the position take somewhat longer.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import numpy as np

from pyllama.attention.registry import create_plugin
from pyllama.bench import bytes_per_token
from pyllama.engine import Engine
from pyllama.sweep.cell import one_line

__all__ = ["CellCost", "estimate"]

CALIBRATION_POSITIONS = 64


@dataclass
class CellCost:
    positions: int  # compared positions (both sides run each one)
    bytes_streamed: int  # weight bytes both engines read
    seconds: float  # estimated on one worker with the given threads


def seconds_per_position(model, reference: str, threads: int, positions: int = CALIBRATION_POSITIONS) -> float:
    """Best of two timed diffs of ``reference`` against itself over ``positions`` positions (token ids
    cycled over the vocabulary), per compared position."""
    n = min(positions, model.config.seq_len)
    tokens = (np.arange(n) % model.config.vocab_size).astype(np.int32)
    best = float("inf")
    for _ in range(2):
        t0 = time.perf_counter()
        model.diff(reference, reference, probe=tokens, threads=threads, progress=False)
        best = min(best, (time.perf_counter() - t0) / n)
    return best


def held_positions(model, spec: str) -> int:
    return int(Engine(model.config, model.weights, create_plugin(spec), 1).max_positions)


def estimate(plan, threads: int = 1) -> dict[str, CellCost]:
    """A CellCost per cell key of ``plan``."""
    per_model: dict[str, tuple[int, float]] = {}
    held: dict[tuple[str, str], int] = {}
    out = {}
    for cell in plan.cells:
        model = plan.models[cell.model].model
        if cell.model not in per_model:
            seconds = seconds_per_position(model, cell.reference, threads)
            per_model[cell.model] = (bytes_per_token(model.weights), seconds)
        per_token, seconds = per_model[cell.model]
        for entry, spec in (("reference", cell.reference), (f"plugins[{cell.entry}] ({cell.family})", cell.spec)):
            if (cell.model, spec) not in held:
                try:
                    held[(cell.model, spec)] = held_positions(model, spec)
                except Exception as exc:  # the plugin refuses this model (or breaks on it): name both
                    raise plan.study.fail(entry, f"on {os.path.basename(cell.model)}: {one_line(exc)}") from exc
        limit = min(held[(cell.model, cell.reference)], held[(cell.model, cell.spec)])
        positions = sum(min(len(seg), limit) for seg in plan.probe_of(cell).segments)
        out[cell.key] = CellCost(positions, 2 * positions * per_token, positions * seconds)
    return out
