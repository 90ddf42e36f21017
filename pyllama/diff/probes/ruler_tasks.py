"""RULER's 11 synthetic tasks (Hsieh et al. 2024, "RULER: What's the real context size of your
long-context language models?", NVIDIA/RULER ``scripts/data/synthetic/``), drafted offline and seeded.

A task's drafter writes the text of one sample for a given haystack ``size``; :mod:`.ruler` renders
it (chat template or plain text), sizes it to the requested tokens and marks its spans. The
templates, answer prefixes, needle sentence and noise haystack are RULER's own, word for word
(:mod:`.ruler_text`); the generators are written for pyllama, after RULER's ``scripts/synthetic.yaml``
and its generators:

* ``niah_*`` — the needle "One of the special magic {numbers} for {key} is: {value}." in a
  haystack: ``noise`` (RULER's five sentences, one line each repetition), ``essay`` (prose; see
  below) or ``needle`` (a haystack of such sentences with other keys, never the asked one). Keys are adjective-noun
  words drawn from the ``wonderwords`` package's lists (as RULER draws them) or UUIDs; values are
  7-digit numbers or UUIDs. A single answer makes the template singular, as RULER's
  replacements do ("A special magic number is hidden ...").
* ``vt`` — a chain "VAR ABCDE = 12345", "VAR FGHIJ = VAR ABCDE ", ... (four hops) among noise
  lines, after one worked example of the task (three-letter names; RULER's in-context example,
  about 500 tokens from 4,096 tokens on, scaled down below that).
* ``cwe`` — a numbered list where 10 words appear 30 times and the others 3 (6 and 1 below 4,096
  tokens), after one worked example, as RULER's ``common_words_extraction.py``; the words are
  ``wonderwords``' nouns, adjectives and verbs.
* ``fwe`` — random 6-letter coded words with Zipf counts (alpha 2); the most frequent one is
  "...", the three after it are the answer.

Sizes: ``niah`` and ``vt`` cut their haystack at ``size`` characters (the fitting prefers the end
of a line or sentence, then of a word), ``cwe`` lists ``size`` distinct words, ``fwe`` writes
``size`` words. The essay haystack is prose written for this project (:mod:`.ruler_text`), not
RULER's Paul Graham essays.

Every draw comes from numpy generators seeded by (seed, task, purpose): the keys, values, and
places do not depend on the size, and a haystack of needles grows by appending, so a bigger size
adds text without redrawing the sample.
"""

from __future__ import annotations

import itertools
import math
import re
import string
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from pyllama.diff.probes.ruler_text import (
    CWE_PREFIX,
    CWE_TEMPLATE,
    DEPTHS,
    FULL_LENGTH,
    FWE_PREFIX,
    FWE_TEMPLATE,
    NEEDLE,
    NIAH_PREFIX,
    NIAH_TEMPLATE,
    NOISE,
    VT_EXAMPLE_TOKENS,
    VT_PREFIX,
    VT_TEMPLATE,
    Draft,
    Stream,
    essay_words,
    insert_lines,
    singular,
    split_template,
    wonderwords_lists,
)
from pyllama.errors import InputError


@dataclass(frozen=True)
class Task:
    """One of RULER's 11 tasks, as ``scripts/synthetic.yaml`` configures it."""

    name: str
    family: str  # niah, vt, cwe, fwe
    generate: int  # RULER's tokens_to_generate: what greedy decoding writes at most
    haystack: str = "noise"  # niah: noise, essay, needle
    key: str = "words"  # niah: words, uuids
    value: str = "numbers"  # niah: numbers, uuids
    keys: int = 1
    values: int = 1
    queries: int = 1


TASKS = {
    t.name: t
    for t in (
        Task("niah_single_1", "niah", 128, "noise"),
        Task("niah_single_2", "niah", 128, "essay"),
        Task("niah_single_3", "niah", 128, "essay", value="uuids"),
        Task("niah_multikey_1", "niah", 128, "essay", keys=4),
        Task("niah_multikey_2", "niah", 128, "needle"),
        Task("niah_multikey_3", "niah", 128, "needle", key="uuids", value="uuids"),
        Task("niah_multivalue", "niah", 128, "essay", values=4),
        Task("niah_multiquery", "niah", 128, "essay", keys=4, queries=4),
        Task("vt", "vt", 30),
        Task("cwe", "cwe", 120),
        Task("fwe", "fwe", 50),
    )
}
TASK_NAMES = tuple(TASKS)


def _rng(seed: int, task: str, purpose: int) -> np.random.Generator:
    return np.random.default_rng([seed, TASK_NAMES.index(task), purpose, 0x5255_4C45])


def _draw(rng: np.random.Generator, kind: str) -> str:
    if kind == "numbers":  # RULER: random.randint(10**6, 10**7 - 1)
        return str(int(rng.integers(10**6, 10**7)))
    if kind == "uuids":
        return str(uuid.UUID(bytes=rng.bytes(16), version=4))
    lists = wonderwords_lists()  # uniform over RULER's adjective-noun pairs
    adjectives, nouns = lists["adjective"], lists["noun"]
    return f"{adjectives[int(rng.integers(len(adjectives)))]}-{nouns[int(rng.integers(len(nouns)))]}"


# ---- needle in a haystack ----------------------------------------------------------------------------
class NiahDrafter:
    """``niah_*``: the keys, values, needles and their places are drawn once; ``draft(size)`` cuts
    the haystack at ``size`` characters and inserts the needles (between lines of a noise or needle
    haystack, between sentences of the essay at RULER's depths)."""

    min_size = 0

    def __init__(self, task: Task, seed: int) -> None:
        self.task = task
        rng = _rng(seed, task.name, 1)
        n_keys = max(task.keys, task.queries)
        keys: list[str] = []
        while len(keys) < n_keys:  # distinct keys, so that each question has one answer
            key = _draw(rng, task.key)
            keys += [key] if key not in keys else []
        values = [[_draw(rng, task.value) for _ in range(task.values)] for _ in keys]
        needles = [
            NEEDLE.format(type_needle_v=task.value, key=k, value=v)
            for k, vs in zip(keys, values, strict=True)
            for v in vs
        ]
        self.needles = [needles[i] for i in rng.permutation(len(needles))]
        asked = [int(i) for i in rng.choice(n_keys, task.queries, replace=False)]
        self.answers = tuple(v for i in asked for v in values[i])
        queries = [keys[i] for i in asked]
        self.query = queries[0] if len(queries) == 1 else ", ".join(queries[:-1]) + ", and " + queries[-1]
        if task.haystack == "essay":
            self.places = np.array([DEPTHS[int(i)] / 100 for i in rng.choice(len(DEPTHS), len(needles), False)])
        else:
            self.places = rng.random(len(needles))
        self.stream = self._stream(_rng(seed, task.name, 2), set(keys))

    def _stream(self, rng: np.random.Generator, keys: set[str]) -> Stream:
        task = self.task
        if task.haystack == "noise":
            return Stream(lambda: NOISE, "\n")
        if task.haystack == "essay":
            words = itertools.cycle(essay_words())
            return Stream(lambda: next(words), " ")

        def needle() -> str:  # a distractor: another key, never one of the sample's
            key = _draw(rng, task.key)
            while key in keys:
                key = _draw(rng, task.key)
            return NEEDLE.format(type_needle_v=task.value, key=key, value=_draw(rng, task.value))

        return Stream(needle, "\n")

    def floors(self, size: int) -> list[int]:
        return self.stream.floors(size)

    def draft(self, size: int) -> Draft:
        task = self.task
        hay = self.stream.cut(size)
        if task.haystack == "essay":
            sentences = re.split(r"(?<=[.!?])\s+", hay) if hay else []
            bounds = [0, *sorted(int(len(sentences) * p) for p in self.places), len(sentences)]
            parts = []
            for i in range(1, len(bounds)):
                parts.append(" ".join(sentences[bounds[i - 1] : bounds[i]]))
                parts += [self.needles[i - 1]] if i - 1 < len(self.needles) else []
            context = " ".join(p for p in parts if p)
        else:
            context = "\n".join(insert_lines(hay.split("\n") if hay else [], self.needles, self.places))
        template, prefix, kind = NIAH_TEMPLATE, NIAH_PREFIX, task.value
        if len(self.answers) == 1:
            template, prefix, kind = singular(template), singular(prefix), kind[:-1]
        instruction, question = split_template(template, type_needle_v=kind, query=self.query)
        prefix = prefix.format(type_needle_v=kind, query=self.query)
        return Draft(instruction, context, question, prefix, self.answers, " " + ", ".join(self.answers))


# ---- variable tracking -------------------------------------------------------------------------------
def _chain(rng: np.random.Generator, letters: int, hops: int) -> tuple[list[str], str, list[str]]:
    """(variable names, value, statements) of one chain: ``VAR A = value``, ``VAR B = VAR A `` ..."""
    names: list[str] = []
    while len(names) < hops + 1:
        name = "".join(string.ascii_uppercase[int(i)] for i in rng.integers(0, 26, letters))
        names += [name] if name not in names else []
    value = str(int(rng.integers(10000, 99999)))  # RULER: np.random.randint(10000, 99999)
    statements = [f"VAR {names[0]} = {value}"] + [f"VAR {names[j + 1]} = VAR {names[j]} " for j in range(hops)]
    return names, value, statements


def _vt_text(lines: list[str], statements: list[str], places: np.ndarray) -> str:
    """Noise lines with the chain's statements among them, in order (RULER's ``variable_tracking.py``)."""
    out = list(lines)
    for j, at in enumerate(sorted(int(p * len(lines)) for p in places)):
        out.insert(at + j, statements[j])
    return "\n".join(out)


class VtDrafter:
    """``vt``: one chain of four hops among noise lines, after a worked example sized by ``count``
    (tokens of a text) to RULER's 500 tokens, or ``length * 500 / 4096`` below 4,096 tokens."""

    hops = 4
    min_size = 0

    def __init__(self, task: Task, seed: int, length: int, count: Callable[[str], int]) -> None:
        rng = _rng(seed, task.name, 1)
        self.names, self.value, self.statements = _chain(rng, 5, self.hops)
        self.places = rng.random(len(self.statements))
        self.stream = Stream(lambda: NOISE, "\n")
        names, value, statements = _chain(rng, 3, self.hops)
        places = rng.random(len(statements))
        budget = round(VT_EXAMPLE_TOKENS * min(1.0, length / FULL_LENGTH))

        def example(n_lines: int) -> str:
            head, question = split_template(VT_TEMPLATE, query=value)
            prefix = VT_PREFIX.format(num_v=self.hops + 1, query=value).rstrip()
            context = _vt_text([NOISE] * n_lines, statements, places)
            return f"{head}{context}\n{question}{prefix} {' '.join(names)}\n"

        n = 0
        while count(example(n + 1)) <= budget:
            n += 1
        self.example = example(n)

    def floors(self, size: int) -> list[int]:
        return self.stream.floors(size)

    def draft(self, size: int) -> Draft:
        hay = self.stream.cut(size)
        context = _vt_text(hay.split("\n") if hay else [], self.statements, self.places)
        head, question = split_template(VT_TEMPLATE, query=self.value)
        prefix = VT_PREFIX.format(num_v=self.hops + 1, query=self.value)
        return Draft(self.example + head, context, question, prefix, tuple(self.names), " " + " ".join(self.names))


# ---- common and frequent words -----------------------------------------------------------------------
def _numbered(words: list[str] | tuple[str, ...]) -> str:
    return " ".join(f"{i + 1}. {w}" for i, w in enumerate(words))


