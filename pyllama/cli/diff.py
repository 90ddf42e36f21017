"""``pyllama diff``: teacher-force one token sequence through two attention plugins and compare them."""

from __future__ import annotations

import os
import sys

import click

from pyllama.cli.shared import (
    checkpoint_option,
    compress_at_option,
    require_tokenizer,
    resolved_spec,
    threads_option,
    tokenizer_option,
)
from pyllama.diff.probes import Probe, probe_from_text
from pyllama.model import Model
from pyllama.outputs import check_outputs, model_inputs, plugin_inputs, probe_inputs

__all__ = ["EXIT_NOT_EXACT", "diff"]

EXIT_NOT_EXACT = 3  # diff --expect-exact: the two plugins are not bit-identical


def _output_file(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """An output of diff must be writable before the diff runs, not found unwritable after it."""
    if value is None:
        return None
    folder = os.path.dirname(os.path.abspath(value))
    if not os.path.isdir(folder):
        raise click.BadParameter(f"{value}: the folder {folder} does not exist", ctx=ctx, param=param)
    if not os.access(folder, os.W_OK | os.X_OK):
        raise click.BadParameter(f"{value}: the folder {folder} is not writable", ctx=ctx, param=param)
    return value


def _output_figure(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A figure path needs a writable folder and an extension matplotlib knows how to write."""
    path = _output_file(ctx, param, value)
    if path is None:
        return None
    from matplotlib.backend_bases import FigureCanvasBase  # lazy: matplotlib only when a figure is asked for

    known = FigureCanvasBase.get_supported_filetypes()
    ext = os.path.splitext(path)[1].lstrip(".").lower()
    if ext not in known:
        got = f"the extension .{ext}" if ext else "no extension"
        raise click.BadParameter(
            f"{value}: {got} is not a figure format; use one of {', '.join(sorted(known))}", ctx=ctx, param=param
        )
    return value


@click.command()
@click.argument("a", callback=resolved_spec)
@click.argument("b", callback=resolved_spec)
@checkpoint_option
@tokenizer_option
@click.option(
    "--probe",
    "probe",
    default=None,
    metavar="NAME[:OPTIONS]|FILE",
    help="standard (default: short stories, a run to 4x the context, name recall), stories, long, "
    "recall, or a text file (sequences separated by lines holding only <|endoftext|>). Retrieval "
    "probes, generated and seeded: passkey[:depth=0.5,length=N,seed=0,digits=5,chat=auto], "
    "needle[:depths=0/0.25/0.5/0.75/1,lengths=N/M,...] (one passkey per depth x length; "
    "default lengths 1/4, 1/2 and all of the context), copy[:span=32,length=N,seed=0]; "
    "length = tokens in the sequence (default half the context). RULER's 11 synthetic tasks: "
    "ruler[:task=niah_single_1/vt/...,length=4096,seed=0,samples=1,chat=auto] (default all 11 at "
    "4096 tokens or the context), scored with RULER's string match on the greedy answer and by "
    "log P(answer).",
)
@click.option(
    "--text",
    "text_file",
    type=click.Path(dir_okay=False, exists=True),
    default=None,
    help="A text file as the probe (same as --probe FILE).",
)
@click.option("-i", "--prompt", default=None, help="This prompt text as the probe.")
@click.option(
    "--json",
    "json_path",
    type=click.Path(dir_okay=False, writable=True),
    default=None,
    callback=_output_file,
    help="Write the summary and every per-position row as JSON.",
)
@click.option(
    "--csv",
    "csv_path",
    type=click.Path(dir_okay=False, writable=True),
    default=None,
    callback=_output_file,
    help="Write every per-position row as CSV.",
)
@click.option(
    "--plot",
    "plot_path",
    type=click.Path(dir_okay=False, writable=True),
    default=None,
    callback=_output_figure,
    help="Write the overview figure (|Δlogit|, KL, per-layer error, memory, recall), e.g. diff.png "
    "(any format matplotlib writes: png, pdf, svg ...).",
)
@click.option(
    "--expect-exact",
    is_flag=True,
    help=f"Exit with status {EXIT_NOT_EXACT} unless every logit is bit-identical (max |Δlogit| == 0).",
)
@compress_at_option("each sequence's context: a retrieval probe's haystack, before its question")
@threads_option
@click.option("--progress/--no-progress", default=None, help="Progress bar (default: on a terminal, for long probes).")
@click.option(
    "--blocks/--no-blocks",
    default=True,
    show_default=True,
    help="Run positions in blocks (each weight read once per block; the same report) or one at a time.",
)
@click.option(
    "--cache/--no-cache",
    "cache",
    default=None,
    help="Record A's run (a built-in plugin) the first time and replay it in later diffs of the same "
    "model file, spec and probe: one forward per position instead of two, the same report. "
    "Records live in $PYLLAMA_DIFF_CACHE (default ~/.cache/pyllama/diff-sides; 'off' turns them "
    "off), at most $PYLLAMA_DIFF_CACHE_GIB GiB (default 8), the least recently used removed first. "
    "Default: on unless PYLLAMA_DIFF_CACHE=off.",
)
def diff(
    a,
    b,
    checkpoint,
    tokenizer,
    probe,
    text_file,
    prompt,
    json_path,
    csv_path,
    plot_path,
    expect_exact,
    compress_at,
    threads,
    progress,
    blocks,
    cache,
):
    """Teacher-force one token sequence through attention plugins A and B and compare them.

    \b
    Both share the model's weights. Per position: max |Δlogit|, KL(P_A ‖ P_B) in float64, top-1
    agreement, the teacher token's Δ log-prob, each layer's relative error of the attention output
    and each plugin's memory_bytes(). A sequence longer than a plugin holds is compared over the
    positions both hold (a note says so).

    \b
    Examples:
      pyllama diff causal sliding:64 -c stories260K.bin -z tok512.bin --plot sliding.png
      pyllama diff causal sink:0,64 --probe stories -c stories260K.bin -z tok512.bin
      pyllama diff causal:positions=2048 sink:4,60,shift -c stories260K.bin -z tok512.bin --csv rows.csv
      pyllama diff causal sliding:4096 -c stories260K.bin -z tok512.bin --expect-exact
      pyllama diff causal sink:4,256 -c SmolLM2-135M-Instruct --probe passkey:depth=0.5,length=1200

    \b
    On a retrieval probe (passkey, needle, copy) it also prints, per sequence and side, P(key)
    teacher-forced, the worst rank of the key's tokens, the greedy answer, and whether the plugin
    retrieves the key (every key token rank 1, the greedy answer holds it); for copy the loss on
    the second copy.
    """
    given = [x for x in (probe, text_file, prompt) if x is not None]
    if len(given) > 1:
        raise click.UsageError("give one of --probe, --text and -i/--prompt")
    check_outputs(
        {**model_inputs(checkpoint, tokenizer), **probe_inputs(text_file or probe), **plugin_inputs(a, b)},
        {"--json": json_path, "--csv": csv_path, "--plot": plot_path},
    )
    model = Model.load(checkpoint, tokenizer=tokenizer, threads=threads or 0)
    model_tokenizer = require_tokenizer(model, checkpoint)
    source: Probe | str
    if prompt is not None:
        source = probe_from_text(prompt, model_tokenizer, name="prompt")
    else:
        source = text_file or probe or "standard"
    report = model.diff(
        a, b, probe=source, threads=threads, progress=progress, blocks=blocks, cache=cache, compress_at=compress_at
    )
    click.echo(report.table())
    for path, write in ((json_path, report.to_json), (csv_path, report.to_csv), (plot_path, report.plot)):
        if path:
            write(path)
            click.echo(f"wrote {path}", err=True)
    if expect_exact and not report.exact:
        fd = report.summary.get("first_diff")
        where = f", first at position {fd['position']} of {fd['sequence']}" if fd else ""
        mx = report.summary.get("max_abs_dlogit", float("nan"))
        click.echo(f"error: not exact: max |Δlogit| = {mx:.6g}{where}", err=True)
        sys.exit(EXIT_NOT_EXACT)
