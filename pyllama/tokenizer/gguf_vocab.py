"""Tokenizers of GGUF files: the ``tokenizer.ggml.*`` metadata, read and applied as llama.cpp does.

Owns reading the vocabulary keys of a GGUF file (format: ggml's ``docs/gguf.md``; keys: gguf-py
``constants.py``, ``Keys.Tokenizer``), llama.cpp's defaults for absent keys and its per-token
attributes (``llama_vocab::impl::load`` in ``src/llama-vocab.cpp``), the matching of special tokens
in the input text (``tokenizer_st_partition``), BOS/EOS, and rendering tokens back to text
(``token_to_piece`` without special tokens). The merges themselves live in ``spm.py`` ("llama",
SentencePiece-style) and ``bpe.py`` + ``pretokenize.py`` ("gpt2", byte-level BPE).

Token texts are kept as str; bytes that are not UTF-8 (which real vocabularies do not contain) are
kept as surrogate escapes, so lookups behave like llama.cpp's byte-string lookups. A file without
tensors (a vocabulary-only GGUF, as llama.cpp's ``models/ggml-vocab-*.gguf``) is fine.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from enum import IntFlag

import numpy as np
from gguf import GGUFReader, GGUFValueType, Keys, TokenType

from pyllama.checkpoint.gguf import INTEGER_TYPES, CheckedReader
from pyllama.errors import TokenizerError
from pyllama.tokenizer.base import Tokenizer
from pyllama.tokenizer.bpe import BpeMerger, byte_decode, parse_merges
from pyllama.tokenizer.pretokenize import PreTokenizer, pre_tokenizer_info
from pyllama.tokenizer.spm import SpmMerger

SUPPORTED_MODELS = {"llama": "SentencePiece-style BPE", "gpt2": "byte-level BPE"}
SPACE_MARK = "\u2581"  # SentencePiece's "▁", which stands for a space in token texts
_C_SPACE = " \t\n\v\f\r"  # isspace() in the C locale, used when special tokens strip whitespace


class TokenAttr(IntFlag):
    """llama.cpp's ``llama_token_attr``."""

    UNDEFINED = 0
    UNKNOWN = 1 << 0
    UNUSED = 1 << 1
    NORMAL = 1 << 2
    CONTROL = 1 << 3
    USER_DEFINED = 1 << 4
    BYTE = 1 << 5
    NORMALIZED = 1 << 6
    LSTRIP = 1 << 7
    RSTRIP = 1 << 8
    SINGLE_WORD = 1 << 9


_TYPE_TO_ATTR: dict[int, TokenAttr] = {  # tokenizer.ggml.token_type -> attribute (others: UNDEFINED)
    TokenType.NORMAL: TokenAttr.NORMAL,
    TokenType.UNKNOWN: TokenAttr.UNKNOWN,
    TokenType.CONTROL: TokenAttr.CONTROL,
    TokenType.USER_DEFINED: TokenAttr.USER_DEFINED,
    TokenType.UNUSED: TokenAttr.UNUSED,
    TokenType.BYTE: TokenAttr.BYTE,
}
SPECIAL = TokenAttr.CONTROL | TokenAttr.USER_DEFINED | TokenAttr.UNKNOWN  # matched in the input text

# llama.cpp recognises some special tokens by their text; these become CONTROL tokens.
_EOG_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>", "<EOT>")
_EOT_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<EOT>", "<｜end▁of▁sentence｜>")
_BY_TEXT = {  # key: texts that stand for it when the key is absent
    Keys.Tokenizer.EOT_ID: _EOT_TEXTS,
    Keys.Tokenizer.EOM_ID: ("<|eom_id|>",),
    Keys.Tokenizer.FIM_PRE_ID: ("<|fim_prefix|>", "<fim-prefix>", "<｜fim▁begin｜>", "<PRE>"),
    Keys.Tokenizer.FIM_SUF_ID: ("<|fim_suffix|>", "<fim-suffix>", "<｜fim▁hole｜>", "<SUF>"),
    Keys.Tokenizer.FIM_MID_ID: ("<|fim_middle|>", "<fim-middle>", "<｜fim▁end｜>", "<MID>"),
    Keys.Tokenizer.FIM_PAD_ID: ("<|fim_pad|>", "<fim-pad>", "<PAD>"),
    Keys.Tokenizer.FIM_REP_ID: ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>"),
    Keys.Tokenizer.FIM_SEP_ID: ("<|file_sep|>",),
}
_DEPRECATED_FIM = {  # older spellings of three FIM keys, read after the new ones
    Keys.Tokenizer.FIM_PRE_ID: Keys.Tokenizer.PREFIX_ID,
    Keys.Tokenizer.FIM_SUF_ID: Keys.Tokenizer.SUFFIX_ID,
    Keys.Tokenizer.FIM_MID_ID: Keys.Tokenizer.MIDDLE_ID,
}


