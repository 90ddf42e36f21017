"""Scores of the retrieval probes (``passkey``, ``needle``, ``copy``, ``ruler``), per plugin.

For each retrieval sequence and each side, from the teacher-forced logits of the rows that predict
the scored tokens (the key's digits; the second copy but its first token):

* ``logp`` — log P(key) = the sum of the key tokens' teacher-forced log-probabilities (float64
  log-softmax of the float32 logits, as every diff metric); ``loss`` = their mean NLL;
* ``ranks`` — each key token's rank among the vocabulary: 1 + the tokens with a larger logit + the
  tokens with an equal logit and a smaller id, so rank 1 is exactly "greedy decoding picks it"
  (``argmax`` takes the first maximum);
* ``greedy`` — the text greedy decoding writes after the prompt, as many tokens as the key has, and
  ``match``: whether it contains the key. Where every key token is rank 1, the teacher-forced chain
  *is* the greedy chain (the same tokens at the same positions, and blocks give the bits of one
  position at a time), so the greedy answer is the key without running anything more. Elsewhere the
  prompt is run again through the plugin and decoded for real (``greedy=False`` skips that; then
  ``greedy`` and ``match`` are None where the chain leaves the key);
* ``retrieves`` — the greedy answer contains the key *and* every key token is rank 1. The second
  implies the first (see above), so it is ``max(ranks) == 1``, whatever ``greedy`` says.
* a RULER task (:mod:`pyllama.diff.probes.ruler`): the key is its reference answers as
  teacher-forced; greedy decoding writes up to RULER's ``tokens_to_generate`` and stops at an end
  token, and ``match_all`` / ``match_part`` are RULER's ``string_match_all`` / ``string_match_part``
  terms of that answer (the share of the references it holds; whether it holds any), ``match`` that
  it holds all of them. Where every answer token is rank 1 the greedy answer starts with the whole
  reference, so it holds every reference whatever follows, and nothing more is decoded.

``score_retrieval`` scores one plugin alone (no reference side): the study runs ``causal`` once per
sequence and every other plugin once, instead of a diff per plugin that runs ``causal`` again.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from pyllama.attention.guard import plugin_calls, plugin_label
from pyllama.attention.registry import create_plugin, resolve_attention
from pyllama.diff import metrics
from pyllama.diff._block import classify_block
from pyllama.diff._metrics import RowSoftmax
from pyllama.diff.branch import Forked, SequenceStart, decode_answer, greedy_decode, teacher_force_rows
from pyllama.diff.probes import Probe, ProbeSource, Segment, Target, load_probe
from pyllama.diff.probes.ruler_metrics import match_all, match_part, postprocess, string_match_all, string_match_part
from pyllama.engine import Engine
from pyllama.errors import InputError
from pyllama.options import check_compress_at, compress_position

if TYPE_CHECKING:
    from pyllama.attention.base import Attention
    from pyllama.attention.spec import PluginSpec
    from pyllama.model import Model

__all__ = [
    "KeyScore",
    "RetrievalRow",
    "RetrievalRun",
    "SequenceScore",
    "decode_answer",
    "greedy_decode",
    "score_retrieval",
    "score_sequence",
    "teacher_rank",
]

BLOCK = 64


def teacher_rank(logits: np.ndarray, next_tokens: np.ndarray) -> np.ndarray:
    """Rank of each row's teacher token in float32 ``logits`` [n, vocab] (1 = the argmax, ties to
    the smaller id as ``argmax``); 0 where there is no teacher token, vocab where the row is not finite."""
    n, vocab = logits.shape
    out = np.zeros(n, dtype=np.int64)
    ok = np.nonzero(next_tokens >= 0)[0]
    if ok.size:
        t = next_tokens[ok]
        rows = logits[ok]
        lt = rows[np.arange(ok.size), t][:, None]
        above = (rows > lt).sum(axis=1)
        ties = (rows == lt).sum(axis=1)
        for i in np.nonzero(ties > 1)[0]:  # rare: count only the equal logits of smaller ids
            above[i] += int((rows[i, : t[i]] == lt[i, 0]).sum())
        out[ok] = above + 1
    out[~metrics.finite_rows(logits)] = vocab
    return out


@dataclass
class KeyScore:
    """One plugin's scores on one retrieval sequence."""

    logp: float  # log P(key tokens), summed
    loss: float  # mean NLL of the key tokens (nats per token)
    ranks: tuple[int, ...]
    greedy: str | None = None  # what greedy decoding writes after the prompt (as many tokens as the key)
    match: bool | None = None  # greedy contains the key (ruler: every reference)
    match_all: float | None = None  # ruler: the share of the references that greedy holds
    match_part: float | None = None  # ruler: 1.0 when greedy holds any reference

    @property
    def p(self) -> float:
        return math.exp(self.logp) if math.isfinite(self.logp) else 0.0

    @property
    def max_rank(self) -> int:
        return max(self.ranks) if self.ranks else 0

    @property
    def retrieves(self) -> bool:
        return bool(self.ranks) and self.max_rank == 1


