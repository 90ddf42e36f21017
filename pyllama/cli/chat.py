"""``pyllama chat``: one turn with an instruct model, its prompt rendered from the file's own template.

A command of the ``pyllama`` CLI (registered by ``cli.py``); the rendering is ``pyllama.chat``'s.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from pyllama.cli import attention_option, checkpoint_option, threads_option, tokenizer_option


@click.command()
@checkpoint_option
@tokenizer_option
@click.argument("message")
@click.option("--system", default=None, help="System message (default: none, or the template's own default).")
@click.option(
    "--template",
    "template_file",
    type=click.Path(dir_okay=False, exists=True),
    default=None,
    help="A Jinja chat template file to use instead of the model's tokenizer.chat_template.",
)
@click.option(
    "-n",
    "--steps",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Positions to run, prompt included; 0 = the model's context. An end-of-turn token stops earlier.",
)
@click.option("-t", "--temperature", type=click.FloatRange(min=0.0), default=0.0, show_default=True)
@click.option("-p", "--topp", type=click.FloatRange(0.0, 1.0), default=0.9, show_default=True)
@click.option("-s", "--seed", type=click.IntRange(min=0), default=0, help="RNG seed; 0 = from the clock.")
@attention_option
@threads_option
@click.option(
    "--print-prompt",
    is_flag=True,
    help="Print the rendered prompt and its token ids as JSON and stop (reads the vocabulary only, no weights).",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object {prompt_ids, ids, text, ...}.")
def chat(
    checkpoint, tokenizer, message, system, template_file, steps, temperature, topp, seed, attention, threads,
    print_prompt, as_json,
):  # fmt: skip
    """Answer MESSAGE with an instruct model, the prompt rendered from its tokenizer.chat_template.

    \b
    Example:
      pyllama chat -c SmolLM2-135M-Instruct.Q4_1.gguf "What is the capital of France?"
    The template is rendered as HF transformers renders it (sandboxed Jinja); generation stops at
    the end-of-turn token (<|im_end|> for ChatML).
    """
    from pyllama import chat as chat_api

    template = None if template_file is None else Path(template_file).read_text(encoding="utf-8")
    if print_prompt:
        from pyllama.tokenizer import load_tokenizer

        tok = load_tokenizer(tokenizer or checkpoint)
        text, ids = chat_api.prompt_ids(tok, message, system, template)
        click.echo(json.dumps({"prompt": text, "prompt_ids": ids}, ensure_ascii=False))
        return
    from pyllama.model import Model

    model = Model.load(checkpoint, tokenizer=tokenizer, threads=threads or 0)

    def stream(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    result = chat_api.generate(
        model,
        message,
        system,
        template,
        on_text=None if as_json else stream,
        steps=steps,
        temperature=temperature,
        topp=topp,
        seed=seed or None,
        attention=attention,
        threads=threads,
    )
    for notice in result.notices:
        click.echo(f"note: {notice}", err=True)
    if as_json:
        click.echo(json.dumps(result.to_json(), ensure_ascii=False))
    else:
        sys.stdout.write("\n")
