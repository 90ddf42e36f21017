"""The RULER leaderboard: every KV-cache method's score against the bytes it removes, in one command.

    import pyllama.leaderboard as lb
    df = lb.run({"models": ["SmolLM2-135M-Instruct"], "methods": ["sink", "snapkv"]}, out="board")
    lb.samples_needed(df)                 # how many samples each score needs to rank the methods

Compress once, branch many. A method that compresses at the context's end attends exactly until
then, so one ``causal`` run of a sample's context (``record``: each layer's keys, values and
queries, about 0.75 GB for SmolLM2 at 4,096 tokens) determines its state there; every such method
and ratio starts from it (``starts``) and runs only the question and the answer
(``pyllama.diff.branch``), bit for bit what it gives from position 0.

``board``: what a board is and its checks; ``methods``: a method at a ratio as a spec; ``record``
and ``starts``: the context run once and how each branch starts from it; ``unit``: one sample, its
context and all its branches, a row each; ``runner``: planning, Dask, resume; ``report``: the table,
Markdown and figure; ``stability``: the samples a score needs; ``cost``: what a board will cost
(``--dry-run``).
"""

from pyllama.leaderboard.board import DEFAULT_SAMPLES, Board, BoardError, load_board, quick_board
from pyllama.leaderboard.cost import dry_run
from pyllama.leaderboard.methods import method_spec, ratio_methods
from pyllama.leaderboard.record import ContextRecord, record_bytes
from pyllama.leaderboard.report import board_points, figure, markdown
from pyllama.leaderboard.runner import plan_board, run
from pyllama.leaderboard.stability import Stability, samples_needed
from pyllama.leaderboard.unit import Unit, run_unit

__all__ = [
    "DEFAULT_SAMPLES",
    "Board",
    "BoardError",
    "ContextRecord",
    "Stability",
    "Unit",
    "board_points",
    "dry_run",
    "figure",
    "load_board",
    "markdown",
    "method_spec",
    "plan_board",
    "quick_board",
    "ratio_methods",
    "record_bytes",
    "run",
    "run_unit",
    "samples_needed",
]