@dataclass
class RetrievalRow:
    """A retrieval sequence and the two sides' scores (``b`` is None for a one-plugin run)."""

    segment: str
    kind: str  # passkey, copy
    key: str
    depth: float | None
    length: int  # tokens in the sequence
    requested: int
    needle: int  # first token of the key in the haystack
    answer: int  # first scored token
    distance: int
    a: KeyScore
    b: KeyScore | None = None
    task: str = ""  # ruler: the task
    answers: tuple[str, ...] = ()  # ruler: the references
    context_end: int = -1  # ruler: the question's first token

    def both(self) -> tuple[KeyScore, KeyScore]:
        """Both sides' scores: a diff's row (a one-plugin run's row has no ``b``)."""
        if self.b is None:
            raise ValueError(f"retrieval row {self.segment}: one plugin's scores, not a diff's")
        return self.a, self.b

    def flat(self) -> dict:
        """One flat record (JSON, CSV, pandas): the sequence's fields, then each side's with _a / _b."""
        out = {k: getattr(self, k) for k in ("segment", "kind", "key", "depth", "length", "needle", "answer")}
        out["distance"] = self.distance
        if self.kind == "ruler":
            out.update(task=self.task, answers=list(self.answers), context_end=self.context_end)
        for side, score in (("a", self.a), ("b", self.b)):
            if score is None:
                continue
            out.update(
                {
                    f"p_{side}": score.p,
                    f"logp_{side}": score.logp,
                    f"loss_{side}": score.loss,
                    f"max_rank_{side}": score.max_rank,
                    f"ranks_{side}": list(score.ranks),
                    f"greedy_{side}": score.greedy,
                    f"match_{side}": score.match,
                    f"retrieves_{side}": score.retrieves,
                }
            )
            if self.kind == "ruler":
                out.update({f"match_all_{side}": score.match_all, f"match_part_{side}": score.match_part})
        return out


def summarize(rows: Sequence[RetrievalRow], side: str) -> dict:
    """Summary scalars of one side: retrieval rate and mean log P(key) over the passkey rows,
    greedy exact-match rate, mean loss on the second copy; RULER's scores (:func:`ruler_summary`)."""
    scores = [(r.kind, getattr(r, side)) for r in rows if getattr(r, side) is not None]
    keys = [s for k, s in scores if k == "passkey"]
    copies = [s for k, s in scores if k == "copy"]
    out: dict = {}
    if keys:
        out[f"retrieval_{side}"] = float(np.mean([s.retrieves for s in keys]))
        out[f"key_logp_{side}"] = float(np.mean([s.logp for s in keys]))
        matches = [s.match for s in keys if s.match is not None]
        out[f"greedy_match_{side}"] = float(np.mean(matches)) if len(matches) == len(keys) else None
    if copies:
        out[f"copy_loss_{side}"] = float(np.mean([s.loss for s in copies]))
        out[f"copy_rank1_{side}"] = float(np.mean([np.mean(np.array(s.ranks) == 1) for s in copies]))
    return out | ruler_summary([r for r in rows if r.kind == "ruler" and getattr(r, side) is not None], side)


