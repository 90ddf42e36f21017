"""The ``pyllama`` command line: generate, tokenize, info (and the commands other modules add).

Errors a user can cause print one line (``error: ...``) and exit non-zero; ``--debug`` shows the
traceback instead. The core never imports click: only this module does.
"""

from __future__ import annotations

import json
import sys
import traceback

import click

from pyllama.errors import PyllamaError

EXIT_USER_ERROR = 1


class PyllamaGroup(click.Group):
    """Turns PyllamaError (and unreadable files) into one line on stderr and a non-zero exit."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except (PyllamaError, OSError) as exc:
            if ctx.obj and ctx.obj.get("debug"):
                traceback.print_exc()
            msg = str(exc) if isinstance(exc, PyllamaError) else f"{exc.filename or ''}: {exc.strerror or exc}"
            click.echo(f"error: {msg}", err=True)
            ctx.exit(EXIT_USER_ERROR)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
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


# ---- shared options (defined once) ------------------------------------------------------------
checkpoint_option = click.option(
    "-c", "--checkpoint", required=True, type=click.Path(dir_okay=False),
    help="Model file: a llama2.c .bin (versions 0/1/2) or a .gguf.",
)
tokenizer_option = click.option(
    "-z", "--tokenizer", type=click.Path(dir_okay=False), default=None,
    help="Tokenizer: llama2.c tokenizer.bin/tok512.bin, or a GGUF. Default: the GGUF's own, or tokenizer.bin "
    "beside the checkpoint.",
)
threads_option = click.option(
    "--threads", type=click.IntRange(min=1), default=None,
    help="Threads for the kernels and plugins (default: all cores). Results are identical for any count.",
)
attention_option = click.option(
    "--attention", "-a", default="causal", show_default=True,
    help="Attention plugin spec, e.g. causal, sliding:256, sink:4,252 (see `pyllama plugins`).",
)


@main.command()
@checkpoint_option
@tokenizer_option
@click.option("-i", "--prompt", default="", help="Prompt text (BOS and a leading space token are added, as run.c).")
@click.option("-n", "--steps", type=int, default=256, show_default=True,
              help="Positions to run, prompt included; 0 = the model's context. Clamped to what the plugin holds.")
@click.option("-t", "--temperature", type=float, default=1.0, show_default=True,
              help="0 = greedy argmax; otherwise softmax(logits / T) sampling.")
@click.option("-p", "--topp", type=float, default=0.9, show_default=True,
              help="Top-p (nucleus) sampling threshold; <= 0 or >= 1 samples from the full distribution.")
@click.option("-s", "--seed", type=int, default=0, help="RNG seed; 0 = from the clock (like run.c).")
@attention_option
@threads_option
@click.option("--ignore-eos", is_flag=True, help="Keep generating when BOS (the sequence delimiter) is sampled.")
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON object {prompt_ids, ids, text, tok_per_s, memory_bytes} instead of streaming.")
def generate(checkpoint, tokenizer, prompt, steps, temperature, topp, seed, attention, threads, ignore_eos, as_json):
    """Generate text, token for token like llama2.c's run.c with the same options.

    \b
    Example:
      pyllama generate -c stories260K.bin -z tok512.bin -i "Once upon a time" -t 0 -n 256
    Text streams to stdout; the achieved tok/s (from the end of the first forward pass, as run.c
    measures it) goes to stderr.
    """
    from pyllama.model import Model

    if topp < 0 or topp > 1:  # run.c resets an out-of-range top-p to 0.9
        topp = 0.9
    model = Model.load(checkpoint, tokenizer=tokenizer, threads=threads or 0)
    if model.tokenizer is None:
        raise click.UsageError(f"{checkpoint}: no tokenizer found beside it; pass one with -z")

    def stream(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    result = model.generate(
        prompt, steps=steps, temperature=max(temperature, 0.0), topp=topp, seed=seed or None,
        attention=attention, threads=threads, ignore_eos=ignore_eos, on_text=None if as_json else stream,
    )
    for notice in result.notices:
        click.echo(f"note: {notice}", err=True)
    if as_json:
        click.echo(json.dumps(result.to_json()))
    else:
        sys.stdout.write("\n")
        if result.steps > 1:
            click.echo(f"achieved tok/s: {result.tok_per_s:f}", err=True)


@main.command()
@tokenizer_option
@click.option("--no-bos", is_flag=True, help="Do not prepend BOS (the raw encoding).")
@click.option("--json", "as_json", is_flag=True, help='Print {"ids": [...]}.')
@click.argument("text")
def tokenize(tokenizer, no_bos, as_json, text):
    """Print the token ids of TEXT, as run.c's encode(bos=1, eos=0) gives them.

    \b
    Example:
      pyllama tokenize -z tok512.bin "Once upon a time"   ->   1 403 407 261 378
    """
    from pyllama.tokenizer import load_tokenizer

    if tokenizer is None:
        raise click.UsageError("pass the tokenizer with -z (a llama2.c tokenizer .bin or a GGUF file)")
    tok = load_tokenizer(tokenizer)
    ids = tok.encode(text, bos=False if no_bos else None, eos=False)
    if as_json:
        click.echo(json.dumps({"ids": list(ids)}))
    else:
        click.echo(" ".join(str(i) for i in ids))


@main.command()
@click.argument("checkpoint", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the facts as one JSON object.")
def info(checkpoint, as_json):
    """Print a model file's config, parameter count, size and format."""
    from pyllama.checkpoint import load_checkpoint

    config, weights = load_checkpoint(checkpoint)
    facts = {
        "file": checkpoint,
        "format": weights.format,
        "bytes": weights.file_bytes,
        "parameters": weights.parameter_count(),
        **config.describe(),
        "tensor_types": sorted({t.qtype.name for t in weights.tensors()}),
    }
    if as_json:
        click.echo(json.dumps(facts))
        return
    width = max(len(k) for k in facts)
    for key, value in facts.items():
        if isinstance(value, int) and not isinstance(value, bool) and key in ("bytes", "parameters"):
            value = f"{value:,}"
        click.echo(f"{key:<{width}}  {value}")


if __name__ == "__main__":
    main()
