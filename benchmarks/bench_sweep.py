"""Studies at scale: cells per minute of ``pyllama.sweep`` with 1 and 2 worker processes, against the
same cells run one by one in this process (the peer), and what one cell costs and moves.

The study is fixed: stories260K, the ``recall`` probe (3 sequences, 1,180 positions), ``sink`` and
``lattice`` at four windows each: 8 cells, each one diff. A LocalCluster is started, then timed from
the first submission to the last row (its start-up is reported apart); each configuration runs
``--repeats`` times, interleaved, and the median is reported.

    python benchmarks/bench_sweep.py --repeats 3 --json bench_sweep.json
"""

from __future__ import annotations

import argparse
import json
import logging
import pickle
import statistics
import time

from random_checkpoints import SHARED

import pyllama.sweep as sweep
from pyllama.sweep.cell import run_cell

MODELS = SHARED / "models"
STUDY = {
    "models": [str(MODELS / "stories260K.bin")],
    "tokenizer": str(MODELS / "tok512.bin"),
    "reference": "causal",
    "probes": ["recall"],
    "plugins": [
        {"name": "sink", "sinks": 4, "window": [8, 16, 32, 64]},
        {"name": "lattice", "sinks": 4, "base": 8, "window": [8, 16, 32, 64]},
    ],
}


def in_process(plan) -> float:
    t0 = time.perf_counter()
    for cell in plan.cells:
        run_cell(cell, threads=1)
    return time.perf_counter() - t0


def on_cluster(workers: int) -> tuple[float, float, float]:
    """(start-up seconds, seconds from the first submission to the last row, the cells' own seconds
    summed: over the wall time, how many cells ran at once on average)."""
    from distributed import Client, LocalCluster

    t0 = time.perf_counter()
    env = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    with LocalCluster(
        n_workers=workers, threads_per_worker=1, processes=True, host="127.0.0.1",
        dashboard_address=None, scheduler_kwargs={"dashboard_address": "127.0.0.1:0"},
        silence_logs=logging.ERROR, env=env,
    ) as cluster, Client(cluster, set_as_default=False) as client:  # fmt: skip
        started = time.perf_counter() - t0
        t1 = time.perf_counter()
        df = sweep.run(STUDY, client=client, threads_per_cell=1)
        elapsed = time.perf_counter() - t1
    assert df["error"].isna().all()
    return started, elapsed, float(df["seconds"].sum())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    plan = sweep.plan_study(sweep.load_study(STUDY))
    n = len(plan.cells)
    runs: dict[str, list[float]] = {"in-process": [], "1 worker": [], "2 workers": []}
    startup: dict[str, list[float]] = {"1 worker": [], "2 workers": []}
    busy: dict[str, list[float]] = {"1 worker": [], "2 workers": []}
    for _ in range(args.repeats):
        runs["in-process"].append(in_process(plan))
        for workers, name in ((1, "1 worker"), (2, "2 workers")):
            s, e, cell_seconds = on_cluster(workers)
            startup[name].append(s)
            runs[name].append(e)
            busy[name].append(cell_seconds / e)
    row, positions = run_cell(plan.cells[0], threads=1, per_position=True)
    moved = {
        "cell_pickle_bytes": len(pickle.dumps(plan.cells[0])),
        "row_pickle_bytes": len(pickle.dumps((row, None))),
        "row_with_positions_pickle_bytes": len(pickle.dumps((row, positions))),
        "positions_per_cell": row["positions"],
    }
    base = statistics.median(runs["in-process"])
    out = {"cells": n, "moved": moved, "results": {}}
    print(f"{n} cells, {row['positions']} positions each; median of {args.repeats}")
    print(f"{'how':<12}{'seconds':>9}{'cells/min':>11}{'vs in-process':>15}{'start-up s':>12}{'cells at once':>15}")
    for name, times in runs.items():
        med = statistics.median(times)
        up = statistics.median(startup[name]) if name in startup else 0.0
        at_once = statistics.median(busy[name]) if name in busy else 1.0
        out["results"][name] = {
            "seconds": med, "cells_per_minute": 60 * n / med, "startup_seconds": up, "cells_at_once": at_once
        }  # fmt: skip
        print(f"{name:<12}{med:>9.2f}{60 * n / med:>11.1f}{base / med:>15.2f}{up:>12.2f}{at_once:>15.2f}")
    print(json.dumps(moved))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
