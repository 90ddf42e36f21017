"""The vocabulary of a GGUF file: its ``tokenizer.ggml.*`` records, read as llama.cpp reads them.

Owns the vocabulary keys (format: ggml's ``docs/gguf.md``; keys: gguf-py ``constants.py``,
``Keys.Tokenizer``), llama.cpp's defaults for absent keys and its per-token attributes
(``llama_vocab::impl::load`` in ``src/llama-vocab.cpp``). Works on records a parse already made
(``pyllama.checkpoint.gguf_meta``): nothing here opens a file. The tokenizer built from a
``GgufVocab`` is ``gguf_tokenizer.GgufTokenizer``; reading a tokenizer file is ``files.py``'s.

Token texts are kept as str; bytes that are not UTF-8 (which real vocabularies do not contain) are
kept as surrogate escapes, so lookups behave like llama.cpp's byte-string lookups.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import IntFlag

import numpy as np
from gguf import GGUFValueType, Keys, TokenType

from pyllama.checkpoint.gguf import INTEGER_TYPES
from pyllama.checkpoint.gguf_meta import MetaValue
from pyllama.errors import TokenizerError
from pyllama.tokenizer.pretokenize import pre_tokenizer_info

SUPPORTED_MODELS = {"llama": "SentencePiece-style BPE", "gpt2": "byte-level BPE"}


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
_ATTR_OF_TYPE = np.array([int(_TYPE_TO_ATTR.get(t, TokenAttr.UNDEFINED)) for t in range(max(_TYPE_TO_ATTR) + 1)])

# llama.cpp recognises some special tokens by their text; these become CONTROL tokens. The lists are
# llama.cpp's at 0c1e570 (llama_vocab::impl::load), in its order.
_EOG_TEXTS = (
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>", "<end_of_turn>",
    "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>",
    "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>", "<｜end▁of▁sentence｜>", "[e~[",
)  # fmt: skip
_EOT_TEXTS = (
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>", "<EOT>", "_<EOT>",
    "[EOT]", "<｜end▁of▁sentence｜>", "<end_of_utterance>",
)  # fmt: skip
_BY_TEXT = {  # key: texts that stand for it when the key is absent
    Keys.Tokenizer.EOT_ID: _EOT_TEXTS,
    Keys.Tokenizer.EOM_ID: ("<|eom_id|>",),
    Keys.Tokenizer.FIM_PRE_ID: (
        "<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>", "<|code_prefix|>",
        "<|prefix|>",
    ),
    Keys.Tokenizer.FIM_SUF_ID: (
        "<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>", "<|code_suffix|>",
        "<|suffix|>",
    ),
    Keys.Tokenizer.FIM_MID_ID: (
        "<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>", "<|code_middle|>",
        "<|middle|>",
    ),
    Keys.Tokenizer.FIM_PAD_ID: ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    Keys.Tokenizer.FIM_REP_ID: ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    Keys.Tokenizer.FIM_SEP_ID: ("<|file_sep|>",),
}  # fmt: skip
_NORMAL_S_MARKERS = ("<|tool_response>", "<|plamo:eos|>")  # gemma4, plamo: their "</s>" is ordinary text
_ALWAYS_RENDERED = ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>")  # gpt-oss: user-defined
_DEPRECATED_FIM = {  # older spellings of three FIM keys, read after the new ones
    Keys.Tokenizer.FIM_PRE_ID: Keys.Tokenizer.PREFIX_ID,
    Keys.Tokenizer.FIM_SUF_ID: Keys.Tokenizer.SUFFIX_ID,
    Keys.Tokenizer.FIM_MID_ID: Keys.Tokenizer.MIDDLE_ID,
}


def _type_shown(record: MetaValue) -> str:
    """``[INT32]`` for an array of int32, ``UINT32`` for a scalar."""
    return f"[{record.item_type.name}]" if record.item_type is not None else record.type.name


class _Metadata:
    """Typed access to the parsed key/value records of a GGUF file, with one-line errors naming it."""

    def __init__(self, records: Mapping[str, MetaValue], name: str) -> None:
        self.records = records
        self.name = name

    def _get(self, key: str, kind: str, *types: GGUFValueType) -> MetaValue | None:
        record = self.records.get(key)
        if record is None:
            return None
        if record.type not in types:
            raise TokenizerError(f"{self.name}: {key} is {_type_shown(record)}, expected {kind}")
        return record

    def _array(self, key: str, item: GGUFValueType) -> MetaValue | None:
        record = self._get(key, f"an array of {item.name}", GGUFValueType.ARRAY)
        if record is not None and record.item_type != item and record.count:
            raise TokenizerError(f"{self.name}: {key} is {_type_shown(record)}, expected an array of {item.name}")
        return record

    def string(self, key: str) -> str | None:
        record = self._get(key, "a string", GGUFValueType.STRING)
        return None if record is None else record.text().decode("utf-8", errors="surrogateescape")

    def integer(self, key: str) -> int | None:
        record = self._get(key, "an integer", *INTEGER_TYPES)
        return None if record is None else int(record.scalar())

    def boolean(self, key: str) -> bool | None:
        record = self._get(key, "a bool", GGUFValueType.BOOL)
        return None if record is None else bool(record.scalar())

    def strings(self, key: str) -> list[str] | None:
        record = self._array(key, GGUFValueType.STRING)
        if record is None:
            return None
        return record.strings().decode("surrogateescape") if record.count else []

    def numbers(self, key: str, kind: GGUFValueType) -> np.ndarray | None:
        record = self._array(key, kind)
        if record is None:
            return None
        return np.asarray(record.numbers()) if record.count else np.zeros(0)


@dataclass
class GgufVocab:
    """What a GGUF file says about its vocabulary, with llama.cpp's defaults where it says nothing."""

    name: str  # the file, for messages
    model: str  # tokenizer.ggml.model
    pre: str | None  # tokenizer.ggml.pre (gpt2 only)
    tokens: list[str]
    scores: list[float]
    attrs: list[int]  # TokenAttr bits as plain ints (an IntFlag operation costs a microsecond)
    merges: list[str]
    special_ids: dict[str, int | None]  # Keys.Tokenizer.*_ID -> id (None: the vocabulary has none)
    add_bos: bool
    add_eos: bool
    add_space_prefix: bool
    ignore_merges: bool = False
    eog_ids: set[int] = field(default_factory=set)
    chat_template: str | None = None  # tokenizer.chat_template (Jinja), for pyllama.chat
    token_ids: dict[str, int] = field(default_factory=dict, repr=False, compare=False)  # text -> id, once built

    @property
    def bos_id(self) -> int | None:
        return self.special_ids[Keys.Tokenizer.BOS_ID]

    @property
    def eos_id(self) -> int | None:
        return self.special_ids[Keys.Tokenizer.EOS_ID]


