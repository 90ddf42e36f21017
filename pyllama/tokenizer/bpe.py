"""Byte-level BPE (GPT-2 style, ``tokenizer.ggml.model = "gpt2"``), as llama.cpp's ``llm_tokenizer_bpe``.

Owns the byte <-> character map of GPT-2 (every byte is shown as a printable character, so that
token texts and merges are strings; ``bytes_to_unicode`` in OpenAI's ``encoder.py``), the merge of
one pre-tokenized word by merge rank (llama.cpp ``src/llama-vocab.cpp``: the lowest rank first, the
leftmost on ties), and the rendering of a token back to bytes (``llama_decode_text``).
"""

from __future__ import annotations

import heapq


def _byte_to_char() -> list[str]:
    """GPT-2's map: printable Latin-1 bytes stand for themselves, the other 68 bytes take the
    characters from U+0100 on, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = [""] * 256
    for b in printable:
        chars[b] = chr(b)
    n = 0
    for b in range(256):
        if not chars[b]:
            chars[b] = chr(256 + n)
            n += 1
    return chars


BYTE_TO_CHAR = _byte_to_char()
CHAR_TO_BYTE = {c: b for b, c in enumerate(BYTE_TO_CHAR)}


def byte_encode(word: str) -> str:
    """The UTF-8 bytes of ``word`` as GPT-2 characters (lone surrogates encoded as they are)."""
    return "".join(BYTE_TO_CHAR[b] for b in word.encode("utf-8", errors="surrogatepass"))


def byte_decode(text: str) -> bytes:
    """A token's text back to bytes. A character outside the map (only in odd vocabularies) is
    rendered as llama.cpp does: ``[UNK_BYTE_0x<its UTF-8 in hex><the whole text>]``."""
    out = bytearray()
    for ch in text:
        b = CHAR_TO_BYTE.get(ch)
        if b is not None:
            out.append(b)
        else:
            utf8 = ch.encode("utf-8", errors="replace" if "\ud800" <= ch <= "\udfff" else "strict")
            out += b"[UNK_BYTE_0x" + utf8.hex().encode() + text.encode("utf-8", errors="surrogateescape") + b"]"
    return bytes(out)


def merge_ranks(merges: list[str]) -> dict[str, int]:
    """``"left right"`` lines -> rank (line number), keyed by the line itself; the first of equal
    lines wins. llama.cpp splits a line at its first space after the first character, so the line of
    a pair (left, right) is exactly ``left + " " + right`` whenever ``left`` has no space after its
    first character; ``BpeMerger`` looks pairs up that way (a dict built in C, no tuple per merge).
    A line without such a space is llama.cpp's pair ("", ""), which no lookup asks for."""
    return dict(zip(reversed(merges), range(len(merges) - 1, -1, -1), strict=True))


class BpeMerger:
    """Merges byte-encoded words into token ids."""

    def __init__(self, token_to_id: dict[str, int], ranks: dict[str, int], ignore_merges: bool) -> None:
        self._token_to_id = token_to_id
        self._ranks = ranks
        self._ignore_merges = ignore_merges
        self._cache: dict[str, tuple[int, ...]] = {}

    def word_ids(self, word: str) -> tuple[int, ...]:
        """Token ids of one pre-tokenized word (plain text; byte-encoded here)."""
        ids = self._cache.get(word)
        if ids is None:
            ids = self._cache[word] = tuple(self._ids(self._merge(byte_encode(word))))
        return ids

    def _merge(self, encoded: str) -> list[str]:
        if self._ignore_merges and encoded in self._token_to_id:
            return [encoded]
        symbols = list(encoded)
        n = len(symbols)
        if n < 2:
            return symbols
        nxt = list(range(1, n + 1))  # n means "no next"
        prv = list(range(-1, n - 1))
        ranks = self._ranks

        def candidate(i: int, j: int) -> tuple[int, int, int, str] | None:
            left, right = symbols[i], symbols[j]
            if left.find(" ", 1) >= 0:  # no merge line splits into this pair (see merge_ranks)
                return None
            rank = ranks.get(left + " " + right)
            return None if rank is None else (rank, i, j, left + right)

        heap = [c for i in range(n - 1) if (c := candidate(i, i + 1)) is not None]
        heapq.heapify(heap)
        while heap:
            _, i, j, text = heapq.heappop(heap)
            # Stale if either side changed since the pair was queued (llama.cpp compares the text).
            if not symbols[i] or not symbols[j] or symbols[i] + symbols[j] != text:
                continue
            symbols[i] = text
            symbols[j] = ""
            nxt[i] = nxt[j]
            if nxt[j] < n:
                prv[nxt[j]] = i
            for a, b in ((prv[i], i), (i, nxt[i])):
                if a >= 0 and b < n and (c := candidate(a, b)) is not None:
                    heapq.heappush(heap, c)
        return [s for s in symbols if s]

    def _ids(self, symbols: list[str]) -> list[int]:
        ids = []
        for symbol in symbols:
            token = self._token_to_id.get(symbol)
            if token is not None:
                ids.append(token)
                continue
            # Not a token (only with inconsistent merges): llama.cpp looks each UTF-8 byte of the
            # symbol up as a one-byte token text and drops the bytes that are none.
            for b in symbol.encode("utf-8"):
                token = self._token_to_id.get(chr(b) if b < 0x80 else chr(0xDC00 + b))
                if token is not None:
                    ids.append(token)
        return ids
