"""RULER's text and the haystacks' sources, for :mod:`.ruler_tasks`.

The templates, answer prefixes, needle sentence and noise haystack are RULER's own
(NVIDIA/RULER ``scripts/data/synthetic/constants.py``, ``niah.py``, ``variable_tracking.py``,
``common_words_extraction.py``, ``freq_words_extraction.py``), word for word, since the tasks'
shape is what the probes reproduce. Words come from the ``wonderwords`` package's lists, as RULER
draws them.

The essay haystack: RULER's is Paul Graham's essays, which cannot be shipped. Here it is
``ruler_essay.txt``, plain expository prose written for this project (about 6,200 words on rivers,
bread, clocks, maps, bridges and the like; no digits, so a numeric needle is the only number),
repeated when a sample needs more, as RULER repeats its essays. Its title lines are dropped.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

import numpy as np

# ---- RULER's text (scripts/data/synthetic/constants.py, niah.py) -----------------------------------
NIAH_TEMPLATE = (
    "Some special magic {type_needle_v} are hidden within the following text. Make sure to memorize it. "
    "I will quiz you about the {type_needle_v} afterwards.\n{context}\n"
    "What are all the special magic {type_needle_v} for {query} mentioned in the provided text?"
)
NIAH_PREFIX = " The special magic {type_needle_v} for {query} mentioned in the provided text are"
NEEDLE = "One of the special magic {type_needle_v} for {key} is: {value}."
NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
VT_TEMPLATE = (
    "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n{context}\n"
    "Question: Find all variables that are assigned the value {query} in the text above."
)
VT_PREFIX = (
    " Answer: According to the chain(s) of variable assignment in the text above, {num_v} variables are "
    "assigned the value {query}, they are: "
)
CWE_TEMPLATE = (
    "Below is a numbered list of words. In these words, some appear more often than others. Memorize the "
    "ones that appear most often.\n{context}\nQuestion: What are the 10 most common words in the above list?"
)
CWE_PREFIX = " Answer: The top 10 words that appear most often in the list are:"
FWE_TEMPLATE = (
    "Read the following coded text and track the frequency of each coded word. Find the three most "
    "frequently appeared coded words. {context}\nQuestion: Do not provide any explanation. Please ignore "
    "the dots '....'. What are the three most frequently appeared words in the above coded text?"
)
FWE_PREFIX = " Answer: According to the coded text above, the three most frequently appeared words are:"
DEPTHS = tuple(int(round(100 * i / 39)) for i in range(40))  # RULER's 40 needle depths (%) in an essay
VT_EXAMPLE_TOKENS = 500  # RULER sizes vt's worked example to 500 tokens
FULL_LENGTH = 4096  # RULER's shortest standard length; below it cwe and vt's example are scaled down


@dataclass(frozen=True)
class Draft:
    """The text of one sample. The user's message is ``instruction + context + "\\n" + question``;
    the reply starts with ``prefix`` (RULER's answer prefix, its leading space included) and the
    answer follows as ``answer_text``. ``example``: a worked exchange before the task (cwe's
    few-shot example: its user text and its reply)."""

    instruction: str
    context: str
    question: str
    prefix: str
    answers: tuple[str, ...]  # RULER's reference list, in its order
    answer_text: str  # the answers as a reply presents them, with a leading space
    example: tuple[str, str] | None = None


def split_template(template: str, **values: str | int) -> tuple[str, str]:
    """(the text before ``{context}``, the text after it and its newline), filled in."""
    head, tail = template.split("{context}")  # every RULER template puts its question on a new line
    return head.format(**values), tail.removeprefix("\n").format(**values)


def singular(text: str) -> str:
    """RULER's edits of the niah template when one value is asked for (``niah.py``)."""
    return text.replace("Some", "A").replace("are all", "is").replace("are", "is").replace("answers", "answer")


# ---- word sources ----------------------------------------------------------------------------------
@lru_cache(maxsize=1)
def wonderwords_lists() -> dict[str, tuple[str, ...]]:
    """``wonderwords``' nouns, adjectives and verbs, each sorted and unique (RULER's word source)."""
    from wonderwords import RandomWord

    words = RandomWord()
    return {c: tuple(sorted(set(words.filter(include_categories=[c])))) for c in ("noun", "adjective", "verb")}


@lru_cache(maxsize=1)
def essay_words() -> tuple[str, ...]:
    """The essay haystack's words, whitespace collapsed as RULER does; title lines dropped."""
    text = resources.files(__package__).joinpath("ruler_essay.txt").read_text(encoding="utf-8")
    lines = [line for line in text.splitlines() if line.strip().endswith((".", "?", "!"))]
    return tuple(" ".join(lines).split())


class Stream:
    """A haystack as one string: ``unit()`` appended with ``joiner`` as far as it is read. Its units
    are lines (``joiner`` a newline) or the essay's words, whose units for a cut are sentences."""

    def __init__(self, unit: Callable[[], str], joiner: str) -> None:
        self.unit, self.joiner, self.text = unit, joiner, ""

    def _grow(self, size: int) -> str:
        if len(self.text) < size:
            parts, n = [self.text], len(self.text)
            while n < size:
                parts.append((self.joiner if n else "") + self.unit())
                n += len(parts[-1])
            self.text = "".join(parts)
        return self.text

    def cut(self, size: int) -> str:
        """The first ``size`` characters, without trailing space."""
        return self._grow(size)[:size].rstrip()

    def floors(self, size: int) -> list[int]:
        """Sizes <= ``size`` that cut the stream at the end of a line or sentence, and of a word."""
        text = self._grow(size + 1)
        if self.joiner == "\n":
            unit = text.rfind("\n", 0, size + 1)
        else:
            unit = max(text.rfind(end, 0, size + 1) for end in (". ", "? ", "! ")) + 1
        word = max(text.rfind(" ", 0, size + 1), text.rfind("\n", 0, size + 1))
        return [max(unit, 0), max(word, 0)]


def insert_lines(lines: list[str], inserts: list[str], places: np.ndarray) -> list[str]:
    """RULER's insertion into a line haystack: each insert before line ``int(place * len(lines))``."""
    out = list(lines)
    at = sorted((int(p * len(lines)) for p in places), reverse=True)
    for index, line in zip(at, inserts, strict=True):
        out.insert(index, line)
    return out
