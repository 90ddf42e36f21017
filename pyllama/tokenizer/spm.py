"""SentencePiece-style BPE (``tokenizer.ggml.model = "llama"``), as llama.cpp's ``llm_tokenizer_spm``.

Owns the merge of one text fragment (spaces already written as ``▁``): start from single
characters, repeatedly merge the adjacent pair whose concatenation is the best-scoring token (the
leftmost on ties; llama.cpp ``src/llama-vocab.cpp``, itself after SentencePiece's BPE model), then
turn each symbol into its token or, when it is none, into byte tokens ``<0xXX>``.

llama.cpp merges the whole fragment at once. When no token of the vocabulary has a ``▁`` right after
another character (llama's 32,000 tokens have none), no merge can join a piece that ends before
such a ``▁`` to the piece that starts with it: the fragment falls into words, ``▁`` runs with what
follows them, that merge alone. Merges inside one word come in the same order either way (best
score, then leftmost), so the ids are the same; each word is then merged once and remembered
(at most ``WORD_MEMORY`` words, then the memory starts again), which is what makes a long probe text
cheap to tokenise again and again. A vocabulary that has such a token is merged whole.
"""

from __future__ import annotations

import heapq
import re
from collections.abc import Callable

WORD_MEMORY = 1 << 16
_WORD_START = re.compile("(?<=[^\u2581])(?=\u2581)")  # before a ▁ that follows another character
_JOINS_WORDS = re.compile("[^\u2581]\u2581")


class SpmMerger:
    """Merges a fragment by token score."""

    def __init__(
        self,
        token_to_id: dict[str, int],
        scores: list[float],
        byte_token: Callable[[int], int],
        word_memory: int = WORD_MEMORY,
    ) -> None:
        self._token_to_id = token_to_id
        self._scores = scores
        self._byte_token = byte_token
        self._joins: bool | None = None  # some token joins two words: decided at the first merge, off the load
        self._words: dict[str, list[int]] = {}
        self._word_memory = word_memory

    @property
    def _by_word(self) -> bool:
        if self._joins is None:
            self._joins = any(_JOINS_WORDS.search(token) for token in self._token_to_id)
        return not self._joins

    def ids(self, text: str) -> list[int]:
        if not self._by_word:
            return self._merge(text)
        words, out = self._words, []
        for word in _WORD_START.split(text):
            ids = words.get(word)
            if ids is None:
                if len(words) >= self._word_memory:
                    words.clear()
                ids = words[word] = self._merge(word)
            out.extend(ids)
        return out

    def _merge(self, text: str) -> list[int]:
        symbols = list(text)
        n = len(symbols)
        token_to_id, scores = self._token_to_id, self._scores
        nxt = list(range(1, n + 1))  # n means "no next"
        prv = list(range(-1, n - 1))

        def candidate(i: int, j: int) -> tuple[float, int, int, int] | None:
            token = token_to_id.get(symbols[i] + symbols[j])
            if token is None:
                return None
            # Queued as (-score, left): the best score first, then the leftmost. The length tells a
            # stale entry (llama.cpp's check: a symbol only grows or empties once queued).
            return (-scores[token], i, j, len(symbols[i]) + len(symbols[j]))

        heap = [c for i in range(n - 1) if (c := candidate(i, i + 1)) is not None]
        heapq.heapify(heap)
        while heap:
            _, i, j, size = heapq.heappop(heap)
            if not symbols[i] or not symbols[j] or len(symbols[i]) + len(symbols[j]) != size:
                continue
            symbols[i] += symbols[j]
            symbols[j] = ""
            nxt[i] = nxt[j]
            if nxt[j] < n:
                prv[nxt[j]] = i
            for a, b in ((prv[i], i), (i, nxt[i])):
                if a >= 0 and b < n and (c := candidate(a, b)) is not None:
                    heapq.heappush(heap, c)

        ids = []
        for symbol in symbols:
            if not symbol:
                continue
            token = token_to_id.get(symbol)
            if token is not None:
                ids.append(token)
            else:
                # Only single characters can be missing (every merge made a token): byte fallback.
                ids.extend(self._byte_token(b) for b in symbol.encode("utf-8", errors="surrogatepass"))
        return ids
