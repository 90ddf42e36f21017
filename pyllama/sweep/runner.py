"""``pyllama.sweep.run``: plan a study, send its cells to Dask, collect the rows into one table."""

from __future__ import annotations

import os
from collections.abc import Callable

from pyllama.diff.probes import is_probe_name
from pyllama.options import check_threads
from pyllama.outputs import check_outputs
from pyllama.sweep.cell import run_cell
from pyllama.sweep.cluster import (
    THREADS_NAME,
    check_cluster_threads,
    cluster_client,
    drain,
    local_size,
    scheduler_address,
)
from pyllama.sweep.cost import estimate
from pyllama.sweep.plan import Plan, plan_study
from pyllama.sweep.study import Study, load_study
from pyllama.sweep.table import ROWS, RowStore, output_files

__all__ = ["SweepInterrupted", "run", "dry_run"]

# run_cell turns the diff's own failures into rows, so a task fails only outside it (a worker out of
# memory, a result that cannot be sent); a cell whose worker dies is rescheduled by Dask on its own,
# up to distributed.scheduler.allowed-failures times
RETRIES = 2


def _plan(study: Study | dict | str | os.PathLike, threads: int) -> Plan:
    return plan_study(study if isinstance(study, Study) else load_study(study), threads=threads)


def run(
    study: Study | dict | str | os.PathLike,
    out: str | os.PathLike | None = None,
    *,
    scheduler: str | None = None,
    workers: int | None = None,
    threads_per_cell: int | None = None,
    resume: bool = False,
    per_position: bool = False,
    progress: bool | None = False,
    retries: int = RETRIES,
    client=None,
    on_row: Callable[[dict], None] | None = None,
):
    """Run every cell of ``study`` (a TOML path, a dict or a Study) on Dask; the results table as a
    pandas DataFrame, one row per cell in study order.

    ``out``: a folder for ``rows.jsonl`` (each row persisted as its cell finishes), ``results.parquet``
    and ``results.csv``; None keeps the rows in memory only. ``scheduler``: a Dask scheduler address
    (default ``DASK_SCHEDULER_ADDRESS``, else a LocalCluster sized to the machine); ``client``: an
    existing ``distributed.Client`` instead. ``resume``: skip cells already in ``out``'s table.
    Threads per cell beyond the engine's limit (on this machine, or on the cluster's smallest worker),
    a malformed or unreachable scheduler, and an output in ``out`` that is one of the study's files
    are refused with InputError before any work.
    """
    if not isinstance(study, Study):
        study = load_study(study)
    check_outputs(study.input_files(), output_files(out, per_position))
    if client is None and scheduler_address(scheduler):
        # a remote scheduler is reached (or refused) before planning, which may measure budgets
        with cluster_client(scheduler, workers, threads_per_cell) as (remote, threads):
            return run(
                study, out, threads_per_cell=threads, resume=resume, per_position=per_position,
                progress=progress, retries=retries, client=remote, on_row=on_row,
            )  # fmt: skip
    if client is not None:
        if threads_per_cell is not None:
            check_cluster_threads(client, threads_per_cell)
    else:
        local_size(workers, threads_per_cell)  # the local cluster's size, refused before planning
    plan = _plan(study, threads_per_cell or 1)
    store = RowStore(out, resume=resume)
    todo = [c for c in plan.cells if not store.done(c.key)]
    try:
        if todo and client is not None:
            _gather(client, todo, threads_per_cell or 1, per_position, retries, store, progress, on_row)
        elif todo:
            with cluster_client(None, workers, threads_per_cell) as (local, threads):
                _gather(local, todo, threads, per_position, retries, store, progress, on_row)
    except KeyboardInterrupt:
        raise SweepInterrupted.of(plan, store) from None
    return store.write([c.key for c in plan.cells], per_position=per_position)


class SweepInterrupted(KeyboardInterrupt):
    """Ctrl-C during a sweep, after its cells were cancelled: what finished, where it is kept, and
    how to run the rest (the message; ``pyllama sweep`` prints it as its one line)."""

    @classmethod
    def of(cls, plan: Plan, store: RowStore) -> SweepInterrupted:
        total = len(plan.cells)
        done = sum(store.done(c.key) for c in plan.cells)
        if store.out is None:
            return cls(f"{done} of {total} cells finished")
        return cls(
            f"{done} of {total} cells finished (kept in {store.out / ROWS}); "
            f"run the same command with --resume to run the other {total - done}"
        )


def _gather(client, cells, threads, per_position, retries, store, progress, on_row) -> None:
    def submit(cell):
        return client.submit(
            run_cell, cell, threads, per_position, key=f"pyllama-cell-{cell.key}", pure=False, retries=retries
        )

    def done(cell, result, exc) -> None:
        row, positions = (cell.error_row(exc), None) if exc is not None else result
        store.append(row, positions)
        if on_row is not None:
            on_row(row)

    drain(client, cells, submit, done, "cell", "sweep", progress)


def dry_run(study: Study | dict | str | os.PathLike, threads_per_cell: int = 1, out: str | os.PathLike | None = None):
    """The cells of ``study`` with their estimated cost, run nothing: a DataFrame with ``positions``,
    ``bytes_streamed`` and ``est_seconds`` per cell, and ``done`` for cells already in ``out``'s table."""
    import pandas as pd  # lazy: pandas only for the DataFrame a dry run returns

    check_threads(threads_per_cell, name=THREADS_NAME, allow_default=False)  # the estimates run here
    plan = _plan(study, threads_per_cell)
    store = RowStore(out, resume=True) if out is not None and os.path.isdir(out) else RowStore(None)
    costs = estimate(plan, threads_per_cell)
    rows = []
    for cell in plan.cells:
        cost = costs[cell.key]
        rows.append(
            {
                "cell": cell.key,
                "model": os.path.basename(cell.model),
                "probe": cell.probe if is_probe_name(cell.probe) else os.path.basename(cell.probe),
                "spec": cell.spec,
                "budget": cell.budget,
                "positions": cost.positions,
                "bytes_streamed": cost.bytes_streamed,
                "est_seconds": cost.seconds,
                "done": store.done(cell.key),
            }
        )
    return pd.DataFrame(rows)
