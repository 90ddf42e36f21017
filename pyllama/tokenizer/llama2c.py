"""The llama2.c tokenizer: its ``tokenizer.bin`` file format, encoder and decoder.

Format (written by llama2.c's ``tokenizer.py export``; little-endian, no magic, no token count):
int32 ``max_token_length``, then for each token id in order: float32 score, int32 byte length,
the bytes (no terminator). SentencePiece's ``▁`` is stored as a plain space; ids 0, 1, 2 are
``<unk>``, BOS and EOS; byte tokens are stored as text, ``<0x00>`` .. ``<0xFF>``, at ids 3..258.

``encode`` reproduces ``encode()`` of llama2.c's ``run.c`` exactly, quirks included: pieces are
compared as C strings (cut at their first NUL byte, and so is the text), the text is split into
at most 4-byte UTF-8 sequences the way run.c scans it, unknown sequences fall back to byte ids
(byte + 3), BOS takes part in the merges, and merging repeatedly applies the best-scoring adjacent
pair (strictly better than -1e10; the leftmost wins ties). The merge here uses a heap over a linked
list instead of run.c's quadratic rescans; it applies the same merges in the same order.

Decoding follows run.c's ``decode()`` (the piece after BOS loses a leading space, ``<0xXX>`` becomes
the byte, parsed as ``sscanf("<0x%02hhX>")`` does) and ``safe_printf()`` (a one-byte piece that is an
ASCII control character other than whitespace is not printed). Unlike run.c, bytes >= 0x80 are
printed: the streaming decoder assembles them into whole UTF-8 characters.
"""

from __future__ import annotations

import heapq
import os
import struct
from collections.abc import Sequence

from pyllama.errors import TokenizerError
from pyllama.tokenizer.base import Tokenizer

BOS_ID = 1  # run.c hard-codes these three
EOS_ID = 2
BYTE_FALLBACK_OFFSET = 3  # byte b is token b + 3: ids 0..2 are <unk>, BOS, EOS
PAIR_MEMORY = 1 << 20  # pairs _merged remembers (about 100 MB at most) before it starts again
MERGE_FLOOR = -1e10  # run.c's initial best_score: a merge must score strictly more (exact in float32)

_HEADER = struct.Struct("<i")
_RECORD = struct.Struct("<fi")
_HEX_DIGITS = b"0123456789abcdefABCDEF"
_C_SPACE = b" \t\n\v\f\r"  # isspace() in the C locale


def _cstring(piece: bytes) -> bytes:
    """What C's string functions see of ``piece``: everything before the first NUL."""
    nul = piece.find(b"\0")
    return piece if nul < 0 else piece[:nul]


def _scan_hex_byte(piece: bytes) -> int | None:
    """``sscanf(piece, "<0x%02hhX>", &b) == 1 ? b : None``, as glibc behaves.

    The literal prefix must match; ``%X`` then skips whitespace, takes an optional sign and up to
    two characters in all, and needs at least one hex digit; the trailing ``>`` is never checked
    because the conversion count is already 1. ``hh`` keeps the low byte of a negative value.
    """
    if not piece.startswith(b"<0x"):
        return None
    i, n = 3, len(piece)
    while i < n and piece[i] in _C_SPACE:
        i += 1
    width, sign = 2, 1
    if i < n and piece[i] in b"+-":
        sign = -1 if piece[i] == ord("-") else 1
        i += 1
        width -= 1
    j = i
    while j < n and j - i < width and piece[j] in _HEX_DIGITS:
        j += 1
    if j == i:
        return None
    return (sign * int(piece[i:j], 16)) & 0xFF


def _is_unprintable_ascii(byte: int) -> bool:
    """True for the one-byte pieces run.c's ``safe_printf`` skips, limited to ASCII: neither
    ``isprint`` nor ``isspace`` in the C locale. (run.c also skips bytes >= 0x80; we assemble those
    into UTF-8 characters instead.)"""
    return byte < 0x80 and not (0x20 <= byte <= 0x7E or 0x09 <= byte <= 0x0D)


def _to_bytes(text: str) -> bytes:
    """UTF-8 of ``text``; surrogate escapes become the bytes they stand for, other lone
    surrogates are encoded as they are (what a C program would be handed)."""
    try:
        return text.encode("utf-8", errors="surrogateescape")
    except UnicodeEncodeError:
        return text.encode("utf-8", errors="surrogatepass")


