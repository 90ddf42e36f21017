"""The interface every tokenizer offers, and the streaming decoder they share.

A tokenizer turns a prompt into token ids (``encode``) and generated ids back into text. Text is
produced one token at a time, the way llama2.c's ``run.c`` prints it: each token is rendered as
bytes *given the token before it* (SentencePiece drops the leading space of the piece that follows
BOS), and the bytes go through one incremental UTF-8 decoder, so a character that a model emits as
several byte tokens is printed whole, once its last byte has arrived, and never split across calls.
"""

from __future__ import annotations

import codecs
from abc import ABC, abstractmethod
from collections.abc import Sequence

from pyllama.errors import TokenizerError


class StreamDecoder:
    """Turns token ids into text as they are generated.

    ``feed(token)`` returns the text that became complete with this token (possibly ``""``, while a
    multi-byte character is still arriving); ``flush()`` returns what is left at the end (an
    incomplete character becomes U+FFFD). Invalid UTF-8 also becomes U+FFFD.
    """

    def __init__(self, tokenizer: Tokenizer, first_token: int | None) -> None:
        self._tokenizer = tokenizer
        self._prev = first_token
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, token: int) -> str:
        data = self._tokenizer.piece_after(self._prev, token)
        self._prev = token
        return self._utf8.decode(data)

    def flush(self) -> str:
        return self._utf8.decode(b"", final=True)


class Tokenizer(ABC):
    """A vocabulary with its encoder and decoder."""

    @property
    @abstractmethod
    def vocab_size(self) -> int:
        """Number of token ids (the model's logits must have exactly this many)."""

    @property
    @abstractmethod
    def bos_id(self) -> int | None:
        """The beginning-of-sequence id, or None when the vocabulary has none."""

    @property
    @abstractmethod
    def eos_id(self) -> int | None:
        """The end-of-sequence id, or None when the vocabulary has none."""

    @property
    @abstractmethod
    def stop_ids(self) -> frozenset[int]:
        """Sampled ids that end a generation (the id itself is not emitted)."""

    @abstractmethod
    def encode(self, text: str, bos: bool | None = None, eos: bool | None = False) -> list[int]:
        """Token ids of ``text``. ``bos``/``eos``: add BOS/EOS; None means "as the file says"."""

    @abstractmethod
    def piece_bytes(self, token: int) -> bytes:
        """The bytes ``token`` stands for when printed (no context: see ``piece_after``)."""

    @abstractmethod
    def piece_after(self, prev: int | None, token: int) -> bytes:
        """The bytes printed for ``token`` when it follows ``prev`` (None: nothing before it)."""

    def decoder(self, first_token: int | None = None) -> StreamDecoder:
        """A streaming decoder; ``first_token`` is the token before the first one fed (usually BOS)."""
        return StreamDecoder(self, first_token)

    def start(self, first_token: int) -> tuple[StreamDecoder, str]:
        """A streaming decoder for a sequence that starts with ``first_token``, and that token's own
        text: ``""`` for BOS, which run.c never prints, else its piece (a vocabulary that adds no BOS,
        as SmolLM2's, starts a prompt with a real token, which is printed)."""
        if first_token == self.bos_id:
            return self.decoder(first_token), ""
        stream = self.decoder(None)
        return stream, stream.feed(first_token)

    def decode_sequence(self, ids: Sequence[int]) -> str:
        """Text of a whole sequence as ``generate`` prints it: every id, except a leading BOS."""
        if not ids:
            return ""
        stream, head = self.start(ids[0])
        return head + "".join(stream.feed(token) for token in ids[1:]) + stream.flush()

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids[1:]`` as printed after ``ids[0]``: ``ids[0]`` is context, never printed (so
        ``decode(encode(text))`` gives ``text`` back where ``encode`` adds BOS; ``decode_sequence``
        prints a first token that is not BOS)."""
        if not ids:
            return ""
        stream = self.decoder(ids[0])
        return "".join(stream.feed(token) for token in ids[1:]) + stream.flush()

    def check_token(self, token: int) -> None:
        """Raise ``TokenizerError`` unless ``token`` is an id of this vocabulary."""
        if not 0 <= token < self.vocab_size:
            raise TokenizerError(f"token id {token} is outside the vocabulary (ids 0..{self.vocab_size - 1})")