def vocab_from_records(records: Mapping[str, MetaValue], name: str) -> GgufVocab:
    """The vocabulary in a GGUF file's parsed key/value records (``tokenizer.ggml.*``), read as
    llama.cpp's ``llama_vocab::load`` does. Opens no file: the records are the loader's (``name``:
    the file, for messages)."""
    meta = _Metadata(records, name)
    K = Keys.Tokenizer
    model, pre, ids, merges, ignore_merges, add_bos, add_space_prefix = _model_defaults(meta, name)
    tokens, scores, attrs, seen = _token_table(meta, name)
    n = len(tokens)
    for key in ids:
        value = meta.integer(key)
        if key in _DEPRECATED_FIM:  # llama.cpp reads the old spelling last, so it wins
            old = meta.integer(_DEPRECATED_FIM[key])
            value = value if old is None else old
        if value is not None and 0 <= value < n:  # an id out of range keeps the default, as in llama.cpp
            ids[key] = value
    add_bos = _first(meta.boolean(K.ADD_BOS), add_bos)
    add_eos = _first(meta.boolean(K.ADD_EOS), False)
    eog = _special_by_text(ids, attrs, seen)
    _mark_unused(tokens, attrs)
    _attrs_by_model_name(meta, pre, attrs, seen)
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
        chat_template=meta.string(K.CHAT_TEMPLATE),
        token_ids=seen,
    )