def _utf8_chunks(data: bytes) -> list[bytes]:
    """Split ``data`` the way run.c's encode loop does: a chunk starts at every byte that is not a
    UTF-8 continuation byte (10xxxxxx) and takes the continuation bytes after it, at most 4 bytes
    in all; stray continuation bytes beyond that start chunks of their own."""
    chunks = []
    start = 0
    n = len(data)
    for k in range(n):
        nxt = data[k + 1] if k + 1 < n else 0
        if (nxt & 0xC0) == 0x80 and k + 1 - start < 4:
            continue
        chunks.append(data[start : k + 1])
        start = k + 1
    return chunks


def _c_lookup_table(cstrings: list[bytes]) -> dict[bytes, int]:
    """Map each C string to the id run.c's ``str_lookup`` returns for it.

    run.c sorts the vocabulary with ``qsort`` and looks strings up with ``bsearch``. With no
    duplicate strings that is a plain dictionary. When a file holds duplicates (real ones do not),
    which id bsearch lands on depends on the sorted order: glibc's qsort is a stable merge sort, so
    equal strings stay in id order, and the binary search below is glibc's.
    """
    table: dict[bytes, int] = {}
    duplicated = set()
    for i, s in enumerate(cstrings):
        if s in table:
            duplicated.add(s)
        else:
            table[s] = i
    if not duplicated:
        return table
    order = sorted(range(len(cstrings)), key=cstrings.__getitem__)  # stable, bytewise like strcmp
    for s in duplicated:
        lo, hi = 0, len(order)
        while lo < hi:
            mid = (lo + hi) // 2
            probe = cstrings[order[mid]]
            if s < probe:
                hi = mid
            elif s > probe:
                lo = mid + 1
            else:
                table[s] = order[mid]
                break
    return table


