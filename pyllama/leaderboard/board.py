"""A leaderboard: models x RULER tasks x lengths x samples, every method at every ratio; checked.

From the command line (``pyllama leaderboard``) or a study file that ``pyllama sweep`` runs::

    [leaderboard]
    models = ["SmolLM2-135M-Instruct"]      # paths relative to the file, or downloaded names
    methods = ["snapkv", "sink"]            # default: every method that takes a ratio
    ratios = [0, 0.25, 0.5, 0.75, 0.9]     # share of the context removed; 0 is causal
    tasks = ["ruler"]                       # RULER's 11, or task names
    lengths = [4096]
    samples = 10                            # seeds seed .. seed + samples - 1 per task and length
    seed = 0

Everything that can be checked without running a model is checked here, and refused in one line
naming the entry: an unknown method or one without a ratio, a ratio outside [0, 1), an unknown task,
a length below RULER's 64 tokens, no samples. The plan (``runner.py``) checks what needs the model: a
length beyond its context, a task whose smallest sample does not fit the length.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyllama.diff.probes.ruler import RULER_NAME, TASK_NAMES
from pyllama.errors import InputError, PyllamaError
from pyllama.leaderboard.methods import check_method, check_ratio, ratio_methods
from pyllama.outputs import model_inputs

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

__all__ = ["Board", "BoardError", "DEFAULT_RATIOS", "DEFAULT_SAMPLES", "is_board_file", "load_board", "quick_board"]

TABLE = "leaderboard"  # the TOML table of a board file
KEYS = ("models", "tokenizer", "methods", "ratios", "tasks", "lengths", "samples", "seed")
DEFAULT_RATIOS = (0.0, 0.25, 0.5, 0.75, 0.9)
DEFAULT_LENGTH = 4096
# Samples per task, length and method: the smallest n whose rankings of the methods agree with the
# whole board's (Kendall's tau >= 0.9) in 95% of bootstrap draws, for the score that ranks them,
# the teacher-forced log P(answer): 10, measured on SmolLM2 (7 event methods x 2 ratios, 4 tasks x 16
# samples at 1,024 tokens). RULER's string match needed more than 16 there (65% of draws at 16); see
# stability.py and docs/leaderboard.md, "Samples worth their cost".
DEFAULT_SAMPLES = 10
# --quick: every method, two ratios, four tasks (one per RULER family), one sample, 2,048 tokens
QUICK_RATIOS = (0.5, 0.9)
QUICK_TASKS = ("niah_single_2", "vt", "cwe", "fwe")
QUICK_LENGTH = 2048


class BoardError(InputError):
    """A leaderboard that cannot be run as given; the message names the entry."""


@dataclass
class Board:
    models: list[str]
    methods: list[str] = field(default_factory=list)  # empty: every method that takes a ratio
    ratios: list[float] = field(default_factory=lambda: list(DEFAULT_RATIOS))
    tasks: list[str] = field(default_factory=lambda: [RULER_NAME])
    lengths: list[int] = field(default_factory=lambda: [DEFAULT_LENGTH])
    samples: int = DEFAULT_SAMPLES
    seed: int = 0
    tokenizer: str | None = None
    source: str = "leaderboard"  # the file name, or the command, for messages
    base_dir: Path = field(default_factory=Path.cwd)
    file: str | None = None

    def __post_init__(self) -> None:
        self.methods = self._check("methods", self.methods or ratio_methods(), check_method)
        if not self.methods:
            raise self.fail("methods", "no method takes a ratio here: name some")
        self.ratios = sorted(set(self._check("ratios", self.ratios, check_ratio)))
        self.tasks = list(dict.fromkeys(t for name in self.tasks for t in _task_names(name, self)))
        for name, values, low in (
            ("lengths", self.lengths, 64),
            ("samples", [self.samples], 1),
            ("seed", [self.seed], 0),
        ):
            bad = [v for v in values if isinstance(v, bool) or not isinstance(v, int) or v < low]
            if bad or not values:
                raise self.fail(name, f"{bad[0] if bad else '[]'!r}: expected whole numbers >= {low}")
        if not self.models:
            raise self.fail("models", "missing: a board needs at least one model")

    def fail(self, entry: str, problem: str) -> BoardError:
        return BoardError(f"{self.source}: {entry}: {problem}")

    def _check(self, entry: str, values: list, check) -> list:
        out = []
        for v in values:
            try:
                out.append(check(v))
            except PyllamaError as exc:
                raise self.fail(entry, str(exc)) from None
        return out

    def path(self, text: str) -> str:
        """A path of the board made absolute against its file's folder; a bare name that is not a
        file there stays as given, for the downloaded-name lookup."""
        p = Path(os.path.expanduser(text))
        if p.is_absolute():
            return str(p)
        beside = self.base_dir / p
        if beside.exists() or os.sep in text:
            return str(beside.resolve())
        return text

    def input_files(self) -> list[tuple[str, str]]:
        """What a run reads, named as messages name it: the board's file, the models and tokenizers."""
        files = [("the leaderboard file", self.file)] if self.file else []
        tokenizer = self.path(self.tokenizer) if self.tokenizer else None
        for i, name in enumerate(self.models):
            for what, path in model_inputs(self.path(name), tokenizer).items():
                files.append((f"{what} of models[{i}]", path))
        return files


