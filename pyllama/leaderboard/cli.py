"""``pyllama leaderboard``: RULER's score against compression for every method, on Dask, in one command.

``run_board`` also runs a board file for ``pyllama sweep`` (a TOML file with a ``[leaderboard]`` table).
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from pyllama.cli.shared import cluster_options, tokenizer_option
from pyllama.errors import InputError
from pyllama.leaderboard.board import DEFAULT_RATIOS, DEFAULT_SAMPLES, Board, quick_board
from pyllama.leaderboard.cost import dry_run as plan_costs
from pyllama.leaderboard.report import FIGURE, MARKDOWN
from pyllama.leaderboard.runner import run
from pyllama.leaderboard.stability import samples_needed
from pyllama.outputs import check_outputs
from pyllama.sweep.cluster import local_size
from pyllama.sweep.study import plural
from pyllama.sweep.table import CSV, TABLE

__all__ = ["EXIT_ROWS_FAILED", "leaderboard", "run_board"]

EXIT_ROWS_FAILED = 1  # the table is written, but at least one row holds an error
STABILITY_MD = "samples_needed.md"
STABILITY_PNG = "samples_needed.png"


def _comma_list(convert):
    def callback(ctx: click.Context, param: click.Parameter, value: str | None):
        if value is None:
            return None
        try:
            return [convert(v.strip()) for v in value.split(",") if v.strip()]
        except ValueError:
            raise click.BadParameter(f"{value!r}: expected values separated by commas", ctx=ctx, param=param) from None

    return callback


@click.command()
@click.option(
    "-c",
    "--checkpoint",
    "models",
    multiple=True,
    type=click.Path(dir_okay=False),
    help="Model file or downloaded name; repeat for several models.",
)
@tokenizer_option
@click.option(
    "--methods",
    callback=_comma_list(str),
    default=None,
    metavar="A,B,...",
    help="Methods (registry names) at each ratio (default: every method that takes a ratio).",
)
@click.option(
    "--ratios",
    callback=_comma_list(float),
    default=None,
    metavar="R,...",
    help=f"Shares of the context removed, each in [0, 1); 0 is causal, the ceiling "
    f"(default: {','.join(f'{r:g}' for r in DEFAULT_RATIOS)}).",
)
@click.option(
    "--tasks",
    callback=_comma_list(str),
    default=None,
    metavar="ruler|T,...",
    help="RULER's 11 tasks (ruler, the default) or task names.",
)
@click.option(
    "--lengths",
    callback=_comma_list(int),
    default=None,
    metavar="N,...",
    help="Tokens per sample, the answer included (default: 4096).",
)
@click.option(
    "--samples",
    type=click.IntRange(min=1),
    default=None,
    help=f"Samples per task and length (default: {DEFAULT_SAMPLES}, what the teacher-forced log P(answer) "
    "needs to rank the methods stably on SmolLM2; RULER's string match needs more than 16; see --samples-needed).",
)
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True, help="The first sample's seed.")
@click.option(
    "--quick",
    is_flag=True,
    help="Every method (or --methods), ratios 0.5 and 0.9, four tasks (one per family), one sample, 2,048 tokens.",
)
@click.option(
    "--out",
    type=click.Path(file_okay=False),
    required=True,
    help="Folder for rows.jsonl, results.parquet/.csv, leaderboard.md and leaderboard.png.",
)
@cluster_options(
    "unit",
    "Worker processes of the local cluster.",
    "Kernel threads of one sample's unit (results are identical for any count).",
)
@click.option("--resume", is_flag=True, help="Continue the table in --out: run only the rows not in it yet.")
@click.option(
    "--samples-needed",
    is_flag=True,
    help=f"Run nothing: from --out's table, how many samples each score needs to rank the methods "
    f"stably ({STABILITY_MD}, {STABILITY_PNG}).",
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="Run no branch: each model and length's units, their branches by how they start and the estimated "
    "CPU time (one sample's context timed per model and length), and what --out holds already.",
)
@click.option("--progress/--no-progress", default=None, help="Progress bar as samples finish (default: on a terminal).")
def leaderboard(
    models,
    tokenizer,
    methods,
    ratios,
    tasks,
    lengths,
    samples,
    seed,
    quick,
    out,
    scheduler,
    workers,
    threads_per_unit,
    resume,
    samples_needed,
    dry_run,
    progress,
):
    """RULER's synthetic tasks scored for every method at every compression ratio: the table, the
    Markdown board and kvpress's figure (score against the share of causal's bytes removed).

    \b
    Each sample's context runs once through causal, recorded; every method that compresses at
    the context's end starts from that record, and runs only the question and the answer.

    \b
    Examples:
      pyllama leaderboard -c SmolLM2-135M-Instruct --quick --out quick/
      pyllama leaderboard -c SmolLM2-135M-Instruct --methods sink,sliding --ratios 0,0.5,0.9 \\
          --tasks niah_single_1,vt --lengths 2048 --samples 4 --out board/
      pyllama leaderboard --out board/ --samples-needed
      pyllama sweep board.toml       # the same as a file: a [leaderboard] table
    """
    if samples_needed:
        write_samples_needed(out)
        return
    if not models:
        raise click.UsageError("give a model with -c (or --samples-needed to read --out's table)")
    if quick:
        board = quick_board(list(models), tokenizer, methods)
    else:
        board = Board(
            list(models),
            methods or [],
            ratios if ratios is not None else list(DEFAULT_RATIOS),
            tasks or ["ruler"],
            lengths or [4096],
            samples or DEFAULT_SAMPLES,
            seed,
            tokenizer,
            source="leaderboard",
        )
    if dry_run:
        echo_dry_run(board, out, workers, threads_per_unit)
        return
    run_board(board, out, scheduler, workers, threads_per_unit, resume, progress)


def echo_dry_run(board: Board, out: str, workers: int | None, threads_per_unit: int | None) -> None:
    """Say what ``board`` would run and cost on the local cluster ``run`` would start (``--dry-run``)."""
    n_workers, threads = local_size(workers, threads_per_unit)
    df = plan_costs(board, threads, out)
    ways = [c for c in df.columns if c.endswith("_branches")]
    for (model, length), group in df.groupby(["model", "length"], sort=False):
        counts = ", ".join(f"{int(group[c].sum()):,} {c.removesuffix('_branches')}" for c in ways)
        click.echo(
            f"{model}, {length:,} tokens: {plural(len(group), 'unit')}, {int(group['branches'].sum()):,} branches "
            f"({counts}, the rest causal's); a unit about {group['passes'].mean():.1f} context passes "
            f"(as measured on the {group['passes_from'].iloc[0]} board), "
            f"{group['est_cpu_seconds'].mean():,.1f} CPU s with {plural(threads, 'thread')}"
        )
    total = df["est_cpu_seconds"].sum()
    rows, done = int(df["branches"].sum()), int(df["done"].sum())
    click.echo(
        f"board: {plural(len(df), 'unit')}, {rows:,} rows ({done:,} already in {out}): about "
        f"{total / 3600:,.1f} CPU hours, {total / 3600 / n_workers:,.1f} hours on {plural(n_workers, 'worker')}"
    )


def run_board(board: Board, out: str, scheduler, workers, threads_per_unit, resume: bool, progress) -> None:
    """Run ``board`` into ``out`` and say what was written (``pyllama sweep`` runs a board file this way)."""
    ran: list[str] = []
    df = run(
        board,
        out,
        scheduler=scheduler,
        workers=workers,
        threads_per_unit=threads_per_unit,
        resume=resume,
        progress=progress,
        on_row=lambda row: ran.append(row["cell"]),
    )
    failed = int(df["error"].notna().sum()) if len(df) else 0
    done = len(df) - len(ran)
    counts = f"{plural(len(df), 'row')}: {len(ran):,} run, {done:,} already done, {failed:,} failed"
    click.echo(f"{counts}: wrote {out}/{TABLE}, {out}/{CSV}, {out}/{MARKDOWN} and {out}/{FIGURE}")
    if failed:
        for _, row in df[df["error"].notna()].iterrows():
            click.echo(
                f"row {row['cell']} ({row['method']} {row['ratio']:g}, {row['task']} seed {row['seed']}): "
                f"{row['error']}",
                err=True,
            )
        sys.exit(EXIT_ROWS_FAILED)


def write_samples_needed(out: str) -> None:
    """The samples each score needs, from ``out``'s table: its Markdown and figure beside it."""
    import pandas as pd  # lazy, here and below: pandas and matplotlib only for this statistic

    from pyllama.plots.leaderboard import samples_needed_figure

    folder = Path(out)
    table = folder / TABLE
    if not table.is_file():
        raise InputError(f"{table}: no leaderboard table there; run pyllama leaderboard --out {out} first")
    check_outputs(
        {"the leaderboard table": table}, [("--out", folder / STABILITY_MD), ("--out", folder / STABILITY_PNG)]
    )
    df = pd.read_parquet(table)
    sections = []
    for (model, length), board in df.groupby(["model", "length"], sort=False):
        result = samples_needed(board)
        sections.append(f"### {model}, {length:,} tokens\n\n{result.markdown()}\n")
        samples_needed_figure(result).savefig(folder / STABILITY_PNG, dpi=120)  # the last board's, if several
        click.echo(
            f"{model}, {length:,} tokens: " + "; ".join(f"{s}: {result.needed_text(s)} samples" for s in result.needed)
        )
    (folder / STABILITY_MD).write_text("\n".join(sections), encoding="utf-8")
    click.echo(f"wrote {folder / STABILITY_MD} and {folder / STABILITY_PNG}")
