"""What a leaderboard will cost, for ``--dry-run``: every unit's branches by how they start, counted in
context passes, and seconds from one context pass timed on this machine.

A unit runs its sample's context once through ``causal``, recorded, then every branch (``starts.py``).
Counted in passes of that context: ``causal``'s own branch continues the recorded engine through the
question and answer; a branch from the record builds its state with ``start_from`` and runs the question
and answer; a replayed branch makes its attention calls over the context again; a branch after a prefix
builds its state over its ``exact_prefix`` from the record and runs the rest of the sequence and the
answer (its way's passes plus a whole run's passes times the share of the context after the prefix); a
whole run is the sequence and the greedy answer. The seconds of one pass are timed here, once per model
and length: the first unit's context recorded as a unit records it, with the unit's threads.

How a branch compares with a pass differs from model to model (Gemma 3's question and answer cost 0.20
passes where SmolLM2's cost 0.12) and length to length (attention grows with the length where the
weights do not; at 2,048 tokens a whole run was 0.9 passes), so the passes are measured per
architecture on its default board at 4,096 tokens (``BRANCH_PASSES``, from each board's rows:
``python benchmarks/board_costs.py docs/boards/...``); an architecture without a board of its own is
planned with llama's. The estimate is a plan's order of magnitude.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyllama.engine import Engine
from pyllama.leaderboard.board import Board, load_board
from pyllama.leaderboard.methods import CEILING, method_spec
from pyllama.leaderboard.record import ContextRecord
from pyllama.leaderboard.runner import plan_board
from pyllama.leaderboard.starts import WAYS, branch_way
from pyllama.leaderboard.unit import Unit, sized_plugin, unit_sample
from pyllama.sweep.cell import pinned_threads
from pyllama.sweep.table import RowStore

if TYPE_CHECKING:
    from pyllama.diff.probes.sequences import Segment
    from pyllama.model import Model

__all__ = ["BRANCH_PASSES", "BRANCH_WAYS", "BranchPasses", "branch_passes", "dry_run", "unit_ways"]


BRANCH_WAYS = (*WAYS, "refused")  # a dry run's columns: how each branch starts, or that its plugin refuses


@dataclass(frozen=True)
class BranchPasses:
    """What a unit's branches cost in passes of its context, measured on one architecture's board."""

    board: str  # the board the figures come from (docs/boards/...)
    ceiling: float  # causal's branch: the question and the answer after the recorded context
    ways: dict[str, float]  # a branch that starts each of starts.WAYS (a refused branch costs nothing)


BRANCH_PASSES = {
    # 70 units of SmolLM2-135M-Instruct; prefix: sliding, sink and kmeans at the four ratios cost 0.86
    # passes on average with 0.6 of the context run
    "llama": BranchPasses("smollm2-4096", 0.12, {"record": 0.11, "replay": 0.63, "prefix": 0.31, "whole": 0.92}),
    # 54 units of Gemma 3 270M, those run since its 15 local layers are kept from the record (starts.py):
    # its board's first 6 units replayed them, and are left out (board_costs.py --skip-units 6)
    "gemma3": BranchPasses("gemma3-4096", 0.20, {"record": 0.19, "replay": 0.35, "prefix": 0.11, "whole": 0.96}),
}


def branch_passes(arch: str) -> BranchPasses:
    """The measured passes of ``arch``'s branches (``ModelConfig.arch``), llama's where it has no board."""
    return BRANCH_PASSES.get(arch, BRANCH_PASSES["llama"])


def unit_ways(unit: Unit, seg: Segment, positions: int, cost: BranchPasses) -> tuple[dict[str, int], float]:
    """How many of the unit's branches start each way on its sample ``seg`` (``unit_sample``), ``causal``'s
    aside (``refused``: the plugin refuses the method's spec at this size, a row that holds its error),
    and the context passes of those branches (``cost``: the model's ``branch_passes``)."""
    ways = dict.fromkeys(BRANCH_WAYS, 0)
    context = seg.context_end + 1
    passes = 0.0
    for branch in unit.branches:
        if branch.method == CEILING:
            continue
        try:
            plugin = sized_plugin(method_spec(branch.method, branch.ratio, context), positions)
        except Exception:  # the board writes this row with the plugin's error and goes on: no cost
            ways["refused"] += 1
            continue
        way = branch_way(plugin)
        ways[way] += 1
        passes += cost.ways[way]
        if way == "prefix":  # the rest of the context after the prefix runs as a whole run does
            passes += cost.ways["whole"] * (1.0 - min(int(plugin.exact_prefix), context) / context)
    return ways, passes


def _pass_seconds(model: Model, seg: Segment, positions: int, threads: int) -> float:
    """CPU seconds of the sample's context recorded through ``causal``, as ``run_unit`` records it."""
    with pinned_threads(threads):
        causal = Engine(model.config, model.weights, sized_plugin(CEILING, positions), threads)
        c0 = time.process_time()
        ContextRecord.run(causal, seg.tokens[: seg.context_end + 1])
        return time.process_time() - c0


def dry_run(board: Board | dict | str | os.PathLike, threads_per_unit: int = 1, out: str | os.PathLike | None = None):
    """The units of ``board`` with their estimated cost, running no branch: a DataFrame with a row per
    unit (its context positions, its branches by way, its ``passes`` with the board they were measured
    on, ``passes_from``, ``est_cpu_seconds`` with
    ``threads_per_unit`` threads, and ``done``: its rows already in ``out``'s table)."""
    import pandas as pd  # lazy: pandas only for the DataFrame a dry run returns

    if not isinstance(board, Board):
        board = load_board(board)
    plan = plan_board(board)
    store = RowStore(out, resume=True) if out is not None and os.path.isdir(out) else RowStore(None)
    timed: dict[tuple[str, int], float] = {}
    rows: list[dict[str, Any]] = []
    for unit in plan.units:
        ways = dict.fromkeys(BRANCH_WAYS, 0)
        context, passes, passes_from, pass_seconds = 0, 0.0, "", 0.0
        try:
            model, seg, positions = unit_sample(unit)
        except Exception:  # the sample itself fails (run_unit writes every row with why): no cost
            ways["refused"] = len(unit.branches)
        else:
            context, cost = seg.context_end + 1, branch_passes(model.config.arch)
            ways, branch_count = unit_ways(unit, seg, positions, cost)
            ceiling = sum(b.method == CEILING for b in unit.branches)
            passes, passes_from = 1.0 + cost.ceiling * ceiling + branch_count, cost.board
            if (unit.model, unit.length) not in timed:
                timed[(unit.model, unit.length)] = _pass_seconds(model, seg, positions, threads_per_unit)
            pass_seconds = timed[(unit.model, unit.length)]
        rows.append(
            dict(
                unit.columns(),
                context=context,
                branches=len(unit.branches),
                **{f"{w}_branches": n for w, n in ways.items()},
                passes=passes,
                passes_from=passes_from,
                est_cpu_seconds=passes * pass_seconds,
                done=sum(store.done(b.key) for b in unit.branches),
            )
        )
    return pd.DataFrame(rows)
