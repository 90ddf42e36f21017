"""``pyllama.leaderboard.run``: plan a board into units, run them on Dask, write the table and the board.

Planning happens before any work: every model is mapped and hashed, each length is checked against
its context, and each task's first sample is generated at each length (a task whose smallest sample
is longer than the length is refused, naming it). A unit (``unit.py``) is one sample on one model
and returns a row per method and ratio; each row is keyed by a hash of what determines it (the
model's and tokenizer's sha256, the task, the length, the seed, the method and the ratio), so
``resume`` runs only the rows not in the table yet, and a unit whose rows are all there not at all.
Units run on the same Dask machinery as ``pyllama sweep`` (``pyllama.sweep.cluster``).

The output folder gets ``rows.jsonl`` (each row flushed as its unit finishes), ``results.parquet``
and ``results.csv``, ``leaderboard.md`` and ``leaderboard.png`` (``report.py``). Nothing there may
be one of the board's inputs (``pyllama.outputs.check_outputs``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pyllama.diff.probes.retrieval import use_chat
from pyllama.diff.probes.ruler import ruler_sample
from pyllama.errors import PyllamaError
from pyllama.hub import resolve
from pyllama.leaderboard.board import Board, load_board
from pyllama.leaderboard.methods import CEILING
from pyllama.leaderboard.report import FIGURE, MARKDOWN, write_board
from pyllama.leaderboard.unit import Branch, Unit, run_unit
from pyllama.model import Model
from pyllama.outputs import check_outputs
from pyllama.sweep.cell import one_line
from pyllama.sweep.cluster import cluster_client, drain, local_size, scheduler_address
from pyllama.sweep.plan import cell_key, file_sha256
from pyllama.sweep.table import CSV, ROWS, TABLE, RowStore

__all__ = ["BoardPlan", "output_files", "plan_board", "run"]

RETRIES = 2  # a unit whose worker dies is run again, as a sweep's cell is


def output_files(out: str | os.PathLike) -> list[tuple[str, Path]]:
    folder = Path(out)
    return [("--out", folder)] + [("--out", folder / n) for n in (ROWS, TABLE, CSV, MARKDOWN, FIGURE)]


@dataclass
class BoardPlan:
    board: Board
    units: list[Unit]

    @property
    def keys(self) -> list[str]:
        """Every row's key, in board order."""
        return [b.key for u in self.units for b in u.branches]


def plan_board(board: Board) -> BoardPlan:
    """Every unit of ``board`` with all its branches; BoardError (one line naming the entry) first."""
    units = []
    for i, name in enumerate(board.models):
        path, tokenizer, model = _load_model(board, i, name)
        model_sha, tok_sha = file_sha256(path), file_sha256(tokenizer) if tokenizer else None
        for length in board.lengths:
            if length > model.config.seq_len:
                raise board.fail("lengths", f"{length:,} is beyond {name}'s context of {model.config.seq_len:,}")
            for task in board.tasks:
                _check_fits(board, model, task, length)
            # sample by sample, every task of a sample before the next: a board stopped part way (and
            # --resume'd) holds the same samples of every task
            for seed in range(board.seed, board.seed + board.samples):
                for task in board.tasks:
                    fields = dict(model=model_sha, tokenizer=tok_sha, task=task, length=length, seed=seed)
                    branches = [Branch(cell_key(**fields, method=CEILING, ratio=0.0), CEILING, 0.0)]
                    branches += [
                        Branch(cell_key(**fields, method=m, ratio=r), m, r)
                        for m in board.methods
                        for r in board.ratios
                        if r > 0
                    ]
                    units.append(
                        Unit(cell_key(**fields), path, model_sha, tokenizer, task, length, seed, tuple(branches))
                    )
    return BoardPlan(board, units)


def _load_model(board: Board, index: int, name: str) -> tuple[str, str | None, Model]:
    where = f"models[{index}]"
    try:
        path = resolve(board.path(name))
        tokenizer = str(resolve(board.path(board.tokenizer), kind="tokenizer")) if board.tokenizer else None
        model = Model.load(path, tokenizer=tokenizer, threads=1)
    except PyllamaError as exc:
        raise board.fail(where, str(exc)) from None
    if model.tokenizer is None:
        raise board.fail(where, f"{name}: no tokenizer found beside it; give one (tokenizer = ... or -z)")
    return str(Path(path).resolve()), str(Path(tokenizer).resolve()) if tokenizer else None, model


def _check_fits(board: Board, model: Model, task: str, length: int) -> None:
    """The task's first sample at ``length``: refused in one line when even its smallest does not fit."""
    assert model.tokenizer is not None  # _load_model refused a model without one
    try:
        ruler_sample(model.tokenizer, task, length, board.seed, use_chat(model.tokenizer, "auto", task))
    except PyllamaError as exc:
        raise board.fail("tasks", one_line(exc)) from None


def run(
    board: Board | dict | str | os.PathLike,
    out: str | os.PathLike,
    *,
    scheduler: str | None = None,
    workers: int | None = None,
    threads_per_unit: int | None = None,
    resume: bool = False,
    progress: bool | None = False,
    client=None,
    on_row: Callable[[dict], None] | None = None,
):
    """Run every row of ``board`` (a Board, a ``[leaderboard]`` dict or a TOML path) not yet in
    ``out``, on Dask (``scheduler``, an existing ``client``, or a local cluster of ``workers``);
    write the table, the Markdown board and the figure into ``out``; the table as a DataFrame."""
    if not isinstance(board, Board):
        board = load_board(board)
    check_outputs(board.input_files(), output_files(out))
    if client is None and scheduler_address(scheduler):
        with cluster_client(scheduler, workers, threads_per_unit) as (remote, threads):
            return run(
                board, out, threads_per_unit=threads, resume=resume, progress=progress, client=remote, on_row=on_row
            )
    if client is None:
        local_size(workers, threads_per_unit)  # the local cluster's size, refused before planning
    plan = plan_board(board)
    store = RowStore(out, resume=resume)
    todo = [_missing(u, store) for u in plan.units]
    todo = [u for u in todo if u.branches]
    if todo and client is not None:
        _gather(client, todo, threads_per_unit or 1, store, progress, on_row)
    elif todo:
        with cluster_client(None, workers, threads_per_unit) as (local, threads):
            _gather(local, todo, threads, store, progress, on_row)
    return write_board(store, plan.keys, out)


def _missing(unit: Unit, store: RowStore) -> Unit:
    """The unit with only the branches whose rows are not done yet."""
    branches = tuple(b for b in unit.branches if not store.done(b.key))
    return Unit(unit.key, unit.model, unit.model_sha256, unit.tokenizer, unit.task, unit.length, unit.seed, branches)


def _gather(client, units: list[Unit], threads: int, store: RowStore, progress, on_row) -> None:
    def submit(unit: Unit):
        return client.submit(run_unit, unit, threads, key=f"pyllama-unit-{unit.key}", pure=False, retries=RETRIES)

    def done(unit: Unit, rows, exc) -> None:
        if exc is not None:  # the task itself failed for good (e.g. KilledWorker): each branch's row says so
            rows = [
                dict(unit.columns(), cell=b.key, method=b.method, ratio=b.ratio, error=one_line(exc))
                for b in unit.branches
            ]
        for row in rows:
            store.append(row)
            if on_row is not None:
                on_row(row)

    drain(client, units, submit, done, "sample", "leaderboard", progress)