def _model_defaults(meta: _Metadata, name: str):
    """The tokenizer model and llama.cpp's defaults for it: (model, pre, special ids, merges,
    ignore_merges, add_bos, add_space_prefix)."""
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
    return model, pre, ids, merges, ignore_merges, add_bos, add_space_prefix


def _token_table(meta: _Metadata, name: str) -> tuple[list[str], list[float], list[int], dict[str, int]]:
    """Token texts, scores, attributes (from token types) and text -> id."""
    K = Keys.Tokenizer
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
    codes = np.full(n, int(TokenType.NORMAL)) if types_arr is None else types_arr.astype(np.int64)
    known = (codes >= 0) & (codes < len(_ATTR_OF_TYPE))
    attrs: list[int] = _ATTR_OF_TYPE[np.where(known, codes, 0)].tolist()
    seen = dict(zip(tokens, range(n), strict=True))  # text -> id, built in C; the loop below only when it must
    if len(seen) != n or "" in seen:
        seen = _distinct(tokens, name)
    return tokens, scores, attrs, seen


def _special_by_text(ids: dict[str, int | None], attrs: list[int], seen: dict[str, int]) -> set[int | None]:
    """Special tokens llama.cpp recognises by text (they become CONTROL); returns the end-of-generation ids.

    Where several texts match one role, llama.cpp takes whichever its hash map yields first; here
    the lowest id."""
    K = Keys.Tokenizer
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
    for text in _ALWAYS_RENDERED:
        if text in seen:
            attrs[seen[text]] = int(TokenAttr.USER_DEFINED)
    eog.discard(None)

    def ends(text: str) -> bool:
        return text in seen and seen[text] in eog

    # o200k_harmony and solar-open: there "<|end|>" ends a message, not the generation
    if ends("<|end|>") and (ends("<|call|>") or ends("<|calls|>")) and (ends("<|return|>") or ends("<|flush|>")):
        eog.discard(seen["<|end|>"])
        attrs[seen["<|end|>"]] = int(TokenAttr.USER_DEFINED)
    if ends("</s>") and any(ends(marker) for marker in _NORMAL_S_MARKERS):
        eog.discard(seen["</s>"])
        attrs[seen["</s>"]] = int(TokenAttr.NORMAL)
    return eog


def _mark_unused(tokens: list[str], attrs: list[int]) -> None:
    """Control tokens whose text says "unused" are UNUSED too (llama.cpp's auto-detection; no
    text it recognises as special says "unused", so doing this last changes nothing)."""
    for token in np.flatnonzero(np.asarray(attrs) & int(TokenAttr.CONTROL)).tolist():
        if "unused" in tokens[token]:
            attrs[token] |= int(TokenAttr.UNUSED)


def _attrs_by_model_name(meta: _Metadata, pre: str | None, attrs: list[int], seen: dict[str, int]) -> None:
    """Per-model token attributes llama.cpp sets by name."""
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


def _distinct(tokens: list[str], name: str) -> dict[str, int]:
    """Text -> id, renaming empty tokens as llama.cpp does; two equal texts are an error."""
    seen: dict[str, int] = {}
    for i, text in enumerate(tokens):
        if not text:
            tokens[i] = text = f"[EMPTY_{i}]"  # llama.cpp's name for an empty token
        if text in seen:
            raise TokenizerError(
                f"{name}: tokens {seen[text]} and {i} are both {text!r}: a vocabulary needs distinct tokens"
            )
        seen[text] = i
    return seen


def _first(value: bool | None, default: bool) -> bool:
    return default if value is None else value