def ruler_summary(rows: Sequence[RetrievalRow], side: str) -> dict:
    """One side over RULER sequences: ``ruler_score`` and ``ruler_part`` (RULER's string_match_all
    and string_match_part of the greedy answers, in percent; None unless every answer is known),
    ``ruler_logp`` (mean log P(answer), teacher-forced) and ``ruler_rank1`` (the share of
    sequences whose every answer token is rank 1)."""
    if not rows:
        return {}
    scores = [getattr(r, side) for r in rows]
    preds = [s.greedy for s in scores]
    known = all(p is not None for p in preds)
    refs = [r.answers for r in rows]
    return {
        f"ruler_score_{side}": string_match_all(preds, refs) if known else None,
        f"ruler_part_{side}": string_match_part(preds, refs) if known else None,
        f"ruler_logp_{side}": float(np.mean([s.logp for s in scores])),
        f"ruler_rank1_{side}": float(np.mean([s.retrieves for s in scores])),
    }


def key_score(
    seg: Segment,
    logp: np.ndarray,
    ranks: np.ndarray,
    top1: np.ndarray,
    decode: Callable[[], list[int]] | None,
    tokenizer,
) -> KeyScore:
    """The scores of the rows predicting ``seg.target``'s tokens (``logp``/``ranks``/``top1`` of those rows)."""
    t = _target(seg)
    key_ids = seg.tokens[t.start : t.start + t.length]
    lp = float(np.sum(logp))
    score = KeyScore(lp, -lp / max(1, t.length), tuple(int(r) for r in ranks))
    if t.kind not in ("passkey", "ruler"):
        return score
    chain = None
    if np.array_equal(top1, key_ids):
        chain = key_ids.tolist()  # the teacher-forced chain is the greedy chain
    elif decode is not None:
        chain = decode()
    if chain is not None and tokenizer is not None:
        score.greedy = tokenizer.decode([int(seg.tokens[t.prompt - 1]), *chain])
        score.match = t.key in score.greedy
        if t.kind == "ruler":
            score.greedy = postprocess(score.greedy)  # as RULER's evaluation reads a prediction
            score.match_all = match_all(score.greedy, t.answers)
            score.match_part = match_part(score.greedy, t.answers)
            score.match = score.match_all == 1.0
    return score


@dataclass
class RetrievalRun:
    """One plugin's scores over a probe (``score_retrieval``)."""

    spec: str
    probe: str
    rows: list[RetrievalRow]
    memory: list[int]  # memory_bytes() at the last position of each scored sequence
    seconds: float
    positions: int
    notes: list[str] = field(default_factory=list)

    @property
    def summary(self) -> dict:
        return {"spec": self.spec, "probe": self.probe, "positions": self.positions, **summarize(self.rows, "a")}


def score_retrieval(
    model: Model,
    attention: str | PluginSpec | Attention | None,
    probe: ProbeSource,
    threads: int | None = None,
    greedy: bool = False,
    block: int = BLOCK,
    compress_at: int | str | None = "context",
) -> RetrievalRun:
    """Teacher-force every retrieval sequence of ``probe`` through one plugin and score it.

    The hidden states of the haystack are not classified (only the rows predicting scored tokens
    are), so a sequence costs one forward of its positions. The scores are those of the same plugin
    in a diff (the same bits; tested). ``greedy=True`` decodes for real where the chain leaves the key.
    ``compress_at``: the compression event, as in a diff (default: after each sequence's context)."""
    t0 = time.perf_counter()
    config = model.config
    where = check_compress_at(compress_at)
    attention = resolve_attention(attention)  # once: it builds the plugin and names it (canonical spec)
    pr = load_probe(probe, model.tokenizer, config.seq_len)
    label = plugin_label(attention)
    plugin = create_plugin(attention)
    n_threads = max(1, int(threads or getattr(model, "threads", 1) or 1))
    with plugin_calls(label, "init"):
        engine = Engine(config, model.weights, plugin, n_threads, max_block=block)
    rows, memory, notes, positions = [], [], [], 0
    for seg in pr.segments:
        if seg.target is None:
            continue
        if len(seg) > engine.max_positions:
            notes.append(f"{seg.name}: {len(seg):,} tokens, {label} holds {engine.max_positions:,}: not scored")
            continue
        event = compress_position(where, seg.context_end)
        scored = score_sequence(engine, seg, model.tokenizer, label, event, greedy=greedy, block=block)
        memory.append(scored.last_bytes)
        positions += scored.positions
        rows.append(_row(seg, scored.score))
    if not rows and not notes:
        raise InputError(f"probe {pr.name}: no retrieval sequence to score (use passkey, needle, copy or ruler)")
    return RetrievalRun(label, pr.name, rows, memory, time.perf_counter() - t0, positions, notes)