class Llama2cTokenizer(Tokenizer):
    """A llama2.c ``tokenizer.bin``: pieces, scores, and run.c's encoder and decoder."""

    def __init__(self, pieces: Sequence[bytes], scores: Sequence[float], max_token_length: int, name: str = "") -> None:
        if len(pieces) != len(scores):
            raise TokenizerError(f"{name or 'tokenizer'}: {len(pieces)} pieces but {len(scores)} scores")
        self.name = name
        self.max_token_length = max_token_length
        self._pieces = list(pieces)
        self._scores = [float(s) for s in scores]
        self._cstrings = [_cstring(p) for p in self._pieces]
        self._lookup = _c_lookup_table(self._cstrings)
        self._pairs: dict[int, int] = {}  # _merged's memory

    # ---- loading -------------------------------------------------------------------------------
    @classmethod
    def load(cls, path: str | os.PathLike[str], vocab_size: int | None = None) -> Llama2cTokenizer:
        """Read a llama2.c tokenizer file. ``vocab_size`` None: every token up to the end of the
        file; otherwise exactly that many, and a file with fewer or more is an error (run.c would
        silently misread it)."""
        name = os.fspath(path)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            raise TokenizerError(f"{name}: no such file") from None
        except IsADirectoryError:
            raise TokenizerError(f"{name}: is a directory, not a tokenizer file") from None
        except OSError as e:
            raise TokenizerError(f"{name}: cannot read: {e.strerror or e}") from None
        return cls.from_bytes(data, name, vocab_size)

    @classmethod
    def from_bytes(cls, data: bytes, name: str = "tokenizer", vocab_size: int | None = None) -> Llama2cTokenizer:
        """Parse the contents of a llama2.c tokenizer file (``name`` is used in error messages)."""
        if not data:
            raise TokenizerError(f"{name}: empty file, expected a llama2.c tokenizer")
        if data[:4] == b"GGUF":
            raise TokenizerError(f"{name}: is a GGUF file, not a llama2.c tokenizer: load it with load_tokenizer()")
        if len(data) < _HEADER.size:
            raise TokenizerError(
                f"{name}: {len(data)} bytes, too short for a llama2.c tokenizer (4-byte header, then the tokens)"
            )
        (max_token_length,) = _HEADER.unpack_from(data, 0)
        if not 0 < max_token_length <= 1 << 16:
            raise TokenizerError(
                f"{name}: header says the longest token is {max_token_length} bytes: not a llama2.c tokenizer "
                "(expected a small positive number, e.g. 27)"
            )
        if vocab_size is not None and vocab_size <= 0:
            raise TokenizerError(f"{name}: the model's vocabulary size is {vocab_size}, expected a positive number")
        pieces: list[bytes] = []
        scores: list[float] = []
        offset = _HEADER.size
        end = len(data)
        while offset < end and (vocab_size is None or len(pieces) < vocab_size):
            offset = cls._read_record(data, offset, len(pieces), max_token_length, name, pieces, scores)
        if vocab_size is not None and (len(pieces) != vocab_size or offset != end):
            held = str(len(pieces)) if offset == end else cls._count_more(data, offset, len(pieces), max_token_length)
            raise TokenizerError(
                f"{name} holds {held} tokens but the model has a vocabulary of {vocab_size}: "
                "pass the model's own tokenizer with -z"
            )
        if not pieces:
            raise TokenizerError(f"{name}: no tokens after the 4-byte header")
        return cls(pieces, scores, max_token_length, name)

    @staticmethod
    def _read_record(
        data: bytes, offset: int, i: int, max_len: int, name: str, pieces: list[bytes], scores: list[float]
    ) -> int:
        left = len(data) - offset
        if left < _RECORD.size:
            raise TokenizerError(
                f"{name}: truncated: token {i} at byte {offset} needs an 8-byte score and length, "
                f"the file ends after {left}"
            )
        score, length = _RECORD.unpack_from(data, offset)
        offset += _RECORD.size
        if not 0 <= length <= max_len:
            raise TokenizerError(
                f"{name}: token {i} at byte {offset - _RECORD.size} claims {length} bytes but the header says "
                f"tokens are at most {max_len}: corrupted, or not a llama2.c tokenizer"
            )
        if length > len(data) - offset:
            raise TokenizerError(
                f"{name}: truncated: token {i} at byte {offset - _RECORD.size} needs {length} bytes, "
                f"the file ends after {len(data) - offset}"
            )
        pieces.append(data[offset : offset + length])
        scores.append(score)
        return offset + length

    @classmethod
    def _count_more(cls, data: bytes, offset: int, held: int, max_len: int) -> str:
        """How many tokens the whole file holds, for an error message about a surplus."""
        pieces: list[bytes] = []
        scores: list[float] = []
        try:
            while offset < len(data):
                offset = cls._read_record(data, offset, held + len(pieces), max_len, "", pieces, scores)
        except TokenizerError:
            return f"more than {held + len(pieces)}"
        return str(held + len(pieces))

    # ---- the vocabulary ------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return len(self._pieces)

    @property
    def bos_id(self) -> int:
        return BOS_ID

    @property
    def eos_id(self) -> int:
        return EOS_ID

    @property
    def stop_ids(self) -> frozenset[int]:
        # run.c stops when BOS is sampled: the tinyllamas were trained with BOS between stories
        return frozenset({BOS_ID})

    @property
    def pieces(self) -> list[bytes]:
        """Every token's bytes exactly as stored in the file."""
        return list(self._pieces)

    @property
    def scores(self) -> list[float]:
        """Every token's merge score (float32 values)."""
        return list(self._scores)

    def __repr__(self) -> str:
        return f"Llama2cTokenizer({self.name!r}, vocab_size={self.vocab_size})"

    # ---- encoding ------------------------------------------------------------------------------
    def encode(self, text: str | bytes, bos: bool | None = True, eos: bool | None = False) -> list[int]:
        """Token ids of ``text``, exactly as run.c's ``encode(tokenizer, text, bos, eos)``.

        ``text`` may be bytes (used as they are, valid UTF-8 or not), or a str, whose
        surrogate escapes (``os.fsdecode``, ``sys.argv``) turn back into the original bytes.
        """
        # run.c reads the text as a C string, so it ends at the first NUL.
        data = _cstring(text if isinstance(text, bytes) else _to_bytes(text))
        tokens: list[int] = []
        if bos is None or bos:
            self._require(BOS_ID, "BOS")
            tokens.append(BOS_ID)
        if data:
            # SentencePiece's dummy prefix: the text is read as if it started with a space.
            space = self._lookup.get(b" ")
            if space is None:
                raise TokenizerError(f"{self.name}: the vocabulary has no ' ' piece, which run.c's encoder needs")
            tokens.append(space)
        for chunk in _utf8_chunks(data):
            token = self._lookup.get(chunk)
            if token is not None:
                tokens.append(token)
                continue
            for byte in chunk:
                self._require(byte + BYTE_FALLBACK_OFFSET, f"byte fallback for 0x{byte:02X}")
                tokens.append(byte + BYTE_FALLBACK_OFFSET)
        tokens = self._merge(tokens)
        if eos:
            self._require(EOS_ID, "EOS")
            tokens.append(EOS_ID)
        return tokens

    def _require(self, token: int, what: str) -> None:
        if token >= self.vocab_size:
            raise TokenizerError(f"{self.name}: {what} needs token {token}, the vocabulary has {self.vocab_size}")

    def _merged(self, left: int, right: int) -> int:
        """The token run.c would merge ``left right`` into if its score can win, else -1; remembered per
        pair (key left * vocab_size + right), since a text meets the same pairs again and again."""
        key = left * len(self._cstrings) + right
        merged = self._pairs.get(key)
        if merged is None:
            if len(self._pairs) >= PAIR_MEMORY:  # a long-lived tokenizer's memory stays bounded
                self._pairs.clear()
            found = self._lookup.get(self._cstrings[left] + self._cstrings[right])
            merged = self._pairs[key] = -1 if found is None or not self._scores[found] > MERGE_FLOOR else found
        return merged

    def _merge(self, tokens: list[int]) -> list[int]:
        """Apply run.c's merges: repeatedly the best-scoring adjacent pair, the leftmost on ties.

        Positions keep their left-to-right order while merging, so "leftmost" is the smallest
        original index; the heap orders candidates by (-score, index) and skips stale entries (a
        candidate is live while both positions are alive, adjacent and hold the same tokens).
        """
        n = len(tokens)
        if n < 2:
            return tokens
        ids = list(tokens)
        nxt = list(range(1, n + 1))  # n means "no next"
        prv = list(range(-1, n - 1))  # -1 means "no previous"
        alive = [True] * n
        merged_of, scores, push, pop = self._merged, self._scores, heapq.heappush, heapq.heappop
        heap = []
        for i in range(n - 1):
            if (m := merged_of(ids[i], ids[i + 1])) >= 0:
                heap.append((-scores[m], i, i + 1, ids[i], ids[i + 1], m))
        heapq.heapify(heap)
        while heap:
            _, i, j, left, right, merged = pop(heap)
            if not (alive[i] and alive[j] and nxt[i] == j and ids[i] == left and ids[j] == right):
                continue
            ids[i] = merged
            alive[j] = False
            nxt[i] = nxt[j]
            if nxt[j] < n:
                prv[nxt[j]] = i
            a = prv[i]
            if a >= 0 and (m := merged_of(ids[a], merged)) >= 0:
                push(heap, (-scores[m], a, i, ids[a], merged, m))
            b = nxt[i]
            if b < n and (m := merged_of(merged, ids[b])) >= 0:
                push(heap, (-scores[m], i, b, merged, ids[b], m))
        return [ids[i] for i in range(n) if alive[i]]

    # ---- decoding ------------------------------------------------------------------------------
    def piece_bytes(self, token: int) -> bytes:
        """run.c's ``decode()`` without the after-BOS rule: the piece as a C string, or the byte a
        ``<0xXX>`` piece stands for (byte 0 prints as nothing, as in C)."""
        self.check_token(token)
        return self._render(self._cstrings[token])

    def piece_after(self, prev: int | None, token: int) -> bytes:
        """run.c's ``decode(prev, token)`` filtered like ``safe_printf`` (ASCII control bytes only)."""
        self.check_token(token)
        piece = self._cstrings[token]
        if prev == BOS_ID and piece[:1] == b" ":
            piece = piece[1:]  # SentencePiece strips the dummy prefix's space after BOS
        piece = self._render(piece)
        if len(piece) == 1 and _is_unprintable_ascii(piece[0]):
            return b""
        return piece

    @staticmethod
    def _render(piece: bytes) -> bytes:
        byte = _scan_hex_byte(piece)
        if byte is None:
            return piece
        return bytes([byte]) if byte else b""
