"""Tokenizers: llama2.c ``tokenizer.bin`` files and the vocabularies inside GGUF files.

``tokenizer_from_records`` builds a GGUF file's tokenizer from the key/value records its parse
already holds (``pyllama.load`` hands over the model loader's, so a GGUF model is parsed once and
no file is opened for its vocabulary). ``load_tokenizer(path)`` reads a tokenizer file: its first
bytes say GGUF or llama2.c (``files.py``). Every tokenizer offers the ``Tokenizer`` interface of
``base``.
"""

from __future__ import annotations

from pyllama.tokenizer.base import StreamDecoder, Tokenizer
from pyllama.tokenizer.files import load_gguf_tokenizer, load_tokenizer, read_gguf_vocab
from pyllama.tokenizer.gguf_tokenizer import GgufTokenizer, tokenizer_from_records
from pyllama.tokenizer.gguf_vocab import GgufVocab, vocab_from_records
from pyllama.tokenizer.llama2c import Llama2cTokenizer

__all__ = [
    "GgufTokenizer",
    "GgufVocab",
    "Llama2cTokenizer",
    "StreamDecoder",
    "Tokenizer",
    "load_gguf_tokenizer",
    "load_tokenizer",
    "read_gguf_vocab",
    "tokenizer_from_records",
    "vocab_from_records",
]
