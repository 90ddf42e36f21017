"""The ``pyllama`` group: one-line errors, the broken-pipe exit, ``--debug``.

Errors a user can cause print one line (``error: ...``) and exit non-zero; ``--debug`` shows the
traceback instead. The commands live in the modules beside this one (``pyllama.cli`` registers them).
"""

from __future__ import annotations

import os
import sys
import traceback

import click

from pyllama.cli.shared import end_streamed_line, forget_streamed_line
from pyllama.errors import PyllamaError

EXIT_USER_ERROR = 1
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE: what a command killed by a closed pipe exits with (`| head`)


class PyllamaGroup(click.Group):
    """Turns PyllamaError (and unreadable files) into one line on stderr and a non-zero exit."""

    def invoke(self, ctx: click.Context):
        forget_streamed_line()
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            # the reader went away (`| head -c 100`): stop quietly, as other command-line tools do.
            # stdout goes to /dev/null so that the interpreter's last flush does not fail again.
            try:
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            except (OSError, ValueError):  # no real file descriptor (a test runner's stdout)
                pass
            ctx.exit(EXIT_BROKEN_PIPE)
        except (PyllamaError, OSError) as exc:
            if ctx.obj and ctx.obj.get("debug"):
                traceback.print_exc()
            msg = str(exc) if isinstance(exc, PyllamaError) else f"{exc.filename or ''}: {exc.strerror or exc}"
            end_streamed_line()
            click.echo(f"error: {msg}", err=True)
            ctx.exit(EXIT_USER_ERROR)
        except click.UsageError as exc:
            # click would print the whole usage block; one line says what is wrong and where to look
            where = exc.ctx.command_path if exc.ctx is not None else ctx.command_path
            click.echo(f"error: {exc.format_message()} (see: {where} --help)", err=True)
            ctx.exit(exc.exit_code)
        except KeyboardInterrupt as exc:  # a command may say what was done and how to go on
            end_streamed_line()
            click.echo(f"interrupted: {exc}" if str(exc) else "interrupted", err=True)
            ctx.exit(130)


@click.group(cls=PyllamaGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, help="Show Python tracebacks instead of one-line errors.")
@click.version_option(package_name="pyllama-attn")
@click.pass_context
def main(ctx: click.Context, debug: bool) -> None:
    """pyllama: a fast, exact Llama engine for experimenting with attention.

    Models are llama2.c checkpoints (.bin) or GGUF files, memory-mapped. Attention is a plugin
    (--attention SPEC) that owns the whole KV cache; `pyllama plugins` lists them.
    """
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug
