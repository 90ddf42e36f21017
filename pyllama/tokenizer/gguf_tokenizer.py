"""The tokenizer of a GGUF vocabulary: llama.cpp's ``llama_tokenize`` and ``token_to_piece``.

Built from a ``GgufVocab`` (``gguf_vocab.py``, itself read from a parse's records): constructing one
opens no file. Owns the matching of special tokens in the input text (``tokenizer_st_partition``),
BOS/EOS and rendering tokens back to text (``token_to_piece`` without special tokens). The merges
themselves live in ``spm.py`` ("llama", SentencePiece-style) and ``bpe.py`` + ``pretokenize.py``
("gpt2", byte-level BPE).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from pyllama.checkpoint.gguf_meta import MetaValue
from pyllama.errors import TokenizerError
from pyllama.tokenizer.base import Tokenizer
from pyllama.tokenizer.bpe import BpeMerger, byte_decode, merge_ranks
from pyllama.tokenizer.gguf_vocab import SPECIAL, GgufVocab, TokenAttr, vocab_from_records
from pyllama.tokenizer.pretokenize import PreTokenizer, pre_tokenizer_info
from pyllama.tokenizer.spm import SpmMerger

SPACE_MARK = "\u2581"  # SentencePiece's "▁", which stands for a space in token texts
_C_SPACE = " \t\n\v\f\r"  # isspace() in the C locale, used when special tokens strip whitespace


class GgufTokenizer(Tokenizer):
    """A GGUF vocabulary with llama.cpp's encoder (``llama_tokenize``) and piece rendering."""

    def __init__(self, vocab: GgufVocab) -> None:
        self.vocab = vocab
        self.name = vocab.name
        self._tokens = vocab.tokens
        self._attrs = vocab.attrs
        ids = vocab.token_ids
        if len(ids) != len(vocab.tokens):  # a vocabulary made by hand (or replaced) without its table
            ids = dict(zip(vocab.tokens, range(len(vocab.tokens)), strict=True))
        self._token_to_id = ids
        # Special tokens are matched longest first (llama.cpp sorts by byte length; ties by id here).
        special = np.flatnonzero(np.asarray(vocab.attrs, dtype=np.int64) & int(SPECIAL)).tolist()
        self._special = sorted(special, key=lambda i: -len(vocab.tokens[i].encode("utf-8", "surrogateescape")))
        if vocab.model == "llama":
            self._spm: SpmMerger | None = SpmMerger(self._token_to_id, vocab.scores, self._byte_token)
            self._bpe: BpeMerger | None = None
            self._pre: PreTokenizer | None = None
        else:
            info = pre_tokenizer_info(vocab.pre, vocab.name)
            self._spm = None
            self._bpe = BpeMerger(self._token_to_id, merge_ranks(vocab.merges), vocab.ignore_merges)
            self._pre = PreTokenizer.named(info.expressions)
        self._pieces: list[bytes | None] = [None] * len(vocab.tokens)

    def __repr__(self) -> str:
        return (
            f"GgufTokenizer({self.name!r}, model={self.model!r}, pre={self.vocab.pre!r}, vocab_size={self.vocab_size})"
        )

    # ---- the vocabulary ------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return len(self._tokens)

    @property
    def bos_id(self) -> int | None:
        return self.vocab.bos_id

    @property
    def eos_id(self) -> int | None:
        return self.vocab.eos_id

    @property
    def eog_ids(self) -> frozenset[int]:
        """Every token that ends a generation in llama.cpp (EOS, EOT, ``<|im_end|>`` ...)."""
        return frozenset(self.vocab.eog_ids)

    @property
    def stop_ids(self) -> frozenset[int]:
        # llama.cpp ends a generation on any end-of-generation token, and on nothing else
        return self.eog_ids

    @property
    def model(self) -> str:
        """``tokenizer.ggml.model``: "llama" or "gpt2"."""
        return self.vocab.model

    @property
    def tokens(self) -> list[str]:
        """Every token's text as stored (``▁`` for spaces in "llama", GPT-2 byte characters in "gpt2")."""
        return list(self._tokens)

    @property
    def scores(self) -> list[float]:
        return list(self.vocab.scores)

    @property
    def attrs(self) -> list[TokenAttr]:
        return [TokenAttr(a) for a in self._attrs]

    # ---- encoding ------------------------------------------------------------------------------
    def encode(
        self, text: str, bos: bool | None = None, eos: bool | None = False, *, parse_special: bool = True
    ) -> list[int]:
        """Token ids of ``text`` as ``llama_tokenize`` gives them.

        ``bos``/``eos`` None: as the file says (``add_bos_token``/``add_eos_token``, else llama.cpp's
        default for the vocabulary). ``parse_special``: control tokens written in the text (e.g.
        ``<|im_start|>``) become those tokens; user-defined tokens always do, as in llama.cpp.
        """
        out: list[int] = []
        if self.vocab.add_bos if bos is None else bos:
            out.append(self._required(self.bos_id, "BOS"))
        fragments = self._partition(text, parse_special) if text else []
        if self._spm is not None:
            prefix = " " if self.vocab.add_space_prefix else ""
            prev_special = True  # the dummy prefix goes at the start and after every special token
            for fragment in fragments:
                if isinstance(fragment, int):
                    out.append(fragment)
                    prev_special = True
                else:
                    piece = (prefix if prev_special else "") + fragment
                    out += self._spm.ids(piece.replace(" ", SPACE_MARK))
                    prev_special = False
        else:
            assert self._bpe is not None and self._pre is not None
            for fragment in fragments:
                if isinstance(fragment, int):
                    out.append(fragment)
                else:
                    for word in self._pre.split(fragment):
                        out += self._bpe.word_ids(word)
        if self.vocab.add_eos if eos is None else eos:
            out.append(self._required(self.eos_id, "EOS"))
        return out

    def _required(self, token: int | None, what: str) -> int:
        if token is None:
            raise TokenizerError(f"{self.name}: the vocabulary has no {what} token")
        return token

    def _partition(self, text: str, parse_special: bool) -> list[str | int]:
        """Split ``text`` at special tokens, longest first (llama.cpp's ``tokenizer_st_partition``)."""
        fragments: list[str | int] = [text]
        for token in self._special:
            attr = self._attrs[token]
            if not parse_special and attr & (TokenAttr.CONTROL | TokenAttr.UNKNOWN):
                continue
            needle = self._tokens[token]
            out: list[str | int] = []
            for fragment in fragments:
                if isinstance(fragment, int) or needle not in fragment:
                    out.append(fragment)
                    continue
                pieces = fragment.split(needle)
                for k, piece in enumerate(pieces):
                    if k > 0 and attr & TokenAttr.RSTRIP:
                        piece = piece.lstrip(_C_SPACE)
                    if k < len(pieces) - 1 and attr & TokenAttr.LSTRIP:
                        piece = piece.rstrip(_C_SPACE)
                    if piece:
                        out.append(piece)
                    if k < len(pieces) - 1:
                        out.append(token)
            fragments = out
        return fragments

    def _byte_token(self, byte: int) -> int:
        """The token of one byte in a "llama" vocabulary: ``<0xXX>``, else the byte itself."""
        token = self._token_to_id.get(f"<0x{byte:02X}>")
        if token is None:
            token = self._token_to_id.get(chr(byte) if byte < 0x80 else chr(0xDC00 + byte))
        if token is None:
            raise TokenizerError(f"{self.name}: no token for byte 0x{byte:02X} (no <0x{byte:02X}> piece)")
        return token

    # ---- decoding ------------------------------------------------------------------------------
    def piece_bytes(self, token: int) -> bytes:
        """What llama.cpp's ``token_to_piece(token, special=false)`` writes: nothing for control and
        unknown tokens, the text of user-defined ones, ``▁`` as space (llama) or GPT-2 characters
        as bytes (gpt2), and the byte of a byte token."""
        self.check_token(token)
        piece = self._pieces[token]
        if piece is None:
            piece = self._pieces[token] = self._render(token)
        return piece

    def _render(self, token: int) -> bytes:
        attr, text = self._attrs[token], self._tokens[token]
        raw = text.encode("utf-8", errors="surrogateescape")
        if attr & (TokenAttr.UNKNOWN | TokenAttr.CONTROL):
            return b""
        if attr & TokenAttr.USER_DEFINED:
            return raw
        if attr & TokenAttr.NORMAL:
            if self.vocab.model == "llama":
                return text.replace(SPACE_MARK, " ").encode("utf-8", errors="surrogateescape")
            return byte_decode(text)
        if attr & TokenAttr.BYTE and self.vocab.model == "llama":
            return bytes([_strtol_hex(raw[3:5]) & 0xFF])
        return b""

    def piece_after(self, prev: int | None, token: int) -> bytes:
        """``piece_bytes``, minus the dummy-prefix space when ``token`` follows BOS (SentencePiece)."""
        piece = self.piece_bytes(token)
        if self.vocab.add_space_prefix and prev is not None and prev == self.bos_id and piece[:1] == b" ":
            return piece[1:]
        return piece


def _strtol_hex(digits: bytes) -> int:
    """``strtol(digits, NULL, 16)`` for the two characters llama.cpp passes (0 if none parse)."""
    s = digits.decode("latin-1").lstrip(_C_SPACE)
    sign = -1 if s[:1] == "-" else 1
    s = s[1:] if s[:1] in ("-", "+") else s
    end = 0
    while end < len(s) and s[end] in "0123456789abcdefABCDEF":
        end += 1
    return sign * int(s[:end], 16) if end else 0


def tokenizer_from_records(records: Mapping[str, MetaValue], name: str, vocab_size: int | None = None) -> GgufTokenizer:
    """The tokenizer of a parsed GGUF file's records (no file is opened). ``vocab_size``: the model's
    vocabulary, which must equal the number of tokens."""
    tokenizer = GgufTokenizer(vocab_from_records(records, name))
    if vocab_size is not None and vocab_size != tokenizer.vocab_size:
        raise TokenizerError(
            f"{tokenizer.name} holds {tokenizer.vocab_size} tokens but the model has a vocabulary of {vocab_size}: "
            "pass the model's own tokenizer with -z"
        )
    return tokenizer
