"""One sequence on one engine, from position 0 or from a recorded state: compress once, branch many.

Every retrieval run of a plugin has the same shape: the sequence teacher-forced in blocks, the
compression event after its context (``compress(pos)``: the block ends there), the final hidden
states of the rows that predict the scored tokens kept, and, where asked, the greedy answer decoded
after its prompt. This module runs that shape, and lets a run begin at a position ``T > 0`` instead
of 0: a **start** (``SequenceStart``) brings the engine's plugin to the state it has after positions
0 .. T - 1 and the event after T - 1, and the run goes on from T. What a start does is its own
business (``pyllama.leaderboard.starts``: a plugin's ``start_from`` over a recorded causal run of
the context, its attention calls replayed, or an engine that ran the context itself). Its contract
is that the bits that follow are those of the run from position 0; the tests check that against
whole runs.

A start is entered again for each run that needs the state at T (the teacher-forced answer, then
the greedy answer). A plugin cannot be rewound, but one that forks (``snapshot()``, see the attention
contract) can be put back: the teacher-forced run snapshots it where the answer begins (``fork``),
and the greedy answer is decoded from there (``Forked``) instead of running the prompt again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import numpy as np

from pyllama.diff._capture import DiffCapture

if TYPE_CHECKING:
    from pyllama.diff.probes import Segment
    from pyllama.engine import Engine

__all__ = [
    "Forked",
    "KeptRows",
    "SequenceStart",
    "answer_positions",
    "decode_answer",
    "greedy_decode",
    "run_prompt",
    "teacher_force_rows",
]


class SequenceStart(Protocol):
    """Where a sequence's run starts: ``enter(engine)`` leaves the engine's plugin in the state after
    positions 0 .. ``position`` - 1 and the compression event after ``position`` - 1, exactly as a
    run from position 0 leaves it; the run then continues at ``position``."""

    position: int

    def enter(self, engine: Engine) -> None: ...


class Forked:
    """The state a teacher-forced run snapshotted after position ``position`` - 1 (and its event, if
    there), with that position's ``logits``: entering restores the plugin, and a run that starts
    with nothing left to run (a greedy decoding) takes ``logits`` as its prompt's last."""

    def __init__(self, state: object, position: int, logits: np.ndarray) -> None:
        self.state = state
        self.position = position
        self.logits = logits

    def enter(self, engine: Engine) -> None:
        engine.attention.restore(self.state)


def _begin(engine: Engine, start: SequenceStart | None) -> int:
    """The engine at the start of a run: reset (position 0), or entered at ``start``; the first position to run."""
    if start is None:
        engine.reset()
        return 0
    start.enter(engine)
    return start.position


def run_prompt(engine: Engine, tokens: np.ndarray, event: int = -1, start: SequenceStart | None = None) -> np.ndarray:
    """Run ``tokens`` (from position 0, or from ``start``) in blocks, the compression event after
    position ``event`` (-1: none; a start has applied its own); the last position's logits."""
    first = begun = _begin(engine, start)
    n = len(tokens)
    logits = engine.logits_view
    if first == n:  # the start is the prompt's end: its own last logits, or none to decode from
        last: np.ndarray | None = getattr(start, "logits", None)
        if last is None:
            raise ValueError(f"run_prompt: the start is at the prompt's end ({n}) and keeps no logits to go on from")
        return last
    if first <= event < n - 1:  # the pass ends at the event, compress, then the rest
        logits = engine.forward_block(np.ascontiguousarray(tokens[first : event + 1], dtype=np.int32), first)
        engine.compress(event)
        first = event + 1
    if first < n:
        logits = engine.forward_block(np.ascontiguousarray(tokens[first:n], dtype=np.int32), first)
    if event == n - 1 and event >= begun:
        engine.compress(event)  # the event after the prompt's last position, before the first decoded token
    return logits


def greedy_decode(
    engine: Engine,
    prompt: np.ndarray,
    steps: int,
    stop: frozenset[int] = frozenset(),
    event: int = -1,
    start: SequenceStart | None = None,
) -> list[int]:
    """Run ``prompt`` (``run_prompt``: from position 0 after a reset, or from ``start``; the event
    after position ``event``) and decode ``steps`` tokens greedily, ending before a token of ``stop``."""
    logits = run_prompt(engine, prompt, event, start)
    out: list[int] = []
    pos = len(prompt)
    for _ in range(steps):
        token = int(np.argmax(logits))
        if token in stop:
            break
        out.append(token)
        if len(out) == steps or pos >= engine.max_positions:
            break
        logits = engine.forward(token, pos)
        pos += 1
    return out