# ---- reading the metadata ----------------------------------------------------------------------
class _Metadata:
    """Typed access to a GGUFReader's key/value fields, with one-line errors naming the file."""

    def __init__(self, reader: GGUFReader, name: str) -> None:
        self.fields = reader.fields
        self.name = name

    def _field(self, key: str, kind: str):
        f = self.fields.get(key)
        if f is None:
            return None
        if not f.types:
            raise TokenizerError(f"{self.name}: {key} has no type, expected {kind}")
        return f

    def _wrong(self, key: str, kind: str, f) -> TokenizerError:
        found = (
            "[" + ", ".join(t.name for t in f.types[1:]) + "]" if f.types[0] == GGUFValueType.ARRAY else f.types[0].name
        )
        return TokenizerError(f"{self.name}: {key} is {found}, expected {kind}")

    def string(self, key: str) -> str | None:
        f = self._field(key, "a string")
        if f is None:
            return None
        if f.types != [GGUFValueType.STRING]:
            raise self._wrong(key, "a string", f)
        return bytes(f.parts[f.data[0]]).decode("utf-8", errors="surrogateescape")

    def integer(self, key: str) -> int | None:
        f = self._field(key, "an integer")
        if f is None:
            return None
        if len(f.types) != 1 or f.types[0] not in INTEGER_TYPES:
            raise self._wrong(key, "an integer", f)
        return int(f.parts[f.data[0]][0])

    def boolean(self, key: str) -> bool | None:
        f = self._field(key, "a bool")
        if f is None:
            return None
        if f.types != [GGUFValueType.BOOL]:
            raise self._wrong(key, "a bool", f)
        return bool(f.parts[f.data[0]][0])

    def strings(self, key: str) -> list[str] | None:
        f = self._field(key, "an array of strings")
        if f is None:
            return None
        if f.types[0] != GGUFValueType.ARRAY or (len(f.types) > 1 and f.types[1] != GGUFValueType.STRING):
            raise self._wrong(key, "an array of strings", f)
        parts = f.parts
        return [bytes(parts[i]).decode("utf-8", errors="surrogateescape") for i in f.data]

    def numbers(self, key: str, kind: GGUFValueType) -> np.ndarray | None:
        f = self._field(key, f"an array of {kind.name}")
        if f is None:
            return None
        if f.types[0] != GGUFValueType.ARRAY or (len(f.types) > 1 and f.types[1] != kind):
            raise self._wrong(key, f"an array of {kind.name}", f)
        if not f.data:
            return np.zeros(0)
        return np.concatenate([f.parts[i] for i in f.data])


