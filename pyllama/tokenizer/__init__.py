"""Tokenizers: llama2.c ``tokenizer.bin`` files and the vocabularies inside GGUF files.

``load_tokenizer(path)`` looks at the file's first bytes: ``GGUF`` is a GGUF file (a model or a
vocabulary-only file; see ``gguf_vocab``), anything else is read as llama2.c's format (``llama2c``,
which has no magic number of its own). Every tokenizer offers the ``Tokenizer`` interface of ``base``.
"""

from __future__ import annotations

import os

from pyllama.errors import TokenizerError
from pyllama.hub import resolve
from pyllama.tokenizer.base import StreamDecoder, Tokenizer
from pyllama.tokenizer.gguf_vocab import GgufTokenizer, load_gguf_tokenizer
from pyllama.tokenizer.llama2c import Llama2cTokenizer

__all__ = [
    "GgufTokenizer",
    "Llama2cTokenizer",
    "StreamDecoder",
    "Tokenizer",
    "load_gguf_tokenizer",
    "load_tokenizer",
]


def load_tokenizer(path: str | os.PathLike[str], vocab_size: int | None = None) -> Tokenizer:
    """Load the tokenizer in ``path``. ``vocab_size``: the model's vocabulary size, which the
    tokenizer must match exactly (None: no check, and a llama2.c file is read to its end).
    ``path`` may also be the name of a downloaded known tokenizer (``tok512``; see ``pyllama.hub``)."""
    name = os.fspath(resolve(path, kind="tokenizer"))
    if os.path.isdir(name):
        raise TokenizerError(f"{name}: is a directory; expected a tokenizer file (llama2.c tokenizer.bin or .gguf)")
    try:
        with open(name, "rb") as f:
            magic = f.read(4)
    except FileNotFoundError:
        raise TokenizerError(f"{name}: no such file") from None
    except OSError as e:
        raise TokenizerError(f"{name}: cannot read: {e.strerror or e}") from None
    if not magic:
        raise TokenizerError(f"{name}: empty file, expected a tokenizer (llama2.c tokenizer.bin or .gguf)")
    if magic == b"GGUF":
        return load_gguf_tokenizer(name, vocab_size)
    return Llama2cTokenizer.load(name, vocab_size)
