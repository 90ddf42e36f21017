"""The memories on the retrieval probes: which memory still finds a pass key, at what depth, for how many bytes.

Every built-in gets the settings of ``memories.py`` for a budget of B dense positions (one setting
per family), and is scored over a needle grid (depth x length): P(key) teacher-forced, the worst
rank of the key's tokens, and whether it retrieves the key (every key token rank 1, which is the
greedy answer being the key). ``causal`` is run once per sequence, as one more plugin, not once per
diff. Bytes are the ledger at the last position of the longest sequence; ``kmeans`` keeps the whole
K/V cache by design (it saves compute, not memory) and is shown at its real bytes.

    python experiments/retrieval.py -c SmolLM2-135M-Instruct.Q4_1.gguf --lengths 1024,2048 --budgets 512
    python experiments/retrieval.py -c stories260K.bin -z tok512.bin --lengths 256,512 --budgets 64

Each plugin's scores are saved as JSON in ``--runs`` (default: ``OUT/retrieval_runs``) and reused by
later calls (``--fresh`` runs them again), so a study can be split over several processes
(``--only SPEC``) and assembled afterwards. Writes ``retrieval.md`` (the table),
``retrieval_needle.png`` (the heatmaps) and ``retrieval_distance.png`` (P(key) against distance).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

from memories import SHARED_MODELS, settings

from pyllama import plots
from pyllama.diff.retrieval_scores import KeyScore, RetrievalRow, score_retrieval
from pyllama.errors import InputError
from pyllama.model import Model
from pyllama.outputs import check_outputs, model_inputs

REPO = Path(__file__).resolve().parents[1]
FAMILIES = ("sliding", "sink", "kmeans", "tiered", "lattice")
OUTPUTS = ("retrieval.md", "retrieval_needle.png", "retrieval_distance.png")


def specs(budget: int, longest: int) -> list[tuple[str, str]]:
    """One setting per family for ``budget`` dense positions: the first of memories.py's."""
    out, seen = [], set()
    for family, spec in settings(budget, longest):
        if family not in seen:
            seen.add(family)
            out.append((family, spec))
    return out


def _file(runs: Path, spec: str, probe: str) -> Path:
    return runs / (re.sub(r"[^A-Za-z0-9.=_-]+", "_", f"{spec}__{probe}") + ".json")


def run_one(model: Model, spec: str, probe: str, runs: Path, threads: int, fresh: bool) -> dict:
    """The saved run of ``spec`` on ``probe``, or a new one (saved)."""
    path = _file(runs, spec, probe)
    if path.is_file() and not fresh:
        return json.loads(path.read_text())
    run = score_retrieval(model, spec, probe, threads=threads)
    data = {
        "spec": spec,
        "probe": probe,
        "seconds": run.seconds,
        "positions": run.positions,
        "threads": threads,
        "memory": run.memory,
        "lengths": [r.length for r in run.rows],
        "rows": [r.flat() for r in run.rows],
        "notes": run.notes,
    }
    path.write_text(json.dumps(data, indent=1) + "\n")
    print(
        f"  {spec:<70} {run.summary.get('retrieval_a', 0):.0%} retrieved, {run.positions:,} positions in "
        f"{run.seconds:.0f} s ({run.positions / run.seconds:.1f} tok/s, {threads} thread(s))",
        file=sys.stderr,
    )
    return data


def rows_of(data: dict) -> list[RetrievalRow]:
    out = []
    for r in data["rows"]:
        score = KeyScore(r["logp_a"], r["loss_a"], tuple(r["ranks_a"]), r["greedy_a"], r["match_a"])
        out.append(
            RetrievalRow(
                r["segment"],
                r["kind"],
                r["key"],
                r["depth"],
                r["length"],
                _requested(r["segment"]),
                r["needle"],
                r["answer"],
                r["distance"],
                score,
            )
        )
    return out


def _requested(segment: str) -> int:
    return int(segment.rsplit("-n", 1)[1])


