"""``pyllama chat``: one turn with an instruct model, its prompt rendered from the file's own template.

A command of the ``pyllama`` CLI (registered by ``pyllama.cli``); the rendering is ``pyllama.chat``'s.
Its sampling options are generate's (``shared.py``), with chat's own defaults (greedy, a reply of at
most 256 tokens).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from pyllama.cli.shared import (
    attention_option,
    checkpoint_option,
    seed_option,
    steps_option,
    stream,
    temperature_option,
    threads_option,
    tokenizer_option,
    topp_option,
)
from pyllama.errors import InputError
from pyllama.load import open_tokenizer
from pyllama.model import Model


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
@steps_option(
    None,
    "Positions to run, prompt included; 0 = the model's context. Default: the prompt and 256 new tokens. "
    "An end-of-turn token stops earlier.",
)
@temperature_option(0.0)
@topp_option
@seed_option
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
    from pyllama import chat as chat_api  # lazy: jinja2 only when this command runs

    template = None if template_file is None else _read_template(Path(template_file))
    if print_prompt:
        tok = open_tokenizer(tokenizer or checkpoint)
        text, ids = chat_api.prompt_ids(tok, message, system, template)
        click.echo(json.dumps({"prompt": text, "prompt_ids": ids}, ensure_ascii=False))
        return
    model = Model.load(checkpoint, tokenizer=tokenizer, threads=threads or 0)
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


def _read_template(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start}): pass a Jinja template") from None
