"""``pyllama generate`` (text, token for token like llama2.c's run.c with the same options) and
``pyllama tokenize`` (the ids run.c's encode gives).
"""

from __future__ import annotations

import json
import sys

import click

from pyllama.cli.shared import (
    attention_option,
    checkpoint_option,
    compress_at_option,
    require_tokenizer,
    seed_option,
    steps_option,
    stream,
    temperature_option,
    threads_option,
    tokenizer_option,
    topp_option,
)
from pyllama.load import open_tokenizer
from pyllama.model import Model

__all__ = ["generate", "tokenize"]


@click.command()
@checkpoint_option
@tokenizer_option
@click.option("-i", "--prompt", default="", help="Prompt text (BOS and a leading space token are added, as run.c).")
@steps_option(256, "Positions to run, prompt included; 0 = the model's context. Clamped to what the plugin holds.")
@temperature_option(1.0)
@topp_option
@seed_option
@attention_option
@compress_at_option("the prompt")
@threads_option
@click.option(
    "--ignore-eos",
    is_flag=True,
    help="Keep generating when an end token is sampled (BOS for llama2.c models, as run.c; "
    "the vocabulary's end-of-generation tokens for GGUF, as llama.cpp).",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print one JSON object {prompt_ids, ids, text, tok_per_s, prompt_tok_per_s, memory_bytes} "
    "instead of streaming.",
)
def generate(
    checkpoint, tokenizer, prompt, steps, temperature, topp, seed, attention, compress_at, threads, ignore_eos, as_json
):
    """Generate text, token for token like llama2.c's run.c with the same options.

    \b
    Example:
      pyllama generate -c stories260K.bin -z tok512.bin -i "Once upon a time" -t 0 -n 256
    Text streams to stdout; the achieved tok/s (from the end of the first forward pass, as run.c
    measures it) goes to stderr.
    """
    model = Model.load(checkpoint, tokenizer=tokenizer, threads=threads or 0)
    require_tokenizer(model, checkpoint)
    result = model.generate(
        prompt,
        steps=steps,
        temperature=temperature,
        topp=topp,
        seed=seed or None,
        attention=attention,
        compress_at=compress_at,
        threads=threads,
        ignore_eos=ignore_eos,
        on_text=None if as_json else stream,
    )
    for notice in result.notices:
        click.echo(f"note: {notice}", err=True)
    if as_json:
        click.echo(json.dumps(result.to_json()))
    else:
        sys.stdout.write("\n")
        if result.steps > 1:
            click.echo(f"achieved tok/s: {result.tok_per_s:f}", err=True)
        if len(result.prompt_ids) > 1:
            click.echo(f"prompt tok/s: {result.prompt_tok_per_s:f}", err=True)


@click.command()
@click.option(
    "-z",
    "--tokenizer",
    type=click.Path(dir_okay=False),
    required=True,
    help="Tokenizer: llama2.c tokenizer.bin/tok512.bin, or a GGUF file (its vocabulary).",
)
@click.option("--no-bos", is_flag=True, help="Do not prepend BOS (the raw encoding).")
@click.option("--json", "as_json", is_flag=True, help='Print {"ids": [...]}.')
@click.argument("text")
def tokenize(tokenizer, no_bos, as_json, text):
    """Print the token ids of TEXT, as run.c's encode(bos=1, eos=0) gives them.

    \b
    Example:
      pyllama tokenize -z tok512.bin "Once upon a time"   ->   1 403 407 261 378
    """
    tok = open_tokenizer(tokenizer)
    ids = tok.encode(text, bos=False if no_bos else None, eos=False)
    if as_json:
        click.echo(json.dumps({"ids": list(ids)}))
    else:
        click.echo(" ".join(str(i) for i in ids))
