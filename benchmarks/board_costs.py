"""What a leaderboard's units cost, read from its rows: the figures behind ``pyllama/leaderboard/cost.py``.

    python benchmarks/board_costs.py docs/boards/smollm2-4096
    python benchmarks/board_costs.py docs/boards/gemma3-4096 --skip-units 6

A board's rows carry each unit's recorded context (``context_cpu_seconds``, on ``causal``'s row) and each
branch's own CPU seconds and way (``record``, ``replay``, ``prefix``, ``whole``; ``context`` for
``causal``). Dividing a branch's seconds by its unit's context gives its cost in context passes, the
unit ``--dry-run`` counts in, so the same board measured on any machine gives the cost model's
constants. A prefix branch's passes are split as ``cost.py`` counts them: its own constant plus a whole
run's passes times the share of the context after the positions it keeps.

Prints the units' CPU seconds, the passes by way with the constants they give (``cost.py``'s
``BRANCH_PASSES`` entry), and the mean CPU seconds of each method at each ratio, as Markdown.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from pyllama.leaderboard.methods import CEILING, kept_positions
from pyllama.leaderboard.starts import WAYS
from pyllama.sweep.table import ROWS, RowStore


def read_rows(board: Path) -> list[dict]:
    """The rows of a board folder as ``--resume`` reads them (a cell's later row replaces an earlier one)."""
    if not (board / ROWS).is_file():
        sys.exit(f"board_costs: {board / ROWS} not found; give a board folder (--out of pyllama leaderboard)")
    return list(RowStore(board, resume=True).rows.values())


def unit_of(row: dict) -> tuple:
    return row["model_sha256"], row["task"], row["length"], row["seed"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("board", type=Path, help="a board folder (pyllama leaderboard --out)")
    ap.add_argument(
        "--skip-units",
        type=int,
        default=0,
        metavar="K",
        help="leave out the board's first K units, in the order their rows were written (units run before a "
        "change to the code)",
    )
    args = ap.parse_args()
    units: dict[tuple, list[dict]] = defaultdict(list)
    for row in read_rows(args.board):
        if row.get("error") is None:
            units[unit_of(row)].append(row)
    for unit in list(units)[: args.skip_units]:
        del units[unit]
    rows = [r for rs in units.values() for r in rs]
    context_s = {u: r["context_cpu_seconds"] for u, rs in units.items() for r in rs if r["method"] == CEILING}
    if not context_s:
        sys.exit("board_costs: no unit with causal's row (the recorded context) among the rows")
    totals = [context_s[u] + sum(r["cpu_seconds"] for r in units[u]) for u in context_s]
    print(
        f"{len(context_s)} units, {len(rows)} rows: {min(totals):.0f}-{max(totals):.0f} CPU s a unit "
        f"(mean {statistics.fmean(totals):.0f}); the recorded context {min(context_s.values()):.1f}-"
        f"{max(context_s.values()):.1f} s (mean {statistics.fmean(context_s.values()):.1f})\n"
    )

    passes: dict[str, list[float]] = defaultdict(list)
    seconds: dict[str, float] = defaultdict(float)
    run_share: list[float] = []
    for u, ctx in context_s.items():
        for r in units[u]:
            passes[r["way"]].append(r["cpu_seconds"] / ctx)
            seconds[r["way"]] += r["cpu_seconds"]
            if r["way"] == "prefix":
                run_share.append(1.0 - kept_positions(r["ratio"], r["context"]) / r["context"])
    all_seconds = sum(totals)
    print("| way | branches | passes (mean) | share of the units' CPU s |\n| --- | ---: | ---: | ---: |")
    print(f"| recorded context | {len(context_s)} | 1 | {100 * sum(context_s.values()) / all_seconds:.0f}% |")
    for way in ("context", *WAYS):
        if passes[way]:
            print(
                f"| {way} | {len(passes[way])} | {statistics.fmean(passes[way]):.2f} | "
                f"{100 * seconds[way] / all_seconds:.0f}% |"
            )
    whole = statistics.fmean(passes["whole"]) if passes["whole"] else 0.0
    constants = {w: round(statistics.fmean(passes[w]), 2) for w in WAYS if passes[w]}
    if run_share:  # cost.py: a prefix branch is ways["prefix"] + ways["whole"] x the share run
        constants["prefix"] = round(statistics.fmean(passes["prefix"]) - whole * statistics.fmean(run_share), 2)
        print(f"\nprefix branches run {100 * statistics.fmean(run_share):.0f}% of the context on average")
    ceiling = round(statistics.fmean(passes["context"]), 2)
    print(f'\nBranchPasses("{args.board.name}", {ceiling}, {constants})  # cost.py\'s BRANCH_PASSES\n')

    by_cell: dict[tuple[str, str], dict[float, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        if r["method"] != CEILING:
            by_cell[(r["method"], r["way"])][r["ratio"]].append(r["cpu_seconds"])
    ratios = sorted({ratio for cells in by_cell.values() for ratio in cells})
    print("| method | way | " + " | ".join(f"{x:g}" for x in ratios) + " |")
    print("| --- | --- | " + " | ".join("---:" for _ in ratios) + " |")
    for (method, way), cells in sorted(by_cell.items(), key=lambda kv: (WAYS.index(kv[0][1]), kv[0][0])):
        print(
            f"| {method} | {way} | "
            + " | ".join(f"{statistics.fmean(cells[x]):.1f}" if x in cells else "" for x in ratios)
            + " |"
        )


if __name__ == "__main__":
    main()
