"""Probes: named token sequences the diff harness teacher-forces through two plugins.

The text ships with the package (``stories.txt``, ``recall.txt``, written for this project in the
style of TinyStories) and is tokenised per model, so each sequence fits *that* model's context:

* ``stories`` — short stories, one sequence each, BOS first, each inside the context (a story that
  tokenises longer is cut at the context, and the probe says so);
* ``long`` — the stories concatenated with BOS between them, as the training data is laid out,
  continued round-robin to 4x the context: where bounded plugins and ``causal:positions=N`` differ
  from a plugin that stops at the context;
* ``recall`` — per character, a sequence where the character's name recurs at a growing distance
  from its last mention (8, 16, 24, 32, 48, 64, ... tokens of filler); the harness scores the name's
  probability at each recurrence;
* ``standard`` — all three;
* ``passkey``, ``needle``, ``copy`` — retrieval probes generated in code, seeded, with options
  (``passkey:depth=0.25,length=2000``): see :mod:`pyllama.diff.probes.retrieval`.
* ``ruler`` — RULER's 11 synthetic tasks, generated in code, seeded, with options
  (``ruler:task=niah_multikey_2,length=4096``): see :mod:`pyllama.diff.probes.ruler`.

Any text file is a probe too: the whole file is one sequence, or several when they are separated
by lines holding only ``<|endoftext|>`` (the TinyStories convention).
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable, Sequence
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias

import numpy as np

from pyllama.diff.probes.retrieval import RETRIEVAL_NAMES, is_retrieval_spec, retrieval_probe
from pyllama.diff.probes.ruler import ruler_probe
from pyllama.diff.probes.sequences import Mark, Probe, Segment, Target
from pyllama.errors import InputError

if TYPE_CHECKING:
    from pyllama.tokenizer.base import Tokenizer

__all__ = [
    "Mark",
    "Probe",
    "Segment",
    "Target",
    "is_probe_name",
    "load_probe",
    "probe_from_text",
    "probe_from_tokens",
    "PROBE_NAMES",
    "RETRIEVAL_NAMES",
]

SEPARATOR = "<|endoftext|>"
LONG_FACTOR = 4  # the long run goes to this many times the context
RECALL_GAPS = (8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024)
PROBE_NAMES = ("standard", "stories", "long", "recall")


# token ids: one sequence, or a list of sequences (load_probe tells them from a path by these types)
TokenIds: TypeAlias = "list[int] | tuple[int, ...] | list[Sequence[int]] | tuple[Sequence[int], ...] | np.ndarray"
ProbeSource: TypeAlias = "str | os.PathLike[str] | Probe | TokenIds"  # what load_probe accepts


def _read_text(name: str) -> str:
    return resources.files(__name__).joinpath(name).read_text(encoding="utf-8")


def split_texts(text: str) -> list[str]:
    """Sequences of a text: split on lines holding only ``<|endoftext|>``; blank ones dropped."""
    parts: list[str] = []
    current: list[str] = []
    for line in text.splitlines():
        if line.strip() == SEPARATOR:
            parts.append("\n".join(current))
            current = []
        else:
            current.append(line)
    parts.append("\n".join(current))
    return [p.strip() for p in parts if p.strip()]


def _encode(tokenizer: Tokenizer, text: str, bos: bool) -> list[int]:
    return list(tokenizer.encode(text, bos=bos, eos=False))


def _bos(tokenizer: Tokenizer) -> int:
    bos = getattr(tokenizer, "bos_id", None)
    if bos is None:
        raise InputError(f"{tokenizer!r} has no BOS token, which the probes use to start and separate sequences")
    return int(bos)


def _stories(tokenizer: Tokenizer, seq_len: int) -> list[Segment]:
    out = []
    for i, story in enumerate(split_texts(_read_text("stories.txt")), 1):
        ids = _encode(tokenizer, story, bos=True)
        note = ""
        if len(ids) > seq_len:
            note = f"cut from {len(ids)} to the context ({seq_len}) tokens"
            ids = ids[:seq_len]
        out.append(Segment(f"story-{i}", "story", np.asarray(ids, dtype=np.int32), note=note))
    return out


def _long(tokenizer: Tokenizer, seq_len: int) -> Segment:
    stories = [_encode(tokenizer, s, bos=True) for s in split_texts(_read_text("stories.txt"))]
    target = LONG_FACTOR * seq_len
    ids: list[int] = []
    i = 0
    while len(ids) < target:  # BOS before each story, as the training data is laid out
        ids.extend(stories[i % len(stories)])
        i += 1
    return Segment(
        "long",
        "long",
        np.asarray(ids[:target], dtype=np.int32),
        note=f"{LONG_FACTOR}x the context ({seq_len}): stories joined by BOS",
    )


def _parse_recall(text: str) -> list[dict]:
    blocks: list[dict] = []
    for raw in text.split("\n\n"):
        block: dict = {"recur": [], "filler": []}
        for line in raw.splitlines():
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            key, _, value = line.partition(":")
            key, value = key.strip(), value.strip()
            if key in ("recur", "filler"):
                block[key].append(value)
            elif key in ("name", "intro"):
                block[key] = value
        if "name" in block:
            blocks.append(block)
    return blocks


def _find(ids: list[int], pattern: list[int]) -> list[int]:
    n = len(pattern)
    return [i for i in range(len(ids) - n + 1) if ids[i : i + n] == pattern] if n else []


def _name_marks(tokenizer: Tokenizer, ids: list[int], name: str, expected: int) -> list[Mark]:
    """Where the name's tokens occur: the spelling (with or without the leading space) that matches
    as many mentions as the text has."""
    best: list[int] = []
    best_pattern: list[int] = []
    for variant in (name, " " + name):
        pattern = _encode(tokenizer, variant, bos=False)
        found = _find(ids, pattern)
        if len(found) == expected:
            best, best_pattern = found, pattern
            break
        if len(found) > len(best):
            best, best_pattern = found, pattern
    return [Mark(name, s, len(best_pattern)) for s in best]


def _fillers(block: dict, first: int, k: int) -> list[str]:
    """The k filler sentences from the block's first-th on, taken in turn."""
    fill = block["filler"]
    return [fill[(first + i) % len(fill)] for i in range(k)]


