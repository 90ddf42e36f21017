"""What a probe is made of: its sequences (``Segment``), the spans a sequence scores (``Mark`` for
recall, ``Target`` for the retrieval probes) and the ``Probe`` that holds them. Plain data, shared by
the probe builders (this package's ``__init__`` and ``retrieval``) and the harness that reads them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["Mark", "Probe", "Segment", "Target"]


@dataclass(frozen=True)
class Mark:
    """A scored span of a sequence: the tokens ``start .. start + length - 1`` spell ``label``."""

    label: str
    start: int
    length: int


@dataclass(frozen=True)
class Target:
    """What a retrieval sequence scores: tokens ``start .. start + length - 1`` (teacher-forced;
    the row before each predicts it). ``prompt`` tokens come before the answer (greedy decoding
    starts there); ``needle`` is the first token of the key in the haystack (of the first copy).
    A RULER task (:mod:`pyllama.diff.probes.ruler`) also says where its question and answer prefix
    start, its reference answers, and how far greedy decoding goes."""

    kind: str  # "passkey", "copy" or "ruler"
    key: str  # the digits; for copy the first copy's text; for ruler the answer as teacher-forced
    start: int
    length: int
    prompt: int
    needle: int
    depth: float | None = None  # fraction of the filler before the needle
    requested: int = 0  # the length the probe asked for (the sequence is at most this long)
    task: str = ""  # ruler: the task's name
    answers: tuple[str, ...] = ()  # ruler: the reference strings, in RULER's order
    context_end: int = -1  # the question's first token (the context is the tokens before it); -1: none
    prefix: int = -1  # ruler: the answer prefix's first token
    generate: int = 0  # tokens greedy decoding writes at most (0: as many as the answer has)
    stop: tuple[int, ...] = ()  # tokens that end greedy decoding (not written)

    @property
    def distance(self) -> int:
        """Tokens from the needle to the answer."""
        return self.start - self.needle


@dataclass
class Segment:
    """One sequence of a probe: teacher-forced from position 0 after a reset."""

    name: str  # "story-3", "long", "recall-pip", "text"
    kind: str  # "story", "long", "recall", "text", "tokens"
    tokens: np.ndarray  # int32, BOS first
    marks: list[Mark] = field(default_factory=list)  # recall: every mention of the name
    note: str = ""  # e.g. "cut at the context (512)"
    target: Target | None = None  # a retrieval sequence: the scored tokens and the needle

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def context_end(self) -> int:
        """The context's last position (a retrieval sequence's haystack, before its question), where
        the compression event comes by default; -1: the sequence has no context apart from its question."""
        t = self.target
        return t.context_end - 1 if t is not None and t.context_end > 0 else -1


@dataclass
class Probe:
    name: str
    segments: list[Segment]

    @property
    def n_positions(self) -> int:
        return sum(len(s) for s in self.segments)

    @property
    def max_length(self) -> int:
        return max((len(s) for s in self.segments), default=0)

    def __repr__(self) -> str:
        return f"Probe({self.name!r}, {len(self.segments)} sequences, {self.n_positions} positions)"