def _task_names(name: Any, board: Board) -> list[str]:
    if name == RULER_NAME:
        return list(TASK_NAMES)
    if name not in TASK_NAMES:
        raise board.fail("tasks", f"unknown task {name!r}; RULER's are {', '.join(TASK_NAMES)} (or ruler: all 11)")
    return [name]


def quick_board(models: list[str], tokenizer: str | None = None, methods: list[str] | None = None) -> Board:
    """``--quick``: every method (or ``methods``), two ratios, four tasks, one sample, 2,048 tokens."""
    return Board(
        models,
        list(methods or []),
        [0.0, *QUICK_RATIOS],
        list(QUICK_TASKS),
        [QUICK_LENGTH],
        1,
        tokenizer=tokenizer,
        source="--quick",
    )


def _read_toml(path: Path) -> dict:
    if not path.is_file():
        raise BoardError(f"{path}: no such file")
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise BoardError(f"{path}: not UTF-8 text; a board file is TOML saved as UTF-8") from None
    except tomllib.TOMLDecodeError as exc:
        raise BoardError(f"{path}: not valid TOML ({exc})") from None


def is_board_file(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a TOML file with a ``[leaderboard]`` table (``pyllama sweep`` runs it as a board)."""
    try:
        return isinstance(_read_toml(Path(path)).get(TABLE), dict)
    except BoardError:
        return False


def load_board(source: str | os.PathLike | dict) -> Board:
    """A Board from a TOML file's ``[leaderboard]`` table, or from a dict of that table's shape."""
    if isinstance(source, dict):
        data, name, base, file = source, "leaderboard", Path.cwd(), None
    else:
        path = Path(source)
        table = _read_toml(path).get(TABLE)
        if not isinstance(table, dict):
            raise BoardError(f"{path}: no [{TABLE}] table")
        data, name, base, file = table, path.name, path.resolve().parent, str(source)
    unknown = [k for k in data if k not in KEYS]
    if unknown:
        raise BoardError(f"{name}: {unknown[0]}: unknown entry; a leaderboard has {', '.join(KEYS)}")
    lists = {}
    for key in ("models", "methods", "ratios", "tasks", "lengths"):
        value = data.get(key)
        if value is not None and not isinstance(value, list):
            value = [value]
        if value is not None and not value:
            raise BoardError(f"{name}: {key}: is empty (leave it out for the default)")
        if value is not None:
            lists[key] = value
    if "models" not in lists:
        raise BoardError(f"{name}: models: missing: a board needs at least one model")
    if not all(isinstance(m, str) for m in lists["models"] + lists.get("methods", [])):
        raise BoardError(f"{name}: models and methods are strings")
    board = Board(
        lists["models"],
        lists.get("methods", []),
        lists.get("ratios", list(DEFAULT_RATIOS)),
        lists.get("tasks", [RULER_NAME]),
        lists.get("lengths", [DEFAULT_LENGTH]),
        data.get("samples", DEFAULT_SAMPLES),
        data.get("seed", 0),
        data.get("tokenizer"),
        name,
        base,
        file,
    )
    return board