def table(model: Model, entries: list[tuple[int | None, str, dict]], kv_bytes: int) -> str:
    name = Path(str(model.path)).name
    lengths = sorted({_requested(r["segment"]) for _, _, d in entries for r in d["rows"]})
    head = " | ".join(f"{n:,}" for n in lengths)
    out = [
        f"{name} (context {model.config.seq_len:,}); P(key) teacher-forced and retrieval (every key token "
        "rank 1, so the greedy answer is the key) over the needle grid; bytes = `memory_bytes()` at the last "
        "position of the longest sequence. Per length: keys retrieved of the depths.",
        "",
        f"| budget | plugin | bytes at the end | x budget | retrieved | {head} | mean log10 P(key) | s |",
        "| ---: | --- | ---: | ---: | ---: | " + " | ".join("---:" for _ in lengths) + " | ---: | ---: |",
    ]
    for budget, spec, d in entries:
        rows = d["rows"]
        hits = [r["max_rank_a"] == 1 for r in rows]
        per = []
        for n in lengths:
            at = [r["max_rank_a"] == 1 for r in rows if _requested(r["segment"]) == n]
            per.append(f"{sum(at)}/{len(at)}" if at else "-")
        mean_log10 = sum(r["logp_a"] for r in rows) / len(rows) / 2.302585092994046
        longest = max(range(len(d["memory"])), key=lambda i: d["lengths"][i])
        mem = d["memory"][longest]
        b = "-" if budget is None else f"{budget} ({budget * kv_bytes / 2**20:.1f} MiB)"
        ratio = "-" if budget is None else f"{mem / (budget * kv_bytes):.2f}"
        out.append(
            f"| {b} | `{spec}` | {mem:,} | {ratio} | {sum(hits)}/{len(hits)} | {' | '.join(per)} | "
            f"{mean_log10:.2f} | {d['seconds']:.0f} |"
        )
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("-c", "--checkpoint", default=str(SHARED_MODELS / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("-z", "--tokenizer", default=None)
    ap.add_argument("--out", default=str(REPO / "docs"))
    ap.add_argument("--runs", default=None, help="folder of the saved runs (default: OUT/retrieval_runs)")
    ap.add_argument("--lengths", default="1024,2048", help="needle grid lengths (tokens), comma-separated")
    ap.add_argument("--depths", default="0.1,0.5,0.9")
    ap.add_argument("--budgets", default="512", help="memory budgets in dense positions, comma-separated")
    ap.add_argument("--causal-lengths", default="", help="more lengths for causal alone (e.g. 4096,8192)")
    ap.add_argument("--causal-depths", default="0.1,0.5,0.9", help="the depths of --causal-lengths")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--only", action="append", default=None, help="run only this spec (repeatable)")
    ap.add_argument("--fresh", action="store_true", help="run again even if a saved run exists")
    ap.add_argument("--saved", action="store_true", help="only assemble the runs already saved (run nothing)")
    args = ap.parse_args(argv)
    out = Path(args.out)
    runs = Path(args.runs) if args.runs else out / "retrieval_runs"
    written = [("--out", out / name) for name in OUTPUTS] + [("--runs", runs)]
    try:  # never write a table, figure or run over the model or its tokenizer
        check_outputs(model_inputs(args.checkpoint, args.tokenizer), written)
    except InputError as exc:
        sys.exit(f"error: {exc}")
    runs.mkdir(parents=True, exist_ok=True)
    model = Model.load(args.checkpoint, tokenizer=args.tokenizer, threads=args.threads)
    lengths = [int(x) for x in args.lengths.split(",")]
    depths = args.depths.replace(",", "/")
    probe = f"needle:depths={depths},lengths={'/'.join(map(str, lengths))}"
    plan: list[tuple[int | None, str, str]] = [(None, "causal", probe)]
    if args.causal_lengths:
        more = f"needle:depths={args.causal_depths.replace(',', '/')},lengths={args.causal_lengths.replace(',', '/')}"
        plan.append((None, "causal", more))
    for budget in (int(b) for b in args.budgets.split(",")):
        plan += [(budget, spec, probe) for _, spec in specs(budget, max(lengths))]
    t0 = time.perf_counter()
    entries = []
    for budget, spec, pr in plan:
        if (args.only and spec not in args.only) or (args.saved and not _file(runs, spec, pr).is_file()):
            continue
        data = run_one(model, spec, pr, runs, args.threads, args.fresh)
        for note in data["notes"]:
            print(f"  note: {spec}: {note}", file=sys.stderr)
        if data["rows"]:
            entries.append((budget, spec, data))
    print(f"  {time.perf_counter() - t0:.0f} s in all", file=sys.stderr)
    if args.only:
        return
    kv = 2 * model.config.n_layers * model.config.kv_dim * 4
    md = table(model, entries, kv)
    (out / "retrieval.md").write_text(md)
    grid = {spec: rows_of(d) for budget, spec, d in entries if d["probe"] == probe}
    plots.needle_heatmap_figure(grid, columns=3).savefig(out / "retrieval_needle.png", dpi=100)
    every = {}
    for _, spec, d in entries:
        every.setdefault(spec, []).extend(rows_of(d))
    plots.key_distance_figure(every).savefig(out / "retrieval_distance.png", dpi=100)
    print(md)


if __name__ == "__main__":
    main()
