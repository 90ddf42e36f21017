"""Studies: a grid of plugins × knobs × budgets × probes × models, run as diffs on Dask, into one table.

    import pyllama.sweep
    df = pyllama.sweep.run("study.toml", out="study-out")      # a pandas DataFrame, one row per cell
    pyllama.sweep.dry_run("study.toml")                          # the cells and their estimated cost

``study``: the file format and its checks; ``plan``: the cells and their keys; ``budget``:
equal-memory sizing; ``cell``: one diff, one row; ``cluster``: the Dask client; ``table``: the row
store and the Parquet/CSV table; ``cost``: ``--dry-run``'s estimates; ``cli``: ``pyllama sweep``.
"""

from pyllama.sweep.cell import TIMING_COLUMNS, Cell, run_cell
from pyllama.sweep.plan import Plan, plan_study
from pyllama.sweep.runner import dry_run, run
from pyllama.sweep.study import Study, StudyError, load_study

__all__ = [
    "TIMING_COLUMNS",
    "Cell",
    "Plan",
    "Study",
    "StudyError",
    "dry_run",
    "load_study",
    "plan_study",
    "run",
    "run_cell",
]