def _open(path_or_reader: str | os.PathLike[str] | GGUFReader) -> tuple[GGUFReader, str]:
    if isinstance(path_or_reader, GGUFReader):
        return path_or_reader, os.fspath(path_or_reader.data.filename or "GGUF file")
    name = os.fspath(path_or_reader)
    if os.path.isdir(name):
        raise TokenizerError(f"{name}: is a directory, not a GGUF file")
    if not os.path.exists(name):
        raise TokenizerError(f"{name}: no such file")
    try:
        with open(name, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise TokenizerError(f"{name}: cannot read: {e.strerror or e}") from None
    if magic != b"GGUF":
        raise TokenizerError(f"{name}: not a GGUF file (starts with {magic!r}, expected b'GGUF')")
    try:  # the loader's bounds-checked reader: gguf-py's own loops for ever on a huge array length
        return CheckedReader(name, "r"), name
    except Exception as e:  # gguf-py raises ValueError, IndexError, KeyError ... on damaged files
        raise TokenizerError(f"{name}: unreadable GGUF file ({type(e).__name__}: {e}): truncated or damaged?") from e


@dataclass
class GgufVocab:
    """What a GGUF file says about its vocabulary, with llama.cpp's defaults where it says nothing."""

    name: str  # the file, for messages
    model: str  # tokenizer.ggml.model
    pre: str | None  # tokenizer.ggml.pre (gpt2 only)
    tokens: list[str]
    scores: list[float]
    attrs: list[TokenAttr]
    merges: list[str]
    special_ids: dict[str, int | None]  # Keys.Tokenizer.*_ID -> id (None: the vocabulary has none)
    add_bos: bool
    add_eos: bool
    add_space_prefix: bool
    ignore_merges: bool = False
    eog_ids: set[int] = field(default_factory=set)

    @property
    def bos_id(self) -> int | None:
        return self.special_ids[Keys.Tokenizer.BOS_ID]

    @property
    def eos_id(self) -> int | None:
        return self.special_ids[Keys.Tokenizer.EOS_ID]


def read_gguf_vocab(path_or_reader: str | os.PathLike[str] | GGUFReader) -> GgufVocab:
    """Read the ``tokenizer.ggml.*`` keys of a GGUF file as llama.cpp's ``llama_vocab::load`` does."""
    reader, name = _open(path_or_reader)
    meta = _Metadata(reader, name)
    K = Keys.Tokenizer
    supported = "; supported: " + ", ".join(f"{m} ({d})" for m, d in SUPPORTED_MODELS.items())
    model = meta.string(K.MODEL)
    if model is None:
        raise TokenizerError(f"{name}: no {K.MODEL} key: the file carries no vocabulary")
    if model not in SUPPORTED_MODELS:
        raise TokenizerError(f"{name}: unsupported tokenizer model {model!r} ({K.MODEL}){supported}")

    pre = meta.string(K.PRE)
    ids: dict[str, int | None] = dict.fromkeys([K.BOS_ID, K.EOS_ID, K.UNK_ID, *_BY_TEXT])
    merges: list[str] = []
    ignore_merges = False
    if model == "llama":
        ids.update({K.BOS_ID: 1, K.EOS_ID: 2, K.UNK_ID: 0})
        add_bos, add_space_prefix = True, True
    else:
        info = pre_tokenizer_info(pre, name)
        found = meta.strings(K.MERGES)
        if found is None:
            raise TokenizerError(f"{name}: a gpt2 (BPE) vocabulary needs {K.MERGES}, the file has none")
        merges = found
        ids.update({K.BOS_ID: None if info.no_bos else 11, K.EOS_ID: 11})  # llama.cpp's defaults
        add_bos, add_space_prefix, ignore_merges = info.add_bos, False, info.ignore_merges
    add_space_prefix = _first(meta.boolean(K.ADD_PREFIX), add_space_prefix)

    tokens = meta.strings(K.LIST)
    if not tokens:
        raise TokenizerError(f"{name}: no tokens ({K.LIST} is missing or empty)")
    n = len(tokens)
    scores_arr = meta.numbers(K.SCORES, GGUFValueType.FLOAT32)
    types_arr = meta.numbers(K.TOKEN_TYPE, GGUFValueType.INT32)
    for key, arr in ((K.SCORES, scores_arr), (K.TOKEN_TYPE, types_arr)):
        if arr is not None and len(arr) != n:
            raise TokenizerError(f"{name}: {key} has {len(arr)} entries for {n} tokens")
    scores = [0.0] * n if scores_arr is None else scores_arr.astype(np.float32).tolist()
    types = [int(TokenType.NORMAL)] * n if types_arr is None else types_arr.tolist()
    attrs = [_TYPE_TO_ATTR.get(t, TokenAttr.UNDEFINED) for t in types]

    seen: dict[str, int] = {}
    for i, text in enumerate(tokens):
        if not text:
            tokens[i] = text = f"[EMPTY_{i}]"  # llama.cpp's name for an empty token
        if text in seen:
            raise TokenizerError(
                f"{name}: tokens {seen[text]} and {i} are both {text!r}: a vocabulary needs distinct tokens"
            )
        seen[text] = i

    for key in ids:
        value = meta.integer(key)
        if key in _DEPRECATED_FIM:  # llama.cpp reads the old spelling last, so it wins
            old = meta.integer(_DEPRECATED_FIM[key])
            value = value if old is None else old
        if value is not None and 0 <= value < n:  # an id out of range keeps the default, as in llama.cpp
            ids[key] = value
    add_bos = _first(meta.boolean(K.ADD_BOS), add_bos)
    add_eos = _first(meta.boolean(K.ADD_EOS), False)

    # Special tokens llama.cpp recognises by text. Where several texts match one role, llama.cpp
    # takes whichever its hash map yields first; here the lowest id.
    for key, texts in _BY_TEXT.items():
        if ids[key] is None:
            candidates = [seen[t] for t in texts if t in seen]
            if candidates:
                chosen = ids[key] = min(candidates)
                attrs[chosen] |= TokenAttr.CONTROL
    eog = {ids[k] for k in (K.FIM_PAD_ID, K.FIM_REP_ID, K.FIM_SEP_ID, K.EOS_ID, K.EOT_ID, K.EOM_ID)}
    for text in _EOG_TEXTS:
        if text in seen:
            attrs[seen[text]] |= TokenAttr.CONTROL
            eog.add(seen[text])

    # Per-model token attributes llama.cpp sets by name.
    model_name = (meta.string(Keys.General.NAME) or "").lower()
    if pre is not None and any(s in pre for s in ("jina-v2-de", "jina-v2-es", "jina-v2-code")):
        if "<mask>" in seen:
            attrs[seen["<mask>"]] |= TokenAttr.LSTRIP
    elif "phi-3" in model_name or "phi3" in model_name:
        for i, a in enumerate(attrs):
            if a & SPECIAL:
                attrs[i] |= TokenAttr.RSTRIP
        for text, on in (("</s>", True), ("<unk>", False), ("<s>", False), ("<|endoftext|>", False)):
            if text in seen:
                i = seen[text]
                attrs[i] = attrs[i] | TokenAttr.RSTRIP if on else attrs[i] & ~TokenAttr.RSTRIP

    return GgufVocab(
        name=name,
        model=model,
        pre=pre,
        tokens=tokens,
        scores=scores,
        attrs=attrs,
        merges=merges,
        special_ids=ids,
        add_bos=add_bos,
        add_eos=add_eos,
        add_space_prefix=add_space_prefix,
        ignore_merges=ignore_merges,
        eog_ids={i for i in eog if i is not None},
    )


def _first(value: bool | None, default: bool) -> bool:
    return default if value is None else value


# ---- the tokenizer -----------------------------------------------------------------------------
class GgufTokenizer(Tokenizer):
    """A GGUF vocabulary with llama.cpp's encoder (``llama_tokenize``) and piece rendering."""

    def __init__(self, vocab: GgufVocab) -> None:
        self.vocab = vocab
        self.name = vocab.name
        self._tokens = vocab.tokens
        self._attrs = vocab.attrs
        self._token_to_id = {t: i for i, t in enumerate(vocab.tokens)}
        # Special tokens are matched longest first (llama.cpp sorts by byte length; ties by id here).
        special = [i for i, a in enumerate(vocab.attrs) if a & SPECIAL]
        self._special = sorted(special, key=lambda i: -len(vocab.tokens[i].encode("utf-8", "surrogateescape")))
        if vocab.model == "llama":
            self._spm: SpmMerger | None = SpmMerger(self._token_to_id, vocab.scores, self._byte_token)
            self._bpe: BpeMerger | None = None
            self._pre: PreTokenizer | None = None
        else:
            info = pre_tokenizer_info(vocab.pre, vocab.name)
            self._spm = None
            self._bpe = BpeMerger(self._token_to_id, parse_merges(vocab.merges), vocab.ignore_merges)
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
        return list(self._attrs)

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


def load_gguf_tokenizer(
    path_or_reader: str | os.PathLike[str] | GGUFReader, vocab_size: int | None = None
) -> GgufTokenizer:
    """The tokenizer of a GGUF file (a model or a vocabulary-only file). ``vocab_size``: the model's
    vocabulary, which must equal the number of tokens."""
    tokenizer = GgufTokenizer(read_gguf_vocab(path_or_reader))
    if vocab_size is not None and vocab_size != tokenizer.vocab_size:
        raise TokenizerError(
            f"{tokenizer.name} holds {tokenizer.vocab_size} tokens but the model has a vocabulary of {vocab_size}: "
            "pass the model's own tokenizer with -z"
        )
    return tokenizer
