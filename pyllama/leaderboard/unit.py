"""The unit of work of a leaderboard: one RULER sample on one model, its context run once, every
method and ratio branched from it; one row per method and ratio.

``run_unit`` runs where Dask puts it. It generates the sample (``ruler:task=T,length=L,seed=S``),
runs its context once through ``causal`` while recording it (``ContextRecord``: the compression event
is after the context's last position, before the question), then scores each branch with the diff's
one-plugin scorer (``pyllama.diff.retrieval_scores.score_sequence``) from the start its plugin takes
(``starts.py``): ``causal`` continues the engine that ran the context, the event methods build their
state from the record (``start_from``) or replay their attention over it, and each then runs only
the question and the answer. Where its teacher-forced chain leaves the answer, the greedy answer
is decoded from the plugin's snapshot where the answer begins (every built-in forks: the attention
contract's ``snapshot``), so nothing runs twice. A method that departs from ``causal`` before the
event replays the positions it attends as ``causal`` does (its ``exact_prefix``) and runs the model
from there; one that evicts from position 0 runs whole, once. Every plugin's buffers hold the
positions the sample's runs reach, not the model's context (``sized_plugin``). A branch's own
failure is its row's ``error``.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from pyllama.attention.base import Attention
from pyllama.attention.guard import plugin_calls, plugin_label
from pyllama.attention.registry import create_plugin, plugin_knobs, resolve_spec
from pyllama.attention.spec import format_spec
from pyllama.diff.branch import SequenceStart, answer_positions
from pyllama.diff.probes import load_probe
from pyllama.diff.probes.ruler_tasks import TASKS
from pyllama.diff.retrieval_scores import score_sequence
from pyllama.engine import Engine
from pyllama.errors import PositionError
from pyllama.leaderboard.methods import CEILING, method_spec
from pyllama.leaderboard.record import ContextRecord
from pyllama.leaderboard.starts import Prefilled, ReplayAttention, branch_way, start_for
from pyllama.sweep.cell import one_line, pinned_threads, worker_model
from pyllama.version import __version__

if TYPE_CHECKING:
    from pyllama.diff.probes.sequences import Segment
    from pyllama.model import Model

__all__ = ["Branch", "TIMING_COLUMNS", "Unit", "run_unit", "sized_plugin", "unit_sample"]

# what may differ between two runs of the same rows (the rest is a function of the unit)
TIMING_COLUMNS = ("cpu_seconds", "seconds", "context_cpu_seconds", "context_seconds", "worker", "threads")


@dataclass(frozen=True)
class Branch:
    """One row of a unit: a method at a ratio (``causal`` at 0), and the key that names its row."""

    key: str
    method: str
    ratio: float


@dataclass(frozen=True)
class Unit:
    """One RULER sample on one model, and the branches to run on it."""

    key: str
    model: str  # absolute path
    model_sha256: str
    tokenizer: str | None
    task: str
    length: int
    seed: int
    branches: tuple[Branch, ...] = field(default=())

    @property
    def probe(self) -> str:
        return f"ruler:task={self.task},length={self.length},seed={self.seed}"

    def columns(self) -> dict[str, Any]:
        return {
            "model": os.path.basename(self.model),
            "model_sha256": self.model_sha256,
            "tokenizer": self.tokenizer,
            "task": self.task,
            "family": TASKS[self.task].family,
            "length": self.length,
            "seed": self.seed,
        }


def run_unit(unit: Unit, threads: int = 1) -> list[dict[str, Any]]:
    """Run ``unit``: its context once, then each branch; one row per branch, in the unit's order
    (``causal`` first). Never raises for a failure of its own: the rows say it."""
    t0, c0 = time.perf_counter(), time.process_time()
    base = unit.columns()
    try:
        with pinned_threads(threads):
            model, seg, positions = unit_sample(unit)
            context = seg.context_end + 1  # the context's positions; the event comes after the last
            causal = Engine(model.config, model.weights, sized_plugin(CEILING, positions), threads)
            record = ContextRecord.run(causal, seg.tokens[:context])
    except Exception as exc:  # the sample itself failed: every row of the unit says why
        return [dict(base, cell=b.key, method=b.method, ratio=b.ratio, error=one_line(exc)) for b in unit.branches]
    base.update(
        tokens=len(seg),
        context=context,
        causal_bytes=record.causal_bytes,
        record_bytes=record.nbytes,
        context_cpu_seconds=time.process_time() - c0,
        context_seconds=time.perf_counter() - t0,
        worker=f"{socket.gethostname()}:{os.getpid()}",
        threads=threads,
        pyllama_version=__version__,
        model_path=unit.model,
    )
    rows = []
    for branch in sorted(unit.branches, key=lambda b: b.method != CEILING):
        with pinned_threads(threads):
            rows.append(_run_branch(model, seg, record, causal, branch, dict(base), threads, positions))
    return rows


def unit_sample(unit: Unit) -> tuple[Model, Segment, int]:
    """The unit's model (the process's, mapped once), its RULER sample, and the positions the sample's
    runs reach (``answer_positions``, at most the model's context), to which its plugins are sized."""
    model = worker_model(unit.model, unit.tokenizer)
    (seg,) = load_probe(unit.probe, model.tokenizer, model.config.seq_len).segments
    return model, seg, min(answer_positions(seg), model.config.seq_len)


def sized_plugin(spec: str, positions: int) -> Attention:
    """``spec``'s plugin, its buffers sized to ``positions`` where it has the ``positions`` knob at its
    default (0: the model's trained context). The unit passes the positions its sample's runs reach
    (``answer_positions``, at most the context), so the size changes no bit, only the memory a branch
    touches and its snapshot copies: Gemma 3's 32,768-position context made a ``causal`` snapshot
    1.2 GB, where a 4,096-token sample needs about 150 MB. The row's ``spec`` stays the method's."""
    resolved = resolve_spec(spec)
    if resolved.values.get("positions") != 0:
        return create_plugin(resolved)
    values = {**resolved.values, "positions": positions}
    canonical = format_spec(resolved.name, plugin_knobs(resolved.cls), values, resolved.shared)
    return create_plugin(replace(resolved, values=values, canonical=canonical))


def _run_branch(
    model, seg, record: ContextRecord, causal: Engine, branch: Branch, row: dict, threads: int, positions: int
) -> dict:
    """One branch's row: its spec, how it started, its ledger after the event, its scores, its cost."""
    t0, c0 = time.perf_counter(), time.process_time()
    row.update(cell=branch.key, method=branch.method, ratio=branch.ratio)
    try:
        spec = method_spec(branch.method, branch.ratio, record.positions)
        row["spec"] = spec
        start: SequenceStart | None
        if branch.method == CEILING:
            engine, way = causal, "context"
            start = Prefilled(causal, ReplayAttention(record))  # entered again only by a plugin that cannot fork
        else:
            plugin = sized_plugin(spec, positions)
            with plugin_calls(spec, "init"):
                engine = Engine(model.config, model.weights, plugin, threads)
            way = branch_way(plugin)
            start = start_for(way, record, plugin)
        row["way"] = way
        row["holds"] = getattr(engine.attention, "holds", "rows")
        if len(seg) > engine.max_positions:
            raise PositionError(f"{spec}: holds {engine.max_positions:,} positions, the sample has {len(seg):,}")
        scored = score_sequence(
            engine, seg, model.tokenizer, plugin_label(engine.attention), record.positions - 1, start
        )
        s = scored.score
        row.update(
            event_bytes=scored.event_bytes,
            bytes_removed=1.0 - scored.event_bytes / row["causal_bytes"],
            score=100.0 * s.match_all if s.match_all is not None else None,
            part=100.0 * s.match_part if s.match_part is not None else None,
            logp=s.logp,
            loss=s.loss,
            max_rank=s.max_rank,
            rank1=s.retrieves,
            greedy=s.greedy,
            error=None,
        )
    except Exception as exc:  # the branch's failure is its row, the board goes on
        row["error"] = one_line(exc)
    row["cpu_seconds"] = time.process_time() - c0
    row["seconds"] = time.perf_counter() - t0
    return row