def answer_positions(seg: Segment) -> int:
    """The positions a retrieval sequence's runs occupy: the teacher-forced sequence, and its prompt
    followed by the greedy answer (``decode_answer``: up to ``generate`` tokens, which may run past
    the sequence's end). A plugin sized to this holds every position either run reaches."""
    t = seg.target
    if t is None:
        raise ValueError(f"sequence {seg.name} is not a retrieval sequence: it has no target to score")
    return max(len(seg), t.prompt + (t.generate or t.length))


def decode_answer(engine: Engine, seg: Segment, event: int = -1, start: SequenceStart | None = None) -> list[int]:
    """The greedy answer of a retrieval sequence on ``engine``: after its prompt, as many tokens as
    its target has (a RULER task: up to its ``generate`` tokens, ending at a ``stop`` token)."""
    t = seg.target
    if t is None:
        raise ValueError(f"sequence {seg.name} is not a retrieval sequence: it has no target to score")
    return greedy_decode(engine, seg.tokens[: t.prompt], t.generate or t.length, frozenset(t.stop), event, start)


class KeptRows:
    """What a teacher-forced run keeps: the final hidden states of the chosen rows ``hidden``
    [rows, dim], the ledger right after the compression event (``event_bytes``; -1: no event ran)
    and at the last position (``last_bytes``), the positions the engine ran, and the plugin's
    ``snapshot()`` after the position asked for (None: not asked, or the plugin does not fork)."""

    def __init__(
        self, hidden: np.ndarray, event_bytes: int, last_bytes: int, positions: int, snapshot: object = None
    ) -> None:
        self.hidden = hidden
        self.event_bytes = event_bytes
        self.last_bytes = last_bytes
        self.positions = positions
        self.snapshot = snapshot


def teacher_force_rows(
    engine: Engine,
    seg: Segment,
    rows: np.ndarray,
    label: str,
    event: int = -1,
    start: SequenceStart | None = None,
    block: int = 64,
    fork: int = -1,
) -> KeptRows:
    """Teacher-force ``seg`` (from position 0, or from ``start``) in blocks of at most ``block``
    positions, the block ending at the event after position ``event``, and keep the final hidden
    state of each position in ``rows`` (ascending; all at or after the first position run). The
    classifier is not applied: the caller classifies the rows it kept. ``fork``: a block also ends
    after that position, where the plugin's ``snapshot()`` is taken (after the event, if there)."""
    config = engine.config
    hidden = np.zeros((block, config.dim), dtype=np.float32)
    kept = np.zeros((rows.size, config.dim), dtype=np.float32)
    capture = DiffCapture(engine.attention, config, hidden=hidden, label=label)
    event_bytes = -1
    snapshot = None
    first = _begin(engine, start)
    if start is not None:
        event_bytes = capture.memory_bytes()  # what the start left: the ledger after its event
    if rows.size and rows[0] < first:
        raise ValueError(f"{seg.name}: row {int(rows[0])} comes before the run's first position {first}")
    engine.set_observer(capture)
    try:
        c0, n = first, len(seg)
        while c0 < n:
            c1 = min(n, c0 + block)
            if c0 <= event < c1:
                c1 = event + 1  # the block ends at the compression event
            if c0 <= fork < c1:
                c1 = fork + 1  # and where the run forks
            capture.begin(c0)
            engine.forward_block(np.ascontiguousarray(seg.tokens[c0:c1], dtype=np.int32), c0, classify=False)
            if c1 - 1 == event:
                engine.compress(event)
                event_bytes = capture.memory_bytes()
            if c1 - 1 == fork:
                snapshot = engine.attention.snapshot()
            inside = (rows >= c0) & (rows < c1)
            kept[inside] = hidden[rows[inside] - c0]
            c0 = c1
        last_bytes = capture.memory_bytes()
    finally:
        engine.set_observer(None)
    return KeptRows(kept, event_bytes, last_bytes, len(seg) - first, snapshot)
