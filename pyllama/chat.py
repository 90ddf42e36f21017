"""Chat prompts: a model file's own ``tokenizer.chat_template``, rendered as HF transformers does.

Owns turning messages (``[{"role": "user", "content": ...}]``) into the prompt text an instruct
model was trained on, and that text into token ids. The template is Jinja; it is rendered the way
transformers' ``apply_chat_template`` renders it (``transformers/utils/chat_template_utils.py``):

- in jinja2's ``ImmutableSandboxedEnvironment`` (a template from a downloaded file cannot reach
  Python objects or mutate the messages), with ``trim_blocks`` and ``lstrip_blocks`` on and the
  ``loopcontrols`` extension (``{% break %}``);
- with the variables ``messages``, ``add_generation_prompt``, ``bos_token``, ``eos_token`` (the
  texts of those tokens), ``tools`` and ``documents`` (None here), the ``raise_exception(msg)`` and
  ``strftime_now(fmt)`` functions, and a ``tojson`` filter that keeps non-ASCII text as it is;
- ``{% generation %} ... {% endgeneration %}`` (transformers' assistant-mask marker) renders its body.

The rendered text is tokenized with special-token parsing on, as llama.cpp tokenizes a chat prompt,
so ``<|im_start|>`` in it is the control token. A template that does not parse or render, or that
calls ``raise_exception``, is one ``InputError``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

from pyllama.errors import InputError, TokenizerError
from pyllama.tokenizer.base import Tokenizer
from pyllama.tokenizer.gguf_tokenizer import GgufTokenizer

if TYPE_CHECKING:
    from pyllama.model import Generation, Model

Message = dict[str, Any]
DEFAULT_REPLY_TOKENS = 256  # tokens a reply may take when no steps are given (an end-of-turn token stops it first)


class _TemplateRaised(Exception):
    """What ``raise_exception`` in a template raises."""


def _raise_exception(message: str) -> None:
    raise _TemplateRaised(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _tojson(value: Any, indent: int | None = None, separators=None, sort_keys: bool = False) -> str:
    # transformers' filter: jinja2's own escapes HTML characters and non-ASCII text
    return json.dumps(value, ensure_ascii=False, indent=indent, separators=separators, sort_keys=sort_keys)


class _Generation(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}``: transformers marks the assistant's text with it."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body, lineno=lineno)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols, _Generation]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


_ENV = _environment()


def messages(user: str, system: str | None = None, history: Sequence[Message] = ()) -> list[Message]:
    """The message list of one turn: an optional system message, earlier turns, the user's text."""
    out: list[Message] = [] if system is None else [{"role": "system", "content": system}]
    return out + [dict(m) for m in history] + [{"role": "user", "content": user}]


def render(
    template: str,
    chat: Sequence[Message],
    add_generation_prompt: bool = True,
    bos_token: str = "",
    eos_token: str = "",
    source: str = "chat template",
    **variables: Any,
) -> str:
    """The prompt text ``template`` makes of ``chat``. ``source`` names the template in errors."""
    try:
        compiled = _ENV.from_string(template)
    except jinja2.TemplateSyntaxError as exc:
        raise InputError(f"{source}: does not parse (line {exc.lineno}): {exc.message}") from None
    context = {"tools": None, "documents": None, **variables}
    try:
        return compiled.render(
            messages=list(chat),
            add_generation_prompt=add_generation_prompt,
            bos_token=bos_token,
            eos_token=eos_token,
            **context,
        )
    except _TemplateRaised as exc:
        raise InputError(f"{source}: the template refuses these messages: {exc}") from None
    except jinja2.TemplateError as exc:
        raise InputError(f"{source}: does not render: {type(exc).__name__}: {exc}") from None
    except (TypeError, ValueError, KeyError, IndexError, AttributeError, ZeroDivisionError) as exc:
        # a template's own bug (e.g. "a" + 1): jinja2 lets Python's error through
        raise InputError(f"{source}: does not render: {type(exc).__name__}: {exc}") from None


