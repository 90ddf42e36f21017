"""Options shared by the commands, defined once, and the helpers they share.

Ranges are checked by ``pyllama.options`` (the Python API runs the same checks), wrapped here as
click callbacks; an option that two commands take with different defaults is a factory.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import click

from pyllama import options
from pyllama.attention.registry import resolve_spec
from pyllama.attention.spec import PluginSpec
from pyllama.errors import PyllamaError, TokenizerError

if TYPE_CHECKING:
    from pyllama.model import Model
    from pyllama.tokenizer import Tokenizer


def _in_range(check):
    """A click callback running one of pyllama.options' checks (the Python API runs the same)."""

    def callback(ctx: click.Context, param: click.Parameter, value):
        if value is None:  # not given, and the option's default is None: the command decides
            return None
        try:
            return check(value, name="")
        except PyllamaError as exc:
            raise click.BadParameter(str(exc), ctx=ctx, param=param) from None

    return callback


def _threads_in_range(value: int | None, name: str) -> int | None:
    return options.check_threads(value, name=name, allow_default=False)


checkpoint_option = click.option(
    "-c",
    "--checkpoint",
    required=True,
    type=click.Path(dir_okay=False),
    help="Model file: a llama2.c .bin (versions 0/1/2) or a .gguf, or a downloaded name (pyllama download --list).",
)
tokenizer_option = click.option(
    "-z",
    "--tokenizer",
    type=click.Path(dir_okay=False),
    default=None,
    help="Tokenizer: llama2.c tokenizer.bin/tok512.bin, or a GGUF. Default: the GGUF's own, or tokenizer.bin "
    "beside the checkpoint.",
)
threads_option = click.option(
    "--threads",
    type=int,
    default=None,
    callback=_in_range(_threads_in_range),
    help="Threads for the kernels and plugins (default: all cores; at most 4 per core). Results are identical "
    "for any count.",
)


def resolved_spec(ctx: click.Context, param: click.Parameter, value: str | None) -> PluginSpec | None:
    """A plugin spec resolved once, before the model loads: a bad one is the command's first error
    (its PluginError line), and the command hands the resolved spec on instead of the string."""
    return None if value is None else resolve_spec(value)


attention_option = click.option(
    "--attention",
    "-a",
    default="causal",
    show_default=True,
    callback=resolved_spec,
    help="Attention plugin spec, e.g. causal, sliding:256, sink:4,252 (see `pyllama plugins`).",
)


def compress_at_option(where: str):
    """--compress-at: where the plugin's compression event comes (``where``: what "context" means here)."""
    return click.option(
        "--compress-at",
        default="context",
        show_default=True,
        metavar="POS|context|none",
        callback=_in_range(options.check_compress_at),
        help=f"The compression event (plugins that compress at it, e.g. snapkv, compress the cache there): "
        f"after position POS, after {where} (context), or never (none).",
    )


def cluster_options(unit: str, workers_help: str, threads_help: str):
    """--scheduler, --workers and --threads-per-UNIT, the Dask options of sweep and leaderboard (``unit``:
    what one task of work is there, cell or unit)."""
    options_ = [
        click.option(
            "--scheduler",
            default=None,
            metavar="tcp://HOST:8786",
            help="A Dask scheduler (default: $DASK_SCHEDULER_ADDRESS, else a local cluster sized to this machine).",
        ),
        click.option("--workers", type=click.IntRange(min=1), default=None, help=workers_help),
        click.option(f"--threads-per-{unit}", type=click.IntRange(min=1), default=None, help=threads_help),
    ]

    def decorate(command):
        for option in reversed(options_):
            command = option(command)
        return command

    return decorate


def steps_option(default: int | None, help: str):
    return click.option(
        "-n",
        "--steps",
        type=int,
        default=default,
        show_default=default is not None,
        callback=_in_range(options.check_steps),
        help=help,
    )


def temperature_option(default: float):
    return click.option(
        "-t",
        "--temperature",
        type=float,
        default=default,
        show_default=True,
        callback=_in_range(options.check_temperature),
        help="0 = greedy argmax; otherwise softmax(logits / T) sampling (finite, >= 0).",
    )


topp_option = click.option(
    "-p",
    "--topp",
    type=float,
    default=0.9,
    show_default=True,
    callback=_in_range(options.check_topp),
    help="Top-p (nucleus) sampling threshold in [0, 1]; 0 or 1 samples from the full distribution.",
)
seed_option = click.option(
    "-s",
    "--seed",
    type=int,
    default=0,
    callback=_in_range(options.check_seed),
    help="RNG seed in [0, 2^64 - 1]; 0 = from the clock (like run.c).",
)


def require_tokenizer(model: Model, checkpoint: str) -> Tokenizer:
    """generate and diff need text: the model's tokenizer, or say why there is none (none beside it,
    or one that does not fit)."""
    if model.tokenizer is None:
        if model.tokenizer_problem:
            problem = model.tokenizer_problem  # the tokenizer's own error may already say how to fix it
            raise TokenizerError(problem if "-z" in problem else f"{problem}; pass the model's tokenizer with -z")
        raise click.UsageError(f"{checkpoint}: no tokenizer found beside it; pass one with -z")
    return model.tokenizer


_line_open = False  # stream() left text on stdout without a newline


def stream(text: str) -> None:
    """Text to stdout as it is generated."""
    global _line_open
    sys.stdout.write(text)
    sys.stdout.flush()
    if text:
        _line_open = not text.endswith("\n")


def forget_streamed_line() -> None:
    """A command starts: no line is open yet."""
    global _line_open
    _line_open = False


def end_streamed_line() -> None:
    """Before an error line: end the line that streamed text left open, so the error starts a line."""
    global _line_open
    if _line_open:
        _line_open = False
        try:
            sys.stdout.write("\n")
            sys.stdout.flush()
        except (OSError, ValueError):  # stdout closed or gone: nothing to end
            pass