def _fillers_for_gap(
    tokens_of: Callable[[list[str]], list[int]],
    sentences: list[str],
    n_tokens: int,
    block: dict,
    first: int,
    filler_tokens: list[int],
    last_start: int,
    gap: int,
) -> int:
    """How many fillers from the first-th on put the next sentence ``gap`` tokens after the last
    mention (at token ``last_start``; the sentences so far are ``n_tokens`` tokens): the least count,
    guessed from the fillers' own token counts and settled by tokenising the whole text
    (``_fewest_fillers``)."""

    def long_enough(k: int) -> bool:
        return len(tokens_of(sentences + _fillers(block, first, k))) - last_start >= gap

    guess = 0
    while n_tokens + sum(filler_tokens[(first + i) % len(filler_tokens)] for i in range(guess)) - last_start < gap:
        guess += 1
    return _fewest_fillers(long_enough, guess)


def _fewest_fillers(long_enough: Callable[[int], bool], guess: int) -> int:
    """The least k >= 0 with long_enough(k), searched from ``guess`` (from the fillers' own token
    counts) one step at a time. Each test tokenises the whole text again: adding one sentence at a
    time, as before, made building the recall probe quadratic (409 tokenisations, 5.6 s with
    llama2.c's 32,000-token vocabulary, 55 s with llama.cpp's SentencePiece test vocabulary: most of
    a diff of a small model); from the guess it takes two or three per gap. It finds the same k as
    trying 0, 1, 2, ... in turn because the token count never falls when a sentence is appended (the
    probe's ids are unchanged for every tokeniser the tests use)."""
    k = guess
    if long_enough(k):
        while k > 0 and long_enough(k - 1):
            k -= 1
        return k
    k += 1
    while not long_enough(k):
        k += 1
    return k


def _recall(tokenizer: Tokenizer, seq_len: int) -> list[Segment]:
    out = []
    for block in _parse_recall(_read_text("recall.txt")):
        name = block["name"]
        sentences = [block["intro"]]

        def tokens_of(parts: list[str]) -> list[int]:
            return _encode(tokenizer, " ".join(parts), bos=True)

        ids = tokens_of(sentences)
        # what each filler adds, about: its tokens alone, BOS and the leading space's piece off
        filler_tokens = [max(1, len(tokens_of([f])) - 2) for f in block["filler"]]
        last = _name_marks(tokenizer, ids, name, " ".join(sentences).count(name))
        last_start = last[-1].start if last else 0
        fill_i = recur_i = 0
        for gap in RECALL_GAPS:
            # filler until the next sentence would start `gap` tokens after the last mention
            n_fill = _fillers_for_gap(tokens_of, sentences, len(ids), block, fill_i, filler_tokens, last_start, gap)
            trial = sentences + _fillers(block, fill_i, n_fill)
            fill_i += n_fill
            trial.append(block["recur"][recur_i % len(block["recur"])])
            trial_ids = tokens_of(trial)
            if len(trial_ids) > seq_len:
                break
            recur_i += 1
            sentences, ids = trial, trial_ids
            marks = _name_marks(tokenizer, ids, name, " ".join(sentences).count(name))
            last_start = marks[-1].start if marks else len(ids)
        text = " ".join(sentences)
        expected = text.count(name)
        marks = _name_marks(tokenizer, ids, name, expected)
        note = "" if len(marks) == expected else f"found {len(marks)} of {expected} mentions of {name} in the tokens"
        out.append(Segment(f"recall-{name.lower()}", "recall", np.asarray(ids, dtype=np.int32), marks, note))
    return out


