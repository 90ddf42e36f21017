"""Reading tokenizer files: the only module of ``pyllama.tokenizer`` that opens one.

``load_tokenizer(path)`` reads the file's first bytes once: ``GGUF`` is a GGUF file (a model or a
vocabulary-only file), whose header and key/value metadata are parsed once (``gguf_meta``; no
tensor infos) and handed to ``tokenizer_from_records``; anything else is read as llama2.c's format
(``llama2c``, which has no magic number of its own), from the same open file. Paths only:
resolving downloaded names is ``pyllama.load``'s job.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import BinaryIO, Protocol

import numpy as np

from pyllama.checkpoint.gguf_meta import MalformedGGUF, MetaValue, read_metadata_file
from pyllama.errors import TokenizerError
from pyllama.tokenizer.base import Tokenizer
from pyllama.tokenizer.gguf_tokenizer import GgufTokenizer, tokenizer_from_records
from pyllama.tokenizer.gguf_vocab import GgufVocab, vocab_from_records
from pyllama.tokenizer.llama2c import Llama2cTokenizer

GGUF_MAGIC = b"GGUF"


class VocabSource(Protocol):
    """A parsed GGUF file: its metadata records and its map (``open_gguf``'s or ``read_metadata_file``'s result)."""

    metadata: Mapping[str, MetaValue]
    data: np.ndarray


def load_tokenizer(path: str | os.PathLike[str], vocab_size: int | None = None) -> Tokenizer:
    """Load the tokenizer in ``path``. ``vocab_size``: the model's vocabulary size, which the
    tokenizer must match exactly (None: no check, and a llama2.c file is read to its end)."""
    name = os.fspath(path)
    if os.path.isdir(name):
        raise TokenizerError(f"{name}: is a directory; expected a tokenizer file (llama2.c tokenizer.bin or .gguf)")
    try:
        with open(name, "rb") as f:  # one open: the sniff, then the map or the read of the same file
            magic = f.read(4)
            if magic == GGUF_MAGIC:
                records = _gguf_records(name, f)
            else:
                data = magic + f.read()
    except FileNotFoundError:
        raise TokenizerError(f"{name}: no such file") from None
    except OSError as e:
        raise TokenizerError(f"{name}: cannot read: {e.strerror or e}") from None
    if not magic:
        raise TokenizerError(f"{name}: empty file, expected a tokenizer (llama2.c tokenizer.bin or .gguf)")
    if magic == GGUF_MAGIC:
        return tokenizer_from_records(records, name, vocab_size)
    return Llama2cTokenizer.from_bytes(data, name, vocab_size)


def _gguf_records(name: str, file: BinaryIO | None = None) -> Mapping[str, MetaValue]:
    """The key/value records of a GGUF file known to start with its magic: one map, one parse."""
    try:  # the header and metadata only: a vocabulary needs no tensor infos
        return read_metadata_file(name, file).metadata
    except MalformedGGUF as e:
        raise TokenizerError(f"{name}: unreadable GGUF file ({e}): truncated or damaged?") from None


def _records(source: str | os.PathLike[str] | VocabSource) -> tuple[Mapping[str, MetaValue], str]:
    """The metadata records of a parsed file (as the loader left them), or of a GGUF file read here."""
    if not isinstance(source, (str, os.PathLike)):
        metadata = getattr(source, "metadata", None)
        if not isinstance(metadata, Mapping):
            raise TokenizerError(
                f"expected a GGUF path or a file parsed by pyllama (open_gguf), not a {type(source).__name__}"
            )
        return metadata, os.fspath(getattr(source.data, "filename", None) or "GGUF file")
    name = os.fspath(source)
    if os.path.isdir(name):
        raise TokenizerError(f"{name}: is a directory, not a GGUF file")
    if not os.path.exists(name):
        raise TokenizerError(f"{name}: no such file")
    try:
        with open(name, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise TokenizerError(f"{name}: cannot read: {e.strerror or e}") from None
    if magic != GGUF_MAGIC:
        raise TokenizerError(f"{name}: not a GGUF file (starts with {magic!r}, expected b'GGUF')")
    return _gguf_records(name), name


def read_gguf_vocab(source: str | os.PathLike[str] | VocabSource) -> GgufVocab:
    """The vocabulary of a GGUF file, or of a file the loader already parsed (``open_gguf``; the
    ``source`` of a GGUF model's ``Weights``), whose records are used without opening anything."""
    return vocab_from_records(*_records(source))


def load_gguf_tokenizer(source: str | os.PathLike[str] | VocabSource, vocab_size: int | None = None) -> GgufTokenizer:
    """The tokenizer of a GGUF file (a model or a vocabulary-only file), or of a file the loader
    already parsed (no file is opened then). ``vocab_size``: the model's vocabulary, which must
    equal the number of tokens."""
    records, name = _records(source)
    return tokenizer_from_records(records, name, vocab_size)
