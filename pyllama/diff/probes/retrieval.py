"""Retrieval probes, generated in code (offline, seeded) and scaled to the model's context.

* ``passkey`` — the pass-key test of Mohtashami & Jaggi (2023), as RULER's noise haystack lays it
  out: an instruction, filler sentences, "The pass key is 71432. Remember it. 71432 is the pass
  key." at a chosen ``depth`` of the filler (0 = its start, 1 = its end), more filler, then the
  question. The answer prefix "The pass key is" ends the prompt and the key's tokens follow it, so
  they are teacher-forced right after the prompt. On an instruct model (a tokenizer file with a
  ``tokenizer.chat_template``) the instruction, filler and question are the user's message, rendered
  with the model's own template, and the answer prefix starts the assistant's turn.
* ``needle`` — the same at every (depth, length) point of a grid: one sequence per point.
* ``copy`` — a span of random word tokens, filler, then the same span again; the second copy is
  scored (its loss collapses under exact attention once the model's induction heads find the
  first copy).

``length`` is the whole sequence in tokens (template, question and key included); the filler is
cut to fit it, so a sequence is at most ``length`` tokens. The ``seed`` draws the key's digits (and
the copy's span); the filler is the same for every seed. Each sequence's :class:`Target` says
which tokens are scored and where the needle is.

Spec strings (``--probe passkey:depth=0.25,length=2000``): ``name:option=value,...``; a list value
(``needle``'s ``depths`` and ``lengths``) separates its items with ``/``.
"""

from __future__ import annotations

import bisect
import difflib
from typing import TYPE_CHECKING, Any

import numpy as np

from pyllama.diff.probes.sequences import Probe, Segment, Target
from pyllama.errors import InputError

if TYPE_CHECKING:
    from pyllama.tokenizer.base import Tokenizer

__all__ = ["RETRIEVAL_NAMES", "Target", "is_retrieval_spec", "retrieval_probe"]

RETRIEVAL_NAMES = ("passkey", "needle", "copy", "ruler")  # ruler: see pyllama.diff.probes.ruler
INTRO = (
    "There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. "
    "I will quiz you about the important information there."
)
NOISE = ("The grass is green.", "The sky is blue.", "The sun is yellow.", "Here we go.", "There and back again.")
NEEDLE = "The pass key is {key}. Remember it. {key} is the pass key."
QUESTION = "What is the pass key?"
ANSWER_PREFIX = "The pass key is"
MIN_LENGTH = 32


