"""RULER's synthetic tasks as probes: ``ruler:task=niah_multikey_2,length=4096,seed=3``.

``ruler`` alone is RULER's 11 synthetic tasks (its two QA tasks need SQuAD and HotpotQA and are
left out, so an average over these is not RULER's 13-task average). The tasks and their text are
:mod:`.ruler_tasks`; this module renders a sample for a model, sizes it and marks its spans.

* **Rendering.** On a model whose tokenizer file has a chat template (and ``chat=auto`` or
  ``yes``), the task's text is the user's message, rendered with the model's own template, and the
  reply starts with RULER's answer prefix (its leading space dropped), as RULER puts the prefix after
  the model template. cwe's worked example is an earlier user turn and its reply. Elsewhere the text
  is RULER's plain layout: the example, a newline, the task, the prefix.
* **Length.** ``length`` is the whole sequence in the model's tokens: context, question, answer
  prefix and the answer. The haystack is sized by bisection on the token count of the whole
  rendered text, to the largest size that fits (a cut at a word end when that is within 1% of
  ``length``, else at a character; cwe's list grows by one entry, fwe's text by one word), so a
  sequence is at most ``length`` tokens and within 1% of it.
  RULER sizes by its tokenizer too, but keeps ``tokens_to_generate`` free instead of the answer.
* **The answer.** The teacher-forced target is the reference answers in RULER's order, written as a
  reply would: niah and fwe joined by ", ", vt by spaces (as RULER's worked example of vt), cwe
  numbered "1. w 2. w" (as its worked example of cwe).
* **Spans** (:class:`~pyllama.diff.probes.sequences.Target`): ``context_end``, the first token of
  the question (the compression event fires after the token before it: query-agnostic); ``prefix``,
  the first token of the answer prefix; ``start`` .. ``start + length - 1``, the answer; ``needle``,
  the first token of the first answer in the context (RULER's ``token_position_answer``);
  ``answers``, the references; ``generate``, RULER's ``tokens_to_generate`` (what greedy decoding
  writes at most, stopping at an end token); ``stop``, the tokenizer's end tokens.

Options: ``task`` (names separated by ``/``; default all 11), ``length`` (tokens; lengths separated by
``/``; default 4,096 or the context if shorter), ``seed`` (0), ``samples`` (1: seeds ``seed`` ..
``seed + samples - 1``), ``chat`` (auto, yes, no). Scores: :mod:`pyllama.diff.retrieval_scores`
(RULER's ``string_match_all`` and ``string_match_part`` on the greedy answer, log P(answer) and the
rank of each answer token).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from pyllama.diff.probes.retrieval import byte_offsets, encode_text, stream_bytes, use_chat
from pyllama.diff.probes.ruler_tasks import TASK_NAMES, TASKS, drafter
from pyllama.diff.probes.ruler_text import Draft
from pyllama.diff.probes.sequences import Probe, Segment, Target
from pyllama.errors import InputError

if TYPE_CHECKING:
    from pyllama.tokenizer.base import Tokenizer

__all__ = ["RULER_NAME", "RulerSample", "TASK_NAMES", "ruler_probe", "ruler_sample"]

RULER_NAME = "ruler"
DEFAULT_LENGTH = 4096
TOLERANCE = 0.01  # a sequence is within 1% of the length asked for
_OPTIONS = {
    "task": "tasks separated by / (default: all 11)",
    "length": "tokens in each sequence, lengths separated by / (default 4096, or the context if shorter)",
    "seed": "the first seed (0)",
    "samples": "sequences per task and length, seeds seed, seed+1, ... (1)",
    "chat": "render with the file's chat template: auto (if it has one), yes, no",
}


@dataclass(frozen=True)
class RulerSample:
    """One generated sample: its draft, rendered text and tokens, and its spans (``target``)."""

    task: str
    seed: int
    draft: Draft
    text: str  # the whole sequence as rendered (chat template included), answer last
    tokens: np.ndarray  # int32
    target: Target


def parse_ruler_spec(text: str, seq_len: int) -> dict[str, Any]:
    """The options of a ``ruler[:option=value,...]`` spec, checked, with defaults."""
    _, _, args = text.partition(":")
    values: dict[str, Any] = {
        "task": TASK_NAMES,
        "length": (min(DEFAULT_LENGTH, seq_len),),
        "seed": 0,
        "samples": 1,
        "chat": "auto",
    }
    for item in filter(None, (a.strip() for a in args.split(","))):
        key, eq, raw = (s.strip() for s in item.partition("="))
        if key not in _OPTIONS or not eq:
            listing = "; ".join(f"{k}: {h}" for k, h in _OPTIONS.items())
            raise InputError(f"probe {text!r}: expected option=value, got {item!r}; ruler takes {listing}")
        if key == "task":
            names = tuple(n.strip() for n in raw.split("/") if n.strip())
            unknown = [n for n in names if n not in TASKS]
            if unknown or not names:
                raise InputError(f"probe {text!r}: unknown task {raw!r}; RULER's are {', '.join(TASK_NAMES)}")
            values["task"] = names
        elif key == "chat":
            if raw not in ("auto", "yes", "no"):
                raise InputError(f"probe {text!r}: chat={raw}: expected auto, yes or no")
            values["chat"] = raw
        else:
            try:
                numbers = tuple(int(x) for x in raw.split("/") if x.strip())
            except ValueError:
                raise InputError(f"probe {text!r}: {key}={raw!r} is not a whole number") from None
            if not numbers or (key != "length" and len(numbers) > 1):
                raise InputError(f"probe {text!r}: {key}={raw!r}: expected {'lengths' if key == 'length' else 'one'}")
            values[key] = numbers if key == "length" else numbers[0]
    if any(n < 64 for n in values["length"]):
        raise InputError(f"probe {text!r}: length {min(values['length'])} is below 64 tokens")
    if values["seed"] < 0 or values["samples"] < 1:
        raise InputError(f"probe {text!r}: expected seed >= 0 and samples >= 1")
    return values


def ruler_probe(text: str, tokenizer: Tokenizer, seq_len: int) -> Probe:
    """The Probe a ``ruler`` spec names: one sequence per task, length and seed."""
    v = parse_ruler_spec(text, seq_len)
    chat = use_chat(tokenizer, v["chat"], text)
    segments = []
    for task in v["task"]:
        for length in v["length"]:
            for seed in range(v["seed"], v["seed"] + v["samples"]):
                s = ruler_sample(tokenizer, task, length, seed, chat)
                t = s.target
                note = (
                    f"{task}, seed {seed}: {len(s.tokens):,} tokens of {length:,}; question at {t.context_end}, "
                    f"answer at {t.start}"
                )
                segments.append(Segment(f"{task}-n{length}-s{seed}", "ruler", s.tokens, note=note, target=t))
    return Probe(text, segments)


USER_MARK = "\x00ruler-user\x00"  # stands for the user's text in a chat frame rendered once


def render(tokenizer: Tokenizer, draft: Draft, chat: bool, frame: str | None = None) -> tuple[str, str]:
    """(the text up to the answer, the answer prefix as it appears there): the answer follows.
    ``frame``: the chat template already rendered around ``USER_MARK`` (see ``_frame``)."""
    user = f"{draft.instruction}{draft.context}\n{draft.question}"
    prefix = draft.prefix.rstrip()  # the answer brings its own leading space
    if chat:
        prefix = prefix.lstrip()  # it starts the assistant's turn
        return (_frame(tokenizer, draft, user) if frame is None else frame.replace(USER_MARK, user)) + prefix, prefix
    head = "" if draft.example is None else f"{draft.example[0]}{draft.example[1]}\n"
    return f"{head}{user}{prefix}", prefix


def _frame(tokenizer: Tokenizer, draft: Draft, user: str = USER_MARK) -> str:
    """The chat template rendered for ``user`` (after cwe's worked example as an earlier turn)."""
    from pyllama.chat import messages, prompt_text

    history = []
    if draft.example is not None:
        history = [
            {"role": "user", "content": draft.example[0]},
            {"role": "assistant", "content": draft.example[1].lstrip()},
        ]
    return prompt_text(tokenizer, messages(user, history=history))


def ruler_sample(tokenizer: Tokenizer, task: str, length: int, seed: int, chat: bool, fast: bool = True) -> RulerSample:
    """One sample of ``task``, ``length`` tokens at most (and within 1% where its units allow).

    In chat, the sizing renders the template once around a mark for the user's text (rendering it
    for every trial size took a third of the time); the final text is rendered for real, and if a
    template treats the text so that the two differ, the sample is sized again rendering each trial
    (``fast=False``)."""
    spec = TASKS[task]

    def count(text: str) -> int:
        return len(encode_text(tokenizer, text, chat))

    maker = drafter(spec, seed, length, count)
    frame = _frame(tokenizer, maker.draft(maker.min_size)) if chat and fast else None

    def total(size: int) -> int:
        draft = maker.draft(size)
        return count(render(tokenizer, draft, chat, frame)[0] + draft.answer_text)

    size = _largest_fitting(total, length, task, maker.min_size)
    for floor in maker.floors(size):  # a cut at a line or sentence end, else a word end, if close enough
        if floor < size and total(floor) >= (1 - TOLERANCE) * length:
            size = floor
            break
    draft = maker.draft(size)
    head, prefix = render(tokenizer, draft, chat)
    if frame is not None and head != render(tokenizer, draft, chat, frame)[0]:
        return ruler_sample(tokenizer, task, length, seed, chat, fast=False)
    text = head + draft.answer_text
    ids = encode_text(tokenizer, text, chat)
    target = _spans(tokenizer, ids, draft, prefix, spec.generate, length, task)
    return RulerSample(task, seed, draft, text, np.asarray(ids, dtype=np.int32), target)


def _largest_fitting(total: Callable[[int], int], length: int, task: str, smallest: int) -> int:
    """The largest haystack size whose sequence is at most ``length`` tokens: the count grows with
    the size, by a roughly constant step, so the search extrapolates, then bisects."""
    lo, n_lo = smallest, total(smallest)
    if n_lo > length:
        raise InputError(
            f"ruler {task}: the sample with its smallest haystack takes {n_lo:,} tokens, more than "
            f"length={length:,}: ask for a longer length"
        )
    step = 64
    hi, n_hi = lo + step, total(lo + step)
    while n_hi <= length:  # aim 5% past where the slope so far says the length is reached
        slope = max(n_hi - n_lo, 1) / (hi - lo)
        lo, n_lo = hi, n_hi
        hi = lo + max(step, int((length - n_lo) / slope * 1.05) + 1)
        n_hi = total(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if total(mid) <= length:
            lo = mid
        else:
            hi = mid
    return lo


def _spans(tokenizer, ids: list[int], draft: Draft, prefix: str, generate: int, length: int, task: str) -> Target:
    """The sample's Target: where its question, answer prefix, answer and first needle are."""
    stream = stream_bytes(tokenizer, ids)
    offsets = byte_offsets(tokenizer, ids)

    def token_at(byte: int) -> int:
        return bisect.bisect_right(offsets, byte) - 1

    answer = draft.answer_text.encode()
    if not stream.endswith(answer):
        raise InputError(
            f"ruler {task}: the tokens do not end with the answer {draft.answer_text!r} (tokenizer {tokenizer!r})"
        )
    answer_at = len(stream) - len(answer)
    prefix_at = stream.rfind(prefix.encode(), 0, answer_at + 1)
    question_at = stream.rfind(draft.question.encode(), 0, max(prefix_at, 0) + 1)
    instruction = draft.instruction.encode()
    context_at = stream.rfind(instruction, 0, max(question_at, 0) + 1)
    context_at += len(instruction) if context_at >= 0 else 0
    needle_at = stream.find(draft.answers[0].encode(), max(context_at, 0), max(question_at, 0))
    if min(prefix_at, question_at, context_at, needle_at) < 0:
        raise InputError(f"ruler {task}: the tokens do not spell the task's text (tokenizer {tokenizer!r})")
    start = token_at(answer_at)
    return Target(
        "ruler",
        draft.answer_text.strip(),
        start,
        len(ids) - start,
        start,
        token_at(needle_at),
        requested=length,
        task=task,
        answers=draft.answers,
        context_end=token_at(question_at),
        prefix=token_at(prefix_at),
        generate=generate,
        stop=tuple(sorted(getattr(tokenizer, "stop_ids", ()))),
    )