def template_of(tokenizer: Tokenizer) -> str | None:
    """The chat template a tokenizer's file carries (``tokenizer.chat_template``), if any."""
    vocab = getattr(tokenizer, "vocab", None)
    return getattr(vocab, "chat_template", None)


def _token_text(tokenizer: Tokenizer, token: int | None) -> str:
    tokens = getattr(tokenizer, "tokens", None)
    if token is None or tokens is None or not 0 <= token < len(tokens):
        return ""
    return tokens[token]


def prompt_text(
    tokenizer: Tokenizer,
    chat: Sequence[Message],
    template: str | None = None,
    add_generation_prompt: bool = True,
) -> str:
    """``chat`` rendered with ``template`` (default: the tokenizer file's own)."""
    source = "chat template"
    if template is None:
        template = template_of(tokenizer)
        name = getattr(tokenizer, "name", "the tokenizer")
        if template is None:
            raise InputError(
                f"{name}: the file has no tokenizer.chat_template; pass a Jinja template with --template FILE"
            )
        source = f"{name}: tokenizer.chat_template"
    return render(
        template,
        chat,
        add_generation_prompt=add_generation_prompt,
        bos_token=_token_text(tokenizer, tokenizer.bos_id),
        eos_token=_token_text(tokenizer, tokenizer.eos_id),
        source=source,
    )


def encode(tokenizer: Tokenizer, text: str) -> list[int]:
    """Token ids of a rendered prompt: control tokens parsed, BOS as the file says, but never twice
    (a template that writes ``{{ bos_token }}`` itself already has it)."""
    bos = tokenizer.bos_id
    bos_text = _token_text(tokenizer, bos)
    add_bos = None if not (bos_text and text.startswith(bos_text)) else False
    if isinstance(tokenizer, GgufTokenizer):
        return tokenizer.encode(text, bos=add_bos, eos=False, parse_special=True)
    return list(tokenizer.encode(text, bos=add_bos, eos=False))  # llama2.c: no special tokens to parse


def prompt_ids(
    tokenizer: Tokenizer, user: str, system: str | None = None, template: str | None = None
) -> tuple[str, list[int]]:
    """(prompt text, token ids) of one user message, rendered with the file's template."""
    text = prompt_text(tokenizer, messages(user, system), template)
    return text, encode(tokenizer, text)


def generate(
    model: Model,
    user: str,
    system: str | None = None,
    template: str | None = None,
    on_text: Callable[[str], None] | None = None,
    **options: Any,
) -> Generation:
    """One chat turn: render ``user`` (and ``system``) with the model's template, generate until an
    end-of-generation token (``<|im_end|>`` for ChatML), and return the reply alone in ``.text``
    (``on_text`` streams the reply only). ``options``: those of ``Model.generate``; without
    ``steps``, the reply stops after ``DEFAULT_REPLY_TOKENS`` tokens (``steps=0``: the context)."""
    tokenizer = model.tokenizer
    if tokenizer is None:
        raise TokenizerError(f"{model.path}: no tokenizer: pass one with tokenizer=... (-z on the CLI)")
    _, ids = prompt_ids(tokenizer, user, system, template)
    if options.get("steps") is None:  # a finite reply: a model that never ends its turn stops here
        # steps count positions, the prompt's included: the last prompt position samples the first token
        options["steps"] = min(len(ids) + DEFAULT_REPLY_TOKENS - 1, model.config.seq_len)
    echoed = len(tokenizer.decode_sequence(ids))  # the prompt's own text, which generate streams first
    seen = 0

    def reply_only(text: str) -> None:
        nonlocal seen
        start = max(echoed - seen, 0)
        seen += len(text)
        if on_text is not None and start < len(text):
            on_text(text[start:])

    result = model.generate(ids, on_text=reply_only, **options)
    result.text = result.text[echoed:]
    return result