# ---- spec strings ----------------------------------------------------------------------------------
def _options(seq_len: int) -> dict[str, dict[str, tuple[type, Any, str]]]:
    """Per probe: option -> (type, default, help). Defaults scale with the context ``seq_len``."""
    common = {
        "seed": (int, 0, "seed of the key's digits"),
        "digits": (int, 5, "digits in the key"),
        "chat": (str, "auto", "render with the file's chat template: auto (if it has one), yes, no"),
    }
    return {
        "passkey": {
            "depth": (float, 0.5, "fraction of the filler before the needle (0 = start, 1 = end)"),
            "length": (int, seq_len // 2, "tokens in the sequence (default: half the context)"),
            **common,
        },
        "needle": {
            "depths": (list, (0.0, 0.25, 0.5, 0.75, 1.0), "depths of the grid, separated by /"),
            "lengths": (list, tuple(seq_len * k // 4 for k in (1, 2, 4)), "lengths of the grid (tokens), by /"),
            **common,
        },
        "copy": {
            "span": (int, max(4, min(32, seq_len // 8)), "tokens in the copied span"),
            "length": (int, seq_len // 2, "tokens in the sequence (default: half the context)"),
            "seed": (int, 0, "seed of the span's tokens"),
        },
    }


def is_retrieval_spec(text: str) -> bool:
    return isinstance(text, str) and text.partition(":")[0].strip() in RETRIEVAL_NAMES


def parse_spec(text: str, seq_len: int) -> tuple[str, dict[str, Any]]:
    """``(name, options)`` of a spec string, every option checked; defaults filled in."""
    name, _, args = text.partition(":")
    name = name.strip()
    table = _options(seq_len)[name]
    values = {k: v[1] for k, v in table.items()}
    for item in filter(None, (a.strip() for a in args.split(","))):
        key, eq, raw = item.partition("=")
        key = key.strip()
        if key not in table or not eq:
            raise InputError(f"probe {text!r}: {_unknown(key, eq, item, list(table))}; {name} takes {', '.join(table)}")
        kind = table[key][0]
        try:
            if kind is list:
                conv = float if key == "depths" else int
                values[key] = tuple(conv(x) for x in raw.split("/") if x.strip())
            else:
                values[key] = kind(raw.strip())
        except ValueError:
            raise InputError(f"probe {text!r}: {key}={raw!r} is not a valid {kind.__name__}") from None
    _check(text, values)
    return name, values


def _unknown(key: str, eq: str, item: str, options: list[str]) -> str:
    """What is wrong with one item of a spec: not option=value, or an option the probe lacks (and
    the option it was likely meant to be)."""
    if not eq:
        return f"expected option=value, got {item!r}"
    close = difflib.get_close_matches(key, options, n=1)
    return f"unknown option {key!r}" + (f" (did you mean {close[0]!r}?)" if close else "")


def _check(text: str, v: dict[str, Any]) -> None:
    def bad(problem: str) -> InputError:
        return InputError(f"probe {text!r}: {problem}")

    for d in (v["depth"],) if "depth" in v else v.get("depths", ()):
        if not 0.0 <= d <= 1.0:
            raise bad(f"depth {d} is outside [0, 1]")
    for n in (v["length"],) if "length" in v else v.get("lengths", ()):
        if n < MIN_LENGTH:
            raise bad(f"length {n} is below {MIN_LENGTH} tokens")
    if "depths" in v and not (v["depths"] and v["lengths"]):
        raise bad("the grid is empty: give depths=a/b/... and lengths=n/m/...")
    if not 1 <= v.get("digits", 1) <= 20:
        raise bad(f"digits={v['digits']}: expected 1 to 20")
    if v.get("seed", 0) < 0:
        raise bad("seed must be >= 0")
    if v.get("chat", "auto") not in ("auto", "yes", "no"):
        raise bad(f"chat={v['chat']}: expected auto, yes or no")
    if "span" in v and not 2 <= v["span"] <= v["length"] // 3:
        raise bad(f"span={v['span']}: expected 2 to a third of the length ({v['length'] // 3})")


def retrieval_probe(text: str, tokenizer: Tokenizer, seq_len: int) -> Probe:
    """The Probe a spec string names, tokenised for ``tokenizer`` (context ``seq_len``)."""
    name, v = parse_spec(text, seq_len)
    if name == "copy":
        return Probe(text, [copy_segment(tokenizer, v["length"], v["span"], v["seed"])])
    chat = use_chat(tokenizer, v["chat"], text)
    points = [(v["depth"], v["length"])] if name == "passkey" else [(d, n) for n in v["lengths"] for d in v["depths"]]
    segs = [passkey_segment(tokenizer, n, d, v["seed"], v["digits"], chat) for d, n in points]
    return Probe(text, segs)


def use_chat(tokenizer: Tokenizer, chat: str, text: str) -> bool:
    from pyllama.chat import template_of  # lazy here and below: jinja2 only for an instruct model's probe

    has = template_of(tokenizer) is not None
    if chat == "yes" and not has:
        raise InputError(f"probe {text!r}: chat=yes, but the tokenizer file has no chat template")
    return has if chat == "auto" else chat == "yes"


# ---- the sequences ---------------------------------------------------------------------------------
def key_digits(seed: int, digits: int) -> str:
    """The key of a seed: ``digits`` decimal digits, the first one not 0."""
    rng = np.random.default_rng([seed, digits, 0x9A55])
    return str(int(rng.integers(1, 10))) + "".join(str(int(d)) for d in rng.integers(0, 10, digits - 1))


def _filler(n: int) -> list[str]:
    return [NOISE[i % len(NOISE)] for i in range(n)]


def _passkey_text(tokenizer: Tokenizer, before: int, after: int, key: str, chat: bool) -> str:
    haystack = " ".join([*_filler(before), NEEDLE.format(key=key), *_filler(before + after)[before:]])
    if not chat:
        return f"{INTRO} {haystack} {QUESTION} {ANSWER_PREFIX} {key}"
    from pyllama.chat import messages, prompt_text

    user = f"{INTRO}\n\n{haystack}\n\n{QUESTION}"
    return prompt_text(tokenizer, messages(user)) + f"{ANSWER_PREFIX} {key}"


def encode_text(tokenizer: Tokenizer, text: str, chat: bool) -> list[int]:
    if chat:
        from pyllama.chat import encode

        return list(encode(tokenizer, text))
    return list(tokenizer.encode(text, bos=None, eos=False))


def passkey_segment(tokenizer: Tokenizer, length: int, depth: float, seed: int, digits: int, chat: bool) -> Segment:
    """One pass-key sequence of at most ``length`` tokens, the needle at ``depth`` of the filler."""
    key = key_digits(seed, digits)
    base = len(encode_text(tokenizer, _passkey_text(tokenizer, 0, 0, key, chat), chat))
    if base > length:
        raise InputError(f"passkey: the prompt without filler is {base} tokens, more than length={length}")
    per = np.mean([len(tokenizer.encode(" " + s, bos=False, eos=False)) for s in NOISE])

    def build(total: int) -> list[int]:
        before = int(round(depth * total))
        return encode_text(tokenizer, _passkey_text(tokenizer, before, total - before, key, chat), chat)

    # the most filler sentences that fit: bisection from an estimate (the sequence grows with them)
    lo, hi = 0, int((length - base) / per * 1.25) + 2
    while len(build(hi)) <= length:
        lo, hi = hi, 2 * hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if len(build(mid)) <= length else (lo, mid)
    ids = build(lo)
    offsets = byte_offsets(tokenizer, ids)
    stream = stream_bytes(tokenizer, ids)
    kb = key.encode()
    first, last = stream.find(kb), stream.rfind(kb)
    if first < 0 or first == last:
        raise InputError(f"passkey: the key {key} was not found twice in the tokens (tokenizer {tokenizer!r})")
    start = bisect.bisect_right(offsets, last) - 1  # the token holding the key's first byte
    n_key = len(ids) - start
    needle = bisect.bisect_right(offsets, first) - 1
    question = bisect.bisect_right(offsets, stream.rfind(QUESTION.encode())) - 1  # where the context ends
    name = f"passkey-d{depth:g}-n{length}"
    target = Target("passkey", key, start, n_key, start, needle, depth, length, context_end=question)
    note = f"key {key} at depth {depth:g}: needle at token {needle}, answer at {start}"
    return Segment(name, "passkey", np.asarray(ids, dtype=np.int32), note=note, target=target)


def stream_bytes(tokenizer: Tokenizer, ids: list[int]) -> bytes:
    return b"".join(tokenizer.piece_after(ids[i - 1] if i else None, t) for i, t in enumerate(ids))


def byte_offsets(tokenizer: Tokenizer, ids: list[int]) -> list[int]:
    """The byte offset at which each token's text starts in the printed stream."""
    out, at = [], 0
    for i, t in enumerate(ids):
        out.append(at)
        at += len(tokenizer.piece_after(ids[i - 1] if i else None, t))
    return out


def word_tokens(tokenizer: Tokenizer) -> np.ndarray:
    """Ids of plain word tokens (ASCII letters, with or without a leading space): the copy's alphabet."""
    out = []
    for t in range(tokenizer.vocab_size):
        piece = tokenizer.piece_bytes(t)
        word = piece[1:] if piece[:1] == b" " else piece
        if len(word) >= 2 and word.isalpha() and word.isascii():
            out.append(t)
    if len(out) < 16:
        raise InputError(f"copy: the vocabulary has only {len(out)} word tokens to draw a span from")
    return np.asarray(out, dtype=np.int32)


def copy_segment(tokenizer: Tokenizer, length: int, span: int, seed: int) -> Segment:
    """Filler, a random span of word tokens, filler, the span again; ``length`` tokens in all."""
    rng = np.random.default_rng([seed, span, 0xC0B1])
    words = word_tokens(tokenizer)
    copy = words[rng.integers(0, len(words), span)].tolist()
    head = list(tokenizer.encode(NOISE[0], bos=None, eos=False))
    fill_ids = list(tokenizer.encode(" " + " ".join(_filler(length)), bos=False, eos=False))
    gap = length - len(head) - 2 * span
    if gap < 1:
        raise InputError(f"copy: length={length} leaves no filler between two spans of {span}")
    ids = head + copy + fill_ids[:gap] + copy
    first, second = len(head), len(head) + span + gap
    # the second copy's first token cannot be predicted (the span is random): score the rest
    target = Target("copy", tokenizer.decode([ids[first - 1], *copy]), second + 1, span - 1, second + 1, first)
    name = f"copy-s{span}-n{length}"
    note = f"span of {span} random word tokens at {first} and again at {second}"
    return Segment(name, "copy", np.asarray(ids, dtype=np.int32), note=note, target=target)