class CweDrafter:
    """``cwe``: ``draft(size)`` lists ``size`` distinct words, the first 10 common (30 times each,
    6 below 4,096 tokens) and the rest uncommon (3 times, 1 below), shuffled and numbered; a worked
    example of 40 words (20 below 4,096) comes first, as RULER's one few-shot example."""

    common = 10
    min_size = common  # RULER's smallest list: the common words alone

    def __init__(self, task: Task, seed: int, length: int) -> None:
        lists = wonderwords_lists()
        self.pool = sorted(set(lists["noun"] + lists["adjective"] + lists["verb"]))
        full = length >= FULL_LENGTH
        self.repeats = (30, 3) if full else (6, 1)
        rng = _rng(seed, task.name, 1)
        example_words = [self.pool[int(i)] for i in rng.choice(len(self.pool), 40 if full else 20, replace=False)]
        ex_common = example_words[: self.common]
        ex_list = self._listing(example_words, (10, 3) if full else (3, 1), rng)
        head, question = split_template(CWE_TEMPLATE)
        self.example = (f"{head}{ex_list}\n{question}", CWE_PREFIX + " " + _numbered(ex_common))
        self.order = _rng(seed, task.name, 2).permutation(len(self.pool))
        self.seed, self.name = seed, task.name

    def _listing(self, words: list[str], repeats: tuple[int, int], rng: np.random.Generator) -> str:
        listed = words[: self.common] * repeats[0] + words[self.common :] * repeats[1]
        return _numbered([listed[int(i)] for i in rng.permutation(len(listed))])

    def floors(self, size: int) -> list[int]:
        return []

    def draft(self, size: int) -> Draft:
        if size > len(self.pool):
            raise InputError(
                f"ruler cwe: the length asks for {size:,} distinct words; wonderwords has {len(self.pool):,}"
            )
        words = [self.pool[int(i)] for i in self.order[:size]]
        context = self._listing(words, self.repeats, _rng(self.seed, self.name, 3))
        head, question = split_template(CWE_TEMPLATE)
        answers = tuple(words[: self.common])
        return Draft(head, context, question, CWE_PREFIX, answers, " " + _numbered(answers), self.example)


class FweDrafter:
    """``fwe``: a vocabulary of ``(length - 50) // 50`` coded 6-letter words (RULER's size), the
    first replaced by "..."; word k is written ``floor(n * k^-2 / zeta(2))`` times for RULER's word
    count n, shuffled. The answer is words 2 to 4, the most frequent after the dots.

    ``draft(size)`` writes ``size`` words: the copies in the order they appear as n grows (the j-th
    copy of word k at n = j k^2 zeta(2)), so at every n the counts are RULER's, and between two n
    the words that n adds arrive one at a time (words 2, 4, 8, ... gain a copy at the same n, a
    step too coarse for 1%). The shuffle orders the copies by random keys, the j-th copy of word k
    taking the j-th draw of word k's own stream: a word more moves no other."""

    min_size = 33  # RULER's counts at n = 40 (24, 6, 2, 1): every answer word written, none after them

    def __init__(self, task: Task, seed: int, length: int) -> None:
        size = (length - task.generate) // 50
        if size < 4:  # the dots and three answers
            raise InputError(f"ruler fwe: length={length} leaves a vocabulary of {size} words; give 250 or more")
        rng = _rng(seed, task.name, 1)
        vocab: set[str] = set()
        while len(vocab) < size:
            vocab.add("".join(string.ascii_lowercase[int(i)] for i in rng.integers(0, 26, 6)))
        ordered = sorted(vocab)
        self.vocab = [ordered[int(i)] for i in rng.permutation(size)]
        self.vocab[0] = "..."  # RULER treats the most frequent word as noise
        self.seed, self.name = seed, task.name

    def floors(self, size: int) -> list[int]:
        return []

    def draft(self, size: int) -> Draft:
        zeta2 = math.pi**2 / 6  # RULER's scipy.special.zeta(alpha) at its alpha = 2
        n = size
        while sum(int(n / (k * k * zeta2)) for k in range(1, len(self.vocab) + 1)) < size:
            n *= 2
        copies = [
            (j * k * k * zeta2, k - 1, j)
            for k in range(1, len(self.vocab) + 1)
            for j in range(1, int(n / (k * k * zeta2)) + 1)
        ]
        counts = Counter(k for _, k, _ in sorted(copies)[:size])
        keys = [(key, k) for k, c in counts.items() for key in _rng(self.seed, self.name, 10 + k).random(c)]
        head, question = split_template(FWE_TEMPLATE)
        answers = tuple(self.vocab[1:4])
        text = " ".join(self.vocab[k] for _, k in sorted(keys))
        return Draft(head, text, question, FWE_PREFIX, answers, " " + ", ".join(answers))


def drafter(task: Task, seed: int, length: int, count: Callable[[str], int]):
    """The drafter of ``task`` for one sample (``count``: tokens of a text, for vt's example)."""
    if task.family == "niah":
        return NiahDrafter(task, seed)
    if task.family == "vt":
        return VtDrafter(task, seed, length, count)
    if task.family == "cwe":
        return CweDrafter(task, seed, length)
    return FweDrafter(task, seed, length)
