"""Pre-tokenizers of byte-level BPE vocabularies: text -> words, exactly as llama.cpp splits it.

Owns the table from a GGUF file's ``tokenizer.ggml.pre`` name to its split expressions (those of
llama.cpp's ``llm_tokenizer_bpe``, ``src/llama-vocab.cpp``, which come from each model's
``tokenizer.json``) and the splitting itself (llama.cpp's ``unicode_regex_split``, ``src/unicode.cpp``):

- The expressions run one after another; each one splits every word the previous ones produced.
  Text that no match covers stays a word of its own: nothing is ever dropped.
- llama.cpp runs them with C++ ``std::regex``, which has no ``\\p{..}`` classes. It therefore maps
  every non-ASCII character to one stand-in character per Unicode category (letter, number,
  punctuation, mark, symbol; whitespace to ``\\v``; anything else to a sixth one) and rewrites
  ``\\p{L}`` as "the letter stand-in or A-Za-z", and so on. This module does the same, so its
  results match llama.cpp's even where plain Unicode semantics would differ: llama.cpp's ``\\p{S}``
  leaves out ``~``, and in expressions without ``\\p{..}`` (deepseek-llm's) non-ASCII whitespace is
  turned into ``\\v`` before matching, so U+3000 never matches a literal range that contains it.
  ``\\s`` is ECMAScript's ASCII whitespace (``re.ASCII``).
- llama.cpp hand-codes the GPT-2 and Llama 3 expressions instead of using std::regex; those
  functions give the same words as the expressions, which is what is used here.

Unicode categories come from the ``regex`` package (``\\p{L}`` etc.): Python's ``re`` has no
``\\p{..}``, and the standard ``unicodedata`` follows whichever Unicode version the running Python
ships (14.0 in 3.11). llama.cpp's tables are Unicode 15.1, so characters assigned after 15.1 are
the only ones whose category can differ here (llama.cpp treats them as unassigned).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import regex

from pyllama.errors import TokenizerError

# The stand-ins llama.cpp puts in place of non-ASCII characters (unicode.cpp, k_ucat_cpt).
_WHITESPACE_STANDIN = "\x0b"
_OTHER_STANDIN = "\xd0"
_CATEGORIES = {  # \p{X}: (its stand-in, the ASCII characters of that class in llama.cpp's k_ucat_map)
    "N": ("\xd1", "0-9"),
    "L": ("\xd2", "A-Za-z"),
    "P": ("\xd3", "!-#%-*,-/:-;?-@\\[-\\]_\\{\\}"),
    "M": ("\xd4", ""),
    "S": ("\xd5", "\\$\\+<->\\^`\\|"),  # no "~": llama.cpp's table leaves it out
}
# One group per class, in _CATEGORIES' order. llama.cpp's whitespace set is Unicode's White_Space
# property, which is what regex's \s matches.
_CLASSIFY = regex.compile(r"(\s)|(\p{N})|(\p{L})|(\p{P})|(\p{M})|(\p{S})")
_STANDINS = [_OTHER_STANDIN, _WHITESPACE_STANDIN, *(standin for standin, _ in _CATEGORIES.values())]


class _Collapser:
    """Replaces each non-ASCII character by its category stand-in (cached per character)."""

    def __init__(self, whitespace_only: bool) -> None:
        self._whitespace_only = whitespace_only
        self._cache: dict[str, str] = {}

    def __call__(self, text: str) -> str:
        if text.isascii():
            return text
        cache = self._cache
        out = []
        for ch in text:
            if ch < "\x80":
                out.append(ch)
                continue
            standin = cache.get(ch)
            if standin is None:
                standin = cache[ch] = self._standin(ch)
            out.append(standin)
        return "".join(out)

    def _standin(self, ch: str) -> str:
        m = _CLASSIFY.match(ch)
        if self._whitespace_only:
            return _WHITESPACE_STANDIN if m is not None and m.lastindex == 1 else ch
        return _STANDINS[m.lastindex or 0] if m is not None else _OTHER_STANDIN


def _translate(expr: str) -> str:
    """Rewrite ``\\p{X}`` for the collapsed text, as llama.cpp does: inside ``[...]`` it becomes the
    stand-in plus the ASCII members, outside it becomes a bracket of those."""
    out = []
    inside = False
    i = 0
    while i < len(expr):
        c = expr[i]
        if c == "[" and (i == 0 or expr[i - 1] != "\\"):
            inside = True
        elif c == "]" and inside and expr[i - 1] != "\\":
            inside = False
        elif expr.startswith("\\p{", i) and i + 4 < len(expr) and expr[i + 4] == "}" and expr[i + 3] in _CATEGORIES:
            standin, ascii_members = _CATEGORIES[expr[i + 3]]
            out.append(standin + ascii_members if inside else "[" + standin + ascii_members + "]")
            i += 5
            continue
        out.append(c)
        i += 1
    return "".join(out)


@dataclass(frozen=True)
class _Expression:
    pattern: re.Pattern[str]
    collapse: _Collapser

    @classmethod
    def compile(cls, expr: str) -> _Expression:
        uses_categories = any(f"\\p{{{k}}}" in expr for k in _CATEGORIES)
        source = _translate(expr) if uses_categories else expr
        return cls(re.compile(source, re.ASCII), _Collapser(whitespace_only=not uses_categories))


# The split expressions, in llama.cpp's spelling (ECMAScript). Their names follow llama.cpp's
# LLAMA_VOCAB_PRE_TYPE_* groups.
GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3 = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# deepseek-llm's letters, written as code points (several are canonically equivalent to others,
# which an editor could silently normalise away).
_DEEPSEEK_LLM_LETTERS = (
    r"A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af\u0370-\u0373"
    r"\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481"
    r"\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b"
    r"\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b"
    r"\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb"
    r"\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128"
    r"\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4"
    r"\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf"
    r"\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3"
    r"\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943"
)
_CJK = r"[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"
_STARCODER = [r"\p{N}", GPT2]
_PORO = [r" ?[^(\s|.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c)]+"]

PRE_TOKENIZERS: dict[str, list[str]] = {
    "default": [r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"],
    "gpt2": [GPT2],
    "llama3": [_LLAMA3],
    "qwen2": [_QWEN2],
    "deepseek-llm": [
        r"[\r\n]",
        r"\s?[" + _DEEPSEEK_LLM_LETTERS + "]+",
        r"\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+",
        r"\s+\Z",  # llama.cpp's "\s+$": ECMAScript's $ is the end of the input, Python's \Z
        _CJK,
        r"\p{N}+",
    ],
    "deepseek-coder": [r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _CJK, r"\p{N}"],
    "deepseek-v3": [
        r"\p{N}{1,3}",
        r"[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
        r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
        r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    ],
    "falcon": [r"[\p{P}\$\+<=>\^~\|`]+", GPT2, r"[0-9][0-9][0-9]"],
    "starcoder": _STARCODER,
    "poro": _PORO,
    "viking": [*_PORO, r"\p{N}"],
    "tekken": [
        r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+"
        r"((?=[\p{L}])([^A-Z]))*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
    ],
}


@dataclass(frozen=True)
class PreTokenizerInfo:
    """What a ``tokenizer.ggml.pre`` name means to llama.cpp (``llama_vocab::impl::load``)."""

    expressions: str  # key of PRE_TOKENIZERS
    ignore_merges: bool = False  # a word that is a token as a whole is not merged piecewise
    add_bos: bool = False  # llama.cpp's default when the file has no add_bos_token key
    no_bos: bool = False  # llama.cpp clears the default BOS id (chatglm)


# Every name llama.cpp accepts for a BPE vocabulary, except chameleon (image tokens).
PRE_NAMES: dict[str, PreTokenizerInfo] = {
    "default": PreTokenizerInfo("default"),
    "llama3": PreTokenizerInfo("llama3", ignore_merges=True, add_bos=True),
    "llama-v3": PreTokenizerInfo("llama3", ignore_merges=True, add_bos=True),
    "llama-bpe": PreTokenizerInfo("llama3", ignore_merges=True, add_bos=True),
    "falcon3": PreTokenizerInfo("llama3", ignore_merges=True, add_bos=True),
    "dbrx": PreTokenizerInfo("llama3"),
    "smaug-bpe": PreTokenizerInfo("llama3"),
    "chatglm-bpe": PreTokenizerInfo("llama3", no_bos=True),
    "deepseek-llm": PreTokenizerInfo("deepseek-llm"),
    "deepseek-coder": PreTokenizerInfo("deepseek-coder"),
    "deepseek-v3": PreTokenizerInfo("deepseek-v3"),
    "falcon": PreTokenizerInfo("falcon"),
    "mpt": PreTokenizerInfo("gpt2"),
    "olmo": PreTokenizerInfo("gpt2"),
    "jais": PreTokenizerInfo("gpt2"),
    "starcoder": PreTokenizerInfo("starcoder"),
    "refact": PreTokenizerInfo("starcoder"),
    "command-r": PreTokenizerInfo("starcoder"),
    "smollm": PreTokenizerInfo("starcoder"),
    "codeshell": PreTokenizerInfo("starcoder"),
    "exaone": PreTokenizerInfo("starcoder"),
    "minerva-7b": PreTokenizerInfo("starcoder"),
    "qwen2": PreTokenizerInfo("qwen2"),
    "deepseek-r1-qwen": PreTokenizerInfo("qwen2"),
    "megrez": PreTokenizerInfo("qwen2"),
    "stablelm2": PreTokenizerInfo("qwen2"),
    "poro-chat": PreTokenizerInfo("poro"),
    "bloom": PreTokenizerInfo("poro"),
    "gpt3-finnish": PreTokenizerInfo("poro"),
    "viking": PreTokenizerInfo("viking"),
    "tekken": PreTokenizerInfo("tekken", ignore_merges=True, add_bos=True),
    **{
        name: PreTokenizerInfo("gpt2")
        for name in (
            "gpt-2",
            "phi-2",
            "jina-es",
            "jina-de",
            "gigachat",
            "jina-v1-en",
            "jina-v2-es",
            "jina-v2-de",
            "jina-v2-code",
            "roberta-bpe",
        )
    },
}


def pre_tokenizer_info(name: str | None, path: str = "") -> PreTokenizerInfo:
    """Look up a ``tokenizer.ggml.pre`` name; None (key absent) is llama.cpp's "default"."""
    info = PRE_NAMES.get("default" if name is None else name)
    if info is None:
        where = f"{path}: " if path else ""
        raise TokenizerError(
            f"{where}unknown pre-tokenizer {name!r} (tokenizer.ggml.pre); supported: {', '.join(sorted(PRE_NAMES))}"
        )
    return info


class PreTokenizer:
    """Splits text into the words BPE merges within."""

    def __init__(self, expressions: list[str]) -> None:
        self._expressions = [_Expression.compile(e) for e in expressions]

    @classmethod
    def named(cls, key: str) -> PreTokenizer:
        return cls(PRE_TOKENIZERS[key])

    def split(self, text: str) -> list[str]:
        words = [text] if text else []
        for expr in self._expressions:
            out: list[str] = []
            for word in words:
                subject = expr.collapse(word)
                pos = 0
                for m in expr.pattern.finditer(subject):
                    start, end = m.span()
                    if start == end:
                        continue
                    if start > pos:
                        out.append(word[pos:start])
                    out.append(word[start:end])
                    pos = end
                if pos < len(word):
                    out.append(word[pos:])
            words = out
        return words