def standard_probe(tokenizer: Tokenizer, seq_len: int, parts: tuple[str, ...] = ("stories", "long", "recall")) -> Probe:
    """The ``standard`` probe (or a part of it) tokenised for a model with context ``seq_len``."""
    _bos(tokenizer)
    segments: list[Segment] = []
    if "stories" in parts:
        segments += _stories(tokenizer, seq_len)
    if "long" in parts:
        segments.append(_long(tokenizer, seq_len))
    if "recall" in parts:
        segments += _recall(tokenizer, seq_len)
    name = "standard" if len(parts) == 3 else "+".join(parts)
    return Probe(name, segments)


def probe_from_text(text: str, tokenizer: Tokenizer, name: str = "text") -> Probe:
    """One sequence per ``<|endoftext|>``-separated part of ``text``, each BOS first."""
    texts = split_texts(text)
    if not texts:
        raise InputError(f"probe {name}: the text is empty")
    segs = [
        Segment(
            name if len(texts) == 1 else f"{name}-{i}",
            "text",
            np.asarray(_encode(tokenizer, t, bos=True), dtype=np.int32),
        )
        for i, t in enumerate(texts, 1)
    ]
    return Probe(name, segs)


def probe_from_tokens(ids: TokenIds, name: str = "tokens") -> Probe:
    """A probe of given token ids: one sequence, or a list of sequences."""
    seqs = [ids] if len(ids) and np.isscalar(ids[0]) else list(ids)
    segs = [
        Segment(name if len(seqs) == 1 else f"{name}-{i}", "tokens", np.asarray(s, dtype=np.int32))
        for i, s in enumerate(seqs, 1)
    ]
    if not segs or any(len(s) < 1 for s in segs):
        raise InputError(f"probe {name}: a sequence needs at least one token")
    return Probe(name, segs)


def is_probe_name(text: str) -> bool:
    """A built-in probe's name, or a retrieval probe's spec string (``needle:lengths=1000/2000``)."""
    return isinstance(text, str) and (text in PROBE_NAMES or is_retrieval_spec(text))


# The built-in probes made for each tokenizer object, by (name, seq_len): a built-in probe depends on
# nothing else, and building one tokenises its texts (1.6 s for the standard probe with llama2.c's
# tokenizer.bin), which a sweep's worker or a notebook would otherwise pay again for every diff of
# the same model. Weak keys: a tokenizer's probes go with it.
_BUILT: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _built_in(name: str, tokenizer: Tokenizer, seq_len: int) -> Probe:
    """The built-in probe ``name`` for ``tokenizer`` and ``seq_len``, built once per tokenizer object;
    its token arrays are read-only, since every caller shares them."""
    try:
        made = _BUILT.setdefault(tokenizer, {})
    except TypeError:  # a tokenizer object that cannot be referenced weakly: build every time
        made = {}
    probe = made.get((name, seq_len))
    if probe is None:
        parts = ("stories", "long", "recall") if name == "standard" else (name,)
        probe = standard_probe(tokenizer, seq_len, parts)
        for seg in probe.segments:
            seg.tokens.flags.writeable = False
        made[(name, seq_len)] = probe
    return probe


def load_probe(probe: ProbeSource, tokenizer: Tokenizer | None, seq_len: int) -> Probe:
    """A Probe from a name (``standard``, ``stories``, ``long``, ``recall``), a retrieval spec
    (``passkey[:options]``, ``needle[:options]``, ``copy[:options]``, ``ruler[:options]``), a text
    file path, a Probe, or token ids."""
    if isinstance(probe, Probe):
        return probe
    if isinstance(probe, (list, tuple, np.ndarray)):
        return probe_from_tokens(probe)
    if tokenizer is None:
        raise InputError("text probes need a tokenizer: load the model with tokenizer=... (-z on the CLI)")
    if isinstance(probe, str) and probe in PROBE_NAMES:
        return _built_in(probe, tokenizer, seq_len)
    path = Path(os.fspath(probe))
    if isinstance(probe, str) and is_retrieval_spec(probe) and not path.is_file():
        if probe.partition(":")[0].strip() == "ruler":
            return ruler_probe(probe, tokenizer, seq_len)
        return retrieval_probe(probe, tokenizer, seq_len)
    if not path.exists():
        names = ", ".join(PROBE_NAMES + RETRIEVAL_NAMES)
        raise InputError(f"unknown probe {str(probe)!r}: expected one of {names} or a text file")
    return probe_from_text(_read_probe_text(path), tokenizer, name=path.stem)


def _read_probe_text(path: Path) -> str:
    """The text of a probe file (any file that reads as text: /dev/null too), or one line saying why not."""
    if path.is_dir():
        raise InputError(f"{path}: is a folder, not a probe text file")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read the probe text ({exc.strerror or exc})") from None
    if not split_texts(text):
        raise InputError(f"{path}: the probe text is empty")
    return text
