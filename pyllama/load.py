"""Opening a model: resolve a name, sniff the file once, parse it once, build its tokenizer from
what the parse holds. Every way in (``Model.load``, the CLI) comes through here, and nothing here
is visited twice:

1. resolve: a downloaded name (``stories15M``) becomes its cached path (``pyllama.hub``; the only
   hub lookup), and a downloaded model gets its downloaded tokenizer;
2. sniff: the file is opened once, and its first four bytes say GGUF or llama2.c
   (``checkpoint.read_checkpoint``, ``sniff_checkpoint``);
3. parse: the same open file is memory-mapped, and its header, metadata and tensors parsed once
   (``parse_checkpoint``);
4. vocabulary: a GGUF's tokenizer is built from the records of that same parse
   (``tokenizer_from_records``: no file is opened); otherwise the tokenizer file given, or
   ``tokenizer.bin`` beside the checkpoint.

The result, ``OpenedModel``, holds the config, the weights, the vocabulary records and the tokenizer.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pyllama import hub
from pyllama.checkpoint import ParsedCheckpoint, read_checkpoint
from pyllama.checkpoint.weights import Weights
from pyllama.config import ModelConfig
from pyllama.errors import TokenizerError
from pyllama.tokenizer import Tokenizer, load_tokenizer, tokenizer_from_records

BESIDE = "tokenizer.bin"  # llama2.c's tokenizer, looked for beside a checkpoint without -z


@dataclass
class OpenedModel:
    """One model file, opened once: what its parse holds and the tokenizer that goes with it."""

    path: Path
    config: ModelConfig
    weights: Weights
    records: Mapping | None  # a GGUF's key/value records (its vocabulary among them); None for llama2.c
    tokenizer: Tokenizer | None
    tokenizer_problem: str | None = None  # why the tokenizer beside the checkpoint was not used


def open_model(path: str | os.PathLike, tokenizer: str | os.PathLike | None = None) -> OpenedModel:
    """Resolve, sniff and parse ``path`` once; ``tokenizer``: a tokenizer file or downloaded name
    (default: the GGUF's own vocabulary, else ``tokenizer.bin`` beside the checkpoint, else none)."""
    model_path, parsed = open_checkpoint(path)
    parsed.config.check_forward(model_path.name)  # a model the forward pass cannot compute stops here
    if tokenizer is None:
        tokenizer = hub.companion_tokenizer(model_path)
    vocab_size = parsed.config.vocab_size
    problem = None
    if tokenizer is not None:
        tok: Tokenizer | None = open_tokenizer(tokenizer, vocab_size)
    elif parsed.records is not None:  # the vocabulary records of the same parse: no second read of the file
        tok = tokenizer_from_records(parsed.records, str(model_path), vocab_size)
    else:
        tok, problem = _tokenizer_beside(model_path, vocab_size)
    return OpenedModel(model_path, parsed.config, parsed.weights, parsed.records, tok, problem)


def open_checkpoint(path: str | os.PathLike) -> tuple[Path, ParsedCheckpoint]:
    """Steps 1 to 3 alone (``pyllama info``): the resolved path and its one parse."""
    model_path = hub.resolve(path)
    return model_path, read_checkpoint(model_path)


def open_tokenizer(path: str | os.PathLike, vocab_size: int | None = None) -> Tokenizer:
    """A tokenizer file or downloaded tokenizer name (``tok512``), read once."""
    return load_tokenizer(hub.resolve(path, kind="tokenizer"), vocab_size)


def _tokenizer_beside(model_path: Path, vocab_size: int) -> tuple[Tokenizer | None, str | None]:
    """``tokenizer.bin`` beside a llama2.c checkpoint, and when it does not fit, why."""
    beside = model_path.with_name(BESIDE)
    if not beside.exists():
        return None, None
    try:
        return load_tokenizer(beside, vocab_size=vocab_size), None
    except TokenizerError as exc:
        return None, f"{model_path}: found {beside.name} beside it, but it does not fit: {exc}"
