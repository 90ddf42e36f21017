"""Measuring a model: ``pyllama bench`` (decode and prompt tok/s, bytes per token) and ``pyllama
trace`` (every intermediate tensor, beside llama.cpp's).
"""

from __future__ import annotations

import json

import click

from pyllama.bench import run_bench
from pyllama.cli.shared import attention_option, checkpoint_option, threads_option, tokenizer_option
from pyllama.trace import format_rows, trace_file

__all__ = ["bench", "trace"]


@click.command()
@click.argument("model", type=click.Path(dir_okay=False))
@tokenizer_option
@click.option("-i", "--prompt", required=True, help="Prompt text (BOS first, as llama.cpp tokenises it).")
@click.option(
    "--compare",
    "log",
    type=click.Path(dir_okay=False),
    default=None,
    help="A llama-eval-callback log of the same prompt: show llama.cpp's sums and the relative difference.",
)
@threads_option
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object {prompt_ids, tensors: [...]}.")
def trace(model, tokenizer, prompt, log, threads, as_json):
    """Sum every intermediate tensor of PROMPT under llama.cpp's names (inp_embd, Qcur-0, ... result_output).

    \b
    Example:
      llama-eval-callback -m stories260K-f32.gguf -p "Hello world" -n 1 > evalcb.log 2>&1
      pyllama trace stories260K-f32.gguf -i "Hello world" --compare evalcb.log
    """
    ids, rows = trace_file(model, prompt, tokenizer, log, threads)
    if as_json:
        click.echo(json.dumps({"prompt_ids": ids, "tensors": [r.to_json() for r in rows]}))
        return
    click.echo(f"prompt ids: {' '.join(map(str, ids))}")
    click.echo(format_rows(rows))


@click.command()
@checkpoint_option
@tokenizer_option
@click.option(
    "-n",
    "--steps",
    type=click.IntRange(min=2),
    default=256,
    show_default=True,
    help="Positions per run, prompt included (clamped to what the attention plugin holds).",
)
@threads_option
@attention_option
@click.option("--repeats", type=click.IntRange(min=1), default=3, show_default=True, help="Runs; tok/s is the best.")
@click.option(
    "--prompt-tokens",
    type=click.IntRange(min=1),
    default=512,
    show_default=True,
    help="Positions of the prompt-processing runs (llama-bench -p; clamped to what the plugin holds).",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of the table.")
def bench(checkpoint, tokenizer, steps, threads, attention, repeats, prompt_tokens, as_json):
    """Decode tok/s, load time, bytes read per token and the bandwidth they imply.

    \b
    Greedy, end tokens ignored, tok/s measured as `generate` measures it (best of --repeats).
    bytes/token: every layer matrix and the classifier as stored (quantised sizes included),
    which each decode step reads once; GB/s = bytes/token x tok/s.
    Example:
      pyllama bench -c stories260K.bin -z tok512.bin --steps 256
    """
    result = run_bench(
        checkpoint,
        tokenizer,
        steps=steps,
        threads=threads or 0,
        attention=attention,
        repeats=repeats,
        prompt_tokens=prompt_tokens,
    )
    for notice in result.notices:
        click.echo(f"note: {notice}", err=True)
    if as_json:
        click.echo(json.dumps(result.to_json()))
        return
    facts = {
        "checkpoint": result.checkpoint,
        "attention": result.attention,
        "threads": result.threads,
        "steps": f"{result.steps} (best of {result.repeats})",
        "decode tok/s": f"{result.tok_per_s:,.1f}",
        "prompt tok/s": f"{result.prompt_tok_per_s:,.1f} ({result.prompt_tokens} positions)",
        "load ms": f"{result.load_ms:,.2f}",
        "weights bytes": f"{result.weights_bytes:,}",
        "bytes/token": f"{result.bytes_per_token:,}",
        "effective GB/s": f"{result.gb_per_s:.2f}",
        "attention memory": f"{result.memory_bytes:,} B",
    }
    width = max(len(k) for k in facts)
    for key, value in facts.items():
        click.echo(f"{key:<{width}}  {value}")