@dataclass
class SequenceScore:
    """One plugin's scores on one retrieval sequence (``score_sequence``), with its ledger right
    after the compression event (-1: none ran) and at the last position, and the positions run."""

    score: KeyScore
    event_bytes: int
    last_bytes: int
    positions: int


def score_sequence(
    engine: Engine,
    seg: Segment,
    tokenizer,
    label: str,
    event: int = -1,
    start: SequenceStart | None = None,
    greedy: bool = True,
    block: int = BLOCK,
) -> SequenceScore:
    """Score the retrieval sequence ``seg`` on ``engine``'s plugin: teacher-forced from position 0
    (or from ``start``: :mod:`pyllama.diff.branch`), the compression event after position ``event``
    (-1: none), only the rows predicting the answer classified; ``greedy``: decode the answer for
    real where the teacher-forced chain leaves it: from the plugin's snapshot where the answer
    begins (a plugin that forks), else from position 0 again, or from ``start``."""
    t = _target(seg)
    scored = np.arange(t.start - 1, t.start + t.length - 1)  # the rows predicting the scored tokens
    fork = t.prompt - 1 if greedy and t.prompt == t.start else -1  # the first scored row: its logits go on
    kept = teacher_force_rows(engine, seg, scored, label, event, start, block, fork)
    n_threads = engine.n_threads
    config = engine.config
    logits = np.zeros((scored.size, config.vocab_size), dtype=np.float32)
    classify_block(engine.weights.classifier, kept.hidden, logits, n_threads)
    nxt = seg.tokens[scored + 1].astype(np.int32)
    lp, ranks = np.zeros(scored.size), np.zeros(scored.size, dtype=np.int64)
    softmax = RowSoftmax(scored.size, config.vocab_size)  # the diff's own metrics: the same bits
    softmax.compute(logits, n_threads)
    softmax.teacher(logits, nxt, lp, ranks)

    def decode() -> list[int]:
        if kept.snapshot is not None:
            return decode_answer(engine, seg, event, Forked(kept.snapshot, t.prompt, logits[0]))
        return decode_answer(engine, seg, event, start)

    score = key_score(seg, lp, ranks, softmax.top1, decode if greedy else None, tokenizer)
    return SequenceScore(score, kept.event_bytes, kept.last_bytes, kept.positions)


def _target(seg: Segment) -> Target:
    """What a retrieval sequence scores; only sequences that have a target are scored."""
    if seg.target is None:
        raise ValueError(f"sequence {seg.name} is not a retrieval sequence: it has no target to score")
    return seg.target


def _row(seg: Segment, a: KeyScore, b: KeyScore | None = None) -> RetrievalRow:
    t = _target(seg)
    return RetrievalRow(
        seg.name,
        t.kind,
        t.key,
        t.depth,
        len(seg),
        t.requested,
        t.needle,
        t.start,
        t.distance,
        a,
        b,
        t.task,
        t.answers,
        t.context_end,
    )


def diff_rows(
    pr: Probe,
    compared: Sequence[int],
    offsets: Sequence[int],
    cols: dict[str, np.ndarray],
    decoders: Sequence[Callable[[Segment], list[int]] | None],
    tokenizer,
) -> list[RetrievalRow]:
    """The retrieval rows of a diff, from its per-position columns (``logp_*``, ``rank_*``, ``top1_*``)."""
    out = []
    for seg, n, off in zip(pr.segments, compared, offsets, strict=True):
        t = seg.target
        if t is None or t.start + t.length > n:
            continue  # not a retrieval sequence, or its answer is past what both plugins hold
        rows = slice(off + t.start - 1, off + t.start + t.length - 1)
        scores = []
        for side, decode in zip("ab", decoders, strict=True):
            dec = None if decode is None else (lambda seg=seg, decode=decode: decode(seg))
            scores.append(
                key_score(
                    seg,
                    cols[f"logp_{side}"][rows],
                    cols[f"rank_{side}"][rows],
                    cols[f"top1_{side}"][rows],
                    dec,
                    tokenizer,
                )
            )
        out.append(_row(seg, *scores))
    return out
