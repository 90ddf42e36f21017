"""``pyllama sweep STUDY.toml``: run a study on Dask and write its results table."""

from __future__ import annotations

import os
from pathlib import Path

import click

__all__ = ["sweep"]


@click.command()
@click.argument("study", type=click.Path(dir_okay=False))
@click.option(
    "--out",
    type=click.Path(file_okay=False),
    default=None,
    help="Folder for rows.jsonl (each row as its cell finishes), results.parquet and results.csv "
    "(default: STUDY's name without .toml, beside it).",
)
@click.option(
    "--scheduler",
    default=None,
    metavar="tcp://HOST:8786",
    help="A Dask scheduler to run on (default: $DASK_SCHEDULER_ADDRESS, else a local cluster sized to this machine).",
)
@click.option("--workers", type=click.IntRange(min=1), default=None, help="Worker processes of the local cluster.")
@click.option(
    "--threads-per-cell",
    type=click.IntRange(min=1),
    default=None,
    help="Kernel threads of one diff (default: 1 with one worker per core). Results are identical for any count.",
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
    Examples:
      pyllama sweep study.toml --dry-run
      pyllama sweep study.toml --out results/ --workers 2
      pyllama sweep study.toml --out results/ --resume --scheduler tcp://10.0.0.5:8786
    """
    from pyllama.sweep.runner import dry_run as plan_costs
    from pyllama.sweep.runner import run
    from pyllama.sweep.study import load_study

    loaded = load_study(study)
    out = out or str(Path(study).with_suffix(""))
    if dry_run:
        _print_costs(plan_costs(loaded, threads_per_cell or 1, out=out if resume else None))
        return
    if scheduler is None and os.environ.get("DASK_SCHEDULER_ADDRESS"):
        scheduler = os.environ["DASK_SCHEDULER_ADDRESS"]
    df = run(
        loaded,
        out,
        scheduler=scheduler,
        workers=workers,
        threads_per_cell=threads_per_cell,
        resume=resume,
        per_position=per_position,
        progress=progress,
    )
    failed = int(df["error"].notna().sum()) if "error" in df else 0
    click.echo(f"{len(df)} cells, {failed} failed: wrote {out}/results.parquet and {out}/results.csv")
    for _, row in df[df["error"].notna()].iterrows() if failed else ():
        click.echo(f"cell {row['cell']} ({row['spec']} on {row['probe']}): {row['error']}", err=True)


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
        f"{len(df)} cells, {len(todo)} to run: {int(todo['positions'].sum()):,} positions, "
        f"{todo['bytes_streamed'].sum() / 1e9:.3g} GB of weights streamed, "
        f"about {todo['est_seconds'].sum():.1f} s on one worker (measured on this machine)"
    )
