"""``pyllama sweep STUDY.toml``: run a study on Dask and write its results table.

A file with a ``[leaderboard]`` table is a RULER leaderboard (``pyllama.leaderboard``): the same
command runs it, its units on the same cluster, with ``--threads-per-cell`` as threads per unit.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from pyllama.cli.shared import cluster_options
from pyllama.leaderboard.board import is_board_file, load_board
from pyllama.leaderboard.cli import echo_dry_run, run_board
from pyllama.sweep.runner import dry_run as plan_costs
from pyllama.sweep.runner import run
from pyllama.sweep.study import load_study, plural

__all__ = ["EXIT_CELLS_FAILED", "sweep"]

EXIT_CELLS_FAILED = 1  # the table is written, but at least one cell's row holds an error


@click.command()
@click.argument("study", type=click.Path(dir_okay=False))
@click.option(
    "--out",
    type=click.Path(file_okay=False),
    default=None,
    help="Folder for rows.jsonl (each row as its cell finishes), results.parquet and results.csv "
    "(default: STUDY's name without .toml, beside it).",
)
@cluster_options(
    "cell",
    "Worker processes of the local cluster (workers × threads per cell: at most 4 per core).",
    "Kernel threads of one diff (default: 1 with one worker per core; at most 4 per core, of the smallest "
    "worker with --scheduler). Results are identical for any count.",
)
@click.option("--resume", is_flag=True, help="Continue the table in --out: run only the cells not in it yet.")
@click.option("--dry-run", is_flag=True, help="Print the cells and their estimated cost; run nothing.")
@click.option("--per-position", is_flag=True, help="Also write every cell's per-position rows (positions.parquet).")
@click.option("--progress/--no-progress", default=None, help="Progress bar as cells finish (default: on a terminal).")
def sweep(study, out, scheduler, workers, threads_per_cell, resume, dry_run, per_position, progress):
    """Run every cell of a study (models × probes × plugins × knob grids × budgets) as one diff each.

    \b
    A study file (TOML):
      models = ["stories260K.bin"]
      tokenizer = "tok512.bin"
      reference = "causal:positions=2048"
      probes = ["standard"]
      budgets = [16384, 32768]    # optional: each plugin's window sized to these bytes
      [[plugins]]
      name = "sink"
      sinks = 4
      window = [60, 124]

    \b
    A file with a [leaderboard] table runs a RULER leaderboard (see pyllama leaderboard):
      [leaderboard]
      models = ["SmolLM2-135M-Instruct"]
      methods = ["sink", "sliding"]
      ratios = [0, 0.5, 0.9]

    \b
    Examples:
      pyllama sweep study.toml --dry-run
      pyllama sweep study.toml --out results/ --workers 2
      pyllama sweep study.toml --out results/ --resume --scheduler tcp://10.0.0.5:8786

    \b
    Exit status: 0 when every cell ran; 1 when a cell failed (the table is still
    written, each failed cell's error is printed, --resume runs them again);
    non-zero, with nothing run, when the study or an option is refused.
    """
    out = out or str(Path(study).with_suffix(""))
    if is_board_file(study):
        if per_position:
            raise click.UsageError("a [leaderboard] file takes no --per-position (its rows are per sample)")
        if dry_run:
            echo_dry_run(load_board(study), out, workers, threads_per_cell)
            return
        run_board(load_board(study), out, scheduler, workers, threads_per_cell, resume, progress)
        return
    loaded = load_study(study)
    if dry_run:
        _print_costs(plan_costs(loaded, threads_per_cell or 1, out=out if resume else None))
        return
    ran: list[str] = []  # the cells run now; the others were already in --out's table (--resume)
    df = run(
        loaded,
        out,
        scheduler=scheduler,  # None: $DASK_SCHEDULER_ADDRESS, else a local cluster
        workers=workers,
        threads_per_cell=threads_per_cell,
        resume=resume,
        per_position=per_position,
        progress=progress,
        on_row=lambda row: ran.append(row["cell"]),
    )
    failed = int(df["error"].notna().sum()) if "error" in df else 0
    done = len(df) - len(ran)
    counts = f", {failed} failed" if not done else f": {len(ran)} run, {done} already done, {failed} failed"
    click.echo(f"{plural(len(df), 'cell')}{counts}: wrote {out}/results.parquet and {out}/results.csv")
    if failed:
        for _, row in df[df["error"].notna()].iterrows():
            click.echo(f"cell {row['cell']} ({row['spec']} on {row['probe']}): {row['error']}", err=True)
        sys.exit(EXIT_CELLS_FAILED)


def _print_costs(df) -> None:
    todo = df[~df["done"]]
    width = max([len(s) for s in df["spec"]] + [4])
    click.echo(f"{'cell':<17}{'model':<18}{'probe':<14}{'spec':<{width + 2}}{'positions':>10}{'est. s':>9}  done")
    for _, r in df.iterrows():
        click.echo(
            f"{r['cell']:<17}{r['model'][:17]:<18}{r['probe'][:13]:<14}{r['spec']:<{width + 2}}"
            f"{r['positions']:>10,}{r['est_seconds']:>9.2f}  {'yes' if r['done'] else ''}"
        )
    click.echo(
        f"{plural(len(df), 'cell')}, {len(todo)} to run: {plural(int(todo['positions'].sum()), 'position')}, "
        f"{todo['bytes_streamed'].sum() / 1e9:.3g} GB of weights streamed, "
        f"about {todo['est_seconds'].sum():.1f} s on one worker (measured on this machine)"
    )
